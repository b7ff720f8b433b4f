"""Transports under faults, on real loopback sockets.

Three properties, checked on every transport where they apply:

* a malformed or oversized request gets a clear error answer (an HTTP status with an
  ``{"error": {...}}`` body, a gRPC status, a tcp error frame) and the server keeps serving;
* a stream that stops early (the server killed, stopped or lying, the deadline passed) is an
  error on the client, a :class:`TransportError`, never a short stream ending normally;
* a client that leaves mid-stream (breaks out, cancels, closes) frees the server's work:
  ``active_streams`` returns to 0 and no task of the server is left behind.

Each test runs its own event loop with ``asyncio.run`` and bounds every wait generously (a busy
2-core machine): a bound that fires is a hang, and fails the test. Servers run in this process,
except where the test kills one (a child process, ``inferwire serve``); the misbehaving peers of
the truncation tests are fakes written here.
"""

from __future__ import annotations

import asyncio
import contextlib
import struct
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable
from pathlib import Path
from typing import Any

import grpc
import grpc.aio
import h2.config
import h2.connection
import h2.errors
import h2.events
import httpx
import orjson
import pytest

import inferwire.codecs as ic
import inferwire.transports as it
from inferwire.schemas import inferwire_pb2 as pb
from tests.helpers.faults import (
    MESSAGES,
    Handler,
    Running,
    assert_serves,
    exchange,
    expected_chunks,
    fake_server,
    http1_request,
    infer_request,
    parse_http1_response,
    read_http1_request,
    server_process,
    serving,
    task_census,
    wait_until,
)

HTTP = ("http1", "http2")
GRPC_SERVICE = "/inferwire.v1.Inference"
BOUND_S = 30.0
"""Outer bound on anything that should take well under a second."""
FREED_S = 6.0
"""How long a server may take to notice a departed client. Streams in the departure tests
last over 10 s, so one that merely ran to its end cannot pass for one that was freed."""
DECODE_S = 0.005
LONG = "stream-2048"
LONG_TOTAL = len(expected_chunks(LONG))


async def collect(
    chunks: AsyncIterator[ic.TokenChunk], *, bound_s: float = BOUND_S
) -> tuple[list[ic.TokenChunk], BaseException | None]:
    """Every chunk ``chunks`` yields, and what the stream ended with: None when it ended
    normally, else the transport error (or a stray ``CancelledError`` that a transport let
    out: not ours to raise, the caller's task was not cancelled)."""
    received: list[ic.TokenChunk] = []
    try:
        async with asyncio.timeout(bound_s):
            async for chunk in chunks:
                received.append(chunk)  # noqa: PERF401 (what came before an error counts)
    except it.TransportError as exc:
        return received, exc
    except asyncio.CancelledError as exc:
        task = asyncio.current_task()
        if task is not None and task.cancelling():
            raise
        return received, exc
    except TimeoutError as exc:
        raise AssertionError(
            f"the stream neither ended nor failed within {bound_s} s ({len(received)} chunks)"
        ) from exc
    return received, None


async def outcome(call: Awaitable[object], *, bound_s: float = BOUND_S) -> object:
    """What ``call`` returned or raised (a transport error or a stray cancellation); a call
    that does neither within ``bound_s`` is a hang and fails the test."""
    try:
        async with asyncio.timeout(bound_s):
            return await call
    except (it.TransportError, asyncio.CancelledError) as exc:
        task = asyncio.current_task()
        if isinstance(exc, asyncio.CancelledError) and task is not None and task.cancelling():
            raise
        return exc
    except TimeoutError as exc:
        raise AssertionError(f"no answer within {bound_s} s: the client hangs") from exc


def open_stream(
    client: it.Client, request: it.GenerateRequest
) -> AsyncGenerator[ic.TokenChunk, None]:
    """``client.generate(request)``, which every transport makes an async generator: one that
    can be closed early (``aclose``), and so cancel its stream."""
    chunks = client.generate(request)
    assert isinstance(chunks, AsyncGenerator)
    return chunks


def assert_error_body(status: int, content_type: str, body: bytes, expected: int) -> None:
    assert status == expected, body
    assert content_type.split(";")[0].strip() == "application/json"
    error = orjson.loads(body)["error"]
    assert isinstance(error["message"], str)
    assert error["message"]
    assert error["code"] == expected


def assert_kserve_error_body(status: int, content_type: str, body: bytes, expected: int) -> None:
    """The Open Inference Protocol's error object: ``{"error": $string}``."""
    assert status == expected, body
    assert content_type.split(";")[0].strip() == "application/json"
    error = orjson.loads(body)["error"]
    assert isinstance(error, str)
    assert error


# -- 1. malformed requests ----------------------------------------------------------------

_INFER_JSON = ic.get("orjson", extensions=True).encode(infer_request())
_CHAT = "/v1/chat/completions"
_COMPLETIONS = "/v1/completions"
_INFER = "/v2/models/x/infer"
_JSON = "application/json"


def _chat(**fields: object) -> bytes:
    """A chat completion request body: valid but for ``fields``."""
    return orjson.dumps({"messages": MESSAGES, **fields})


HTTP_MALFORMED = [
    pytest.param("POST", _CHAT, _JSON, b"{not json", 400, id="invalid-json"),
    pytest.param("POST", _CHAT, _JSON, b"[1, 2]", 400, id="json-not-an-object"),
    pytest.param(
        "POST", _CHAT, _JSON, _chat(workload="no-such", stream=True), 400, id="unknown-workload"
    ),
    pytest.param("POST", _CHAT, _JSON, _chat(max_tokens=-1), 400, id="negative-max-tokens"),
    pytest.param("POST", _CHAT, _JSON, _chat(seed="one"), 400, id="seed-not-an-integer"),
    pytest.param("POST", _CHAT, _JSON, b'{"stream": true}', 400, id="no-messages"),
    pytest.param("POST", _CHAT, _JSON, _chat(messages=[{"content": "x"}]), 400, id="no-role"),
    pytest.param("POST", _CHAT, _JSON, _chat(model="no-such"), 404, id="unknown-model"),
    pytest.param("POST", _CHAT, _JSON, _chat(n=2), 400, id="more-than-one-choice"),
    pytest.param("POST", _CHAT, _JSON, _chat(stream="yes"), 400, id="stream-not-a-bool"),
    pytest.param(
        "POST",
        _CHAT,
        _JSON,
        _chat(stream_options={"include_usage": True}),
        400,
        id="stream-options-without-stream",
    ),
    pytest.param(
        "POST", _CHAT, _JSON, _chat(inferwire={"extension": True}), 400, id="unknown-extension"
    ),
    pytest.param("POST", _COMPLETIONS, _JSON, b"{}", 400, id="completion-without-prompt"),
    pytest.param("POST", _COMPLETIONS, _JSON, b'{"prompt": ["a", "b"]}', 400, id="two-prompts"),
    pytest.param("POST", _CHAT, "text/plain", b"{}", 415, id="chat-wrong-content-type"),
    pytest.param("GET", _CHAT, None, b"", 405, id="chat-by-get"),
    pytest.param("POST", "/v1/models", _JSON, b"{}", 405, id="models-by-post"),
    pytest.param("GET", "/v1/models/no-such", None, b"", 404, id="unknown-model-retrieved"),
    pytest.param("GET", "/v1/embeddings", None, b"", 404, id="unknown-openai-route"),
    pytest.param("POST", _INFER, "text/plain", _INFER_JSON, 415, id="infer-wrong-content-type"),
    pytest.param("POST", _INFER, None, b"\x00\xff garbage", 400, id="infer-no-content-type"),
    pytest.param("POST", _INFER, "application/vnd.msgpack", b"\x80", 415, id="infer-foreign-codec"),
    pytest.param("POST", _INFER, _JSON, b"\x00\xff garbage", 400, id="infer-garbage"),
    pytest.param("POST", _INFER, _JSON, b'{"model": "x"}', 400, id="infer-incomplete"),
    pytest.param("POST", "/v2/models/y/infer", _JSON, _INFER_JSON, 400, id="infer-other-model"),
    pytest.param("POST", "/no/such/route", _JSON, b"{}", 404, id="unknown-route"),
    pytest.param("GET", "/v2/no/such/route", None, b"", 404, id="unknown-v2-route"),
    pytest.param("GET", "/v2/models/x/versions/2", None, b"", 404, id="unknown-model-version"),
    pytest.param("GET", _INFER, None, b"", 405, id="infer-by-get"),
]


async def _http_answer(
    transport: str, srv: Running, method: str, path: str, content_type: str | None, body: bytes
) -> tuple[int, str, bytes]:
    if transport == "http1":
        raw = http1_request(method, path, content_type, body)
        status, headers, payload = parse_http1_response(await exchange(srv.host, srv.port, raw))
        return status, headers.get("content-type", ""), payload
    # prior-knowledge h2c from an independent client
    headers = {} if content_type is None else {"content-type": content_type}
    async with httpx.AsyncClient(http1=False, http2=True, timeout=BOUND_S) as client:
        response = await client.request(
            method, f"http://{srv.address}{path}", content=body, headers=headers
        )
    assert response.http_version == "HTTP/2"
    return response.status_code, response.headers.get("content-type", ""), response.content


@pytest.mark.parametrize("transport", HTTP)
@pytest.mark.parametrize(("method", "path", "content_type", "body", "status"), HTTP_MALFORMED)
def test_http_malformed_request_is_answered_and_server_keeps_serving(
    transport: str, method: str, path: str, content_type: str | None, body: bytes, status: int
) -> None:
    async def run() -> None:
        async with serving(transport) as srv:
            answer = await _http_answer(transport, srv, method, path, content_type, body)
            check = assert_kserve_error_body if path.startswith("/v2") else assert_error_body
            check(*answer, expected=status)
            assert srv.service.streams_started == 0
            await assert_serves(transport, srv.address)

    asyncio.run(run())


HTTP1_UNPARSABLE = [
    pytest.param(b"HELLO WORLD\r\n\r\n", 400, id="not-http"),
    # RFC 9112, 6.3: both framings at once "ought to be handled as an error" (a smuggling
    # attempt): 400. 501 is for a transfer coding the server does not know (6.1).
    pytest.param(
        b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\ncontent-length: 2\r\n"
        b"transfer-encoding: chunked\r\n\r\n2\r\n{}\r\n0\r\n\r\n",
        400,
        id="length-and-chunked",
    ),
    pytest.param(
        b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\ntransfer-encoding: gzip\r\n\r\n",
        501,
        id="unknown-transfer-coding",
    ),
    pytest.param(
        b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\ncontent-length: x\r\n\r\n{}",
        400,
        id="bad-content-length",
    ),
    pytest.param(
        b"GET /v2/health/ready HTTP/1.1\r\nhost: x\r\nx-padding: " + b"a" * 20_000 + b"\r\n\r\n",
        431,
        id="headers-too-large",
    ),
]


@pytest.mark.parametrize(("raw", "status"), HTTP1_UNPARSABLE)
def test_http1_unparsable_request_is_answered_and_closed(raw: bytes, status: int) -> None:
    async def run() -> None:
        async with serving("http1") as srv:
            answer, headers, body = parse_http1_response(await exchange(srv.host, srv.port, raw))
            assert_error_body(answer, headers["content-type"], body, status)
            assert headers.get("connection") == "close"
            await assert_serves("http1", srv.address)

    asyncio.run(run())


def test_http1_bad_request_keeps_the_connection_for_the_next() -> None:
    """An error the application answers (not the parser) leaves the connection usable: a bad
    request and a good one pipelined on one connection get two answers."""

    async def run() -> None:
        async with serving("http1") as srv:
            bad = http1_request("POST", _CHAT, _JSON, b"{not json", close=False)
            good = http1_request("POST", _INFER, _JSON, _INFER_JSON)
            data = await exchange(srv.host, srv.port, bad + good)
            status, headers, body = parse_http1_response(data)
            assert_error_body(status, headers["content-type"], body, 400)
            rest = data.split(b"\r\n\r\n", 1)[1][len(body) :]
            status, _, body = parse_http1_response(rest)
            assert status == 200
            response = ic.get("orjson", extensions=True).decode(body, ic.InferResponse)
            assert response.outputs[0].data.tolist() == infer_request().inputs[0].data.tolist()

    asyncio.run(run())


_GARBAGE = b"\xff\xff\xff\xff\xff garbage"
GRPC_MALFORMED = [
    pytest.param("Infer", _GARBAGE, id="infer-garbage"),
    pytest.param("Generate", _GARBAGE, id="generate-garbage"),
    pytest.param(
        "Generate",
        pb.GenerateRequest(workload="no-such").SerializeToString(),
        id="generate-unknown-workload",
    ),
    pytest.param(
        "Generate", pb.GenerateRequest(workload="").SerializeToString(), id="generate-no-workload"
    ),
]


@pytest.mark.parametrize("codec", ["orjson", "protobuf"])
@pytest.mark.parametrize(("method", "payload"), GRPC_MALFORMED)
def test_grpc_malformed_request_is_invalid_argument(
    codec: str, method: str, payload: bytes
) -> None:
    async def run() -> None:
        async with serving("grpc", codec) as srv:
            async with grpc.aio.insecure_channel(srv.address) as channel:
                with pytest.raises(grpc.aio.AioRpcError) as info:
                    await asyncio.wait_for(_raw_grpc_call(channel, method, payload), BOUND_S)
                assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
                assert info.value.details()
            assert srv.service.streams_started == 0
            await assert_serves("grpc", srv.address, codec)

    asyncio.run(run())


async def _raw_grpc_call(channel: grpc.aio.Channel, method: str, payload: bytes) -> None:
    """Call ``method`` with ``payload`` as its bytes, bypassing every serializer."""
    path = f"{GRPC_SERVICE}/{method}"
    if method == "Infer":
        await channel.unary_unary(path)(payload)
    else:
        async for _ in channel.unary_stream(path)(payload):
            pass


def _tcp_frame(op: bytes, body: bytes) -> bytes:
    return op + struct.pack(">I", len(body)) + body


TCP_MALFORMED = [
    pytest.param(_tcp_frame(b"Z", b"{}"), True, id="unknown-op"),
    pytest.param(_tcp_frame(b"G", b"{nope"), False, id="generate-bad-json"),
    pytest.param(_tcp_frame(b"G", b'"a string"'), False, id="generate-not-an-object"),
    pytest.param(_tcp_frame(b"G", b'{"workload": "no-such"}'), False, id="generate-unknown"),
    pytest.param(_tcp_frame(b"I", _GARBAGE), False, id="infer-garbage"),
]


@pytest.mark.parametrize(("frame", "closes"), TCP_MALFORMED)
def test_tcp_malformed_request_is_an_error_frame(frame: bytes, closes: bool) -> None:
    """The answer is an error frame with a JSON body; a request the server could frame leaves
    the connection usable for the next one, an unknown operation ends it."""

    async def run() -> None:
        async with serving("tcp") as srv:
            reader, writer = await asyncio.open_connection(srv.host, srv.port)
            try:
                async with asyncio.timeout(BOUND_S):
                    writer.write(frame)
                    await writer.drain()
                    status, length = struct.unpack(">cI", await reader.readexactly(5))
                    assert status == b"\x01"
                    error = orjson.loads(await reader.readexactly(length))["error"]
                    assert error["code"] == 400
                    assert error["message"]
                    if closes:
                        assert await reader.read() == b""
                    else:
                        await _tcp_generate_on(reader, writer)
            finally:
                writer.close()
                with contextlib.suppress(OSError):
                    await writer.wait_closed()
            await assert_serves("tcp", srv.address)

    asyncio.run(run())


async def _tcp_generate_on(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    """A whole stream-16 generate on an already open tcp connection."""
    writer.write(_tcp_frame(b"G", b'{"workload": "stream-16"}'))
    await writer.drain()
    assert await reader.readexactly(1) == b"\x00"
    decoder = ic.get("orjson", extensions=True).stream_decoder()
    received: list[ic.TokenChunk] = []
    while not decoder.finished:
        data = await reader.read(65536)
        assert data, "the connection closed mid-stream"
        received += decoder.feed(data)
    assert received == expected_chunks("stream-16")


@pytest.mark.parametrize("transport", it.TRANSPORTS)
def test_garbage_connection_is_closed_and_server_keeps_serving(transport: str) -> None:
    """Bytes of no protocol at all (for tcp: an unknown op with a length over any limit): the
    server ends that connection, after an error answer where the protocol has one."""

    async def run() -> None:
        async with serving(transport) as srv:
            answer = await exchange(srv.host, srv.port, b"Z\xff\xff\xff\xff garbage\r\n\r\n")
            if transport == "http1":
                status, headers, body = parse_http1_response(answer)
                assert_error_body(status, headers["content-type"], body, 400)
            elif transport == "tcp":
                assert answer[:1] == b"\x01"
                assert orjson.loads(answer[5:])["error"]["code"] == 413
            await assert_serves(transport, srv.address)

    asyncio.run(run())


REMOTE_STATUS: dict[str, int | str] = {
    "tcp": 400,
    "http1": 400,
    "http2": 400,
    "grpc": "INVALID_ARGUMENT",
}


@pytest.mark.parametrize("transport", it.TRANSPORTS)
def test_bad_request_is_remote_error_and_the_client_goes_on(transport: str) -> None:
    async def run() -> None:
        async with serving(transport) as srv, it.connect(transport, srv.address) as client:
            for request in (
                it.GenerateRequest(workload="no-such-workload"),
                it.GenerateRequest(workload="embed-1x384"),  # not a token stream
            ):
                received, error = await collect(client.generate(request))
                assert received == []
                assert isinstance(error, it.RemoteError), error
                assert error.status == REMOTE_STATUS[transport]
                assert error.detail
            chunks, error = await collect(client.generate(it.GenerateRequest(workload="stream-16")))
            assert error is None
            assert chunks == expected_chunks("stream-16")

    asyncio.run(run())


# -- 2. a server killed mid-stream ---------------------------------------------------------

KILL_AFTER = 5


@pytest.mark.parametrize("transport", it.TRANSPORTS)
def test_server_killed_mid_stream_is_an_error(
    transport: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    args = ["--decode-ms", str(DECODE_S * 1000)]
    with server_process(transport, "orjson", args, tmp_path / "server.log") as child:

        async def run() -> tuple[int, it.TransportError | None]:
            received = 0
            # the client's own read timeout is longer than the bound: only the lost connection
            # may end the stream
            limits = it.Limits(timeout_s=120.0)
            async with it.connect(transport, child.address, limits=limits) as client:
                try:
                    async with asyncio.timeout(20.0):
                        async for _ in client.generate(it.GenerateRequest(workload=LONG)):
                            received += 1
                            if received == KILL_AFTER:
                                child.kill()
                except it.TransportError as exc:
                    return received, exc
            return received, None

        received, error = asyncio.run(run())
    request.node.user_properties += [("chunks_received", received), ("error", repr(error))]
    assert error is not None, f"the stream ended normally after {received} of {LONG_TOTAL}"
    assert KILL_AFTER <= received < LONG_TOTAL
    if transport != "grpc":
        assert isinstance(error, it.StreamTruncatedError), repr(error)
    if isinstance(error, it.StreamTruncatedError):
        assert error.chunks_received == received


@pytest.mark.parametrize("transport", it.TRANSPORTS)
def test_server_stopping_mid_stream_is_an_error(transport: str) -> None:
    async def run() -> None:
        async with serving(transport, decode_s=DECODE_S) as srv:
            async with it.connect(transport, srv.address) as client:
                chunks = client.generate(it.GenerateRequest(workload=LONG))
                first = [await anext(chunks) for _ in range(3)]
                stopping = asyncio.create_task(srv.server.stop())
                rest, error = await collect(chunks)
                await asyncio.wait_for(stopping, BOUND_S)
            received = len(first) + len(rest)
            assert isinstance(error, it.TransportError), f"{error!r} after {received} chunks"
            assert received < LONG_TOTAL
            assert srv.service.active_streams == 0

    asyncio.run(run())


# -- 3. a client that leaves mid-stream ----------------------------------------------------

DEPARTURES = ("break", "aclose", "cancel-task", "close-client")


async def _leave_mid_stream(
    mode: str, client: it.Client
) -> AsyncGenerator[ic.TokenChunk, None] | None:
    """Start a long stream, take three chunks, leave as ``mode`` says. Returns the iterator
    when it is still held open (``close-client``: only closing the client may end it)."""
    request = it.GenerateRequest(workload=LONG)
    if mode == "break":
        received = 0
        async for _ in client.generate(request):
            received += 1
            if received == 3:
                break
        return None
    if mode == "aclose":
        async with contextlib.aclosing(open_stream(client, request)) as chunks:
            for _ in range(3):
                await anext(chunks)
        return None
    if mode == "cancel-task":
        three = asyncio.Event()

        async def consume() -> None:
            received = 0
            async for _ in client.generate(request):
                received += 1
                if received == 3:
                    three.set()

        task = asyncio.create_task(consume())
        await asyncio.wait_for(three.wait(), BOUND_S)
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        assert task.cancelled()
        return None
    assert mode == "close-client"
    chunks = open_stream(client, request)
    for _ in range(3):
        await anext(chunks)
    await client.close()
    return chunks


@pytest.mark.parametrize("mode", DEPARTURES)
@pytest.mark.parametrize("transport", it.TRANSPORTS)
def test_client_leaving_mid_stream_frees_the_server(transport: str, mode: str) -> None:
    async def run() -> None:
        async with serving(transport, decode_s=DECODE_S) as srv:
            baseline = task_census()
            client = it.connect(transport, srv.address)
            try:
                held = await _leave_mid_stream(mode, client)
                freed = await wait_until(lambda: srv.service.active_streams == 0, timeout_s=FREED_S)
                assert freed, f"a stream still runs {FREED_S} s after the client left ({mode})"
                if held is not None:  # what is left of the stream is an error, not an end
                    rest, error = await collect(held)
                    await held.aclose()
                    assert isinstance(error, it.TransportError), (
                        f"after close() the held stream gave {len(rest)} more chunks and ended "
                        f"with {error!r}, not a TransportError"
                    )
                else:  # the client itself is still good for the next request
                    chunks, error = await collect(
                        client.generate(it.GenerateRequest(workload="stream-16"))
                    )
                    assert error is None
                    assert chunks == expected_chunks("stream-16")
            finally:
                await client.close()
            assert srv.service.streams_started == (1 if held is not None else 2)
            await assert_serves(transport, srv.address)
            settled = await wait_until(lambda: task_census() <= baseline, timeout_s=10.0)
            assert settled, f"tasks left behind: {task_census() - baseline}"

    asyncio.run(run())


# -- 4. oversized messages -----------------------------------------------------------------

SMALL_LIMITS = it.Limits(max_message_bytes=64 * 1024)
BIG_TENSOR_BYTES = 1 << 20


@pytest.mark.parametrize("transport", it.TRANSPORTS)
def test_oversized_request_is_refused_and_server_keeps_serving(transport: str) -> None:
    async def run() -> None:
        async with serving(transport, limits=SMALL_LIMITS) as srv:
            async with it.connect(transport, srv.address) as client:
                error = await outcome(client.infer(infer_request(BIG_TENSOR_BYTES)), bound_s=15.0)
                if transport in HTTP:
                    assert isinstance(error, it.RemoteError), repr(error)
                    assert error.status == 413
                elif transport == "grpc":
                    assert isinstance(error, it.MessageTooLargeError | it.RemoteError), repr(error)
                    if isinstance(error, it.RemoteError):
                        assert error.status == "RESOURCE_EXHAUSTED"
                else:
                    assert isinstance(error, it.RemoteError), repr(error)
                    assert "limit" in error.detail
                    assert error.status == 413  # the error body's code, not a blanket 400
                small = infer_request()
                async with asyncio.timeout(BOUND_S):
                    response = await client.infer(small)
                assert response.outputs[0].data.tolist() == small.inputs[0].data.tolist()
            await assert_serves(transport, srv.address)

    asyncio.run(run())


def test_tcp_oversized_length_is_refused_before_the_body() -> None:
    """The length prefix alone is enough to refuse: the server answers 413 without waiting
    for a body it will never read."""

    async def run() -> None:
        async with serving("tcp", limits=SMALL_LIMITS) as srv:
            head = b"I" + struct.pack(">I", 1 << 30)
            data = await exchange(srv.host, srv.port, head)
            status, length = struct.unpack(">cI", data[:5])
            assert status == b"\x01"
            assert orjson.loads(data[5 : 5 + length])["error"]["code"] == 413

    asyncio.run(run())


@pytest.mark.parametrize("transport", it.TRANSPORTS)
def test_client_limit_refuses_to_send_without_contacting_the_server(transport: str) -> None:
    async def silent(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.read()

    async def run() -> None:
        async with fake_server(silent) as fake:
            async with it.connect(transport, fake.address, limits=SMALL_LIMITS) as client:
                error = await outcome(client.infer(infer_request(BIG_TENSOR_BYTES)), bound_s=10.0)
            await asyncio.sleep(0.2)  # a connection the client did open would be accepted by now
            assert isinstance(error, it.MessageTooLargeError), repr(error)
            assert fake.connections == 0

    asyncio.run(run())


# -- 5. HTTP/2 multiplexing ----------------------------------------------------------------


def test_http2_many_concurrent_streams_share_one_connection() -> None:
    streams = 50
    expected = expected_chunks("stream-256")

    async def run() -> None:
        async with serving("http2", decode_s=0.001) as srv:
            peak = 0

            async def sample() -> None:
                nonlocal peak
                while True:
                    peak = max(peak, srv.service.active_streams)
                    await asyncio.sleep(0.005)

            sampler = asyncio.create_task(sample())
            try:
                async with it.connect("http2", srv.address) as client:
                    request = it.GenerateRequest(workload="stream-256")
                    results = await asyncio.gather(
                        *(collect(client.generate(request), bound_s=60.0) for _ in range(streams))
                    )
                    connections = len(_h2_protocols(srv))
            finally:
                sampler.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await sampler
            for chunks, error in results:
                assert error is None, repr(error)
                assert chunks == expected
            assert connections == 1
            assert srv.service.streams_started == streams
            assert peak > 1, "the streams ran one after another"

    asyncio.run(run())


def _h2_protocols(srv: Running) -> set[Any]:
    protocols: set[Any] = getattr(srv.server, "protocols")  # noqa: B009 (Http2Server only)
    return protocols


def test_http2_slow_reader_stalls_only_its_own_stream() -> None:
    """A consumer that takes one chunk and then holds its stream open stops the server's
    sending for that stream alone (flow control): its window fills, and the other streams on
    the connection still complete. Closing it frees the server."""
    # the slow stream's SSE bytes (about 1.3 MB) pass the client's 1 MiB stream window
    slow_workload = "stream-2048-top5"

    async def run() -> None:
        async with serving("http2") as srv, it.connect("http2", srv.address) as client:
            slow = open_stream(client, it.GenerateRequest(workload=slow_workload))
            try:
                assert await anext(slow) == expected_chunks(slow_workload)[0]
                others = await asyncio.gather(
                    *(
                        collect(client.generate(it.GenerateRequest(workload="stream-256", seed=s)))
                        for s in range(10)
                    )
                )
                for seed, (chunks, error) in enumerate(others):
                    assert error is None
                    assert chunks == expected_chunks("stream-256", seed)
                # still held, not finished: the server waits for window, not for the reader
                assert srv.service.active_streams == 1
            finally:
                await slow.aclose()
            freed = await wait_until(lambda: srv.service.active_streams == 0, timeout_s=FREED_S)
            assert freed
            chunks, error = await collect(client.generate(it.GenerateRequest(workload="stream-16")))
            assert error is None
            assert chunks == expected_chunks("stream-16")
            assert len(_h2_protocols(srv)) == 1

    asyncio.run(run())


# -- 6. gRPC deadlines ---------------------------------------------------------------------


def test_grpc_deadline_before_the_first_token(request: pytest.FixtureRequest) -> None:
    async def run() -> None:
        async with serving("grpc", prefill_s=60.0) as srv:
            async with it.connect("grpc", srv.address, deadline_s=0.2) as client:
                received, error = await collect(
                    client.generate(it.GenerateRequest(workload="stream-16")), bound_s=20.0
                )
                assert received == []
                assert isinstance(error, it.TransportTimeoutError), repr(error)
            # whether the handler had begun by the deadline depends on the machine's load;
            # if it had, it must be gone
            request.node.user_properties.append(("handler_started", srv.service.streams_started))
            freed = await wait_until(lambda: srv.service.active_streams == 0, timeout_s=FREED_S)
            assert freed, "the handler still runs after the deadline"
            await assert_serves("grpc", srv.address, stream=False)  # prefill: unary only

    asyncio.run(run())


def test_grpc_deadline_mid_stream_is_an_error_not_a_short_stream() -> None:
    async def run() -> None:
        async with serving("grpc", decode_s=DECODE_S) as srv:
            async with it.connect("grpc", srv.address, deadline_s=2.0) as client:
                received, error = await collect(client.generate(it.GenerateRequest(workload=LONG)))
                assert isinstance(error, it.TransportTimeoutError), repr(error)
                assert 0 < len(received) < LONG_TOTAL
                assert received == expected_chunks(LONG)[: len(received)]
            freed = await wait_until(lambda: srv.service.active_streams == 0, timeout_s=FREED_S)
            assert freed, "the handler still runs after the deadline"
            await assert_serves("grpc", srv.address)

    asyncio.run(run())


# -- 7. truncated streams from lying peers -------------------------------------------------

CUTS = ("nothing", "after-3-chunks", "mid-frame", "before-end-marker", "torn-end-marker")
STREAM_CODECS = ("orjson", "protobuf", "delta")


def cut_stream(codec: str, cut: str) -> tuple[bytes, int]:
    """A stream-16 stream in ``codec`` cut as ``cut`` says, and how many whole chunks it has."""
    encoder = ic.get(codec, extensions=True).stream_encoder()
    frames = [encoder.encode(chunk) for chunk in expected_chunks("stream-16")]
    end = encoder.end()
    whole = b"".join(frames)
    if cut == "nothing":
        return b"", 0
    if cut == "after-3-chunks":
        return b"".join(frames[:3]), 3
    if cut == "mid-frame":
        return b"".join(frames[:3]) + frames[3][: len(frames[3]) // 2], 3
    if cut == "before-end-marker":
        return whole, len(frames)
    assert cut == "torn-end-marker"
    return whole + end[:-1], len(frames)


def _assert_truncated(
    received: list[ic.TokenChunk], error: BaseException | None, whole: int
) -> None:
    assert isinstance(error, it.StreamTruncatedError), f"{error!r} after {len(received)} chunks"
    assert len(received) == whole
    assert error.chunks_received == whole
    assert received == expected_chunks("stream-16")[:whole]


@pytest.mark.parametrize("cut", CUTS)
@pytest.mark.parametrize("codec", STREAM_CODECS)
def test_tcp_truncated_stream_is_never_complete(codec: str, cut: str) -> None:
    stream, whole = cut_stream(codec, cut)

    async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        (length,) = struct.unpack(">I", (await reader.readexactly(5))[1:])
        await reader.readexactly(length)
        writer.write(b"\x00" + stream)  # OK, then part of a stream; then the fake closes
        await writer.drain()

    async def run() -> None:
        async with fake_server(answer) as fake, it.connect("tcp", fake.address, codec=codec) as c:
            received, error = await collect(c.generate(it.GenerateRequest(workload="stream-16")))
            _assert_truncated(received, error, whole)

    asyncio.run(run())


def test_tcp_end_marker_counting_more_chunks_than_sent_is_an_error() -> None:
    """A length-prefixed stream's end marker counts its chunks: one that skipped a chunk but
    ended properly is still caught."""
    chunks = expected_chunks("stream-16")
    encoder = ic.get("protobuf", extensions=True).stream_encoder()
    frames = [encoder.encode(chunk) for chunk in chunks]
    stream = b"".join(frames[:3] + frames[4:]) + encoder.end()

    async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        (length,) = struct.unpack(">I", (await reader.readexactly(5))[1:])
        await reader.readexactly(length)
        writer.write(b"\x00" + stream)
        await writer.drain()
        await reader.read()

    async def run() -> None:
        async with (
            fake_server(answer) as fake,
            it.connect("tcp", fake.address, codec="protobuf") as client,
        ):
            request = it.GenerateRequest(workload="stream-16")
            received, error = await collect(client.generate(request))
        assert isinstance(error, it.ProtocolError), repr(error)
        assert len(received) < len(chunks)

    asyncio.run(run())


HTTP1_ENDINGS = ("chunked-terminated", "chunked-cut", "content-length-short", "until-close")


def _http1_response(codec: str, stream: bytes, ending: str) -> bytes:
    head = (
        f"HTTP/1.1 200 OK\r\ncontent-type: {ic.get(codec, extensions=True).stream_media_type}\r\n"
    )
    if ending.startswith("chunked"):
        body = b"".join(b"%x\r\n%b\r\n" % (len(b), b) for b in (stream[:100], stream[100:]) if b)
        if ending == "chunked-terminated":
            body += b"0\r\n\r\n"  # a proper end of the HTTP body, short of the stream's
        return (head + "transfer-encoding: chunked\r\n\r\n").encode() + body
    if ending == "content-length-short":
        return (head + f"content-length: {len(stream) + 500}\r\n\r\n").encode() + stream
    assert ending == "until-close"
    return (head + "connection: close\r\n\r\n").encode() + stream


@pytest.mark.parametrize("cut", ["after-3-chunks", "mid-frame", "torn-end-marker"])
@pytest.mark.parametrize("ending", HTTP1_ENDINGS)
@pytest.mark.parametrize("codec", ["orjson", "protobuf"])
def test_http1_truncated_stream_is_never_complete(codec: str, ending: str, cut: str) -> None:
    stream, whole = cut_stream(codec, cut)

    async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_http1_request(reader)
        writer.write(_http1_response(codec, stream, ending))
        await writer.drain()
        if ending == "chunked-terminated":
            await reader.read()  # the HTTP message is whole: the client decides, not EOF

    async def run() -> None:
        async with (
            fake_server(answer) as fake,
            it.connect("http1", fake.address, codec=codec) as client,
        ):
            request = it.GenerateRequest(workload="stream-16")
            received, error = await collect(client.generate(request))
        _assert_truncated(received, error, whole)

    asyncio.run(run())


H2_ENDINGS = ("end-stream", "closed", "goaway", "reset")


def _h2_fake(codec: str, stream: bytes, ending: str) -> Handler:
    async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        conn = h2.connection.H2Connection(
            h2.config.H2Configuration(client_side=False, header_encoding=None)
        )
        conn.initiate_connection()
        writer.write(conn.data_to_send())
        stream_id = None
        while stream_id is None:
            data = await reader.read(65536)
            if not data:
                return
            for event in conn.receive_data(data):
                if isinstance(event, h2.events.StreamEnded):
                    stream_id = event.stream_id
            writer.write(conn.data_to_send())
        media = ic.get(codec, extensions=True).stream_media_type
        conn.send_headers(stream_id, [(":status", "200"), ("content-type", media)])
        for start in range(0, len(stream), 4096):
            conn.send_data(stream_id, stream[start : start + 4096])
        if ending == "end-stream":
            conn.end_stream(stream_id)
        elif ending == "goaway":
            conn.close_connection(h2.errors.ErrorCodes.INTERNAL_ERROR)
        elif ending == "reset":
            conn.reset_stream(stream_id, h2.errors.ErrorCodes.INTERNAL_ERROR)
        writer.write(conn.data_to_send())
        await writer.drain()
        if ending != "closed":
            while await reader.read(65536):
                pass  # until the client closes

    return answer


@pytest.mark.parametrize("cut", ["after-3-chunks", "mid-frame", "torn-end-marker"])
@pytest.mark.parametrize("ending", H2_ENDINGS)
def test_http2_truncated_stream_is_never_complete(ending: str, cut: str) -> None:
    codec = "orjson"
    stream, whole = cut_stream(codec, cut)

    async def run() -> None:
        async with (
            fake_server(_h2_fake(codec, stream, ending)) as fake,
            it.connect("http2", fake.address, codec=codec) as client,
        ):
            request = it.GenerateRequest(workload="stream-16")
            received, error = await collect(client.generate(request))
        assert received == expected_chunks("stream-16")[:whole]
        if ending == "reset":
            assert isinstance(error, it.CancelledByPeerError), repr(error)
        else:
            _assert_truncated(received, error, whole)

    asyncio.run(run())


@pytest.mark.parametrize("cut", ["after-3-chunks", "before-end-marker"])
def test_grpc_stateful_stream_without_end_marker_is_truncated(cut: str) -> None:
    """A gRPC server that ends a ``delta`` stream with status OK but without the codec's end
    marker: the client must not take the OK for the stream's end."""
    encoder = ic.get("delta", extensions=True).stream_encoder()
    frames = [encoder.encode(chunk) for chunk in expected_chunks("stream-16")]
    sent = frames[:3] if cut == "after-3-chunks" else frames

    async def generate(request: bytes, context: grpc.aio.ServicerContext) -> AsyncIterator[bytes]:
        for frame in sent:
            yield frame

    async def run() -> None:
        server = grpc.aio.server()
        handlers = {"Generate": grpc.unary_stream_rpc_method_handler(generate)}
        server.add_generic_rpc_handlers(
            (grpc.method_handlers_generic_handler(GRPC_SERVICE.lstrip("/"), handlers),)
        )
        port = server.add_insecure_port("127.0.0.1:0")
        await server.start()
        try:
            async with it.connect("grpc", f"127.0.0.1:{port}", codec="delta") as client:
                request = it.GenerateRequest(workload="stream-16")
                received, error = await collect(client.generate(request))
        finally:
            await server.stop(grace=None)
        _assert_truncated(received, error, len(sent))

    asyncio.run(run())
