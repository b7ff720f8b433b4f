"""The engine's stamps of each request, and an engine's closed socket seen at once, with a real
engine process and a frontend's client on loopback (IPC and TCP), on asyncio and uvloop.

The stamps are ``time.monotonic_ns()`` of two processes on one host (CLOCK_MONOTONIC), so they
compare with this process's own: each lies inside the window in which this process sent the
request and read its last chunk, in the order a request meets them; and with a batch of one, a
request that waited is scheduled only once the one before it has finished. No wall-clock
assertion but generous bounds: a killed engine must be noticed well inside the liveness
timeout, which the test sets far above them."""

from __future__ import annotations

import asyncio
import subprocess
import time
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

import inferwire.codecs as ic
from inferwire._runtime import loops
from inferwire.engine import hop
from inferwire.engine.client import EngineClient, EngineStream
from inferwire.engine.hop_codecs import hop_codec
from inferwire.engine.launch import EngineProcess
from inferwire.transports import GenerateRequest, ServiceUnavailableError
from inferwire.transports.engine_service import EngineService
from inferwire.workloads import token_stream_source

WAIT_S = 60.0
FAST = ("--step-scale", "0.05")
LIVENESS_S = 120.0
"""The liveness timeout of the disconnect tests: far above any bound they wait, so that only
the socket monitor can end their streams in time."""
NOTICED_S = 10.0
"""How long a killed engine may take to be noticed: the monitor sees it in milliseconds."""


@pytest.fixture
def engines() -> Iterator[Callable[..., EngineProcess]]:
    started: list[EngineProcess] = []

    def start(*args: str) -> EngineProcess:
        engine = EngineProcess(*args, stderr=subprocess.DEVNULL).start()
        started.append(engine)
        return engine

    yield start
    for engine in started:
        engine.kill()


def run(coro: Awaitable[Any], loop: str) -> Any:
    async def bounded() -> Any:
        async with asyncio.timeout(WAIT_S * 2):
            return await coro

    return loops.run(bounded(), loop)


async def drain(stream: EngineStream) -> list[ic.TokenChunk]:
    chunks: list[ic.TokenChunk] = []
    while batch := await stream.next_batch(64):
        chunks += batch
    return chunks


def add(seed: int = 0, **fields: Any) -> hop.Add:
    return hop.Add(rid="-", workload=fields.pop("workload", "stream-256"), seed=seed, **fields)


def in_order(stamps: hop.EngineStamps, sent_ns: int, read_ns: int) -> None:
    assert sent_ns <= stamps.arrived_ns <= stamps.scheduled_ns
    assert stamps.scheduled_ns < stamps.first_token_ns <= stamps.last_token_ns <= read_ns


@pytest.mark.parametrize("codec", ["msgspec-msgpack", "protobuf", "delta", "orjson", "pickle"])
def test_each_request_gets_its_stamps_with_its_last_output_through_any_hop_codec(
    codec: str, event_loop_kind: str, engines: Callable[..., EngineProcess], tmp_path: Path
) -> None:
    engine = engines("--endpoint", f"ipc://{tmp_path}/e", "--codec", codec, "--allow-pickle", *FAST)

    async def main() -> None:
        async with EngineClient(engine.endpoint, hop_codec(codec, allow_pickle=True)) as client:
            await client.wait_ready(WAIT_S)
            sent_ns = time.monotonic_ns()
            asked = [await client.open_stream(add(seed, want_stamps=True)) for seed in range(3)]
            plain = await client.open_stream(add(9))
            results = await asyncio.gather(*(drain(s) for s in [*asked, plain]))
            read_ns = time.monotonic_ns()
            for seed, (stream, chunks) in enumerate(zip(asked, results, strict=False)):
                assert chunks == list(token_stream_source("stream-256", seed))
                assert stream.stamps is not None
                assert stream.stamps.rid == stream.rid
                in_order(stream.stamps, sent_ns, read_ns)
            assert plain.stamps is None  # not asked, not sent

    run(main(), event_loop_kind)


def test_a_request_that_waited_for_a_slot_is_scheduled_when_it_is_freed(
    event_loop_kind: str, engines: Callable[..., EngineProcess], tmp_path: Path
) -> None:
    """A batch of one: the second request queues until the first has finished, and its
    stamps say so; the first never waited."""
    engine = engines("--endpoint", f"ipc://{tmp_path}/e", "--max-batch", "1", *FAST)

    async def main() -> None:
        async with EngineClient(engine.endpoint, hop_codec("msgspec-msgpack")) as client:
            first = await client.open_stream(add(1, want_stamps=True, max_tokens=64))
            second = await client.open_stream(add(2, want_stamps=True, max_tokens=64))
            await asyncio.gather(drain(first), drain(second))
            assert first.stamps is not None
            assert second.stamps is not None
            assert second.stamps.arrived_ns < first.stamps.last_token_ns
            assert second.stamps.scheduled_ns >= first.stamps.last_token_ns
            queued_ns = second.stamps.scheduled_ns - second.stamps.arrived_ns
            decoded_ns = first.stamps.last_token_ns - first.stamps.first_token_ns
            assert queued_ns > decoded_ns  # it waited out the first one's whole decode

    run(main(), event_loop_kind)


def test_the_service_puts_the_engine_stamps_on_its_stream_before_the_last_chunk(
    event_loop_kind: str, engines: Callable[..., EngineProcess], tmp_path: Path
) -> None:
    engine = engines("--endpoint", f"ipc://{tmp_path}/e", "--codec", "protobuf", *FAST)

    async def main() -> None:
        async with EngineClient(engine.endpoint, hop_codec("protobuf")) as client:
            await client.wait_ready(WAIT_S)
            service = EngineService(token_stream_source, client, want_stamps=True)
            stream = service.open(GenerateRequest(workload="stream-256", seed=4))
            stamps = stream.stamps
            seen_at_last = 0
            async for batch in service.batches(stream, max_chunks=8):
                if batch[-1].finish_reason is not None:
                    seen_at_last = stamps.last_token_ns
            assert seen_at_last  # there when the last chunk was handed over
            assert 0 < stamps.arrived_ns <= stamps.scheduled_ns < stamps.first_token_ns
            assert stamps.first_token_ns <= stamps.last_token_ns == seen_at_last
            unstamped = EngineService(token_stream_source, client)
            other = unstamped.open(GenerateRequest(workload="stream-16"))
            assert [c async for c in unstamped.generate(other)] == list(other.chunks)
            assert other.stamps.last_token_ns == 0

    run(main(), event_loop_kind)


@pytest.mark.parametrize("transport", ["ipc", "tcp"])
def test_a_killed_engine_is_noticed_at_once_not_after_the_liveness_timeout(
    transport: str, event_loop_kind: str, engines: Callable[..., EngineProcess], tmp_path: Path
) -> None:
    """SIGKILL: no goodbye, and the client was not told the engine's process; its socket
    monitor sees the connection close. The liveness timeout is far longer than the wait."""
    where = f"ipc://{tmp_path}/e" if transport == "ipc" else "tcp://127.0.0.1:0"
    engine = engines("--endpoint", where)  # the default step model: streams take a while

    async def main() -> None:
        codec = hop_codec("msgspec-msgpack")
        async with EngineClient(engine.endpoint, codec, liveness_timeout_s=LIVENESS_S) as client:
            await client.wait_ready(WAIT_S)
            assert client.ready
            service = EngineService(token_stream_source, client)
            streams = [
                service.open(GenerateRequest(workload="stream-2048", seed=s)) for s in (1, 2)
            ]
            batches = [service.batches(s, max_chunks=1) for s in streams]
            for each in batches:
                assert await anext(each)
            engine.kill()
            async with asyncio.timeout(NOTICED_S):
                for each in batches:
                    with pytest.raises(ServiceUnavailableError) as failed:
                        async for _ in each:
                            pass
                    assert isinstance(failed.value.__cause__, hop.EngineGoneError)
                    assert "closed its connection" in str(failed.value)
            assert not client.ready
            assert client.stats()["engine_lost"] == 1

    run(main(), event_loop_kind)


def test_the_client_is_ready_again_once_a_new_engine_answers(
    event_loop_kind: str, engines: Callable[..., EngineProcess], tmp_path: Path
) -> None:
    endpoint = f"ipc://{tmp_path}/e"
    first = engines("--endpoint", endpoint, *FAST)

    async def main() -> None:
        codec = hop_codec("msgspec-msgpack")
        async with EngineClient(endpoint, codec, liveness_timeout_s=LIVENESS_S) as client:
            await client.wait_ready(WAIT_S)
            first.kill()
            async with asyncio.timeout(NOTICED_S):
                while client.ready:
                    await asyncio.sleep(0.01)
            engines("--endpoint", endpoint, *FAST)
            await client.wait_ready(WAIT_S)
            assert client.ready
            chunks = await drain(await client.open_stream(add(3)))
            assert chunks == list(token_stream_source("stream-256", 3))

    run(main(), event_loop_kind)
