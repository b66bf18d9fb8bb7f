"""What a browser may do with a sandbox's preview URL: the rules that keep one sandbox's pages away from
another's credentials (SECURITY.md, "Browsers").

An origin is a browser's unit of trust, not a cookie's ``Path``. Host mode gives each sandbox port its
own origin (``{port}-{id}.{preview_domain}``), but those hosts are siblings under one registrable
domain, so they are *same-site*: a ``SameSite=Lax`` cookie rides on a request one sandbox's page
sends to another. Three rules close that:

- **Fetch Metadata** (:func:`cross_site_refusal`): a request that carries only the access cookie is
  served when the sandbox's own page or the user sent it: ``Sec-Fetch-Site`` ``same-origin`` or
  ``none``, or a top-level navigation (``Sec-Fetch-Mode: navigate``, GET or HEAD, to a document).
  Browsers that send no Fetch Metadata fall back to ``Origin`` (and, for unsafe methods, ``Referer``)
  naming the request's own host. A bearer token in ``Authorization`` is never checked this way: no
  browser attaches it by itself.
- **A sandbox's cookies are its own** (:func:`sandbox_cookie`): a ``Set-Cookie`` from a sandbox loses
  its ``Domain`` (host-only) and, in path mode, gets a ``Path`` under the sandbox's prefix, parsed as
  RFC 6265 and browsers parse it (any spacing and case). A sandbox never sets the gateway's cookie.
- **A cookie bomb costs one request** (:class:`CookieNames`): a head too large because of cookies is
  answered 431 with ``Set-Cookie`` lines that expire every cookie it carried, on the host and on the
  preview domain, the access cookie excepted.

Path mode shares one origin among every sandbox, so no rule about credentials can separate them:
any page one sandbox serves there could read another's cookies and storage, frame its pages, read
``document.referrer`` or register a service worker for the whole origin. So, unless
``preview_path_cookies`` accepts one origin for a single tenant, **no sandbox content becomes a page
on that origin** (:func:`browser_document`: a navigation, frame, worker or service-worker script is
refused with a page pointing to the host URL), and every path-mode response carries
:data:`PATH_MODE_HEADERS` (``Content-Security-Policy: sandbox``: whatever a browser still renders gets
an opaque origin and runs no script; ``Referrer-Policy: no-referrer``: no URL, and no token in it,
leaves as a referrer). Path URLs are for programs that send the token in each request.

Pure: no I/O. Nothing here is on the common path (read only for cookie-authorised keyed requests,
sandbox responses that set cookies, and refused heads), so it stays plain Python.
"""

from __future__ import annotations

import re

from gateway.access import COOKIE_NAME
from gateway.errors import Forbidden

HOST_COOKIE_NAME = "__Host-" + COOKIE_NAME  # the access cookie where the scheme is https (host mode)
_OURS = {COOKIE_NAME.lower(), HOST_COOKIE_NAME.lower()}  # a sandbox's Set-Cookie may not name them, any case
_OURS_EXACT = {COOKIE_NAME.encode(), HOST_COOKIE_NAME.encode()}  # what a browser sends back: names are case-sensitive
PATH_MODE_HEADERS = b"\r\nContent-Security-Policy: sandbox\r\nReferrer-Policy: no-referrer"
_DOCUMENT_DESTS = frozenset({b"document", b"iframe", b"frame", b"embed", b"object", b"worker", b"sharedworker",
                             b"serviceworker", b"fencedframe"})
_SAFE = (b"GET", b"HEAD")
_TOKEN_PARAM = re.compile(rb"(?<=[?&])access_token=[^&#]*&?")
_AUTHORITY = re.compile(rb"^[a-z][a-z0-9+.-]*://([^/?#]*)", re.I)


def cross_site_refusal(method: bytes, headers: list[bytes], host: bytes | None) -> Forbidden | None:
    """None when a request authorised by the access cookie alone was sent by the sandbox's own page or
    the user (see the module docstring); else the 403 to answer. ``headers`` is the request's forwarded
    header groups (name, ": ", value, CRLF), as in ``Exchange.headers``."""
    site = mode = dest = origin = referer = None
    for i in range(0, len(headers), 4):
        name = headers[i].lower()
        if name.startswith(b"sec-fetch-"):
            value = headers[i + 2].strip().lower()
            if name == b"sec-fetch-site":
                site = value
            elif name == b"sec-fetch-mode":
                mode = value
            elif name == b"sec-fetch-dest":
                dest = value
        elif name == b"origin":
            origin = headers[i + 2].strip()
        elif name == b"referer":
            referer = headers[i + 2].strip()
    if site is not None:
        if site in (b"same-origin", b"none"):
            return None
        if mode == b"navigate" and method in _SAFE and dest in (None, b"document"):
            return None  # a link or a typed address: the user's own navigation, top-level only (no frames)
        return _refusal(f"Sec-Fetch-Site: {site.decode('latin-1')}, Sec-Fetch-Mode: "
                        f"{(mode or b'-').decode('latin-1')}, Sec-Fetch-Dest: {(dest or b'-').decode('latin-1')}")
    # No Fetch Metadata (an older browser, or a page on plain http to a name it does not trust).
    if origin is not None:
        return None if _same_authority(origin, host) else _refusal(f"Origin: {origin.decode('latin-1')}")
    if method not in _SAFE and referer is not None and not _same_authority(referer, host):
        return _refusal("its Referer is another site")
    return None  # a program (no browser sends an unsafe request without Origin), or a plain navigation


def browser_document(headers: list[bytes]) -> bool:
    """Whether a browser asks for something it would run as a page or a worker on the request's origin:
    a navigation, a frame, an embed, a worker or a service-worker script (Fetch Metadata), or, from a
    browser that sends none, a request that accepts HTML."""
    mode = dest = accept = None
    service_worker = metadata = False
    for i in range(0, len(headers), 4):
        name = headers[i].lower()
        if name.startswith(b"sec-fetch-"):
            metadata = True
            if name == b"sec-fetch-mode":
                mode = headers[i + 2].strip().lower()
            elif name == b"sec-fetch-dest":
                dest = headers[i + 2].strip().lower()
        elif name == b"service-worker":
            service_worker = True
        elif name == b"accept":
            accept = headers[i + 2].lower()
    if service_worker or mode == b"navigate" or dest in _DOCUMENT_DESTS:
        return True
    return not metadata and accept is not None and b"text/html" in accept


def _same_authority(url: bytes, host: bytes | None) -> bool:
    match = _AUTHORITY.match(url)
    return match is not None and host is not None and match.group(1).lower() == host.strip().lower()


def _refusal(why: str) -> Forbidden:
    return Forbidden(f"this request came from another site's page ({why}) and carries only the preview URL's "
                     "cookie, which is for the sandbox's own pages and the user's navigations; open the URL "
                     "directly, or send the access token as Authorization: Bearer", code="cross_site_request")


def sandbox_cookie(value: bytes, prefix: bytes | None) -> bytes | None:
    """A sandbox's ``Set-Cookie`` value as the client gets it: without ``Domain`` (host-only), with its
    ``Path`` under ``prefix`` in path mode; None (the line is dropped) for the gateway's own cookie or
    a value with no name-value pair."""
    pair, _, attributes = value.partition(b";")
    name, eq, _ = pair.partition(b"=")
    if not eq or name.strip().decode("latin-1").lower() in _OURS:
        return None
    kept = [pair.strip()]
    path: bytes | None = None
    at = -1  # where the (last) Path was: the rewritten one goes there
    for attribute in attributes.split(b";"):
        key, _, attr_value = attribute.partition(b"=")
        key = key.strip().lower()
        if key == b"domain":
            continue
        if key == b"path":
            path = attr_value.strip()  # the last one counts (RFC 6265 5.3 step 6)
            at = len(kept)
            continue
        if attribute.strip():
            kept.append(attribute.strip())
    if prefix is not None and path is not None and path.startswith(b"/"):
        path = prefix + path
    # (No Path, or one not starting with "/": the browser's default, the URL's directory, is under the prefix.)
    if path is not None:
        kept.insert(at if at >= 0 else len(kept), b"Path=" + path)
    return b"; ".join(kept)


_CACHE_CONTROL = re.compile(rb"\r\ncache-control:([^\r]*)")  # on the lower-cased head


def private_to_caches(head: bytes, low: bytes) -> bytes:
    """A response to a request a preview credential opened, marked ``Cache-Control: private`` unless the
    sandbox said ``private`` or ``no-store``: a shared cache (a CDN before the preview domain) must not
    keep it for whoever asks next without a token. (Added beside a ``public``, it wins: RFC 9111 5.2.2.7.)"""
    for value in _CACHE_CONTROL.findall(low):
        if b"private" in value or b"no-store" in value:
            return head
    return head + b"\r\nCache-Control: private"


_PATH_SEGMENT = re.compile(rb"[A-Za-z0-9._~!$&'()*+,=:@%-]+")
_CLEAR_SITE_DATA = re.compile(rb"\r\nclear-site-data:[^\r]*", re.I)


def without_clear_site_data(head: bytes) -> bytes:
    """A response head without ``Clear-Site-Data``: from one preview host it would clear the cookies and
    storage of the whole site, every sibling sandbox and the access cookies included."""
    return _CLEAR_SITE_DATA.sub(b"", head)


def referer_without_token(headers: list[bytes]) -> list[bytes]:
    """``headers`` with ``access_token`` cut from a ``Referer``'s query (path mode: every sandbox is one
    origin, so a browser sends a page's whole URL, token included, to the other sandboxes it links to)."""
    for i in range(0, len(headers), 4):
        if headers[i].lower() == b"referer" and _TOKEN_PARAM.search(headers[i + 2]):
            headers[i + 2] = _TOKEN_PARAM.sub(b"", headers[i + 2]).replace(b"?&", b"?").rstrip(b"?&")
    return headers


class CookieNames:
    """The cookie names in a request head read as it arrives, for a head refused as too large.

    Only names are kept (bounded in number and length), so reading a bombed head of any size costs
    a few kilobytes; ``feed`` returns True once the head has ended (or the bound on what is read is
    reached), when :meth:`clearing` gives the ``Set-Cookie`` lines that expire them."""

    MAX_NAMES = 200
    MAX_NAME = 4096  # a browser's limit for a whole cookie
    MAX_ANSWER = 96 * 1024  # bytes of Set-Cookie in one answer (Chromium drops a response head over 256 KiB
    # whole); names past it are expired by the next answer
    MAX_HEAD = 1024 * 1024  # read no more than this of a refused head looking for names
    _MAX_CARRY = 256

    def __init__(self) -> None:
        self.names: dict[bytes, None] = {}
        self.navigation = False
        self.paths: list[bytes] = [b"/"]  # the request path's ancestors: a cookie's Path may be any of them
        self._first = True
        self._carry = b""
        self._read = 0

    def feed(self, data: bytes) -> bool:
        self._read += len(data)
        text = self._carry + data
        start = 0
        while (end := text.find(b"\r\n", start)) >= 0:
            if end == start:
                return True  # the empty line: the head has ended
            self._line(text[start:end])
            start = end + 2
        rest = text[start:]
        cr = rest.endswith(b"\r")  # a line end split between reads: the CR is kept whatever is cut
        if cr:
            rest = rest[:-1]
        if rest[:7].lower() == b"cookie:":
            # A long Cookie line arrives in pieces: take the names of the pairs that are whole, and of the
            # pair under way keep its name alone (its value may be kilobytes, trickled a byte a read).
            cut = rest.rfind(b";")
            if cut > 7:
                self._line(rest[:cut])
                rest = b"Cookie:" + rest[cut + 1:]
            name, eq, _ = rest[7:].partition(b"=")
            rest = (b"Cookie:" + name + eq)[:self.MAX_NAME + 8]
        else:
            rest = rest[:self._MAX_CARRY]  # a header's name (and a short value) is at its start
        self._carry = rest + b"\r" if cr else rest
        return self._read >= self.MAX_HEAD

    def _line(self, line: bytes) -> None:
        if self._first:
            self._first = False
            self._request_line(line)
            return
        name, colon, value = line.partition(b":")
        if not colon:
            return
        low = name.strip().lower()
        if low == b"sec-fetch-mode" and value.strip().lower() == b"navigate":
            self.navigation = True
        if low != b"cookie":
            return
        for pair in value.split(b";"):
            cookie, eq, _ = pair.partition(b"=")
            cookie = cookie.strip()
            if eq and cookie and len(cookie) <= self.MAX_NAME and len(self.names) < self.MAX_NAMES \
                    and cookie not in _OURS_EXACT:  # SGW_ACCESS is another cookie: a bomb may use it
                self.names[cookie] = None

    def _request_line(self, line: bytes) -> None:
        """The target's path and its ancestors, with and without a closing slash (``/a/b`` -> ``/``, ``/a``,
        ``/a/``, ``/a/b``, ``/a/b/``), at most MAX_PATHS deep: a cookie whose Path is one of them reaches
        this request, and only a Set-Cookie naming that very Path expires it."""
        target = line.split(b" ")[1] if line.count(b" ") >= 2 else b"/"
        path = target.split(b"?", 1)[0]
        if not path.startswith(b"/"):  # absolute-form: http://host/path
            path = b"/" + path.partition(b"://")[2].partition(b"/")[2]
        parts = []
        for part in path.split(b"/")[1:]:
            if not part:
                continue
            if not _PATH_SEGMENT.fullmatch(part):
                break  # ';', a space or a control byte would add attributes to our own Set-Cookie lines
            parts.append(part)
        parts = parts[:self.MAX_PATHS]
        for depth in range(1, len(parts) + 1):
            self.paths.append(b"/" + b"/".join(parts[:depth]))
            self.paths.append(b"/" + b"/".join(parts[:depth]) + b"/")  # a Path matches as written

    MAX_PATHS = 8

    def clearing(self, domain: str | None) -> list[bytes]:
        """``Set-Cookie`` values that expire every name seen for ``/`` and each ancestor of the request's
        path, host-only and on ``domain`` and each of its parents but the last two labels' parent (a
        preview domain below a registrable domain: a script may set cookies up to it; a browser ignores
        a Domain it would not accept)."""
        lines: list[bytes] = []
        size = 0
        scopes = [b""] + [b"; Domain=" + parent for parent in _parents(domain)]
        for name in self.names:
            mine = [name + b"=; Max-Age=0; Path=" + path + scope for path in self.paths for scope in scopes]
            size += sum(len(line) + 14 for line in mine)  # "Set-Cookie: " and CRLF
            if size > self.MAX_ANSWER and lines:
                break
            lines += mine
        return lines


def _parents(domain: str | None) -> list[bytes]:
    """``sbx.preview.example.com`` -> itself, ``preview.example.com``, ``example.com``."""
    if not domain:
        return []
    labels = domain.encode("ascii").split(b".")
    return [b".".join(labels[i:]) for i in range(0, max(1, len(labels) - 1))]


__all__ = ["HOST_COOKIE_NAME", "PATH_MODE_HEADERS", "CookieNames", "browser_document", "cross_site_refusal", "private_to_caches", "without_clear_site_data",
           "referer_without_token", "sandbox_cookie"]


# Keyed requests (gateway.proxy._keys): a sandbox's Set-Cookie made its own (sandbox_cookie above), and in
# path mode its Location put under the sandbox's prefix; the upstream side calls these on such a head.
_REWRITTEN = re.compile(rb"\r\n(location|set-cookie):[ \t]*([^\r]*)", re.I)
_SET_COOKIE = re.compile(rb"\r\n(set-cookie):[ \t]*([^\r]*)", re.I)


def rewrite_under_prefix(head: bytes, prefix: bytes, authorities: tuple[bytes, ...]) -> bytes:
    """A response head with ``Location`` (a path, or an absolute URL on one of ``authorities``) and
    ``Set-Cookie`` ``Path`` put under ``prefix`` (path mode), cookies host-only."""
    def one(match: re.Match[bytes]) -> bytes:
        name, value = match.group(1), match.group(2)
        if name.lower() == b"location":
            return b"\r\n" + name + b": " + _location_under(value, prefix, authorities)
        cookie = sandbox_cookie(value, prefix)
        return b"\r\n" + name + b": " + cookie if cookie is not None else b""
    return _REWRITTEN.sub(one, head)


def host_only_cookies(head: bytes) -> bytes:
    """A response head whose ``Set-Cookie`` lines lose ``Domain`` (host mode: preview hosts are same-site
    siblings, and a cookie for their parent would reach every other sandbox)."""
    def one(match: re.Match[bytes]) -> bytes:
        cookie = sandbox_cookie(match.group(2), None)
        return b"\r\n" + match.group(1) + b": " + cookie if cookie is not None else b""
    return _SET_COOKIE.sub(one, head)


def _location_under(value: bytes, prefix: bytes, authorities: tuple[bytes, ...]) -> bytes:
    if value.startswith(b"/") and not value.startswith(b"//"):
        return prefix + value
    scheme, sep, rest = value.partition(b"://")
    if sep and scheme.lower() in (b"http", b"https"):
        authority, slash, path = rest.partition(b"/")
        if authority.lower() in authorities:
            return prefix + b"/" + path
    return value
