"""The engine in its own process and a frontend's client on the hop, on asyncio and uvloop:
streams through every hop codec equal the service's chunks; failures end streams as typed
errors (the engine killed, stopped or restarted mid-stream; overloaded; refused codecs); the
engine survives hostile bytes and frees the requests of a frontend that vanished; PAUSE and
RESUME keep a slow consumer's stream whole. Real processes on loopback and IPC, started and
stopped here; no wall-clock assertion (timeouts are generous bounds only)."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import zmq

import inferwire.codecs as ic
from inferwire._runtime import loops
from inferwire.engine import hop
from inferwire.engine.client import EngineClient, EngineStream
from inferwire.engine.hop_codecs import hop_codec
from inferwire.engine.launch import EngineProcess
from inferwire.transports import GenerateRequest
from inferwire.transports.engine_service import EngineService
from inferwire.workloads import cut_stream, token_stream_source

WAIT_S = 60.0
"""A bound on any wait: only a hang reaches it."""
FAST = ("--step-scale", "0.05")
"""A decode step of about a quarter of a millisecond: stream-256 in well under a second."""


STAGES = {
    "queue_s",
    "first_scheduled_s",
    "prefill_s",
    "decode_s",
    "batch_wait_s",
    "encode_s",
    "ttft_s",
    "engine_s",
}
"""What END_STATS carries (seconds)."""


def expected(workload: str = "stream-256", seed: int = 0) -> list[ic.TokenChunk]:
    return list(token_stream_source(workload, seed))


@pytest.fixture
def endpoint(tmp_path: Path) -> str:
    return f"ipc://{tmp_path}/engine.sock"


@pytest.fixture
def engine_factory() -> Iterator[Callable[..., EngineProcess]]:
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


async def drain(stream: EngineStream, max_chunks: int = 32) -> list[ic.TokenChunk]:
    chunks: list[ic.TokenChunk] = []
    while batch := await stream.next_batch(max_chunks):
        chunks += batch
    return chunks


def add(seed: int = 0, **fields: Any) -> hop.Add:
    return hop.Add(rid="-", workload=fields.pop("workload", "stream-256"), seed=seed, **fields)


@pytest.mark.parametrize("codec", ["msgspec-msgpack", "protobuf", "delta", "orjson", "pickle"])
def test_streams_through_each_hop_codec(
    codec: str, event_loop_kind: str, engine_factory: Callable[..., EngineProcess], endpoint: str
) -> None:
    engine = engine_factory("--endpoint", endpoint, "--codec", codec, "--allow-pickle", *FAST)
    assert engine.endpoint == endpoint
    assert engine.codec == codec

    async def main() -> None:
        codec_ = hop_codec(codec, allow_pickle=True)
        async with EngineClient(endpoint, codec_, process=engine.process) as client:
            streams = [
                await client.open_stream(add(seed, want_stage_times=True)) for seed in range(6)
            ]
            results = await asyncio.gather(*(drain(s) for s in streams))
            for seed, (stream, chunks) in enumerate(zip(streams, results, strict=True)):
                assert chunks == expected(seed=seed)
                assert stream.stage_times is not None
                assert set(stream.stage_times) == STAGES
            stats = client.stats()
            assert stats["chunks_decoded"] == 6 * 256
            assert stats["decode_ns"] > 0
            assert stats["open_streams"] == 0
            engine_stats = await client.engine_stats()
            assert engine_stats["requests_finished"] == 6
            assert engine_stats["requests"] == 0
            assert engine_stats["kv_blocks_used"] == 0

    run(main(), event_loop_kind)


def test_the_service_streams_through_the_engine_over_tcp(
    event_loop_kind: str, engine_factory: Callable[..., EngineProcess]
) -> None:
    engine = engine_factory("--endpoint", "tcp://127.0.0.1:0", *FAST)
    assert engine.endpoint.startswith("tcp://127.0.0.1:")
    assert not engine.endpoint.endswith(":0")

    async def main() -> None:
        async with EngineClient(engine.endpoint, hop_codec("msgspec-msgpack")) as client:
            service = EngineService(token_stream_source, client, stage_times=True)
            request = GenerateRequest(workload="stream-256", seed=5, max_tokens=40, model="m")
            stream = service.open(request)
            got = [c async for c in service.generate(stream)]
            assert got == list(service.chunks(request))
            assert got[-1].finish_reason == "length"
            assert got[0].model == "m"
            assert service.active_streams == 0
            assert service.streams_started == 1
            assert service.last_stage_times is not None
            assert service.last_stage_times["hop_decode_s"] > 0
            assert service.hop_stats()["chunks_decoded"] == len(got)

    run(main(), event_loop_kind)


def test_a_closed_consumer_aborts_its_request(
    event_loop_kind: str, engine_factory: Callable[..., EngineProcess], endpoint: str
) -> None:
    engine_factory("--endpoint", endpoint)  # the default step model: a stream takes a while

    async def main() -> None:
        async with EngineClient(endpoint, hop_codec("msgspec-msgpack")) as client:
            service = EngineService(token_stream_source, client)
            stream = service.open(GenerateRequest(workload="stream-2048"))
            batches = service.batches(stream, max_chunks=1)
            await anext(batches)
            await batches.aclose()
            assert service.active_streams == 0
            await _until(client, lambda s: s["requests"] == 0 and s["kv_blocks_used"] == 0)
            assert (await client.engine_stats())["requests_aborted"] == 1

    run(main(), event_loop_kind)


async def _until(client: EngineClient, condition: Callable[[hop.Stats], bool]) -> hop.Stats:
    async with asyncio.timeout(WAIT_S):
        while not condition(stats := await client.engine_stats()):
            await asyncio.sleep(0.05)
    return stats


@pytest.mark.parametrize("how", ["exit", "liveness"])
def test_an_engine_killed_mid_stream_fails_every_open_stream(
    how: str, event_loop_kind: str, engine_factory: Callable[..., EngineProcess], endpoint: str
) -> None:
    """With the process known, its exit is seen at once; without, the liveness timeout."""
    engine = engine_factory("--endpoint", endpoint, "--codec", "delta")

    async def main() -> None:
        process = engine.process if how == "exit" else None
        liveness_s = 30.0 if how == "exit" else 1.0
        async with EngineClient(
            endpoint, hop_codec("delta"), process=process, liveness_timeout_s=liveness_s
        ) as client:
            streams = [
                await client.open_stream(add(seed, workload="stream-2048")) for seed in range(4)
            ]
            for stream in streams:
                assert await stream.next_batch(1)
            if how == "exit":
                engine.kill()
            else:
                os.kill(engine.pid, signal.SIGSTOP)  # alive, but silent
            outcomes = await asyncio.gather(*(drain(s) for s in streams), return_exceptions=True)
            for outcome in outcomes:
                assert isinstance(outcome, hop.EngineGoneError), outcome
            assert client.stats()["engine_lost"] == 1
            with pytest.raises(hop.EngineGoneError):
                await client.open_stream(add())  # no engine welcomes it
            if how == "liveness":
                # it wakes: the client greets it in a new session, so it drops the old one's
                os.kill(engine.pid, signal.SIGCONT)
                await client.wait_ready(WAIT_S)
                stats = await _until(
                    client, lambda s: s["requests"] == 0 and s["kv_blocks_used"] == 0
                )
                assert stats["requests_aborted"] == len(streams)
                assert await drain(await client.open_stream(add(3))) == expected(seed=3)

    run(main(), event_loop_kind)


def test_a_restarted_engine_serves_new_streams(
    event_loop_kind: str, engine_factory: Callable[..., EngineProcess], endpoint: str
) -> None:
    first = engine_factory("--endpoint", endpoint, "--codec", "protobuf")

    async def main() -> None:
        async with EngineClient(endpoint, hop_codec("protobuf"), liveness_timeout_s=1.0) as client:
            stream = await client.open_stream(add(workload="stream-2048"))
            assert await stream.next_batch(1)
            first.kill()
            with pytest.raises(hop.EngineGoneError):
                await drain(stream)
            # the same endpoint: ZeroMQ reconnects by itself
            engine_factory("--endpoint", endpoint, "--codec", "protobuf", *FAST)
            await client.wait_ready(WAIT_S)
            assert await drain(await client.open_stream(add(3))) == expected(seed=3)

    run(main(), event_loop_kind)


def test_overload_is_a_typed_error(
    event_loop_kind: str, engine_factory: Callable[..., EngineProcess], endpoint: str
) -> None:
    engine_factory("--endpoint", endpoint, "--max-batch", "1", "--max-waiting", "1")

    async def main() -> None:
        async with EngineClient(endpoint, hop_codec("msgspec-msgpack")) as client:
            streams = [await client.open_stream(add(seed, max_tokens=64)) for seed in range(6)]
            outcomes = await asyncio.gather(*(drain(s) for s in streams), return_exceptions=True)
            overloaded = [o for o in outcomes if isinstance(o, hop.EngineOverloadedError)]
            whole = [o for o in outcomes if isinstance(o, list)]
            assert overloaded
            assert whole
            assert len(overloaded) + len(whole) == len(outcomes)
            assert (await client.engine_stats())["overloaded"] == len(overloaded)

    run(main(), event_loop_kind)


def test_a_bad_request_is_a_typed_error(
    engine_factory: Callable[..., EngineProcess], endpoint: str
) -> None:
    engine_factory("--endpoint", endpoint, *FAST)

    async def main() -> None:
        async with EngineClient(endpoint, hop_codec("msgspec-msgpack")) as client:
            stream = await client.open_stream(add(workload="no-such-workload"))
            with pytest.raises(hop.EngineRequestError, match="no-such-workload"):
                await drain(stream)
            assert await drain(await client.open_stream(add(1))) == expected(seed=1)

    run(main(), "asyncio")


def test_codec_mismatch_and_pickle_are_refused(
    engine_factory: Callable[..., EngineProcess], endpoint: str
) -> None:
    refused = subprocess.run(
        [
            sys.executable,
            "-m",
            "inferwire.cli",
            "engine",
            "--endpoint",
            endpoint,
            "--codec",
            "pickle",
        ],
        capture_output=True,
        text=True,
        timeout=WAIT_S,
        check=False,
    )
    assert refused.returncode == 2
    assert "allow" in refused.stderr
    engine_factory("--endpoint", endpoint, "--codec", "pickle", "--allow-pickle", *FAST)

    async def main() -> None:
        async with EngineClient(endpoint, hop_codec("msgspec-msgpack")) as client:
            with pytest.raises(hop.HopRefusedError, match="pickle"):
                await client.open_stream(add())
        async with EngineClient(endpoint, hop_codec("pickle", allow_pickle=True)) as client:
            assert await drain(await client.open_stream(add(2))) == expected(seed=2)

    run(main(), "asyncio")


def test_a_slow_consumer_pauses_and_resumes_without_losing_chunks(
    event_loop_kind: str, engine_factory: Callable[..., EngineProcess], endpoint: str
) -> None:
    engine_factory("--endpoint", endpoint, "--codec", "delta", *FAST)

    async def main() -> None:
        codec = hop_codec("delta")
        async with EngineClient(endpoint, codec, high_water=8, low_water=2) as client:
            fast = await client.open_stream(add(1))
            slow = await client.open_stream(add(2))
            slow_chunks: list[ic.TokenChunk] = []

            async def consume_slowly() -> None:
                while batch := await slow.next_batch(1):
                    slow_chunks.extend(batch)
                    await asyncio.sleep(0.002)

            fast_chunks, _ = await asyncio.gather(drain(fast), consume_slowly())
            assert fast_chunks == expected(seed=1)
            assert slow_chunks == expected(seed=2)
            stats = client.stats()
            assert stats["pauses"] > 0
            assert stats["resumes"] > 0

    run(main(), event_loop_kind)


def test_the_engine_survives_hostile_bytes(
    engine_factory: Callable[..., EngineProcess], endpoint: str
) -> None:
    engine_factory("--endpoint", endpoint, *FAST)
    context = zmq.Context()
    raw = context.socket(zmq.DEALER)
    raw.setsockopt(zmq.LINGER, 0)
    raw.setsockopt(zmq.RCVTIMEO, int(WAIT_S * 1000))
    raw.connect(endpoint)
    try:
        for frames in (
            [b"A", b"\xff" * 40],
            [b"Z"],
            [b"", b"", b""],
            [b"H", b"\x81\xa1x\x01"],
            [hop.ADD, hop.add(add())[1]],  # a request before HELLO
        ):
            raw.send_multipart(frames)
            answer = hop.parse_from_engine(raw.recv_multipart())
            assert isinstance(answer, hop.Failure)
            assert answer.kind in ("protocol", "unknown-frontend")
        raw.send_multipart(hop.ping())
        assert isinstance(hop.parse_from_engine(raw.recv_multipart()), hop.Heartbeat)
    finally:
        raw.close(linger=0)
        context.term()

    async def main() -> None:
        async with EngineClient(endpoint, hop_codec("msgspec-msgpack")) as client:
            assert await drain(await client.open_stream(add(4))) == expected(seed=4)
            assert (await client.engine_stats())["protocol_errors"] >= 4

    run(main(), "asyncio")


FRONTEND = """
import asyncio, sys
from inferwire.engine import hop
from inferwire.engine.client import EngineClient
from inferwire.engine.hop_codecs import hop_codec

async def main():
    client = await EngineClient(sys.argv[1], hop_codec("msgspec-msgpack")).start()
    streams = [await client.open_stream(hop.Add(rid="-", workload="stream-2048", seed=s))
               for s in range(3)]
    for stream in streams:
        await stream.next_batch(1)
    print("streaming", flush=True)
    await asyncio.sleep(3600)

asyncio.run(main())
"""


@pytest.mark.parametrize("liveness", [False, True])
def test_a_vanished_frontend_has_its_requests_freed(
    liveness: bool, engine_factory: Callable[..., EngineProcess], endpoint: str
) -> None:
    """SIGKILL (ZeroMQ can no longer route to it), or SIGSTOP (silent: the liveness
    timeout); then a new frontend streams at once."""
    engine_factory(
        "--endpoint", endpoint, "--liveness-timeout", "1", "--step", "decode_base_s=0.02"
    )
    frontend = subprocess.Popen(
        [sys.executable, "-c", FRONTEND, endpoint], stdout=subprocess.PIPE, text=True
    )
    try:
        assert frontend.stdout is not None
        assert frontend.stdout.readline().strip() == "streaming"
        if liveness:
            frontend.send_signal(signal.SIGSTOP)
        else:
            frontend.kill()

        async def main() -> None:
            async with EngineClient(endpoint, hop_codec("msgspec-msgpack")) as client:
                stats = await _until(
                    client,
                    lambda s: (
                        s["frontends_dropped"] >= 1
                        and s["running"] == 0
                        and s["kv_blocks_used"] == 0
                    ),
                )
                assert stats["requests_aborted"] == 3
                stream = await client.open_stream(add(6, max_tokens=16))
                assert await drain(stream) == cut_stream(expected(seed=6), 16)

        run(main(), "asyncio")
    finally:
        frontend.kill()
        frontend.wait(WAIT_S)
        if frontend.stdout is not None:
            frontend.stdout.close()


def test_a_frontend_that_stops_reading_loses_no_frame(
    engine_factory: Callable[..., EngineProcess], endpoint: str
) -> None:
    """The engine's socket to it fills (high-water mark 1): its messages wait in the engine's
    outbox and its requests are paused, never dropped; once it reads, every stream is whole."""
    engine_factory("--endpoint", endpoint, "--hwm", "1", "--liveness-timeout", "60", *FAST)
    codec = hop_codec("msgspec-msgpack")
    workload = "stream-2048-top5"  # about 1 MB a stream on the hop: more than socket buffers
    context = zmq.Context()
    raw = context.socket(zmq.DEALER)
    raw.setsockopt(zmq.LINGER, 0)
    raw.setsockopt(zmq.RCVHWM, 1)
    raw.setsockopt(zmq.RCVTIMEO, int(WAIT_S * 1000))
    raw.connect(endpoint)
    try:
        raw.send_multipart(hop.hello("raw", codec.name))
        assert isinstance(hop.parse_from_engine(raw.recv_multipart()), hop.Welcome)
        decoders = {}
        for seed in range(4):
            rid = f"r{seed}"
            raw.send_multipart(hop.add(hop.Add(rid=rid, workload=workload, seed=seed)))
            decoders[rid] = codec.stream_decoder()
        time.sleep(2.0)  # not reading: the engine's sends back up
        chunks: dict[str, list[ic.TokenChunk]] = {rid: [] for rid in decoders}
        stats_asked = False
        while not all(d.finished for d in decoders.values()):
            message = hop.parse_from_engine(raw.recv_multipart())
            if isinstance(message, hop.Outputs):
                for rid, frame in message.items:
                    chunks[rid] += decoders[rid].feed(frame)
            if not stats_asked:
                raw.send_multipart(hop.stats_query())
                stats_asked = True
        for seed in range(4):
            decoders[f"r{seed}"].close()
            assert chunks[f"r{seed}"] == expected(workload, seed)
        raw.send_multipart(hop.stats_query())
        while not isinstance(stats := hop.parse_from_engine(raw.recv_multipart()), dict):
            pass
        assert stats["outbox_waits"] > 0
        assert stats["requests_finished"] == 4
    finally:
        raw.close(linger=0)
        context.term()


class FakeEngine:
    """A ROUTER in a thread that welcomes a frontend and answers each ADD with what
    ``answer(rid, n)`` returns (the n-th ADD): an engine that sends hostile bytes."""

    def __init__(
        self, endpoint: str, codec: str, answer: Callable[[bytes, int], list[list[bytes]]]
    ) -> None:
        self.context = zmq.Context()
        self.socket = self.context.socket(zmq.ROUTER)
        self.socket.setsockopt(zmq.LINGER, 0)
        self.socket.bind(endpoint)
        self.codec = codec
        self.answer = answer
        self.stopping = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        adds = 0
        while not self.stopping.is_set():
            if not self.socket.poll(50):
                continue
            identity, *frames = self.socket.recv_multipart()
            message = hop.parse_from_frontend(frames)
            replies: list[list[bytes]] = []
            if isinstance(message, hop.Hello):
                replies = [hop.welcome("fake", self.codec)]
            elif isinstance(message, hop.Bare) and message.kind == hop.PING:
                replies = [hop.heartbeat("fake")]
            elif isinstance(message, hop.Add):
                replies = self.answer(message.rid.encode(), adds)
                adds += 1
            for reply in replies:
                self.socket.send_multipart([identity, *reply])

    def close(self) -> None:
        self.stopping.set()
        self.thread.join(WAIT_S)
        self.socket.close(linger=0)
        self.context.term()


def test_hostile_bytes_from_the_engine_fail_streams_with_typed_errors(
    event_loop_kind: str, endpoint: str
) -> None:
    codec = hop_codec("msgspec-msgpack")
    chunks = expected()

    def answer(rid: bytes, n: int) -> list[list[bytes]]:
        encoder = codec.stream_encoder()
        if n == 0:  # a frame that is not the codec's
            return [hop.outputs([(rid, b"\x00\x00\x00\x00\x05garbage")])]
        if n == 1:  # a chunk lost on the way: the end frame's count disagrees
            first, _lost = encoder.encode(chunks[0]), encoder.encode(chunks[1])
            return [hop.outputs([(rid, first)]), hop.outputs([(rid, encoder.end())])]
        if n == 2:  # a whole stream, to show the client still works
            frames = [encoder.encode(c) for c in chunks[:3]]
            return [hop.outputs([(rid, b"".join(frames) + encoder.end())])]
        if n == 3:
            return []  # left open
        return [[hop.OUTPUTS, rid]]  # a message that does not parse: every stream may miss it

    fake = FakeEngine(endpoint, codec.name, answer)

    async def main() -> None:
        async with EngineClient(endpoint, codec) as client:
            with pytest.raises(hop.StreamFailedError):
                await drain(await client.open_stream(add()))
            with pytest.raises(hop.StreamFailedError, match="sent 2 messages, 1 arrived"):
                await drain(await client.open_stream(add()))
            assert await drain(await client.open_stream(add())) == chunks[:3]
            streams = [await client.open_stream(add()) for _ in range(2)]
            for stream in streams:
                with pytest.raises(hop.StreamFailedError, match="unreadable"):
                    await drain(stream)
            assert client.stats()["open_streams"] == 0
            assert client.stats()["protocol_errors"] == 1

    try:
        run(main(), event_loop_kind)
    finally:
        fake.close()


@pytest.mark.parametrize(
    ("options", "message"),
    [
        (("--endpoint", "udp://x"), "neither ipc"),
        (("--endpoint", "tcp://127.0.0.1:x"), "not tcp://HOST:PORT"),
        (("--step", "no_such_s=1"), "--step no_such_s=1"),
        (("--step", "decode_base_s=-1"), "--step decode_base_s=-1"),
        (("--codec", "tensor"), "invalid choice"),
    ],
)
def test_engine_command_mistakes_are_one_line(options: tuple[str, ...], message: str) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "inferwire.cli", "engine", *options],
        capture_output=True,
        text=True,
        timeout=WAIT_S,
        check=False,
    )
    assert done.returncode == 2
    assert message in done.stderr
    assert "Traceback" not in done.stderr
