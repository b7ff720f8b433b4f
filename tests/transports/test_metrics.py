"""Every server's Prometheus metrics (:mod:`inferwire.transports.metrics`), end to end (the
meter alone: :mod:`tests.test_metrics_meter`).

Each transport as a real ``inferwire serve`` process on 127.0.0.1 with ``--metrics-port 0``,
driven by our own client (a stream, a unary call, a bad request, a stream the client leaves),
scraped over HTTP and read with prometheus_client's parser: the names and labels of
OBSERVE-SPEC.md, counts that match what the client did, in-flight back to 0. A server records a
request a moment after its client has read the answer, so each scrape that checks counts is
repeated until they are in (generous bounds, never a wall-clock assertion). ``http1`` and
``http2`` answer ``GET /metrics`` on their own port as well; ``--no-metrics`` exposes nothing.
The process cases run on both event loops (``event_loop_kind``, ``tests/conftest.py``).
"""

from __future__ import annotations

import asyncio
import contextlib
import re
import select
import signal
import subprocess
import sys
from collections.abc import AsyncGenerator, Coroutine, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final, TypeVar, cast

import httpx
import numpy as np
import pytest

import inferwire.codecs as ic
import inferwire.transports as it
from inferwire._runtime import loops
from tests.transports.metrics_helpers import Scrape, delta, scrape, settled

T = TypeVar("T")
TRANSPORTS: Final = ("tcp", "http1", "http2", "grpc")
CODEC: Final = "orjson"
WORKLOAD: Final = "stream-256"
LONG_WORKLOAD: Final = "stream-2048"
OUTCOMES_SEEN: Final = ("ok", "bad_request", "cancelled", "error")
DECODE_MS: Final = "1"
"""Paced, so a stream lasts a quarter of a second at least: long enough for a client to leave
it midway."""
STARTUP_TIMEOUT_S: Final = 120.0
STOP_TIMEOUT_S: Final = 20.0
CALL_TIMEOUT_S: Final = 120.0
_LISTENING: Final = re.compile(r"listening on (\S+):(\d+) loop=(\w+)(?: metrics=(\S+))?")


# -- the server processes --------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Served:
    transport: str
    process: subprocess.Popen[str]
    address: str
    metrics_address: str
    loop: str

    @property
    def metrics_url(self) -> str:
        return f"http://{self.metrics_address}/metrics"


def start(folder: Path, *args: str) -> subprocess.Popen[str]:
    log = folder / f"{'-'.join(a.strip('-') for a in args[:4])}.stderr"
    with log.open("w") as stderr:
        return subprocess.Popen(
            [sys.executable, "-m", "inferwire.cli", "serve", *args],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=stderr,
            text=True,
        )


def announced(process: subprocess.Popen[str]) -> re.Match[str]:
    assert process.stdout is not None
    ready, _, _ = select.select([process.stdout], [], [], STARTUP_TIMEOUT_S)
    line = process.stdout.readline() if ready else ""
    match = _LISTENING.fullmatch(line.strip())
    assert match is not None, f"{process.args!r} announced {line!r} (exit {process.poll()})"
    return match


def stop(process: subprocess.Popen[str]) -> int:
    """SIGTERM; its exit status (0: a clean stop, its metrics side server's included)."""
    if process.poll() is None:
        process.send_signal(signal.SIGTERM)
    try:
        return process.wait(STOP_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()
        raise AssertionError(f"{process.args!r} ignored SIGTERM") from None
    finally:
        if process.stdout is not None:
            process.stdout.close()


def server_args(transport: str, loop: str = "asyncio") -> list[str]:
    return ["--transport", transport, "--codec", CODEC, "--host", "127.0.0.1", "--loop", loop]


@pytest.fixture(scope="module")
def servers(
    tmp_path_factory: pytest.TempPathFactory, event_loop_kind: str
) -> Iterator[dict[str, Served]]:
    """One server of each transport, started together, with its metrics on a side port, on
    the case's kind of event loop (``tests/conftest.py``)."""
    folder = tmp_path_factory.mktemp(f"metrics-{event_loop_kind}")
    processes = {
        t: start(
            folder,
            *server_args(t, event_loop_kind),
            "--decode-ms",
            DECODE_MS,
            "--metrics-port",
            "0",
        )
        for t in TRANSPORTS
    }
    try:
        served = {}
        for transport, process in processes.items():
            match = announced(process)
            assert match.group(3) == event_loop_kind, f"{transport} runs on {match.group(3)}"
            assert match.group(4), f"{transport} did not announce its metrics port"
            address = f"{match.group(1)}:{match.group(2)}"
            served[transport] = Served(transport, process, address, match.group(4), event_loop_kind)
        yield served
    finally:
        codes = {t: stop(p) for t, p in processes.items()}
    assert codes == dict.fromkeys(TRANSPORTS, 0), codes  # the side servers stop cleanly too


def run(coro: Coroutine[Any, Any, T], loop: str) -> T:
    """``coro`` on a new event loop of the kind ``loop`` names, bounded."""

    async def bounded() -> T:
        return await asyncio.wait_for(coro, CALL_TIMEOUT_S)

    return loops.run(bounded(), loop)


def infer_request() -> ic.InferRequest:
    data = np.arange(12, dtype=np.float32).reshape(3, 4)
    return ic.InferRequest(
        model="echo",
        id="m1",
        inputs=(ic.Tensor(name="x", datatype="FP32", shape=data.shape, data=data),),
    )


async def drive(served: Served) -> int:
    """A whole stream, a unary call and a bad request; the chunks the stream carried."""
    async with it.connect(served.transport, served.address, codec=CODEC) as client:
        chunks = [c async for c in client.generate(it.GenerateRequest(workload=WORKLOAD))]
        response = await client.infer(infer_request())
        assert response.outputs[0].shape == (3, 4)
        with pytest.raises(it.RemoteError):
            async for _ in client.generate(it.GenerateRequest(workload="no-such-workload")):
                pass
    return len(chunks)


# -- what each transport records -------------------------------------------------------------


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_a_stream_a_unary_call_and_a_bad_request_are_counted(
    servers: dict[str, Served], transport: str
) -> None:
    served = servers[transport]
    before = scrape(served.metrics_url)
    tokens = run(drive(served), served.loop)
    assert tokens == 256

    def requests(scrape: Scrape, kind: str, outcome: str) -> float:
        return delta(scrape, before, "inferwire_requests_total", kind=kind, outcome=outcome)

    def done(scrape: Scrape) -> bool:
        return (
            scrape.value("inferwire_streams_in_flight") == 0
            and requests(scrape, "stream", "ok") >= 1
            and requests(scrape, "unary", "ok") >= 1
            and requests(scrape, "unary", "bad_request") >= 1
        )

    after = settled(served.metrics_url, done)
    after.check_families()
    labels = {"transport": transport, "codec": CODEC}
    assert requests(after, "stream", "ok") == 1
    assert requests(after, "unary", "ok") == 1
    assert requests(after, "unary", "bad_request") == 1  # a refused stream is a unary answer
    for kind in ("stream", "unary"):
        for outcome in ("cancelled", "error"):
            assert requests(after, kind, outcome) == 0, (kind, outcome)
    assert after.value("inferwire_streams_in_flight", transport=transport) == 0
    assert delta(after, before, "inferwire_generation_tokens_total", **labels) == tokens
    ttft = "inferwire_time_to_first_token_seconds_count"
    assert delta(after, before, ttft, **labels) == 1
    itl = "inferwire_inter_token_latency_seconds_count"
    assert delta(after, before, itl, **labels) == tokens - 1
    e2e = "inferwire_e2e_request_latency_seconds_count"
    assert delta(after, before, e2e, kind="stream", **labels) == 1
    assert delta(after, before, e2e, kind="unary", **labels) == 1  # a refusal has none
    assert delta(after, before, "inferwire_encode_seconds_count", codec=CODEC) == tokens
    assert delta(after, before, "inferwire_response_bytes_total", **labels) > tokens
    assert after.value("inferwire_time_to_first_token_seconds_sum", **labels) > 0


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_a_stream_the_client_leaves_is_cancelled(
    servers: dict[str, Served], transport: str
) -> None:
    served = servers[transport]
    before = scrape(served.metrics_url)

    async def leave() -> int:
        async with it.connect(transport, served.address, codec=CODEC) as client:
            stream = cast(
                "AsyncGenerator[ic.TokenChunk, None]",
                # 2048 tokens at 1 ms: the server is still streaming when the client leaves,
                # even if this process is not scheduled for a second (a busy CI machine)
                client.generate(it.GenerateRequest(workload=LONG_WORKLOAD)),
            )
            async with contextlib.aclosing(stream):
                taken = 0
                async for _ in stream:
                    taken += 1
                    if taken == 3:
                        break
        return taken

    assert run(leave(), served.loop) == 3
    after = settled(
        served.metrics_url,
        lambda s: (
            s.value("inferwire_streams_in_flight") == 0
            and delta(s, before, "inferwire_requests_total", outcome="cancelled") >= 1
        ),
    )
    requests = "inferwire_requests_total"
    outcomes = {o: delta(after, before, requests, kind="stream", outcome=o) for o in OUTCOMES_SEEN}
    assert outcomes["cancelled"] == 1, outcomes
    assert delta(after, before, requests) == 1
    assert after.value("inferwire_streams_in_flight") == 0
    # a token counts once its write returned; the one a write was on when the call ended
    # may have reached the client (gRPC: the third message, its write cancelled)
    tokens = delta(after, before, "inferwire_generation_tokens_total")
    assert 2 <= tokens < 2048
    assert delta(after, before, "inferwire_e2e_request_latency_seconds_count") == 0


@pytest.mark.parametrize("transport", ["http1", "http2"])
def test_http_servers_answer_scrapes_on_their_own_port_without_counting_them(
    servers: dict[str, Served], transport: str
) -> None:
    served = servers[transport]
    own = f"http://{served.address}/metrics"
    first = scrape(own, http2=transport == "http2")
    first.check_families()
    second = scrape(own, http2=transport == "http2")
    side = scrape(served.metrics_url)
    for each in (second, side):
        assert each.value("inferwire_requests_total") == first.value("inferwire_requests_total")
        assert each.value("inferwire_streams_in_flight") == 0


@pytest.mark.parametrize("transport", ["http1", "http2"])
def test_other_http_routes_count_as_unary_requests(
    servers: dict[str, Served], transport: str
) -> None:
    served = servers[transport]
    before = scrape(served.metrics_url)
    http2 = transport == "http2"
    with httpx.Client(http1=not http2, http2=http2, timeout=CALL_TIMEOUT_S) as client:
        assert client.get(f"http://{served.address}/v1/models").status_code == 200
        assert client.get(f"http://{served.address}/v2/health/ready").status_code == 200
        assert client.get(f"http://{served.address}/no/such/route").status_code == 404
        bad = client.post(f"http://{served.address}/v1/chat/completions", content=b"{")
        assert bad.status_code == 400

    def counted(s: Scrape, outcome: str) -> float:
        return delta(s, before, "inferwire_requests_total", kind="unary", outcome=outcome)

    after = settled(served.metrics_url, lambda s: counted(s, "ok") + counted(s, "bad_request") >= 4)
    assert counted(after, "ok") == 2
    assert counted(after, "bad_request") == 2
    assert after.value("inferwire_streams_in_flight") == 0


def test_grpc_kserve_calls_are_counted(servers: dict[str, Served]) -> None:
    import grpc

    from inferwire.schemas.kserve import inference_pb2 as kpb

    served = servers["grpc"]
    before = scrape(served.metrics_url)

    async def calls() -> None:
        async with grpc.aio.insecure_channel(served.address) as channel:
            live = channel.unary_unary(
                "/inference.GRPCInferenceService/ServerLive",
                request_serializer=kpb.ServerLiveRequest.SerializeToString,
                response_deserializer=kpb.ServerLiveResponse.FromString,
            )
            assert (await live(kpb.ServerLiveRequest())).live
            infer = channel.unary_unary(
                "/inference.GRPCInferenceService/ModelInfer",
                request_serializer=kpb.ModelInferRequest.SerializeToString,
                response_deserializer=kpb.ModelInferResponse.FromString,
            )
            with pytest.raises(grpc.aio.AioRpcError):  # a decoupled model streams
                await infer(kpb.ModelInferRequest(model_name=WORKLOAD))

    run(calls(), served.loop)

    def counted(s: Scrape, outcome: str) -> float:
        return delta(s, before, "inferwire_requests_total", kind="unary", outcome=outcome)

    after = settled(served.metrics_url, lambda s: counted(s, "ok") + counted(s, "bad_request") >= 2)
    assert counted(after, "ok") == 1
    assert counted(after, "bad_request") == 1


# -- turned off ------------------------------------------------------------------------------


@pytest.mark.parametrize("transport", ["http1", "http2"])
def test_no_metrics_exposes_nothing(tmp_path: Path, transport: str) -> None:
    process = start(tmp_path, *server_args(transport), "--no-metrics")
    try:
        match = announced(process)
        assert match.group(4) is None
        address = f"{match.group(1)}:{match.group(2)}"
        http2 = transport == "http2"
        with httpx.Client(http1=not http2, http2=http2, timeout=CALL_TIMEOUT_S) as client:
            assert client.get(f"http://{address}/metrics").status_code == 404
    finally:
        assert stop(process) == 0


def test_no_metrics_records_nothing() -> None:
    """Off, a server holds no metrics, so its routes hand the sender no meter."""
    service = it.SimulatedService(lambda workload, seed: [])
    codec = ic.get(CODEC, extensions=True)
    for transport in TRANSPORTS:
        server = it.server_class(transport)(service, codec)
        assert server.metrics is None
        app = getattr(server, "app", None)
        if app is not None:
            assert app.handle("GET", "/v1/models", {}, b"").meter is None
            assert app.handle("GET", "/metrics", {}, b"").status == 404


def test_no_metrics_with_a_metrics_port_is_refused(tmp_path: Path) -> None:
    process = start(tmp_path, *server_args("tcp"), "--no-metrics", "--metrics-port", "0")
    process.communicate(timeout=STARTUP_TIMEOUT_S)
    assert process.returncode == 2
    log = next(tmp_path.glob("*.stderr")).read_text()
    assert "--metrics-port exposes the metrics that --no-metrics turns off" in log


def test_http2_streams_reset_as_they_open_leave_nothing_in_flight(
    servers: dict[str, Served],
) -> None:
    """Requests reset in the same read that brought them (Rapid Reset's pattern): their
    handlers are cancelled before they start, and still end their meters."""
    import socket

    import h2.config
    import h2.connection

    from inferwire.transports.openai_api import chat_request_body

    served = servers["http2"]
    before = scrape(served.metrics_url)
    host, port = served.address.rsplit(":", 1)
    body = chat_request_body(it.GenerateRequest(workload=WORKLOAD))
    conn = h2.connection.H2Connection(h2.config.H2Configuration(client_side=True))
    conn.initiate_connection()
    resets = 20
    for _ in range(resets):
        stream_id = conn.get_next_available_stream_id()
        headers = [
            (":method", "POST"),
            (":scheme", "http"),
            (":authority", served.address),
            (":path", "/v1/chat/completions"),
            ("content-type", "application/json"),
        ]
        conn.send_headers(stream_id, headers)
        conn.send_data(stream_id, body, end_stream=True)
        conn.reset_stream(stream_id)
    with socket.create_connection((host, int(port)), timeout=CALL_TIMEOUT_S) as sock:
        sock.sendall(conn.data_to_send())
        after = settled(
            served.metrics_url,
            lambda s: (
                delta(s, before, "inferwire_requests_total") >= resets
                and s.value("inferwire_streams_in_flight") == 0
            ),
        )
    cancelled = delta(after, before, "inferwire_requests_total", kind="stream", outcome="cancelled")
    assert cancelled == resets
    assert delta(after, before, "inferwire_requests_total") == resets
    assert after.value("inferwire_streams_in_flight") == 0
