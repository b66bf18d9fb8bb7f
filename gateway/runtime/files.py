"""Path confinement and the file endpoints (upload, download, list, exists).

Confinement is decided on the *resolved* path, never on the string: every
spelling of a traversal (``..``, ``%2e%2e%2f``, an absolute path, a symlink
inside root that points out) ends up as a real path that is or is not under
root, so one comparison catches them all. aiohttp has already decoded
``%2F`` into ``/`` in ``match_info`` (``/download/a%2Fb.txt`` names
``a/b.txt``) and a literal ``%2F`` in a file name arrives as ``%252F``.

The process running shell commands in this sandbox can write anywhere it has
permission to; confinement protects the *API* from naming files outside the
workspace, it is not a security boundary against the sandbox's own code.
"""

from __future__ import annotations

import contextlib
import os
import stat
import tempfile
from email.message import Message
from email.utils import collapse_rfc2231_value
from pathlib import Path
from collections.abc import Iterator
from typing import Any

from aiohttp import BodyPartReader, hdrs, web
from aiohttp.http_exceptions import BadHttpMessage

from .config import CONFIG
from .errors import BadRequest, NotFound, PathOutsideRoot, PermissionDenied

_CHUNK_BYTES = 256 * 1024


def resolve_inside(root: Path, rel: str) -> Path:
    """Resolve ``rel`` against ``root`` and refuse anything that lands outside.

    ``root`` must already be resolved. An empty ``rel`` names root itself.
    Absolute paths are refused rather than re-rooted: a client sending
    ``/etc/passwd`` means the host file, and silently serving
    ``<root>/etc/passwd`` instead would hide its mistake.
    """
    if "\x00" in rel:
        raise BadRequest("path contains a NUL byte", code="invalid_path")
    if rel.startswith("/"):
        raise PathOutsideRoot(f"absolute path {rel!r} is outside the sandbox root; send a relative path")
    try:
        candidate = (root / rel).resolve()
    except (OSError, RuntimeError) as exc:  # symlink loop (RuntimeError before 3.13)
        raise BadRequest(f"path {rel!r} cannot be resolved: {exc}", code="invalid_path") from exc
    if candidate != root and not candidate.is_relative_to(root):
        raise PathOutsideRoot(f"path {rel!r} resolves outside the sandbox root")
    return candidate


@contextlib.contextmanager
def _fs_errors(rel: str) -> Iterator[None]:
    """Turn the OS's answers about ``rel`` into ours.

    Anything else (a full disk, an I/O error) is the sandbox's fault, not the
    client's, and stays a 500.
    """
    try:
        yield
    except PermissionError as exc:
        raise PermissionDenied(f"the sandbox runtime may not access {rel!r}: {exc.strerror}") from exc
    except (NotADirectoryError, FileExistsError) as exc:
        raise BadRequest(f"a parent of {rel!r} is a file, not a directory", code="not_a_directory") from exc
    except FileNotFoundError as exc:
        raise NotFound(f"nothing at {rel!r}") from exc


def _target(request: web.Request) -> tuple[str, Path]:
    """The decoded ``{path}`` of the route and where it resolves."""
    rel = request.match_info.get("path", "")
    return rel, resolve_inside(request.app[CONFIG].root, rel)


def _entry(root: Path, path: Path) -> dict[str, Any]:
    """One listing row.

    A symlink is described by its target only when the target is inside
    root; otherwise by the link itself, so a listing never reports the size
    or age of a file outside the sandbox.
    """
    st = path.lstat()
    if stat.S_ISLNK(st.st_mode):
        with contextlib.suppress(OSError, RuntimeError):
            target = path.resolve(strict=True)
            if target == root or target.is_relative_to(root):
                st = target.stat()
    is_dir = stat.S_ISDIR(st.st_mode)
    return {
        "name": path.name,
        "size": 0 if is_dir else st.st_size,
        "type": "directory" if is_dir else "file",
        "mod_time": st.st_mtime,
    }


async def handle_download(request: web.Request) -> web.StreamResponse:
    """``GET /download/{path}``: stream the file (FileResponse uses sendfile)."""
    rel, path = _target(request)
    if path.is_dir():
        raise BadRequest(f"{rel!r} is a directory; use /list to read directories", code="is_a_directory")
    if not path.is_file():
        raise NotFound(f"no file at {rel!r}")
    if not os.access(path, os.R_OK):  # else FileResponse answers a bare 403
        raise PermissionDenied(f"the sandbox runtime may not read {rel!r}")
    return web.FileResponse(path, headers={"Content-Type": "application/octet-stream"})


async def handle_list(request: web.Request) -> web.Response:
    """``GET /list/{path}``: the directory's entries, sorted by name.

    ``mod_time`` is a float POSIX timestamp (seconds), the legacy
    agent-sandbox python-runtime format its clients decode.
    """
    rel, path = _target(request)
    if not path.exists():
        raise NotFound(f"no directory at {rel!r}")
    if not path.is_dir():
        raise BadRequest(f"{rel!r} is a file; use /download to read files", code="not_a_directory")
    root = request.app[CONFIG].root
    entries = []
    with _fs_errors(rel):
        children = sorted(path.iterdir(), key=lambda p: p.name)
    for child in children:
        with contextlib.suppress(FileNotFoundError):  # removed while we listed
            entries.append(_entry(root, child))
    return web.json_response(entries)


async def handle_exists(request: web.Request) -> web.Response:
    """``GET /exists/{path}``: whether anything (file or directory) is there."""
    rel, path = _target(request)
    return web.json_response({"path": rel, "exists": path.exists()})


async def handle_upload(request: web.Request) -> web.Response:
    """``POST /upload``: multipart field ``file``; its filename is the path.

    Only the first ``file`` part is stored; other fields are skipped.
    """
    if not request.content_type.startswith("multipart/"):
        raise BadRequest("send multipart/form-data with a 'file' field", code="not_multipart")
    root = request.app[CONFIG].root
    try:
        reader = await request.multipart()
        while (part := await reader.next()) is not None:
            if isinstance(part, BodyPartReader) and (disposition := _disposition(part))[0] == "file":
                break
        else:
            raise BadRequest("multipart body has no 'file' field", code="missing_file")
        rel = disposition[1]
        if not rel:
            raise BadRequest("the 'file' field needs a filename: the destination path", code="missing_filename")
        path = resolve_inside(root, rel)
        if path == root or path.is_dir():
            raise BadRequest(f"{rel!r} is a directory; name a file", code="is_a_directory")
        size = await _save(part, path, rel)
    except (ValueError, KeyError, BadHttpMessage) as exc:  # malformed multipart framing
        raise BadRequest(f"malformed multipart body: {exc!r}", code="bad_multipart") from exc
    return web.json_response({"path": rel, "size": size})


def _disposition(part: BodyPartReader) -> tuple[str | None, str | None]:
    """The part's field name and filename, exactly as the client sent them.

    Not ``part.filename``: aiohttp strips leading slashes from quoted values
    (``/etc/passwd`` would quietly become ``etc/passwd`` instead of being
    refused) and warns on odd headers. The stdlib parser handles quoting and
    RFC 2231 ``filename*`` and changes nothing else.
    """
    message = Message()
    message["Content-Disposition"] = part.headers.get(hdrs.CONTENT_DISPOSITION, "")
    name = message.get_param("name", header="content-disposition")
    if isinstance(name, tuple):  # RFC 2231 name*=
        name = collapse_rfc2231_value(name)
    return name, message.get_filename()


async def _save(part: BodyPartReader, path: Path, rel: str) -> int:
    """Stream ``part`` into ``path`` chunk by chunk, atomically.

    The bytes go to a temporary file beside the target and are renamed into
    place at the end, so an aborted upload never leaves a half-written file
    where a reader could find it. Writes are plain blocking calls: they land
    in the page cache in microseconds, less than a thread hop per chunk costs.
    """
    with _fs_errors(rel):
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp_name = tempfile.mkstemp(dir=path.parent, prefix=".upload-")
    size = 0
    try:
        with os.fdopen(fd, "wb") as out:
            # mkstemp makes 0600 files; keep an existing file's mode, else 0644.
            os.fchmod(out.fileno(), stat.S_IMODE(path.stat().st_mode) if path.exists() else 0o644)
            while chunk := await part.read_chunk(_CHUNK_BYTES):
                out.write(chunk)
                size += len(chunk)
        with _fs_errors(rel):
            os.replace(tmp_name, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp_name)
        raise
    return size
