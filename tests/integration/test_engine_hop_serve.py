"""``inferwire serve --engine``: every transport's server as a frontend of a real engine
process, driven by the project's own clients, on asyncio and uvloop. Streams equal the
service's chunks through each hop codec; an engine killed mid-stream fails every open stream
on every transport (an error, never a short complete stream); an overloaded engine fails the
streams it refused; a frontend killed mid-stream has its requests freed and a restarted one
streams at once. Real processes on loopback, started and stopped here; no wall-clock
assertion."""

from __future__ import annotations

import asyncio
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import openai
import pytest

import inferwire.transports as it
from inferwire._runtime import loops
from inferwire._runtime.child import ChildProcess
from inferwire.engine.client import EngineClient
from inferwire.engine.hop_codecs import hop_codec
from inferwire.engine.launch import EngineProcess
from inferwire.transports.server_process import ServerProcess
from inferwire.workloads import MODEL, cut_stream, token_stream_source

WAIT_S = 60.0
FAST = ("--step-scale", "0.05")
HOP_CODECS = ("msgspec-msgpack", "protobuf", "delta", "pickle")


def frontend(transport: str, engine: str, hop: str, loop: str, *extra: str) -> ServerProcess:
    """``inferwire serve --engine`` in a child process, started."""
    options = ("--no-metrics", "--loop", loop, "--engine", engine, "--engine-codec", hop)
    server = ServerProcess(
        "serve",
        "--transport",
        transport,
        "--codec",
        "protobuf",
        *options,
        "--allow-pickle",
        *extra,
        stderr=subprocess.DEVNULL,
    )
    return server.start()


@pytest.fixture
def processes() -> Iterator[Callable[..., Any]]:
    """Starts engines (``engine(*options)``) and frontends (``frontend(...)``) that the
    test's end stops, whatever happened."""
    started: list[ChildProcess] = []

    def start(kind: str, *args: Any) -> Any:
        if kind == "engine":
            made: ChildProcess = EngineProcess(*args, stderr=subprocess.DEVNULL).start()
        else:
            made = frontend(*args)
        started.append(made)
        return made

    yield start
    for process in reversed(started):
        process.kill()


def run(coro: Any, loop: str) -> Any:
    async def bounded() -> Any:
        async with asyncio.timeout(WAIT_S * 2):
            return await coro

    return loops.run(bounded(), loop)


async def stream_all(client: it.Client, seed: int, **fields: Any) -> list[Any]:
    request = it.GenerateRequest(workload=fields.pop("workload", "stream-256"), seed=seed, **fields)
    return [chunk async for chunk in client.generate(request)]


# each loop runs every transport once and every hop codec once (a rotation, not the product:
# the product is 32 server processes on a 2-core machine)
CASES = [
    pytest.param(transport, hop, id=f"{transport}-{hop}")
    for transport, hop in zip(it.TRANSPORTS, HOP_CODECS, strict=True)
]


@pytest.mark.parametrize(("transport", "hop"), CASES)
def test_every_transport_serves_the_engine_streams(
    transport: str,
    hop: str,
    event_loop_kind: str,
    processes: Callable[..., Any],
    tmp_path: Path,
) -> None:
    engine = processes(
        "engine", "--endpoint", f"ipc://{tmp_path}/e", "--codec", hop, "--allow-pickle", *FAST
    )
    frontend = processes("frontend", transport, engine.endpoint, hop, event_loop_kind)

    async def main() -> None:
        async with it.connect(transport, frontend.address, codec="protobuf") as client:
            results = await asyncio.gather(*(stream_all(client, seed) for seed in range(4)))
            for seed, chunks in enumerate(results):
                assert chunks == list(token_stream_source("stream-256", seed))
            cut = await stream_all(client, 9, max_tokens=20)
            assert cut == cut_stream(token_stream_source("stream-256", 9), 20)

    run(main(), event_loop_kind)


@pytest.mark.parametrize("transport", it.TRANSPORTS)
def test_an_engine_killed_mid_stream_fails_every_stream_on_every_transport(
    transport: str, event_loop_kind: str, processes: Callable[..., Any], tmp_path: Path
) -> None:
    engine = processes("engine", "--endpoint", f"ipc://{tmp_path}/e")  # the default step model
    frontend = processes(
        "frontend",
        transport,
        engine.endpoint,
        "msgspec-msgpack",
        event_loop_kind,
        "--engine-liveness-timeout",
        "1",
    )

    async def main() -> None:
        async with it.connect(transport, frontend.address, codec="protobuf") as client:
            started = asyncio.Event()
            counts: list[int] = []

            async def one(seed: int) -> None:
                request = it.GenerateRequest(workload="stream-2048", seed=seed)
                count = 0
                try:
                    async for _ in client.generate(request):
                        count += 1
                        started.set()
                finally:
                    counts.append(count)

            tasks = [asyncio.ensure_future(one(seed)) for seed in range(3)]
            await started.wait()
            await asyncio.sleep(0.1)
            engine.kill()
            outcomes = await asyncio.gather(*tasks, return_exceptions=True)
            for outcome in outcomes:
                assert isinstance(outcome, it.TransportError), outcome
            assert all(count < 2048 for count in counts)

    run(main(), event_loop_kind)


def test_an_overloaded_engine_fails_the_streams_it_refused(
    processes: Callable[..., Any], tmp_path: Path
) -> None:
    engine = processes(
        "engine", "--endpoint", f"ipc://{tmp_path}/e", "--max-batch", "1", "--max-waiting", "1"
    )
    frontend = processes("frontend", "http2", engine.endpoint, "msgspec-msgpack", "asyncio")

    async def main() -> None:
        async with it.connect("http2", frontend.address, codec="protobuf") as client:
            outcomes = await asyncio.gather(
                *(stream_all(client, seed, max_tokens=64) for seed in range(6)),
                return_exceptions=True,
            )
            failed = [o for o in outcomes if isinstance(o, it.TransportError)]
            whole = [o for o in outcomes if isinstance(o, list)]
            assert failed
            assert whole
            assert len(failed) + len(whole) == len(outcomes)
            for chunks in whole:
                assert chunks[-1].finish_reason == "length"

    run(main(), "asyncio")


def test_a_killed_frontend_has_its_requests_freed_and_a_new_one_streams(
    event_loop_kind: str, processes: Callable[..., Any], tmp_path: Path
) -> None:
    engine = processes(
        "engine", "--endpoint", f"ipc://{tmp_path}/e", "--step", "decode_base_s=0.02"
    )
    first = processes("frontend", "tcp", engine.endpoint, "msgspec-msgpack", event_loop_kind)

    async def main() -> None:
        async with it.connect("tcp", first.address, codec="protobuf") as client:
            chunks = client.generate(it.GenerateRequest(workload="stream-2048"))
            await anext(chunks)
            first.kill()
            with pytest.raises(it.TransportError):
                async for _ in chunks:
                    pass
        async with EngineClient(engine.endpoint, hop_codec("msgspec-msgpack")) as watcher:
            async with asyncio.timeout(WAIT_S):
                while True:
                    stats = await watcher.engine_stats()
                    if stats["frontends_dropped"] >= 1 and stats["kv_blocks_used"] == 0:
                        break
                    await asyncio.sleep(0.05)
            assert stats["requests_aborted"] == 1
            assert stats["running"] == 0
        second = processes("frontend", "tcp", engine.endpoint, "msgspec-msgpack", event_loop_kind)
        async with it.connect("tcp", second.address, codec="protobuf") as client:
            got = await stream_all(client, 4, max_tokens=12)
            assert got == cut_stream(token_stream_source("stream-256", 4), 12)

    run(main(), event_loop_kind)


def test_serve_refuses_pickle_unless_allowed(tmp_path: Path) -> None:
    refused = subprocess.run(
        [
            sys.executable,
            "-m",
            "inferwire.cli",
            "serve",
            "--transport",
            "tcp",
            "--engine",
            f"ipc://{tmp_path}/e",
            "--engine-codec",
            "pickle",
        ],
        capture_output=True,
        text=True,
        timeout=WAIT_S,
        check=False,
    )
    assert refused.returncode == 2
    assert "allow" in refused.stderr


def test_serve_refuses_an_engine_of_another_codec(
    processes: Callable[..., Any], tmp_path: Path
) -> None:
    engine = processes("engine", "--endpoint", f"ipc://{tmp_path}/e", "--codec", "protobuf")
    refused = subprocess.run(
        [
            sys.executable,
            "-m",
            "inferwire.cli",
            "serve",
            "--transport",
            "tcp",
            "--engine",
            engine.endpoint,
            "--engine-codec",
            "delta",
        ],
        capture_output=True,
        text=True,
        timeout=WAIT_S,
        check=False,
    )
    assert refused.returncode == 2
    assert "refused this frontend" in refused.stderr
    assert "'protobuf'" in refused.stderr


def test_a_frontend_started_before_its_engine_serves_once_it_is_up(
    processes: Callable[..., Any], tmp_path: Path
) -> None:
    endpoint = f"ipc://{tmp_path}/e"
    frontend = processes(
        "frontend",
        "http1",
        endpoint,
        "msgspec-msgpack",
        "asyncio",
        "--engine-liveness-timeout",
        "1",
    )

    async def main() -> None:
        async with it.connect("http1", frontend.address, codec="protobuf") as client:
            with pytest.raises(it.TransportError):
                await stream_all(client, 0)  # no engine: the stream fails, it does not hang
            processes("engine", "--endpoint", endpoint, *FAST)
            async with asyncio.timeout(WAIT_S):
                while True:
                    try:
                        chunks = await stream_all(client, 1)
                    except it.TransportError:
                        continue  # the engine is not up yet
                    break
            assert chunks == list(token_stream_source("stream-256", 1))

    run(main(), "asyncio")


def test_the_openai_sdk_streams_through_the_engine(
    processes: Callable[..., Any], tmp_path: Path
) -> None:
    """The client people use against a frontend of the engine: the openai SDK's streamed and
    non-streamed chat completions carry the engine's tokens whole, usage included."""
    engine = processes("engine", "--endpoint", f"ipc://{tmp_path}/e", *FAST)
    frontend = processes("frontend", "http1", engine.endpoint, "msgspec-msgpack", "asyncio")
    expected = list(token_stream_source("stream-16", 3))
    request: dict[str, Any] = {
        "model": MODEL,
        "messages": [{"role": "user", "content": "hi"}],
        "seed": 3,
        "extra_body": {"workload": "stream-16"},
    }
    with openai.OpenAI(
        base_url=f"http://{frontend.address}/v1", api_key="unused", max_retries=0, timeout=WAIT_S
    ) as sdk:
        stream = sdk.chat.completions.create(
            **request, stream=True, stream_options={"include_usage": True}
        )
        events = list(stream)
        text = "".join(e.choices[0].delta.content or "" for e in events if e.choices)
        assert text == "".join(c.text for c in expected)
        finishes = [e.choices[0].finish_reason for e in events if e.choices]
        assert finishes[-1] == expected[-1].finish_reason
        assert events[-1].usage is not None
        assert events[-1].usage.completion_tokens == sum(len(c.token_ids) for c in expected)

        completion = sdk.chat.completions.create(**request, max_tokens=5)
        cut = cut_stream(expected, 5)
        assert completion.choices[0].message.content == "".join(c.text for c in cut)
        assert completion.choices[0].finish_reason == "length"
