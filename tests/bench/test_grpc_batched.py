"""gRPC's ``GenerateBatched`` (one message per batch of due chunks) and the bare grpcio floor
server, on loopback.

* Every codec that carries token streams: the batched stream equals the service's, with and
  without timing; on the wire, the messages' data joined is exactly the codec's byte stream
  (what ``tcp`` sends), and unpaced it takes one message (a batch holds every due chunk).
* Paced, each message holds the one chunk that was due: batching holds nothing back.
* A batch cut mid-frame, a stream without its end marker, bytes that are not the codec's, an
  envelope that is not a ``StreamBytes``: each is an error (``StreamTruncatedError`` for the
  first two), never a short stream that ends normally; so is a server killed mid-stream.
* The floor server (``python -m inferwire.bench.procs.grpc_floor``) starts, announces itself
  and streams our ``Generate``'s messages byte for byte.
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import grpc
import grpc.aio
import pytest

import inferwire.codecs as ic
import inferwire.transports as it
from inferwire import workloads
from inferwire.transports import grpc_envelope as envelope
from inferwire.transports.grpc_transport import BATCH_CHUNKS, GrpcClient, _request_to_pb
from inferwire.workloads import token_stream_source
from tests.helpers.faults import expected_chunks, server_process, serving

SERVICE = "inferwire.v1.Inference"
STREAM_CODECS = [
    name
    for name in ic.names()
    if ic.TokenChunk in ic.get(name, extensions=True).types and name != "tensor"
]
BOUND_S = 30.0
"""Outer bound on a stream that should take well under a second: one that fires is a hang."""


def _stream_bytes(codec: str, chunks: list[ic.TokenChunk]) -> bytes:
    encoder = ic.get(codec, extensions=True).stream_encoder()
    return b"".join(encoder.encode(chunk) for chunk in chunks) + encoder.end()


def _request_bytes(request: it.GenerateRequest) -> bytes:
    return bytes(_request_to_pb(request).SerializeToString())


async def _raw_batched(address: str, request: it.GenerateRequest) -> list[bytes]:
    """``GenerateBatched``'s messages as grpc hands them over."""
    async with grpc.aio.insecure_channel(address) as channel:
        call = channel.unary_stream(f"/{SERVICE}/GenerateBatched")
        return [message async for message in call(_request_bytes(request))]


@pytest.mark.parametrize("codec", STREAM_CODECS)
def test_batched_stream_equals_the_service(codec: str) -> None:
    request = it.GenerateRequest(workload="stream-256-top5")
    expected = expected_chunks("stream-256-top5")

    async def run() -> None:
        async with serving("grpc", codec) as srv:
            async with it.connect("grpc", srv.address, codec=codec, batched=True) as client:
                assert [c async for c in client.generate(request)] == expected
                timing = it.StreamTiming()
                timed = [c async for c in client.generate(request, timing=timing)]
                assert timed == expected
                assert len(timing.server) == len(expected)
            messages = await _raw_batched(srv.address, request)
        data = [envelope.read_stream_bytes(message, "test") for message in messages]
        assert b"".join(data) == _stream_bytes(codec, expected)
        assert len(messages) == -(-len(expected) // BATCH_CHUNKS)

    asyncio.run(run())


@pytest.mark.parametrize(
    "codec",
    [name for name in STREAM_CODECS if ic.get(name, extensions=True).stream_shape == "independent"],
)
def test_the_message_stream_is_each_chunks_own_bytes(codec: str) -> None:
    """What ``Generate`` sends: for a codec of independent chunks, each message is exactly
    ``encode``'s bytes of its chunk (protobuf's encoder serializes a stream's repeated head
    once; the bytes must not change), over every token-stream workload."""
    c = ic.get(codec, extensions=True)
    for name in workloads.names():
        chunks = [m for m in workloads.get(name).messages(0) if isinstance(m, ic.TokenChunk)]
        encoder = c.message_encoder()
        assert [encoder.encode(chunk) for chunk in chunks] == [c.encode(x) for x in chunks]
        assert encoder.end() == b""


def test_the_per_message_rpc_stays_one_chunk_a_message() -> None:
    request = it.GenerateRequest(workload="stream-16")

    async def run() -> None:
        async with (
            serving("grpc", "protobuf") as srv,
            grpc.aio.insecure_channel(srv.address) as channel,
        ):
            call = channel.unary_stream(f"/{SERVICE}/Generate")
            messages = [m async for m in call(_request_bytes(request))]
        codec = ic.get("protobuf", extensions=True)
        assert [codec.decode(m, ic.TokenChunk) for m in messages] == expected_chunks("stream-16")

    asyncio.run(run())


def test_paced_batches_go_out_as_they_come_due() -> None:
    """Paced, a batch holds the chunks due when it is sent: one each on a quiet machine. Two
    can share one where the server's process was not scheduled for a token's time (the CI
    machine is shared), so the count is bounded, not exact; all chunks in one message would
    mean batching waited for the stream."""
    request = it.GenerateRequest(workload="stream-256", max_tokens=12)
    expected = list(it.SimulatedService(token_stream_source).chunks(request))

    async def run() -> None:
        async with serving("grpc", "protobuf", decode_s=0.02) as srv:
            messages = await _raw_batched(srv.address, request)
            async with it.connect("grpc", srv.address, codec="protobuf", batched=True) as client:
                assert [c async for c in client.generate(request)] == expected
        assert len(expected) // 2 < len(messages) <= len(expected)
        assert b"".join(envelope.read_stream_bytes(m, "test") for m in messages) == (
            _stream_bytes("protobuf", expected)
        )

    asyncio.run(run())


@contextlib.asynccontextmanager
async def _fake_batched(messages: list[bytes]) -> AsyncIterator[str]:
    """A gRPC server whose ``GenerateBatched`` sends ``messages`` then ends the call OK."""

    async def generate(request: bytes, context: grpc.aio.ServicerContext) -> AsyncIterator[bytes]:
        for message in messages:
            yield message

    handlers = {"GenerateBatched": grpc.unary_stream_rpc_method_handler(generate)}
    server = grpc.aio.server()
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(SERVICE, handlers),))
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    try:
        yield f"127.0.0.1:{port}"
    finally:
        await server.stop(grace=None)


async def _read_from(messages: list[bytes], codec: str) -> tuple[int, BaseException | None]:
    """Chunks read from a fake server of ``messages``, and the error the stream ended with."""
    received = 0
    async with (
        _fake_batched(messages) as address,
        it.connect("grpc", address, codec=codec, batched=True) as client,
    ):
        try:
            async with asyncio.timeout(BOUND_S):
                async for _ in client.generate(it.GenerateRequest(workload="stream-16")):
                    received += 1
        except it.TransportError as exc:
            return received, exc
    return received, None


@pytest.mark.parametrize("codec", ["orjson", "protobuf", "delta"])
def test_a_batch_cut_mid_frame_is_truncation(codec: str) -> None:
    data = _stream_bytes(codec, expected_chunks("stream-16"))
    half = envelope.write_stream_bytes(data[: len(data) // 2])
    received, error = asyncio.run(_read_from([half], codec))
    assert isinstance(error, it.StreamTruncatedError), repr(error)
    assert error.chunks_received == received < 16


@pytest.mark.parametrize("codec", ["orjson", "protobuf", "delta"])
def test_a_stream_without_its_end_marker_is_truncation(codec: str) -> None:
    chunks = expected_chunks("stream-16")
    encoder = ic.get(codec, extensions=True).stream_encoder()
    whole_frames = b"".join(encoder.encode(chunk) for chunk in chunks)  # no end()
    received, error = asyncio.run(_read_from([envelope.write_stream_bytes(whole_frames)], codec))
    assert isinstance(error, it.StreamTruncatedError), repr(error)
    assert received == error.chunks_received == 16


def test_an_empty_call_is_truncation() -> None:
    received, error = asyncio.run(_read_from([], "orjson"))
    assert isinstance(error, it.StreamTruncatedError), repr(error)
    assert received == 0


@pytest.mark.parametrize(
    "message",
    [
        envelope.write_stream_bytes(b"data: {not json}\n\n"),
        envelope.write_stream_bytes(b"event: x\ndata: [DONE]\n\ndata: {}\n\n"),
        b"\x0a\x20short",  # the field is longer than the message
        b"\x0b",  # a group start: not a StreamBytes
    ],
    ids=["bad-json", "bytes-after-the-end", "field-past-the-end", "bad-wire-type"],
)
def test_bytes_that_are_not_the_stream_are_a_protocol_error(message: bytes) -> None:
    _, error = asyncio.run(_read_from([message], "orjson"))
    assert isinstance(error, it.ProtocolError), repr(error)


def test_stream_bytes_follow_protobufs_rules() -> None:
    data = b"data: x\n\n"
    one = envelope.write_stream_bytes(data)
    assert envelope.read_stream_bytes(one, "t") == data
    unknown = b"\x10\x05"  # field 2, varint: skipped
    assert envelope.read_stream_bytes(unknown + one + unknown, "t") == data
    assert envelope.read_stream_bytes(envelope.write_stream_bytes(b"old") + one, "t") == data
    assert envelope.read_stream_bytes(b"", "t") == b""


def test_batched_must_be_a_bool() -> None:
    with pytest.raises(ValueError, match="batched"):
        GrpcClient("127.0.0.1", 1, ic.get("orjson", extensions=True), batched="yes")  # type: ignore[arg-type]


KILL_AFTER = 5


def test_server_killed_mid_stream_is_truncation(tmp_path: Path) -> None:
    args = ["--decode-ms", "5"]
    total = len(expected_chunks("stream-2048"))
    with server_process("grpc", "orjson", args, tmp_path / "server.log") as child:

        async def run() -> tuple[int, it.TransportError | None]:
            received = 0
            async with it.connect("grpc", child.address, batched=True) as client:
                try:
                    async with asyncio.timeout(BOUND_S):
                        stream = client.generate(it.GenerateRequest(workload="stream-2048"))
                        async for _ in stream:
                            received += 1
                            if received == KILL_AFTER:
                                child.kill()
                except it.TransportError as exc:
                    return received, exc
            return received, None

        received, error = asyncio.run(run())
    assert KILL_AFTER <= received < total
    assert isinstance(error, it.StreamTruncatedError), repr(error)
    assert error.chunks_received == received


FLOOR_METHOD = "/inferwire.bench.Floor/Messages"


@pytest.mark.parametrize("codec", ["orjson", "delta"])
def test_the_floor_server_streams_our_messages(codec: str) -> None:
    process = subprocess.Popen(
        [sys.executable, "-m", "inferwire.bench.procs.grpc_floor", "--codec", codec],
        stdout=subprocess.PIPE,
        stdin=subprocess.DEVNULL,
        text=True,
    )
    try:
        assert process.stdout is not None
        line = process.stdout.readline()
        assert line.startswith("listening on 127.0.0.1:"), line
        assert " loop=" in line
        address = line.split()[2]

        async def run() -> tuple[list[bytes], list[bytes]]:
            async with grpc.aio.insecure_channel(address) as channel:
                floor = [m async for m in channel.unary_stream(FLOOR_METHOD)(b"")]
            async with (
                serving("grpc", codec) as srv,
                grpc.aio.insecure_channel(srv.address) as channel,
            ):
                call = channel.unary_stream(f"/{SERVICE}/Generate")
                ours = [m async for m in call(_request_bytes(it.GenerateRequest()))]
            return floor, ours

        floor, ours = asyncio.run(run())
        assert floor == ours
        assert len(floor) >= len(expected_chunks("stream-256"))
    finally:
        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=30) == 0
        if process.stdout is not None:
            process.stdout.close()
