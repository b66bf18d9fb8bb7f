"""Hostile identities: control characters, invalid UTF-8, duplicated or missing identity headers,
look-alike identities that must stay distinct tenants, and boundary identities."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from tests.hostile.harness import (
    BOUNDARY, CONTROL_CHARS, IO_TIMEOUT, LOOKALIKES, MALFORMED, NOT_UTF8, REFERENCES, W, answer,
    assert_error_shape, bad_identity, bot_value, Build, check_rejected, Err, get, head_with, Hostile, ident,
    ident_of, LookAlike, org_value, raw_client, send, session_value, user_value,
)

pytestmark = pytest.mark.asyncio(loop_scope="package")

DATA_CASES: list[Any] = [
    # -- control characters and odd unicode in identity values -----------------------------------
    pytest.param(org_value(b"rej\torg"), bad_identity("X-Org-Id", CONTROL_CHARS), id="tab-in-org-id"),
    pytest.param(org_value("\u202eemca".encode()), bad_identity("X-Org-Id", "must not contain bidirectional"),
                 id="bidi-override-in-org-id"),
    pytest.param(user_value("\u2066mallory\u2069".encode()), bad_identity("X-User-Id", "must not contain bidirectional"),
                 id="bidi-isolates-in-user-id"),
    pytest.param(user_value(b"mal\tlory"), bad_identity("X-User-Id", CONTROL_CHARS), id="tab-in-user-id"),
    pytest.param(session_value(b"rej\tsession"), bad_identity("X-Session-Id", CONTROL_CHARS), id="tab-in-session-id"),
    pytest.param(bot_value(b"b\tot"), bad_identity("X-Bot-Id", CONTROL_CHARS), id="tab-in-bot-id"),
    pytest.param(org_value(b"rej\x01org"), MALFORMED, id="soh-in-org-id"),
    pytest.param(user_value(b"mal\x1b[31mlory"), MALFORMED, id="ansi-escape-in-user-id"),
    pytest.param(org_value(b"rej\x7forg"), MALFORMED, id="del-in-org-id"),
    pytest.param(org_value(b"rej\x0borg"), MALFORMED, id="vertical-tab-in-org-id"),
    pytest.param(org_value(b"rej\xc2\x85org"), bad_identity("X-Org-Id", CONTROL_CHARS), id="c1-nel-in-org-id"),
    pytest.param(user_value(b"mal\xc2\x9blory"), bad_identity("X-User-Id", CONTROL_CHARS), id="c1-csi-in-user-id"),
    pytest.param(org_value(b"rej\xe2\x80\xa8org"), bad_identity("X-Org-Id", CONTROL_CHARS),
                 id="line-separator-in-org-id"),
    pytest.param(session_value(b"rej\xe2\x80\xa9s"), bad_identity("X-Session-Id", CONTROL_CHARS),
                 id="paragraph-separator-in-session-id"),
    # -- invalid UTF-8: lone surrogates, overlong forms, truncated and out-of-range sequences --------
    pytest.param(org_value(b"rej\xed\xa0\x80org"), bad_identity("X-Org-Id", NOT_UTF8), id="lone-high-surrogate-org"),
    pytest.param(user_value(b"\xed\xbf\xbfmallory"), bad_identity("X-User-Id", NOT_UTF8),
                 id="lone-low-surrogate-user"),
    pytest.param(session_value(b"rej\xed\xa0\xbd\xed\xb8\x80"), bad_identity("X-Session-Id", NOT_UTF8),
                 id="cesu8-surrogate-pair-session"),
    pytest.param(org_value(b"rej\xc0\xaforg"), bad_identity("X-Org-Id", NOT_UTF8), id="overlong-2-byte-slash-org"),
    pytest.param(user_value(b"\xe0\x80\xafmallory"), bad_identity("X-User-Id", NOT_UTF8), id="overlong-3-byte-user"),
    pytest.param(bot_value(b"\xf0\x80\x80\xafbot"), bad_identity("X-Bot-Id", NOT_UTF8), id="overlong-4-byte-bot"),
    pytest.param(org_value(b"rej\xc0\x80org"), bad_identity("X-Org-Id", NOT_UTF8), id="overlong-nul-org"),
    pytest.param(org_value(b"rej\xe2\x82"), bad_identity("X-Org-Id", NOT_UTF8), id="truncated-sequence-org"),
    pytest.param(org_value(b"\xf4\x90\x80\x80"), bad_identity("X-Org-Id", NOT_UTF8), id="beyond-u10ffff-org"),
    pytest.param(user_value(b"mall\xe9ry"), bad_identity("X-User-Id", NOT_UTF8), id="latin-1-byte-user"),
    pytest.param(session_value(b"\xff\xferej"), bad_identity("X-Session-Id", NOT_UTF8), id="ff-fe-bytes-session"),
    # -- duplicated, empty and missing identity headers ---------------------------------------------
    pytest.param(get(b"/", b"X-User-Id: victim\r\n"), bad_identity("X-User-Id", "must be given once"),
                 id="duplicated-user-id"),
    pytest.param(get(b"/", b"X-Session-Id: walk-1\r\n"), bad_identity("X-Session-Id", "must be given once"),
                 id="duplicated-session-id"),
    pytest.param(get(b"/", b"X-Org-Id: walk-org\r\n"), bad_identity("X-Org-Id", "must be given once"),
                 id="duplicated-org-id"),
    pytest.param(bot_value(b"b1\r\nX-Bot-Id: b2"), bad_identity("X-Bot-Id", "must be given once"),
                 id="duplicated-bot-id"),
    pytest.param(head_with(b"x-user-id: a\r\nX-USER-ID: b\r\nX-Session-Id: {s}\r\n"),
                 bad_identity("X-User-Id", "must be given once"), id="duplicated-user-id-other-case"),
    pytest.param(get(b"/", b"X-User-Id: mallory\r\n"), bad_identity("X-User-Id", "must be given once"),
                 id="duplicated-user-id-same-value"),
    pytest.param(user_value(b""), bad_identity("X-User-Id", "must not be empty"), id="empty-user-id"),
    pytest.param(session_value(b""), bad_identity("X-Session-Id", "must not be empty"), id="empty-session-id"),
    pytest.param(user_value(b"   \t "), bad_identity("X-User-Id", "must not be empty"), id="whitespace-only-user-id"),
    pytest.param(head_with(b"X-Org-Id: rej-org\r\nX-Session-Id: {s}\r\n"), bad_identity("X-User-Id", "is required"),
                 id="missing-user-id"),
    pytest.param(head_with(b"X-Org-Id: rej-org\r\nX-User-Id: mallory\r\n"), bad_identity("X-Session-Id", "is required"),
                 id="missing-session-id"),
    pytest.param(head_with(b"X-Note: {s}\r\n"), bad_identity("X-User-Id", "is required"), id="no-identity-at-all"),
]


@pytest.mark.parametrize(("build", "expected"), DATA_CASES)
async def test_data_plane_rejects_hostile_input(gw: Hostile, request: pytest.FixtureRequest, build: Build,
                                                expected: Err) -> None:
    await check_rejected(gw, request, build, expected)


@pytest.mark.parametrize("alike", LOOKALIKES, ids=lambda a: a.id)
async def test_look_alike_identity_routes_to_a_different_sandbox(gw: Hostile, alike: LookAlike) -> None:
    """The dry run (which creates nothing) never places a look-alike in the original's sandbox."""
    reference = await gw.dry_run(*REFERENCES[alike.ref])
    assert reference["sandbox_id"] == gw.bound[alike.ref]
    placed = await gw.dry_run(*alike.identity)
    assert placed["sandbox_id"] != reference["sandbox_id"]
    if alike.ref == "iso" and alike.field == "org":
        # A look-alike of a per-session org is another org: shared, not per-session (and its own sandbox).
        assert placed["sandbox_id"].startswith("org-") and reference["sandbox_id"].startswith("ses-")


async def test_look_alikes_are_pairwise_distinct(gw: Hostile) -> None:
    placed = [(await gw.dry_run(*a.identity))["sandbox_id"] for a in LOOKALIKES]
    references = [gw.bound[name] for name in REFERENCES]
    assert len(set(placed) | set(references)) == len(placed) + len(references)


@pytest.mark.parametrize("alike", [a for a in LOOKALIKES if a.bind], ids=lambda a: a.id)
async def test_look_alike_headers_reach_their_own_sandbox(gw: Hostile, alike: LookAlike) -> None:
    """UTF-8 header bytes decode to the same identity as the JSON that bound it, and to no other."""
    org, user, session = alike.identity
    head = b"GET /echo/lookalike HTTP/1.1\r\n" + ident(session.encode(), org.encode(), user.encode()) + b"\r\n"
    response, _ = await send(gw.data_port, head)
    assert response is not None and response.status == 200, response
    sandbox = response.json()["headers"]["X-Sandbox-Id"]
    assert sandbox == gw.bound[f"alike:{alike.id}"]
    assert response.headers[b"x-runtime-sandbox-id"] == sandbox.encode()
    assert sandbox not in {gw.bound[name] for name in REFERENCES}


@pytest.mark.parametrize("alike", [a for a in LOOKALIKES if a.field != "session"], ids=lambda a: a.id)
async def test_look_alike_replaying_the_originals_session_is_404(gw: Hostile, alike: LookAlike) -> None:
    """A look-alike org or user sending the original's session ID gets the unknown-session 404."""
    org, user, _ = alike.identity
    session = REFERENCES[alike.ref][2]
    head = b"GET /echo/x HTTP/1.1\r\n" + ident(session.encode(), org.encode(), user.encode()) + b"\r\n"
    response, _ = await send(gw.data_port, head)
    assert response is not None
    assert_error_shape(response, Err(404, "not_found"))
    assert b"x-runtime-sandbox-id" not in response.headers


@pytest.mark.parametrize("name", list(BOUNDARY))
async def test_boundary_identities_reach_their_own_sandbox(gw: Hostile, name: str) -> None:
    org, user, session = BOUNDARY[name]
    response, _ = await send(gw.data_port, b"GET /echo/b HTTP/1.1\r\n" + ident_of(BOUNDARY[name]) + b"\r\n")
    assert response is not None and response.status == 200, response
    assert response.json()["headers"]["X-Sandbox-Id"] == gw.bound[name]
    personal = await gw.dry_run(None, user, session)
    assert personal["sandbox_id"] != gw.bound[name]  # an empty org is not a personal account


async def test_empty_bot_id_is_absent_and_identity_does_not_carry_over_a_connection(gw: Hostile) -> None:
    """Two pipelined requests: the first (walker, empty X-Bot-Id) is served; the second, without identity
    headers on the same connection, is 400 (identity is per request, never per connection)."""
    first = b"GET /echo/1 HTTP/1.1\r\n" + W + b"X-Bot-Id:\r\n\r\n"
    second = b"GET /echo/2 HTTP/1.1\r\nHost: gw\r\nX-Note: no identity\r\n\r\n"
    async with raw_client(gw.data_port) as (reader, writer):
        writer.write(first + second)
        one = await asyncio.wait_for(answer(reader), IO_TIMEOUT)
        two = await asyncio.wait_for(answer(reader), IO_TIMEOUT)
    assert one is not None and one.status == 200 and one.json()["sandbox_id"] == gw.bound["walker"]
    assert two is not None
    assert_error_shape(two, bad_identity("X-User-Id", "is required"))


async def test_the_owner_check_holds_on_a_connection_its_owner_used_first(gw: Hostile) -> None:
    """On one keep-alive connection the owner is served, then a look-alike sends the owner's session ID:
    404, as on a connection of its own (the connection's memo of the checked route is for the owner's
    identity only; gateway/route_cache.py)."""
    alike = next(a for a in LOOKALIKES if a.field != "session")
    org, user, session = REFERENCES[alike.ref]
    owner = b"GET /echo/1 HTTP/1.1\r\n" + ident(session.encode(), org.encode(), user.encode()) + b"\r\n"
    org, user, _ = alike.identity
    other = b"GET /echo/2 HTTP/1.1\r\n" + ident(session.encode(), org.encode(), user.encode()) + b"\r\n"
    async with raw_client(gw.data_port) as (reader, writer):
        for _ in range(2):  # the second time the owner's route comes from the cache and the memo
            writer.write(owner)
            served = await asyncio.wait_for(answer(reader), IO_TIMEOUT)
            assert served is not None and served.status == 200, served
            assert served.json()["headers"]["X-Sandbox-Id"] == gw.bound[alike.ref]
        writer.write(other)
        refused = await asyncio.wait_for(answer(reader), IO_TIMEOUT)
    assert refused is not None
    assert_error_shape(refused, Err(404, "not_found"))
    assert b"x-runtime-sandbox-id" not in refused.headers
