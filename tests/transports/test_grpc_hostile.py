"""The gRPC transport against oversized messages, deadlines and cancellation, on loopback.

* A message over a receive limit (the server's or the client's) is ``RESOURCE_EXHAUSTED``,
  which the client raises as :class:`MessageTooLargeError`; the channel goes on working.
* A deadline or a cancel frees the server's handler at once: ``active_streams`` is back to 0
  well within a bound far shorter than the stream (over 10 s of paced tokens).
* A cancelled stream (by the server, or under a reader by the client's own close) ends in a
  :class:`TransportError`, never as a short stream that ends normally.

Each test starts its own server in its own event loop (``asyncio.run``). The departure and
deadline cases of ``test_transport_faults`` check that the handler is freed at all; these
check that it is freed promptly, and cover ``Session`` too.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
import tracemalloc
from collections.abc import AsyncIterator

import grpc
import grpc.aio
import numpy as np
import pytest

import inferwire.codecs as ic
import inferwire.transports as it
from inferwire.codecs.errors import ElementBudgetError
from inferwire.schemas import inferwire_pb2 as pb
from inferwire.transports.grpc_transport import GrpcClient
from tests.helpers.faults import expected_chunks, infer_request, serving, wait_until

SERVICE = "inferwire.v1.Inference"
BOUND_S = 20.0
"""Outer bound on anything that should take well under a second: one that fires is a hang."""
FREED_S = 2.0
"""How soon a handler must be gone after a deadline or cancel: generous for a busy machine,
and far short of the streams below."""
DECODE_S = 0.005
LONG = "stream-2048"
"""2048 chunks paced at DECODE_S per token: over 10 s, so a handler that ran to its end
cannot pass for one that was freed."""
LONG_TOTAL = len(expected_chunks(LONG))
SMALL_LIMITS = it.Limits(max_message_bytes=64 * 1024)
BIG = 1 << 20


async def _consume(
    chunks: AsyncIterator[ic.TokenChunk], received: list[ic.TokenChunk]
) -> BaseException | None:
    """Read ``chunks`` into ``received``; what the stream ended with (None: a normal end)."""
    try:
        async with asyncio.timeout(BOUND_S):
            async for chunk in chunks:
                received.append(chunk)  # noqa: PERF401 (what came before an error counts)
    except it.TransportError as exc:
        return exc
    except asyncio.CancelledError as exc:
        task = asyncio.current_task()
        if task is not None and task.cancelling():
            raise
        return exc  # a stray cancellation let out by the transport: the test fails on it
    except TimeoutError as exc:
        raise AssertionError(f"the stream hung after {len(received)} chunks") from exc
    return None


@contextlib.asynccontextmanager
async def _fake_server(handlers: dict[str, grpc.RpcMethodHandler]) -> AsyncIterator[str]:
    """A gRPC server of ``handlers`` on the service's name, standing in for ours: its address."""
    server = grpc.aio.server()
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(SERVICE, handlers),))
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    try:
        yield f"127.0.0.1:{port}"
    finally:
        await server.stop(grace=None)


async def _assert_channel_works(client: it.Client, codec: str) -> None:
    request = infer_request()
    async with asyncio.timeout(BOUND_S):
        if codec != "delta":  # delta carries token streams only
            response = await client.infer(request)
            assert response.outputs[0].data.tolist() == request.inputs[0].data.tolist()
        chunks = [c async for c in client.generate(it.GenerateRequest(workload="stream-16"))]
    assert chunks == expected_chunks("stream-16")


# -- messages over a receive limit --------------------------------------------------------

_BIG_GENERATE = it.GenerateRequest(workload="stream-16", model="m" * BIG)


async def _send_big(client: GrpcClient, method: str) -> BaseException | None:
    if method == "Infer":
        try:
            async with asyncio.timeout(BOUND_S):
                await client.infer(infer_request(BIG))
        except it.TransportError as exc:
            return exc
        return None
    received: list[ic.TokenChunk] = []
    if method == "Generate":
        error = await _consume(client.generate(_BIG_GENERATE), received)
    else:
        async with client.session() as session:
            error = await _consume(session.generate(_BIG_GENERATE), received)
    assert received == []
    return error


@pytest.mark.parametrize(
    ("codec", "method"),
    [
        ("orjson", "Infer"),
        ("protobuf", "Infer"),
        ("orjson", "Generate"),
        ("protobuf", "Generate"),
        ("delta", "Generate"),
        ("orjson", "Session"),
        ("protobuf", "Session"),
    ],
)
def test_grpc_request_over_the_server_limit_is_message_too_large(codec: str, method: str) -> None:
    """The client's own limit is the default (64 MiB): only the server's refuses."""

    async def run() -> None:
        async with (
            serving("grpc", codec, limits=SMALL_LIMITS) as srv,
            it.connect("grpc", srv.address, codec=codec) as client,
        ):
            assert isinstance(client, GrpcClient)
            error = await _send_big(client, method)
            assert isinstance(error, it.MessageTooLargeError), repr(error)
            assert srv.service.streams_started == 0
            await _assert_channel_works(client, codec)
            if method == "Session":
                async with client.session() as session:
                    request = it.GenerateRequest(workload="stream-16")
                    chunks = [c async for c in session.generate(request)]
                assert chunks == expected_chunks("stream-16")

    asyncio.run(run())


def test_grpc_request_over_the_server_limit_is_resource_exhausted_on_the_wire() -> None:
    """What the client translates: grpc's own status, seen from a plain channel."""

    async def run() -> None:
        async with (
            serving("grpc", limits=SMALL_LIMITS) as srv,
            grpc.aio.insecure_channel(srv.address) as channel,
        ):
            infer = channel.unary_unary(f"/{SERVICE}/Infer")
            with pytest.raises(grpc.aio.AioRpcError) as info:
                await asyncio.wait_for(infer(b"\x00" * BIG), BOUND_S)
            assert info.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
            # the channel is still good: a small garbage request reaches the handler
            with pytest.raises(grpc.aio.AioRpcError) as info:
                await asyncio.wait_for(infer(b"\xff garbage"), BOUND_S)
            assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT

    asyncio.run(run())


def test_grpc_response_over_the_client_limit_is_message_too_large() -> None:
    """A server that answers with more than the client accepts: refused by the client's
    receive limit, and the next (small) answer on the same channel is read."""
    codec = ic.get("orjson", extensions=True)

    async def infer(data: bytes, context: grpc.aio.ServicerContext) -> bytes:
        request = codec.decode(data, ic.InferRequest)
        tensor = request.inputs[0]
        if request.id == "big":
            count = BIG // 4
            tensor = ic.Tensor(
                name="output_0", datatype="FP32", shape=(count,), data=np.zeros(count, "<f4")
            )
        return codec.encode(ic.InferResponse(model=request.model, id=request.id, outputs=(tensor,)))

    async def run() -> None:
        handlers = {"Infer": grpc.unary_unary_rpc_method_handler(infer)}
        async with (
            _fake_server(handlers) as address,
            it.connect("grpc", address, limits=SMALL_LIMITS) as client,
        ):
            small = infer_request()
            big = ic.InferRequest(model=small.model, id="big", inputs=small.inputs)
            with pytest.raises(it.MessageTooLargeError):
                await asyncio.wait_for(client.infer(big), BOUND_S)
            response = await asyncio.wait_for(client.infer(small), BOUND_S)
            assert response.outputs[0].data.tolist() == small.inputs[0].data.tolist()

    asyncio.run(run())


MILLION = 1_000_000


@pytest.mark.parametrize("codec", ["protobuf", "msgpack", "orjson"])
def test_grpc_client_holds_the_codec_limits_on_a_hostile_stream(codec: str) -> None:
    """A server that sends one chunk of a million token ids (3-7 MB, under the 64 MiB message
    limit): the client decodes through the codec, whose element budget (262,144) refuses it
    before a million Python ints are built (about 36 MB); the error is the transport's."""
    hostile = ic.get(codec, extensions=True).encode(
        ic.TokenChunk(
            id="x", model="m", created=0, index=0, seq=0, text="", token_ids=tuple(range(MILLION))
        )
    )

    async def generate(request: bytes, context: grpc.aio.ServicerContext) -> AsyncIterator[bytes]:
        yield hostile

    async def run() -> tuple[BaseException | None, int]:
        handlers = {"Generate": grpc.unary_stream_rpc_method_handler(generate)}
        async with (
            _fake_server(handlers) as address,
            it.connect("grpc", address, codec=codec) as client,
        ):
            received: list[ic.TokenChunk] = []
            tracemalloc.start()
            try:
                error = await _consume(client.generate(it.GenerateRequest()), received)
                peak = tracemalloc.get_traced_memory()[1]
            finally:
                tracemalloc.stop()
            assert received == []
            return error, peak

    error, peak = asyncio.run(run())
    assert isinstance(error, it.ProtocolError), repr(error)
    assert isinstance(error.__cause__, ElementBudgetError), repr(error.__cause__)
    assert peak < 3 * len(hostile) + (4 << 20), f"peak {peak} bytes for {len(hostile)} received"


# -- deadlines and cancels free the handler -----------------------------------------------


async def _three_then(
    chunks: AsyncIterator[ic.TokenChunk], received: list[ic.TokenChunk], three: asyncio.Event
) -> BaseException | None:
    async def counted() -> AsyncIterator[ic.TokenChunk]:
        async for chunk in chunks:
            yield chunk  # back here once the chunk is in ``received``
            if len(received) == 3:
                three.set()

    return await _consume(counted(), received)


async def _cancel_task(client: GrpcClient, received: list[ic.TokenChunk]) -> None:
    three = asyncio.Event()
    task = asyncio.create_task(
        _three_then(client.generate(it.GenerateRequest(workload=LONG)), received, three)
    )
    await asyncio.wait_for(three.wait(), BOUND_S)
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task
    assert task.cancelled()


async def _close_client_under_reader(
    client: GrpcClient, received: list[ic.TokenChunk]
) -> BaseException | None:
    three = asyncio.Event()
    task = asyncio.create_task(
        _three_then(client.generate(it.GenerateRequest(workload=LONG)), received, three)
    )
    await asyncio.wait_for(three.wait(), BOUND_S)
    await client.close()
    return await asyncio.wait_for(task, BOUND_S)


async def _close_session_under_reader(
    client: GrpcClient, received: list[ic.TokenChunk]
) -> BaseException | None:
    three = asyncio.Event()
    session = client.session()
    task = asyncio.create_task(
        _three_then(session.generate(it.GenerateRequest(workload=LONG)), received, three)
    )
    await asyncio.wait_for(three.wait(), BOUND_S)
    await session.close()
    return await asyncio.wait_for(task, BOUND_S)


@pytest.mark.parametrize(
    "departure", ["cancel-task", "close-client-under-reader", "close-session-under-reader"]
)
def test_grpc_cancel_frees_the_handler_at_once_and_is_never_a_short_success(
    departure: str,
) -> None:
    async def run() -> None:
        async with serving("grpc", decode_s=DECODE_S) as srv:
            client = it.connect("grpc", srv.address)
            assert isinstance(client, GrpcClient)
            received: list[ic.TokenChunk] = []
            try:
                if departure == "cancel-task":
                    await _cancel_task(client, received)
                    error: BaseException | None = None
                elif departure == "close-client-under-reader":
                    error = await _close_client_under_reader(client, received)
                else:
                    error = await _close_session_under_reader(client, received)
                left = time.monotonic()
                freed = await wait_until(lambda: srv.service.active_streams == 0, timeout_s=5.0)
                freed_s = time.monotonic() - left
            finally:
                await client.close()
            assert freed, "the handler still runs 5 s after the cancel"
            assert freed_s < FREED_S, f"the handler ran on for {freed_s:.2f} s"
            assert 3 <= len(received) < LONG_TOTAL
            assert received == expected_chunks(LONG)[: len(received)]
            if departure != "cancel-task":  # a reader left mid-stream: an error, not an end
                assert isinstance(error, it.StreamTruncatedError), repr(error)
                assert error.chunks_received == len(received)
            assert srv.service.streams_started == 1

    asyncio.run(run())


@pytest.mark.parametrize("method", ["Generate", "Session"])
def test_grpc_deadline_frees_the_handler_at_once(method: str) -> None:
    async def run() -> None:
        async with serving("grpc", decode_s=DECODE_S) as srv:
            async with it.connect("grpc", srv.address, deadline_s=1.5) as client:
                assert isinstance(client, GrpcClient)
                received: list[ic.TokenChunk] = []
                request = it.GenerateRequest(workload=LONG)
                if method == "Generate":
                    error = await _consume(client.generate(request), received)
                else:
                    async with client.session() as session:
                        error = await _consume(session.generate(request), received)
                passed = time.monotonic()
                freed = await wait_until(lambda: srv.service.active_streams == 0, timeout_s=5.0)
                freed_s = time.monotonic() - passed
            assert isinstance(error, it.TransportTimeoutError), repr(error)
            assert 0 < len(received) < LONG_TOTAL
            assert received == expected_chunks(LONG)[: len(received)]
            assert freed, "the handler still runs 5 s after the deadline"
            assert freed_s < FREED_S, f"the handler ran on for {freed_s:.2f} s"

    asyncio.run(run())


def test_grpc_raw_cancel_is_cancelled_and_frees_the_handler() -> None:
    """Seen from a plain channel: a cancelled call has status CANCELLED (what a peer sees as
    RST_STREAM), reading it again raises rather than ending, and the handler is gone."""

    async def run() -> None:
        async with serving("grpc", decode_s=DECODE_S) as srv:
            async with grpc.aio.insecure_channel(srv.address) as channel:
                generate = channel.unary_stream(f"/{SERVICE}/Generate")
                call = generate(pb.GenerateRequest(workload=LONG).SerializeToString())
                for _ in range(3):
                    await asyncio.wait_for(call.read(), BOUND_S)
                assert srv.service.active_streams == 1
                cancelled = time.monotonic()
                assert call.cancel()
                freed = await wait_until(lambda: srv.service.active_streams == 0, timeout_s=5.0)
                freed_s = time.monotonic() - cancelled
                assert await call.code() == grpc.StatusCode.CANCELLED
                with pytest.raises(asyncio.CancelledError):
                    await call.read()
            assert freed
            assert freed_s < FREED_S, f"the handler ran on for {freed_s:.2f} s"

    asyncio.run(run())


# -- a stream the server cancels -----------------------------------------------------------


@pytest.mark.parametrize("codec", ["orjson", "protobuf", "delta"])
def test_grpc_stream_cancelled_by_the_server_is_an_error(codec: str) -> None:
    """A server that sends three chunks and then ends the call as CANCELLED."""
    encoder = ic.get(codec, extensions=True).stream_encoder() if codec == "delta" else None
    chunks = expected_chunks("stream-16")
    frames = [
        encoder.encode(c) if encoder else ic.get(codec, extensions=True).encode(c)
        for c in chunks[:3]
    ]

    async def generate(request: bytes, context: grpc.aio.ServicerContext) -> AsyncIterator[bytes]:
        for frame in frames:
            yield frame
        await context.abort(grpc.StatusCode.CANCELLED, "cancelled by the server")

    async def run() -> None:
        handlers = {"Generate": grpc.unary_stream_rpc_method_handler(generate)}
        async with (
            _fake_server(handlers) as address,
            it.connect("grpc", address, codec=codec) as client,
        ):
            received: list[ic.TokenChunk] = []
            request = it.GenerateRequest(workload="stream-16")
            error = await _consume(client.generate(request), received)
        assert isinstance(error, it.CancelledByPeerError), repr(error)
        assert received == chunks[:3]

    asyncio.run(run())


def test_grpc_session_used_after_close_is_a_transport_error() -> None:
    async def run() -> None:
        async with serving("grpc") as srv, it.connect("grpc", srv.address) as client:
            assert isinstance(client, GrpcClient)
            session = client.session()
            request = it.GenerateRequest(workload="stream-16")
            received: list[ic.TokenChunk] = []
            assert await _consume(session.generate(request), received) is None
            assert received == expected_chunks("stream-16")
            await session.close()
            after: list[ic.TokenChunk] = []
            error = await _consume(session.generate(request), after)
            assert isinstance(error, it.TransportError), repr(error)
            assert after == []
            await _assert_channel_works(client, "orjson")

    asyncio.run(run())
