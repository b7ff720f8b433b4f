"""The peer servers (uvicorn + Starlette, Hypercorn + Starlette): they start, serve the same
token stream as ours, byte for byte, to our client and to httpx, and stop without a trace."""

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
from inferwire.bench.procs import peer_servers
from inferwire.bench.report import peers as peers_report
from inferwire.transports import server_process
from inferwire.transports.openai_api import chat_request_body
from inferwire.workloads import MODEL, token_stream_source
from tests.helpers.faults import MESSAGES

CODEC = "orjson"
# (peer, our client's transport, the CLI options that ask for it)
PEERS = [("uvicorn", "http1", ()), ("hypercorn", "http2", ("--http2",))]
REQUESTS = [
    it.GenerateRequest(workload="stream-256"),
    it.GenerateRequest(workload="stream-256", seed=3, max_tokens=17, model=MODEL),
]


def _expected(request: it.GenerateRequest) -> list[ic.TokenChunk]:
    return list(it.SimulatedService(token_stream_source).chunks(request))


def _wire_bytes(request: it.GenerateRequest) -> bytes:
    """The body our http1 and http2 servers send for ``request``."""
    encoder = ic.get(CODEC, extensions=True).stream_encoder()
    return b"".join(encoder.encode(c) for c in _expected(request)) + encoder.end()


@pytest.fixture(scope="module", params=PEERS, ids=[p[0] for p in PEERS])
def peer(request: pytest.FixtureRequest) -> Iterator[tuple[server_process.ServerProcess, str]]:
    name, transport, options = request.param
    with peer_servers.peer(name, CODEC, *options) as process:
        yield process, transport


async def _stream(transport: str, address: str, request: it.GenerateRequest) -> list[object]:
    async with it.connect(transport, address, codec=CODEC) as client:
        return [chunk async for chunk in client.generate(request)]


@pytest.mark.parametrize("request_", REQUESTS, ids=["whole", "cut-seed-model"])
def test_our_client_streams_the_services_chunks(
    peer: tuple[server_process.ServerProcess, str], request_: it.GenerateRequest
) -> None:
    process, transport = peer
    assert asyncio.run(_stream(transport, process.address, request_)) == _expected(request_)


def test_concurrent_streams_on_one_client(peer: tuple[server_process.ServerProcess, str]) -> None:
    process, transport = peer

    async def go() -> list[list[object]]:
        async with it.connect(transport, process.address, codec=CODEC) as client:

            async def one(request: it.GenerateRequest) -> list[object]:
                return [chunk async for chunk in client.generate(request)]

            return await asyncio.gather(*(one(r) for r in REQUESTS * 4))

    assert asyncio.run(go()) == [_expected(r) for r in REQUESTS * 4]


@pytest.mark.parametrize("request_", REQUESTS, ids=["whole", "cut-seed-model"])
def test_httpx_reads_our_bytes(
    peer: tuple[server_process.ServerProcess, str], request_: it.GenerateRequest
) -> None:
    process, transport = peer
    http2 = transport == "http2"

    async def go() -> httpx.Response:
        # http1=False: HTTP/2 with prior knowledge, as our client speaks it
        async with httpx.AsyncClient(http1=not http2, http2=http2) as client:
            return await client.post(
                f"http://{process.address}/v1/chat/completions",
                content=chat_request_body(request_),
                headers={"content-type": "application/json"},
            )

    response = asyncio.run(go())
    assert response.status_code == 200
    assert response.http_version == ("HTTP/2" if http2 else "HTTP/1.1")
    assert response.headers["content-type"].startswith("text/event-stream")
    assert response.content == _wire_bytes(request_)
    decoder = ic.get(CODEC, extensions=True).stream_decoder()
    assert decoder.feed(response.content) == _expected(request_)
    assert decoder.finished


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ({"workload": "no-such", "stream": True, "messages": MESSAGES}, "unknown workload"),
        ({"workload": "stream-256", "stream": False, "messages": MESSAGES}, "only streaming"),
        ({"workload": "stream-256", "seed": -1, "messages": MESSAGES}, "seed"),
        ({"workload": "stream-256", "stream": True}, "messages"),
    ],
)
def test_bad_requests_are_400(
    peer: tuple[server_process.ServerProcess, str], body: dict[str, object], message: str
) -> None:
    process, transport = peer
    http2 = transport == "http2"

    async def go() -> httpx.Response:
        async with httpx.AsyncClient(http1=not http2, http2=http2) as client:
            return await client.post(f"http://{process.address}/v1/chat/completions", json=body)

    response = asyncio.run(go())
    assert response.status_code == 400
    assert message in response.json()["error"]["message"]


def test_our_client_sees_remote_error(peer: tuple[server_process.ServerProcess, str]) -> None:
    process, transport = peer
    with pytest.raises(it.RemoteError, match="unknown workload"):
        asyncio.run(_stream(transport, process.address, it.GenerateRequest(workload="no-such")))


@pytest.mark.parametrize(("name", "transport", "options"), PEERS, ids=[p[0] for p in PEERS])
def test_stops_cleanly_with_a_connection_open(
    name: str, transport: str, options: tuple[str, ...]
) -> None:
    process = peer_servers.peer(name, CODEC, *options).start()
    popen = process.process
    assert popen is not None
    server = psutil.Process(popen.pid)
    assert server.children(recursive=True) == []  # one process: no workers, no reloader

    async def go() -> None:
        client = it.connect(transport, process.address, codec=CODEC)
        assert [c async for c in client.generate(REQUESTS[1])] == _expected(REQUESTS[1])
        started = time.monotonic()
        # the kept-alive connection is still open while the server stops
        await asyncio.get_running_loop().run_in_executor(None, process.stop)
        assert time.monotonic() - started < 5.0
        await client.close()

    asyncio.run(go())
    assert popen.returncode == 0
    assert not psutil.pid_exists(popen.pid)


def test_http2_is_hypercorn_only() -> None:
    with pytest.raises(SystemExit) as exit_info:
        peer_servers.main(["--server", "uvicorn", "--http2"])
    assert exit_info.value.code == 2


def test_unknown_peer() -> None:
    with pytest.raises(ValueError, match="unknown peer"):
        peer_servers.peer("gunicorn")


def test_rows_read_the_peers_benchmarks(tmp_path: Path) -> None:
    def bench(server: str, **extra: object) -> dict[str, object]:
        info = {
            "server": server,
            "stack": "s",
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
            **extra,
        }
        return {"group": peers_report.GROUP, "extra_info": info}

    raw = {
        "benchmarks": [
            bench("inferwire-http1"),
            {"group": "transport stream orjson", "extra_info": {}},
            bench("uvicorn", baseline="inferwire-http1", ratio_tokens_per_server_cpu_s=1.6),
        ]
    }
    path = tmp_path / "peers.json"
    path.write_text(json.dumps(raw))
    table = peers_report.rows(path)
    assert [r.server for r in table] == ["inferwire-http1", "uvicorn"]
    assert table[0].baseline is None
    assert table[1].baseline == "inferwire-http1"
    assert table[1].ratio_tokens_per_server_cpu_s == 1.6
