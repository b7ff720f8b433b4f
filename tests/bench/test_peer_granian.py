"""The granian peer (granian + Starlette, its Rust HTTP/1.1 and HTTP/2): it serves the peers'
app byte for byte as the uvicorn peer does, to httpx (a client nobody here wrote) and to ours;
the benchmark's CPU count takes in the worker that serves, not only the process it started;
it stops with its worker, a connection still open; and the report holds it to its own target,
saying nothing of it in a run without it."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import psutil  # type: ignore[import-untyped, unused-ignore]
import pytest

import inferwire.codecs as ic
import inferwire.transports as it
from inferwire._runtime import loops
from inferwire.bench import bench_peers
from inferwire.bench.procs import peer_servers
from inferwire.bench.procs.placement import cpu_clock
from inferwire.bench.report import peers as peers_report
from inferwire.bench.report.results import PEERS_RAW
from inferwire.transports import server_process
from inferwire.transports.openai_api import chat_request_body
from inferwire.workloads import MODEL, token_stream_source
from tests.helpers.faults import MESSAGES

CODEC = "orjson"
# granian's mode: our client's transport, httpx's protocol, the peer's CLI options
MODES = {"http1": ("HTTP/1.1", ()), "http2": ("HTTP/2", ("--http2",))}
REQUEST = it.GenerateRequest(workload="stream-256", seed=3, max_tokens=17, model=MODEL)
WHOLE = it.GenerateRequest(workload="stream-256")


def _expected(request: it.GenerateRequest) -> list[ic.TokenChunk]:
    return list(it.SimulatedService(token_stream_source).chunks(request))


@pytest.fixture(scope="module")
def uvicorn() -> Iterator[server_process.ServerProcess]:
    with peer_servers.peer("uvicorn", CODEC) as process:
        yield process


@pytest.fixture(scope="module")
def granian() -> Iterator[dict[str, server_process.ServerProcess]]:
    """granian in each mode, both up for the module."""
    with (
        peer_servers.peer("granian", CODEC, *MODES["http1"][1]) as http1,
        peer_servers.peer("granian", CODEC, *MODES["http2"][1]) as http2,
    ):
        yield {"http1": http1, "http2": http2}


async def _post(address: str, body: bytes, http2: bool) -> httpx.Response:
    # http1=False: HTTP/2 with prior knowledge, as our client speaks it
    async with httpx.AsyncClient(http1=not http2, http2=http2) as client:
        return await client.post(
            f"http://{address}/v1/chat/completions",
            content=body,
            headers={"content-type": "application/json"},
        )


@pytest.mark.parametrize("mode", list(MODES))
def test_granian_sends_the_uvicorn_peers_bytes(
    granian: dict[str, server_process.ServerProcess],
    uvicorn: server_process.ServerProcess,
    mode: str,
) -> None:
    body = chat_request_body(REQUEST)
    theirs = asyncio.run(_post(granian[mode].address, body, http2=mode == "http2"))
    reference = asyncio.run(_post(uvicorn.address, body, http2=False))
    assert (theirs.status_code, reference.status_code) == (200, 200)
    assert theirs.http_version == MODES[mode][0]
    assert theirs.headers["server"] == "granian"  # not another server on a reused port
    assert theirs.headers["content-type"] == reference.headers["content-type"]
    assert theirs.content == reference.content
    decoder = ic.get(CODEC, extensions=True).stream_decoder()
    assert decoder.feed(theirs.content) == _expected(REQUEST)
    assert decoder.finished


@pytest.mark.parametrize("mode", list(MODES))
def test_our_client_streams_the_services_chunks(
    granian: dict[str, server_process.ServerProcess], mode: str
) -> None:
    async def go() -> list[list[object]]:
        async with it.connect(mode, granian[mode].address, codec=CODEC) as client:

            async def one(request: it.GenerateRequest) -> list[object]:
                return [chunk async for chunk in client.generate(request)]

            return await asyncio.gather(*(one(r) for r in [WHOLE, REQUEST] * 2))

    assert asyncio.run(go()) == [_expected(r) for r in [WHOLE, REQUEST] * 2]
    assert granian[mode].loop == loops.requested_loop()


def test_a_bad_request_is_400(granian: dict[str, server_process.ServerProcess]) -> None:
    body = {"workload": "no-such", "stream": True, "messages": MESSAGES}

    async def go() -> httpx.Response:
        async with httpx.AsyncClient() as client:
            return await client.post(
                f"http://{granian['http1'].address}/v1/chat/completions", json=body
            )

    response = asyncio.run(go())
    assert response.status_code == 400
    assert "unknown workload" in response.json()["error"]["message"]


def test_the_cpu_counted_is_the_worker_that_serves(
    granian: dict[str, server_process.ServerProcess],
) -> None:
    """granian's main process forks one worker, which serves: the CPU of the process we
    started alone would miss nearly all of it."""
    process = granian["http1"]
    pids = bench_peers.server_pids(process.pid)
    assert len(pids) == 2  # --workers 1
    main, worker = pids
    assert psutil.Process(worker).ppid() == main == process.pid
    before = {pid: time.clock_gettime_ns(cpu_clock(pid)) for pid in pids}
    total_before = bench_peers.cpu_ns(pids)

    async def go() -> None:
        async with it.connect("http1", process.address, codec=CODEC) as client:
            for _ in range(8):
                assert [c async for c in client.generate(WHOLE)] == _expected(WHOLE)

    asyncio.run(go())
    total = bench_peers.cpu_ns(pids) - total_before
    used = {pid: time.clock_gettime_ns(cpu_clock(pid)) - before[pid] for pid in pids}
    assert used[worker] > used[main]
    assert total >= used[worker] > 0


def test_stops_with_its_worker_a_connection_open() -> None:
    process = peer_servers.peer("granian", CODEC).start()
    popen = process.process
    assert popen is not None
    pids = bench_peers.server_pids(popen.pid)

    async def go() -> None:
        client = it.connect("http1", process.address, codec=CODEC)
        assert [c async for c in client.generate(REQUEST)] == _expected(REQUEST)
        # the kept-alive connection is still open while the server stops
        await asyncio.get_running_loop().run_in_executor(None, process.stop)
        await client.close()

    asyncio.run(go())
    assert popen.returncode == 0
    assert not any(psutil.pid_exists(pid) for pid in pids)
    with pytest.raises(RuntimeError, match="has ended"):
        bench_peers.cpu_ns(pids)


def test_its_worker_ends_when_the_main_process_is_killed() -> None:
    """A stop that times out kills the process it started (SIGKILL), which granian cannot pass
    on: its worker must not go on serving, holding the port."""
    process = peer_servers.peer("granian", CODEC).start()
    try:
        main, worker = bench_peers.server_pids(process.pid)
        process.kill()
        worker_process = psutil.Process(worker)
        # generous: a SIGTERM'd worker stops at once, a busy machine may delay it
        worker_process.wait(timeout=30)
        assert not psutil.pid_exists(main)
    finally:
        process.stop()


def _bench(server: str, stack: str, **extra: object) -> dict[str, object]:
    info = {
        "server": server,
        "stack": stack,
        "protocol": "HTTP/1.1",
        "tokens_per_s": 10.0,
        "tokens_per_server_cpu_s": 20.0,
        "itl_p50_us": 1.0,
        "itl_p99_us": 2.0,
        "itl_p999_us": 3.0,
        "tpot_mean_us": 4.0,
        "server_cpu_utilization": 0.5,
        "client_cpu_utilization": 0.5,
        "correct": True,
        "server_loop": "uvloop",
        **extra,
    }
    return {"group": peers_report.GROUP, "extra_info": info}


def _run(tmp_path: Path, *benchmarks: dict[str, object]) -> Path:
    (tmp_path / PEERS_RAW).write_text(json.dumps({"benchmarks": list(benchmarks)}))
    return tmp_path


def test_the_report_holds_granian_to_its_own_target(tmp_path: Path) -> None:
    """1.5x against uvicorn, 1.0x against granian, each as its run recorded; granian's rows in
    the targets, the peers table and the plot's data."""
    ours = _bench("inferwire-http1", "inferwire")
    uvicorn = _bench(
        "uvicorn",
        "uvicorn+starlette",
        baseline="inferwire-http1",
        ratio_tokens_per_server_cpu_s=1.4,
        target_ratio=1.5,
    )
    granian = _bench(
        "granian-http1",
        "granian+starlette",
        baseline="inferwire-http1",
        ratio_tokens_per_server_cpu_s=1.2,
        target_ratio=1.0,
    )
    raw_dir = _run(tmp_path, ours, uvicorn, granian)

    targets = peers_report.target_rows(raw_dir)

    assert [(row[0], row[3], row[4]) for row in targets] == [
        ("`inferwire-http1` vs uvicorn+starlette (HTTP/1.1, uvloop)", ">= 1.5x", "**missed**"),
        ("`inferwire-http1` vs granian+starlette (HTTP/1.1, uvloop)", ">= 1x", "met"),
    ]
    section = peers_report.section(raw_dir)
    assert "| `granian-http1` | HTTP/1.1 | uvloop |" in section
    assert "The target against granian is 1.0x" in section
    plot = peers_report.plot_data(peers_report.rows(raw_dir / PEERS_RAW))
    assert plot is not None
    assert [(s.x, s.kind) for s in plot.panels[0].series][-1] == (
        ("granian-http1",),
        peers_report.PEER,
    )


def test_a_run_without_granian_reads_as_before(tmp_path: Path) -> None:
    """No granian rows, no granian words; a peer that recorded no target is held to 1.5x."""
    uvicorn = _bench(
        "uvicorn",
        "uvicorn+starlette",
        baseline="inferwire-http1",
        ratio_tokens_per_server_cpu_s=1.6,
    )
    raw_dir = _run(tmp_path, _bench("inferwire-http1", "inferwire"), uvicorn)

    assert "granian" not in peers_report.section(raw_dir)
    ((*_, target, verdict),) = peers_report.target_rows(raw_dir)
    assert (target, verdict) == (">= 1.5x", "met")
