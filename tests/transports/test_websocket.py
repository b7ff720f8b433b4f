"""The ``websocket`` transport: our client and server, clients nobody here wrote (the
``websockets`` library's, aiohttp's), and peers that misbehave, on loopback sockets.

Servers run in the test's own event loop (``serving`` of ``tests/helpers/faults.py``), one per
test (starting one takes about a millisecond); a fake server made of websockets' Sans-I/O
protocol plays the misbehaving peer for the client's cases. Every wait is bounded generously
(``BOUND_S``): a bound that fires is a hang, never a slow machine's verdict.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable, Coroutine
from typing import Any, TypeVar

import aiohttp
import orjson
import pytest
import websockets
from websockets.asyncio.client import connect as ws_connect
from websockets.client import ClientProtocol
from websockets.frames import Close, Frame, Opcode
from websockets.server import ServerProtocol
from websockets.typing import Subprotocol
from websockets.uri import parse_uri

import inferwire.codecs as ic
import inferwire.transports as it
from inferwire._runtime import loops
from inferwire.codecs.integrity import StreamVerifier
from inferwire.transports.service import MAX_BATCH_CHUNKS
from inferwire.transports.websocket import WebSocketServer
from inferwire.transports.websocket_wire import data_frame
from inferwire.workloads import token_stream_source
from tests.conftest import LOOP_KINDS
from tests.helpers.faults import (
    MESSAGES,
    expected_chunks,
    infer_request,
    server_process,
    serving,
    wait_until,
)

BOUND_S = 30.0
T = TypeVar("T")
CHAT = "/v1/chat/completions"


def run(coro: Coroutine[Any, Any, T], loop: str = "asyncio") -> T:
    async def bounded() -> T:
        async with asyncio.timeout(BOUND_S):
            return await coro

    return loops.run(bounded(), loop)


def url(address: str, path: str = CHAT) -> str:
    return f"ws://{address}{path}"


def chat_body(workload: str = "stream-16", **extra: Any) -> bytes:
    return orjson.dumps({"model": None, "messages": MESSAGES, "workload": workload, **extra})


def _openai_request(workload: str = "stream-16", **extra: Any) -> bytes:
    obj = {"messages": MESSAGES, "workload": workload, **extra}
    return orjson.dumps(obj)


async def _our_stream(address: str, codec: str, workload: str = "stream-16") -> None:
    """Our client's whole stream, checked chunk by chunk as it arrives, and an infer echo."""
    expected = expected_chunks(workload)
    verifier = StreamVerifier(expected)
    async with it.connect("websocket", address, codec=codec) as client:
        chunks = []
        async for chunk in client.generate(it.GenerateRequest(workload=workload)):
            verifier.check(chunk)
            chunks.append(chunk)
        verifier.finish()
        assert chunks == expected
        if ic.InferRequest not in ic.get(codec).types:
            return  # a codec of token streams only (delta)
        request = infer_request()
        for _ in range(3):  # one connection, requests in turn
            response = await client.infer(request)
            assert response.outputs[0].data.tolist() == request.inputs[0].data.tolist()


# -- our client and server ------------------------------------------------------------------


@pytest.mark.parametrize("codec", ["orjson", "protobuf", "delta"])
def test_our_client_reads_whole_streams(codec: str) -> None:
    async def main() -> None:
        async with serving("websocket", codec) as server:
            await _our_stream(server.address, codec, "stream-256")

    run(main())


@pytest.mark.skipif(not loops.uvloop_installed(), reason="uvloop is not installed")
def test_on_uvloop() -> None:
    """The pair on the loop users deploy: its transports are not asyncio's."""

    async def main() -> None:
        assert loops.running() == "uvloop"
        async with serving("websocket", "delta") as server:
            await _our_stream(server.address, "delta", "stream-256")
            await _our_stream(server.address, "orjson")

    run(main(), "uvloop")


def test_the_http1_server_upgrades_to_the_same_routes() -> None:
    async def main() -> None:
        async with serving("http1", "delta") as server:
            await _our_stream(server.address, "delta")
            await _our_stream(server.address, "orjson")  # any codec, named by the subprotocol
            # and plain HTTP on the same server is unchanged
            async with it.connect("http1", server.address, codec="delta") as client:
                request = it.GenerateRequest(workload="stream-16")
                assert [c async for c in client.generate(request)] == expected_chunks("stream-16")

    run(main())


def test_inferwire_serve_runs_the_websocket_transport(tmp_path: Any) -> None:
    with server_process("websocket", "protobuf", ["--no-metrics"], tmp_path / "log") as child:
        run(_our_stream(child.address, "protobuf"))


def test_a_bad_request_is_an_error_object_then_1008() -> None:
    async def main() -> None:
        async with serving("websocket") as server:
            client = it.connect("websocket", server.address, codec="orjson")
            async with client:
                with pytest.raises(it.RemoteError) as raised:
                    async for _ in client.generate(it.GenerateRequest(workload="no-such")):
                        pass
                assert raised.value.status == 400
            async with ws_connect(url(server.address), proxy=None) as ws:
                await ws.send(orjson.dumps({"messages": MESSAGES, "model": "gpt-9"}).decode())
                error = orjson.loads(await ws.recv())
                assert error["error"]["code"] == 404
                assert error["error"]["param"] == "model"
                with pytest.raises(websockets.ConnectionClosedError) as closed:
                    await ws.recv()
                assert closed.value.rcvd is not None
                assert closed.value.rcvd.code == 1008
            await _our_stream(server.address, "orjson")

    run(main())


def test_an_unknown_codec_subprotocol_is_refused_in_the_handshake() -> None:
    async def main() -> None:
        async with serving("websocket") as server:
            with pytest.raises(websockets.InvalidStatus) as refused:
                async with ws_connect(
                    url(server.address), subprotocols=[Subprotocol("inferwire.nope")], proxy=None
                ):
                    pass
            assert refused.value.response.status_code == 400
            # an unknown route, before any upgrade
            with pytest.raises(websockets.InvalidStatus) as refused:
                async with ws_connect(url(server.address, "/nowhere"), proxy=None):
                    pass
            assert refused.value.response.status_code == 404

    run(main())


# -- clients nobody here wrote ----------------------------------------------------------------


def test_the_websockets_client_reads_openai_json_chunks() -> None:
    """No subprotocol: OpenAI's chunks as text, then ``[DONE]`` and a normal close."""

    async def main() -> None:
        async with (
            serving("websocket", "delta") as server,  # a binary server codec: JSON still
            ws_connect(url(server.address), proxy=None) as ws,
        ):
            assert ws.subprotocol is None
            await ws.send(_openai_request(stream_options={"include_usage": True}).decode())
            messages = [message async for message in _until_done(ws)]
            with pytest.raises(websockets.ConnectionClosedOK):
                await ws.recv()
            assert ws.close_code == 1000
        chunks = [orjson.loads(m) for m in messages]
        assert {c["object"] for c in chunks} == {"chat.completion.chunk"}
        assert len({c["id"] for c in chunks}) == 1
        text = "".join(c["choices"][0]["delta"].get("content", "") for c in chunks if c["choices"])
        assert text == "".join(c.text for c in expected_chunks("stream-16"))
        assert chunks[-1]["choices"] == []  # the usage-only chunk of include_usage
        assert chunks[-1]["usage"]["completion_tokens"] == 16
        assert "seq" not in chunks[0]  # OpenAI's bytes, none of inferwire's fields

    run(main())


async def _until_done(ws: Any) -> Any:
    while (message := await ws.recv()) != "[DONE]":
        assert isinstance(message, str), "a JSON codec's chunks are text messages"
        yield message


def test_aiohttp_reads_binary_chunks_by_subprotocol() -> None:
    async def main() -> None:
        codec = ic.get("protobuf", extensions=True)
        async with serving("websocket", "orjson") as server, aiohttp.ClientSession() as session:
            ws = await session.ws_connect(
                url(server.address), protocols=["inferwire.protobuf"], autoclose=False
            )
            assert ws.protocol == "inferwire.protobuf"
            await ws.send_str(chat_body(inferwire={"extensions": True}).decode())
            decoder = codec.message_decoder()
            chunks: list[ic.TokenChunk] = []
            while True:
                message = await ws.receive()
                if message.type is aiohttp.WSMsgType.TEXT:
                    assert message.data == "[DONE]"
                    break
                assert message.type is aiohttp.WSMsgType.BINARY
                chunks += decoder.feed(message.data)
            closing = await ws.receive()
            assert closing.type is aiohttp.WSMsgType.CLOSE
            assert closing.data == 1000
            await ws.close()
        assert chunks == expected_chunks("stream-16")

    run(main())


def test_pings_are_answered_idle_and_mid_stream() -> None:
    async def main() -> None:
        async with (
            serving("websocket", decode_s=0.01) as server,
            ws_connect(
                url(server.address), subprotocols=[Subprotocol("inferwire.orjson")], proxy=None
            ) as ws,
        ):
            await asyncio.wait_for(await ws.ping(b"idle"), BOUND_S)
            await ws.send(chat_body(inferwire={"extensions": True}).decode())
            assert orjson.loads(await ws.recv())["seq"] == 0
            await asyncio.wait_for(await ws.ping(b"mid-stream"), BOUND_S)  # 15 tokens to go
            rest = [message async for message in _until_done(ws)]
            assert len(rest) == 15

    run(main())


def test_a_request_in_many_fragments_is_one_message() -> None:
    body = chat_body(inferwire={"extensions": True}).decode()
    fragments = [body[i : i + 7] for i in range(0, len(body), 7)]

    async def main() -> None:
        async with (
            serving("websocket", limits=it.Limits(max_message_bytes=4096)) as server,
            ws_connect(
                url(server.address), subprotocols=[Subprotocol("inferwire.orjson")], proxy=None
            ) as ws,
        ):
            await ws.send(fragments)  # one message, a frame a fragment
            assert len([m async for m in _until_done(ws)]) == 16

    run(main())


# -- limits and hostile input -----------------------------------------------------------------


@pytest.mark.parametrize("fragmented", [False, True], ids=["one-frame", "fragmented"])
def test_a_message_over_the_limit_is_refused_with_1009(fragmented: bool) -> None:
    big = _openai_request(padding="x" * 8000).decode()

    async def main() -> None:
        async with serving("websocket", limits=it.Limits(max_message_bytes=4096)) as server:
            async with ws_connect(url(server.address), proxy=None) as ws:
                await ws.send([big[:3000], big[3000:]] if fragmented else big)
                error = orjson.loads(await ws.recv())
                assert error["error"]["code"] == 413
                with pytest.raises(websockets.ConnectionClosedError) as closed:
                    await ws.recv()
                assert closed.value.rcvd is not None
                assert closed.value.rcvd.code == 1009
            # our client refuses to send such a request at all
            limits = it.Limits(max_message_bytes=64)
            async with it.connect("websocket", server.address, limits=limits) as client:
                with pytest.raises(it.MessageTooLargeError):
                    async for _ in client.generate(it.GenerateRequest(workload="stream-16")):
                        pass
            await _our_stream(server.address, "orjson")

    run(main())


def test_our_client_refuses_a_message_over_its_limit() -> None:
    async def main() -> None:
        async with serving("websocket", "orjson") as server:
            limits = it.Limits(max_message_bytes=400)  # a request fits, a top-5 chunk does not
            async with it.connect("websocket", server.address, limits=limits) as client:
                request = it.GenerateRequest(workload="stream-16-top5")
                with pytest.raises(it.MessageTooLargeError):
                    async for _ in client.generate(request):
                        pass

    run(main())


async def _raw_handshake(
    address: tuple[str, int], subprotocols: list[Subprotocol], *, rcvbuf: int = 0
) -> tuple[asyncio.StreamReader, asyncio.StreamWriter, ClientProtocol]:
    """A client connection made of websockets' Sans-I/O protocol, to send what a well-behaved
    client would not (with ``rcvbuf``: a small receive buffer, for a client that stops
    reading)."""
    sock = socket.socket()
    if rcvbuf:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
    sock.setblocking(False)
    await asyncio.get_running_loop().sock_connect(sock, address)
    reader, writer = await asyncio.open_connection(sock=sock)
    protocol = ClientProtocol(
        parse_uri(f"ws://{address[0]}:{address[1]}{CHAT}"), subprotocols=subprotocols or None
    )
    protocol.send_request(protocol.connect())
    writer.writelines(protocol.data_to_send())
    while not protocol.events_received():
        protocol.receive_data(await reader.read(4096))
    assert protocol.handshake_exc is None
    return reader, writer, protocol


def _frames(protocol: ClientProtocol) -> list[Frame]:
    return [event for event in protocol.events_received() if isinstance(event, Frame)]


async def _read_to_end(reader: asyncio.StreamReader) -> bytes:
    data = b""
    with contextlib.suppress(ConnectionError):
        while chunk := await reader.read(65536):
            data += chunk
    return data


def test_invalid_utf8_in_a_request_is_1007() -> None:
    async def main() -> None:
        async with serving("websocket") as server:
            reader, writer, protocol = await _raw_handshake((server.host, server.port), [])
            writer.write(Frame(Opcode.TEXT, b'{"messages": "\xff\xfe"}').serialize(mask=True))
            protocol.receive_data(await _read_to_end(reader))
            writer.close()
            frames = _frames(protocol)
            assert orjson.loads(frames[0].data)["error"]["code"] == 400
            assert protocol.close_rcvd is not None
            assert protocol.close_rcvd.code == 1007
            await _our_stream(server.address, "orjson")

    run(main())


def test_garbage_instead_of_a_handshake() -> None:
    async def main() -> None:
        async with serving("websocket") as server:
            for garbage in (
                b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03" * 20 + b"\r\n\r\n",
                b"HELLO\r\n\r\n",
            ):
                reader, writer = await asyncio.open_connection(server.host, server.port)
                writer.write(garbage)
                answer = await _read_to_end(reader)
                writer.close()
                assert answer == b"" or answer.startswith(b"HTTP/1.1 400 ")
            # a plain GET without the upgrade
            reader, writer = await asyncio.open_connection(server.host, server.port)
            writer.write(b"GET /v1/chat/completions HTTP/1.1\r\nhost: x\r\n\r\n")
            assert (await _read_to_end(reader)).startswith(b"HTTP/1.1 426 ")
            writer.close()
            await _our_stream(server.address, "orjson")

    run(main())


@pytest.mark.parametrize("loop", LOOP_KINDS)
def test_a_client_that_stops_reading_costs_bounded_memory(loop: str) -> None:
    """The server's socket and transport buffers fill, its writes wait on drain for at most
    ``timeout_s``, then the connection is dropped and the next client is served."""

    async def main() -> None:
        limits = it.Limits(timeout_s=1.0)
        async with serving("websocket", limits=limits) as running:
            server = running.server
            assert isinstance(server, WebSocketServer)
            assert server._server is not None
            for listener in server._server.sockets:  # accepted sockets inherit it
                listener.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 16384)
            address = (running.host, running.port)
            reader, writer, protocol = await _raw_handshake(
                address, [Subprotocol("inferwire.orjson")], rcvbuf=16384
            )
            protocol.send_text(chat_body("stream-2048-top5", inferwire={"extensions": True}))
            writer.writelines(protocol.data_to_send())
            peak = 0

            def dropped() -> bool:
                nonlocal peak
                peak = max(peak, server.write_buffer_bytes())
                return not server.endpoint._writers

            assert await wait_until(dropped, timeout_s=BOUND_S, interval_s=0.01)
            assert 0 < peak <= 512 * 1024, peak  # the whole stream is 1.3 MB
            protocol.receive_data(await _read_to_end(reader))
            writer.close()
            texts = [f.data for f in _frames(protocol) if f.opcode is Opcode.TEXT]
            assert b"[DONE]" not in texts  # the stream failed, never reported whole
            await _our_stream(running.address, "orjson")

    run(main(), loop)


# -- the client against a misbehaving server -------------------------------------------------

Script = Callable[[asyncio.StreamWriter], Awaitable[None]]
_ORJSON = ic.get("orjson", extensions=True)


def _chunk_frames(count: int) -> bytes:
    return b"".join(
        data_frame(_ORJSON.encode(c), text=True) for c in expected_chunks("stream-16")[:count]
    )


def _close_frame(code: int) -> bytes:
    return Frame(Opcode.CLOSE, Close(code, "").serialize()).serialize(mask=False)


@contextlib.asynccontextmanager
async def fake_websocket_server(
    script: Script, pongs: list[bytes] | None = None
) -> AsyncIterator[tuple[str, list[int | None]]]:
    """A server that completes the handshake (taking the client's subprotocol), reads the
    request message, runs ``script(writer)``, then notes the close code the client sends
    (None: none) in the list it yields beside its address, and the pongs it got in
    ``pongs``."""
    closes: list[int | None] = []

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        protocol = ServerProtocol(select_subprotocol=lambda _, offers: offers[0])
        try:
            events: list[Any] = []
            while not events:  # the handshake request
                protocol.receive_data(await reader.read(4096))
                events = protocol.events_received()
            protocol.send_response(protocol.accept(events[0]))
            writer.writelines(protocol.data_to_send())
            while not any(e.opcode is Opcode.TEXT for e in events[1:]):  # the chat request
                protocol.receive_data(await reader.read(4096))
                events += protocol.events_received()
            await script(writer)
            with contextlib.suppress(TimeoutError, ConnectionError):
                async with asyncio.timeout(10.0):
                    while protocol.close_rcvd is None and (data := await reader.read(4096)):
                        protocol.receive_data(data)
                        for event in protocol.events_received():
                            if not isinstance(event, Frame) or pongs is None:
                                continue
                            if event.opcode is Opcode.PONG:
                                pongs.append(bytes(event.data))
            closes.append(None if protocol.close_rcvd is None else protocol.close_rcvd.code)
        finally:
            writer.close()

    listener = await asyncio.start_server(handle, "127.0.0.1", 0)
    try:
        yield f"127.0.0.1:{listener.sockets[0].getsockname()[1]}", closes
    finally:
        listener.close()
        await listener.wait_closed()


async def _generate(address: str, **options: Any) -> list[ic.TokenChunk]:
    async with it.connect("websocket", address, codec="orjson", **options) as client:
        return [c async for c in client.generate(it.GenerateRequest(workload="stream-16"))]


async def _cut_with_close(writer: asyncio.StreamWriter) -> None:
    writer.write(_chunk_frames(3) + _close_frame(1000))


async def _cut_without_close(writer: asyncio.StreamWriter) -> None:
    writer.write(_chunk_frames(3))
    await writer.drain()
    writer.transport.abort()


async def _failed_mid_stream(writer: asyncio.StreamWriter) -> None:
    error = b'{"error":{"message":"engine died","type":"x","param":null,"code":500}}'
    writer.write(_chunk_frames(3) + data_frame(error, text=True) + _close_frame(1011))


@pytest.mark.parametrize(
    "script", [_cut_with_close, _cut_without_close, _failed_mid_stream], ids=lambda s: s.__name__
)
def test_a_stream_cut_mid_way_is_truncated(script: Script) -> None:
    async def main() -> None:
        async with fake_websocket_server(script) as (address, _):
            with pytest.raises(it.StreamTruncatedError) as raised:
                await _generate(address)
            assert raised.value.chunks_received == 3

    run(main())


def test_our_client_fails_invalid_utf8_with_1007() -> None:
    async def bad_text(writer: asyncio.StreamWriter) -> None:
        writer.write(_chunk_frames(1) + data_frame(b'{"id": "\xff\xfe"}', text=True))

    async def main() -> None:
        async with fake_websocket_server(bad_text) as (address, closes):
            with pytest.raises(it.ProtocolError, match="UTF-8"):
                await _generate(address)
            assert await wait_until(lambda: bool(closes), timeout_s=BOUND_S)
            assert closes == [1007]

    run(main())


def test_our_client_fails_an_oversized_frame_with_1009() -> None:
    async def big(writer: asyncio.StreamWriter) -> None:
        writer.write(_chunk_frames(1) + data_frame(b"x" * 10_000, text=True))

    async def main() -> None:
        async with fake_websocket_server(big) as (address, closes):
            with pytest.raises(it.MessageTooLargeError):
                await _generate(address, limits=it.Limits(max_message_bytes=4096))
            assert await wait_until(lambda: bool(closes), timeout_s=BOUND_S)
            assert closes == [1009]

    run(main())


def test_a_client_that_leaves_mid_stream_stops_the_stream() -> None:
    async def main() -> None:
        async with serving("websocket", decode_s=0.005) as server:
            async with it.connect("websocket", server.address) as client:
                request = it.GenerateRequest(workload="stream-256")
                async for chunk in client.generate(request):
                    if chunk.seq == 2:
                        break
            endpoint = server.server.endpoint  # type: ignore[attr-defined]
            assert await wait_until(lambda: not endpoint._writers, timeout_s=BOUND_S)
            await _our_stream(server.address, "orjson")

    run(main())


class _FailingService(it.SimulatedService):
    """Fails every stream after its first batch, as an engine that went away would."""

    async def batches(
        self, stream: it.TokenStream, *, max_chunks: int = MAX_BATCH_CHUNKS
    ) -> AsyncGenerator[list[ic.TokenChunk], None]:
        async for batch in super().batches(stream, max_chunks=max_chunks):
            yield batch
            raise it.ServiceUnavailableError("the engine went away")


def test_a_server_failure_mid_stream_is_an_error_object_then_1011() -> None:
    async def main() -> None:
        service = _FailingService(token_stream_source)
        server = WebSocketServer(service, ic.get("orjson", extensions=True))
        host, port = await server.start()
        try:
            async with it.connect("websocket", (host, port)) as client:
                request = it.GenerateRequest(workload="stream-256")
                with pytest.raises(it.StreamTruncatedError, match="the stream failed") as cut:
                    async for _ in client.generate(request):
                        pass
                assert cut.value.chunks_received > 0
            async with ws_connect(f"ws://{host}:{port}{CHAT}", proxy=None) as ws:
                await ws.send(_openai_request("stream-256").decode())
                while "error" not in (message := orjson.loads(await ws.recv())):
                    assert message["object"] == "chat.completion.chunk"
                assert message["error"]["code"] == 500
                with pytest.raises(websockets.ConnectionClosedError) as closed:
                    await ws.recv()
                assert closed.value.rcvd is not None
                assert closed.value.rcvd.code == 1011
        finally:
            await server.stop()

    run(main())


def test_a_timed_stream_carries_the_server_stamps() -> None:
    async def main() -> None:
        async with (
            serving("websocket", "protobuf") as server,
            it.connect("websocket", server.address, codec="protobuf") as client,
        ):
            timing = it.StreamTiming()
            request = it.GenerateRequest(workload="stream-16")
            chunks = [c async for c in client.generate(request, timing=timing)]
            assert chunks == expected_chunks("stream-16")
            assert len(timing.received_ns) == len(timing.decoded_ns) == 16
            assert timing.server.shape[0] == 16  # one row a chunk
            assert 0 < timing.server_request_ns[0] <= timing.server_request_ns[1]
            assert all(ns >= 0 for ns in timing.stages_ns()["network"])

    run(main())


# -- sessions: one connection, streams in turn -------------------------------------------------


def test_our_client_runs_streams_in_turn_on_one_session() -> None:
    """Streams reuse one connection; ``new_connection_per_request`` opens one each, which the
    server closes after ``[DONE]``."""

    async def main() -> None:
        async with serving("websocket", "delta") as server:
            writers = server.server.endpoint._writers  # type: ignore[attr-defined]
            async with it.connect("websocket", server.address, codec="delta") as client:
                for _ in range(3):
                    chunks = [
                        c async for c in client.generate(it.GenerateRequest(workload="stream-16"))
                    ]
                    assert chunks == expected_chunks("stream-16")
                    assert len(writers) == 1  # the same session, still open
            async with it.connect(
                "websocket", server.address, codec="delta", new_connection_per_request=True
            ) as client:
                for _ in range(2):
                    chunks = [
                        c async for c in client.generate(it.GenerateRequest(workload="stream-16"))
                    ]
                    assert chunks == expected_chunks("stream-16")
                assert await wait_until(lambda: not writers, timeout_s=BOUND_S)

    run(main())


def test_the_websockets_client_keeps_a_session() -> None:
    async def main() -> None:
        async with (
            serving("websocket", "orjson") as server,
            ws_connect(url(server.address, CHAT + "?session=1"), proxy=None) as ws,
        ):
            for _ in range(2):
                await ws.send(_openai_request().decode())
                messages = [orjson.loads(m) async for m in _until_done(ws)]
                text = "".join(c["choices"][0]["delta"].get("content", "") for c in messages)
                assert text == "".join(c.text for c in expected_chunks("stream-16"))
            await ws.close()
            assert ws.close_code == 1000

    run(main())


async def _read_until_done(ws: Any) -> None:
    while await ws.recv() != "[DONE]":
        pass


def test_a_second_request_before_done_is_a_policy_violation() -> None:
    async def main() -> None:
        async with (
            serving("websocket", "orjson", decode_s=0.005) as server,
            ws_connect(url(server.address, CHAT + "?session=1"), proxy=None) as ws,
        ):
            await ws.send(_openai_request("stream-256").decode())
            await ws.recv()  # the stream has started
            await ws.send(_openai_request().decode())
            with pytest.raises(websockets.ConnectionClosedError):
                await _read_until_done(ws)
            assert ws.close_code == 1008
            await _our_stream(server.address, "orjson")  # and the server goes on

    run(main())


def test_our_client_reads_fragments_and_answers_pings_mid_stream() -> None:
    """Frames the fast path hands to the library: a chunk in three fragments with a ping
    between them (control frames may come between fragments, RFC 6455 5.4)."""
    chunks = expected_chunks("stream-16")
    encoded = [_ORJSON.encode(c) for c in chunks]
    third = len(encoded[3]) // 3
    pongs: list[bytes] = []

    async def fragmented(writer: asyncio.StreamWriter) -> None:
        frames = [data_frame(e, text=True) for e in encoded[:3]]
        frames.append(Frame(Opcode.TEXT, encoded[3][:third], fin=False).serialize(mask=False))
        frames.append(Frame(Opcode.PING, b"mid").serialize(mask=False))
        frames.append(
            Frame(Opcode.CONT, encoded[3][third : 2 * third], fin=False).serialize(mask=False)
        )
        frames.append(Frame(Opcode.CONT, encoded[3][2 * third :]).serialize(mask=False))
        frames += [data_frame(e, text=True) for e in encoded[4:]]
        frames.append(data_frame(b"[DONE]", text=True))
        for frame in frames:  # one write each: frames split across the client's reads too
            writer.write(frame)
            await writer.drain()

    async def main() -> None:
        async with fake_websocket_server(fragmented, pongs) as (address, closes):
            assert await _generate(address) == chunks
            assert await wait_until(lambda: bool(closes), timeout_s=BOUND_S)
            assert closes == [1000]
            assert pongs == [b"mid"]

    run(main())


def test_our_client_refuses_a_masked_frame_from_the_server() -> None:
    async def masked(writer: asyncio.StreamWriter) -> None:
        writer.write(_chunk_frames(2) + Frame(Opcode.TEXT, b"{}").serialize(mask=True))

    async def main() -> None:
        async with fake_websocket_server(masked) as (address, closes):
            with pytest.raises(it.ProtocolError, match="mask"):
                await _generate(address)
            assert await wait_until(lambda: bool(closes), timeout_s=BOUND_S)
            assert closes == [1002]

    run(main())
