"""Small data-plane gaps a new user hit: a browser's /favicon.ico, request trailers."""

from __future__ import annotations

import asyncio

import aiohttp
import pytest
from aiohttp import web

from tests.proxy_helpers import (  # noqa: F401  (start_gateway is a fixture)
    CachingFakeResolver, backend, echo_headers, identity_headers, start_gateway)


@pytest.fixture
async def sandbox(aiohttp_server):
    seen: list[str] = []

    async def handler(request: web.Request) -> web.Response:
        seen.append(request.path)
        return await echo_headers(request)

    return await backend(aiohttp_server, handler), seen


@pytest.mark.parametrize(("headers", "page"), [
    pytest.param({}, "application/json", id="a client"),
    pytest.param({"Sec-Fetch-Mode": "no-cors", "Sec-Fetch-Dest": "image"}, "application/json", id="a browser's fetch"),
])
async def test_a_favicon_without_identity_is_404_not_400(sandbox, start_gateway, headers, page):
    """Beside a path URL a browser asks the origin for /favicon.ico with no identity and no token."""
    endpoint, seen = sandbox
    gw = await start_gateway(CachingFakeResolver(endpoint))
    async with aiohttp.ClientSession() as http:
        async with http.get(f"{gw.url}/favicon.ico", headers=headers) as response:
            assert response.status == 404 and response.content_type == page
            assert (await response.json())["error"]["code"] == "not_found"
        async with http.get(f"{gw.url}/favicon.ico", headers=identity_headers()) as response:
            assert response.status == 200  # with an identity it is the sandbox's own
    assert seen == ["/favicon.ico"]



async def test_request_trailers_reach_the_sandbox_after_the_body_never_in_its_head(start_gateway):
    """A chunked request's trailer fields go on with its last chunk (what the sandbox's connection
    carries, HTTP/1.1 chunked); identity, credentials and framing in a trailer are dropped."""
    received = asyncio.get_running_loop().create_future()

    async def raw_sandbox(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        data = b""
        while not data.endswith(b"\r\n\r\n") or b"\r\n0\r\n" not in data:
            data += await reader.read(65536)
        received.set_result(data)
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nConnection: close\r\n\r\nok")
        await writer.drain()
        writer.close()
        await writer.wait_closed()

    server = await asyncio.start_server(raw_sandbox, "127.0.0.1", 0)
    from gateway.model import Endpoint

    gw = await start_gateway(CachingFakeResolver(Endpoint("127.0.0.1", server.sockets[0].getsockname()[1])))
    reader, writer = await asyncio.open_connection("127.0.0.1", gw.port)
    head = "".join(f"{k}: {v}\r\n" for k, v in identity_headers().items())
    writer.write(f"POST /x HTTP/1.1\r\nHost: gw\r\nTransfer-Encoding: chunked\r\nTrailer: X-Checksum\r\n{head}\r\n"
                 "5\r\nhello\r\n0\r\nX-Checksum: abc\r\nX-User-Id: mallory\r\nAuthorization: Bearer t\r\n"
                 "X-Sandbox-Id: ses-other\r\n\r\n".encode())
    done, _ = await asyncio.wait([received], timeout=10)
    assert done, await asyncio.wait_for(reader.read(65536), 5)
    data = received.result()
    assert (await asyncio.wait_for(reader.readuntil(b"ok"), 10)).startswith(b"HTTP/1.1 200 ")
    writer.close()
    await writer.wait_closed()
    server.close()
    await server.wait_closed()
    head_out, _, body_out = data.partition(b"\r\n\r\n")
    assert b"\r\nx-checksum:" not in head_out.lower() and b"mallory" not in data and b"Bearer" not in data
    assert b"ses-other" not in data
    assert body_out == b"5\r\nhello\r\n0\r\nX-Checksum: abc\r\n\r\n"
