"""The serving helpers inside their frameworks: a Starlette app (FastAPI's responses are
Starlette's), an aiohttp app, both driven in process, and the httpx helper against them and
against streams cut short."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

import inferwire.codecs as ic
import inferwire.serving as iws
from inferwire.serving import aiohttp as iws_aiohttp
from inferwire.serving import httpx as iws_httpx
from inferwire.serving import starlette as iws_starlette

CODECS = ["orjson", "msgspec-json", "msgspec-msgpack", "protobuf", "flatbuffers", "delta"]
OFFERS = ("orjson", "msgspec-msgpack", "protobuf", "flatbuffers", "delta")
BODY = b'{"messages": [{"role": "user", "content": "hi"}], "stream": true}'


async def _chunks(request: iws.ChatCompletionRequest) -> AsyncIterator[ic.TokenChunk]:
    builder = iws.ChunkBuilder("m", include_usage=request.include_usage, prompt_tokens=2)
    for i in range(5):
        await asyncio.sleep(0)
        yield builder.chunk(f"t{i} ", [i])
    yield builder.finish("end", [9])


def _starlette_app() -> Starlette:
    async def chat(request: Request) -> Response:
        chat = iws.ChatCompletionRequest.parse(await request.body())
        codec = iws_starlette.negotiated(request, OFFERS)
        return iws_starlette.stream_response(_chunks(chat), codec)

    app = Starlette(routes=[Route("/v1/chat/completions", chat, methods=["POST"])])
    iws_starlette.install(app)
    return app


def _aiohttp_app() -> web.Application:
    async def chat(request: web.Request) -> web.StreamResponse:
        chat = iws.ChatCompletionRequest.parse(await request.read())
        codec = iws_aiohttp.negotiated(request, OFFERS)
        return await iws_aiohttp.stream_response(request, _chunks(chat), codec)

    app = web.Application(middlewares=[iws_aiohttp.error_middleware])
    app.router.add_post("/v1/chat/completions", chat)
    return app


async def _with_starlette(work: Any) -> Any:
    transport = httpx.ASGITransport(app=_starlette_app())
    async with httpx.AsyncClient(transport=transport, base_url="http://test") as client:
        return await work(client)


async def _with_aiohttp(work: Any) -> Any:
    server = TestServer(_aiohttp_app(), host="127.0.0.1")
    async with TestClient(server) as test_client:
        base = str(test_client.make_url("/"))
        async with httpx.AsyncClient(base_url=base) as client:
            return await work(client)


APPS = [pytest.param(_with_starlette, id="starlette"), pytest.param(_with_aiohttp, id="aiohttp")]


async def _stream(
    client: httpx.AsyncClient, accept: str | None, body: bytes = BODY
) -> tuple[str, list[ic.TokenChunk]]:
    headers = {"content-type": "application/json"}
    if accept is not None:
        headers["accept"] = accept
    async with client.stream("POST", "/v1/chat/completions", content=body, headers=headers) as r:
        return r.headers["content-type"], [c async for c in iws_httpx.aiter_chunks(r)]


@pytest.mark.parametrize("app", APPS)
@pytest.mark.parametrize("codec", CODECS)
def test_each_codec_streams_through_the_framework(app: Any, codec: str) -> None:
    accept = iws_httpx.accept(codec)
    content_type, chunks = asyncio.run(app(lambda client: _stream(client, accept)))
    chosen = iws.negotiate(accept, OFFERS)
    assert content_type.split(";")[0] == chosen.stream_media_type
    assert [c.text for c in chunks] == [f"t{i} " for i in range(5)] + ["end"]
    assert chunks[-1].finish_reason == "stop"
    if chosen.media_type != iws.JSON:
        assert [c.token_ids for c in chunks] == [(0,), (1,), (2,), (3,), (4,), (9,)]


@pytest.mark.parametrize("app", APPS)
def test_no_accept_is_openais_json_events(app: Any) -> None:
    body = BODY.replace(b"true}", b'true, "stream_options": {"include_usage": true}}')
    content_type, chunks = asyncio.run(app(lambda client: _stream(client, None, body)))
    assert content_type.startswith("text/event-stream")
    assert chunks[-1].usage == ic.Usage(prompt_tokens=2, completion_tokens=6)
    assert chunks[-1].text == ""


async def _post(client: httpx.AsyncClient, accept: str, body: bytes) -> httpx.Response:
    return await client.post(
        "/v1/chat/completions", content=body, headers={"accept": accept, "content-type": "x"}
    )


@pytest.mark.parametrize("app", APPS)
def test_an_unacceptable_accept_is_406_with_the_list(app: Any) -> None:
    response = asyncio.run(app(lambda client: _post(client, "image/png", BODY)))
    assert response.status_code == 406
    assert response.headers["content-type"].startswith("application/json")
    error = response.json()["error"]
    assert error["code"] == 406
    assert all(media in error["message"] for media in iws.offered(OFFERS))


@pytest.mark.parametrize("app", APPS)
def test_a_bad_request_is_400_naming_its_field(app: Any) -> None:
    body = b'{"messages": [{"role": "user"}], "n": 0}'
    response = asyncio.run(app(lambda client: _post(client, "*/*", body)))
    assert response.status_code == 400
    assert response.json()["error"] == {
        "message": "n must be at least 1",
        "type": "invalid_request_error",
        "param": "n",
        "code": 400,
    }


@pytest.mark.parametrize("app", APPS)
def test_the_httpx_helper_raises_the_servers_error(app: Any) -> None:
    async def work(client: httpx.AsyncClient) -> Any:
        return await _stream(client, "*/*", b"{}")

    with pytest.raises(iws.ResponseError, match="messages is required") as raised:
        asyncio.run(app(work))
    assert raised.value.response_status == 400


# -- the httpx helper on streams that are not whole ------------------------------------------


def _wire(codec: str) -> bytes:
    async def collect() -> bytes:
        chat = iws.ChatCompletionRequest.parse(BODY)
        return b"".join([p async for p in iws.stream_body(_chunks(chat), ic.get(codec))])

    return asyncio.run(collect())


def _mock(content: bytes, content_type: str, status: int = 200) -> httpx.Client:
    def handler(request: httpx.Request) -> httpx.Response:
        return httpx.Response(status, content=content, headers={"content-type": content_type})

    return httpx.Client(transport=httpx.MockTransport(handler), base_url="http://test")


@pytest.mark.parametrize("codec", CODECS)
def test_a_truncated_stream_is_an_incomplete_stream_error(codec: str) -> None:
    wire = _wire(codec)
    media = ic.get(codec).stream_media_type
    with _mock(wire, media) as client, client.stream("POST", "/") as response:
        assert len(list(iws_httpx.iter_chunks(response, codec))) == 6
    with (
        _mock(wire[: len(wire) - 3], media) as client,
        client.stream("POST", "/") as response,
        pytest.raises(ic.IncompleteStreamError),
    ):
        list(iws_httpx.iter_chunks(response, codec))


def test_a_corrupt_stream_is_a_decode_error() -> None:
    wire = _wire("protobuf")
    corrupt = wire[:5] + b"\xff" * 20 + wire[25:]
    with (
        _mock(corrupt, "application/vnd.inferwire.frames+protobuf") as client,
        client.stream("POST", "/") as response,
        pytest.raises(ic.DecodeError),
    ):
        list(iws_httpx.iter_chunks(response))


def test_a_connection_closed_mid_stream_is_incomplete() -> None:
    class Cut(httpx.SyncByteStream):
        def __iter__(self) -> Any:
            yield _wire("delta")[:40]
            raise httpx.RemoteProtocolError("peer closed connection")

    def handler(request: httpx.Request) -> httpx.Response:
        return httpx.Response(
            200, stream=Cut(), headers={"content-type": "application/vnd.inferwire.delta"}
        )

    with (
        httpx.Client(transport=httpx.MockTransport(handler)) as client,
        client.stream("POST", "http://test/") as response,
        pytest.raises(ic.IncompleteStreamError, match="peer closed"),
    ):
        list(iws_httpx.iter_chunks(response))


@pytest.mark.parametrize(
    ("content", "content_type", "status"),
    [
        (b'{"id": "x"}', "application/json", 200),
        (b"<html>", "text/html", 200),
        (b'{"error": {"message": "nope", "code": 503}}', "application/json", 503),
    ],
)
def test_an_answer_that_is_not_a_stream_is_a_response_error(
    content: bytes, content_type: str, status: int
) -> None:
    with (
        _mock(content, content_type, status) as client,
        client.stream("POST", "/") as response,
        pytest.raises(iws.ResponseError),
    ):
        list(iws_httpx.iter_chunks(response))


def test_accept_lists_codecs_in_order() -> None:
    assert iws_httpx.accept("delta") == "application/vnd.inferwire.delta"
    assert iws_httpx.accept("delta", "protobuf", "orjson", "json") == (
        "application/vnd.inferwire.delta, application/vnd.inferwire.frames+protobuf;q=0.9, "
        "text/event-stream;q=0.8"
    )
