"""``inferwire serve`` as vLLM's server behaves, in real processes on 127.0.0.1: a frontend
(``serve --engine``) in front of a real engine process, or the simulated service alone.

- every OpenAI answer's per-request ``metrics`` object, its vLLM histograms on ``/metrics``
  and its span's ``gen_ai.latency.*`` attributes are what its raw stamps (``--stamps-file``,
  the ground truth) make, and the stamps are in the order a request meets them, with a queue
  where the engine made one wait;
- ``/health`` answers 503 while the engine is not there (not yet up, or killed), 200 when it is;
- a stream the engine drops is one line of the server's log, not a traceback;
- the OpenAI path continues the client's trace (its ``traceparent``).

No wall-clock assertion: bounds are generous, and where one proves a point (a killed engine
noticed at once) the liveness timeout is set far above it."""

from __future__ import annotations

import asyncio
import contextlib
import gzip
import http.server
import math
import secrets
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, Final

import httpx
import openai
import orjson
import pytest
from openai.types.chat import ChatCompletionChunk
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2
from opentelemetry.proto.common.v1 import common_pb2

import inferwire.transports as it
from inferwire._runtime.child import ChildProcess
from inferwire.engine.launch import EngineProcess
from inferwire.transports.metrics import VLLM_HISTOGRAMS
from inferwire.transports.request_stamps import RequestStamps, metrics_object
from inferwire.transports.server_process import ServerProcess
from inferwire.workloads import MODEL
from tests.helpers.faults import MESSAGES
from tests.transports.metrics_helpers import Scrape

WAIT_S: Final = 60.0
FAST: Final = ("--step-scale", "0.05")
LIVENESS_S: Final = "120"
"""The frontend's liveness timeout where a test proves a killed engine is seen at once."""
NOTICED_S: Final = 10.0
WORKLOAD: Final = "stream-16"
TOKENS: Final = 16
GEN_AI: Final = {
    "queue": "gen_ai.latency.time_in_queue",
    "prefill": "gen_ai.latency.time_in_model_prefill",
    "decode": "gen_ai.latency.time_in_model_decode",
    "inference": "gen_ai.latency.time_in_model_inference",
    "ttft": "gen_ai.latency.time_to_first_token",
    "e2e": "gen_ai.latency.e2e",
}
"""vLLM's span attributes (``vllm/tracing.py``), by interval."""


@pytest.fixture
def processes() -> Iterator[Callable[..., Any]]:
    """Starts engines (``start("engine", *options)``) and servers (``start("serve", log,
    *options)``), each killed at the test's end whatever happened."""
    started: list[ChildProcess] = []

    def start(kind: str, *args: Any) -> Any:
        if kind == "engine":
            made: ChildProcess = EngineProcess(*args, stderr=subprocess.DEVNULL)
        else:
            log, *options = args
            made = ServerProcess("serve", "--loop", "asyncio", *options, stderr=log)
        started.append(made.start())
        return made

    yield start
    for process in reversed(started):
        process.kill()


def frontend(
    start: Callable[..., Any], log: Any, transport: str, engine: str, *extra: str
) -> ServerProcess:
    server: ServerProcess = start(
        "serve", log, "--transport", transport, "--codec", "orjson", "--engine", engine, *extra
    )
    return server


def stamps_of(line: dict[str, Any]) -> RequestStamps:
    return RequestStamps(
        model=line["model"],
        received_ns=line["frontend_received_ns"] or 0,
        arrived_ns=line["engine_arrived_ns"] or 0,
        scheduled_ns=line["engine_scheduled_ns"] or 0,
        first_token_ns=line["engine_first_token_ns"] or 0,
        last_token_ns=line["engine_last_token_ns"] or 0,
        first_chunk_ns=line["frontend_first_chunk_ns"] or 0,
        last_chunk_ns=line["frontend_last_chunk_ns"] or 0,
        last_chunk_written_ns=line["frontend_last_chunk_written_ns"] or 0,
    )


def read_lines(path: Path, count: int) -> dict[str, dict[str, Any]]:
    """The stamps file's lines by request id, once ``count`` are there."""
    deadline = time.monotonic() + WAIT_S
    while True:
        lines = [orjson.loads(line) for line in path.read_bytes().splitlines()]
        if len(lines) >= count or time.monotonic() > deadline:
            break
        time.sleep(0.02)
    by_id = {line["request_id"]: line for line in lines}
    assert len(by_id) == len(lines) == count
    return by_id


def in_order(line: dict[str, Any]) -> None:
    """A request meets its stamps in this order, on one host's clock."""
    order = [
        "frontend_received_ns",
        "engine_arrived_ns",
        "engine_scheduled_ns",
        "engine_first_token_ns",
        "engine_last_token_ns",
        "frontend_last_chunk_ns",
        "frontend_last_chunk_written_ns",
    ]
    values = [line[name] for name in order]
    assert all(isinstance(v, int) and v > 0 for v in values), line
    assert values == sorted(values), line
    assert line["engine_scheduled_ns"] < line["engine_first_token_ns"]
    assert line["engine_first_token_ns"] <= line["frontend_first_chunk_ns"]
    assert line["frontend_first_chunk_ns"] <= line["frontend_last_chunk_ns"]


def chat(**fields: Any) -> dict[str, Any]:
    return {"model": MODEL, "messages": MESSAGES, "extra_body": {"workload": WORKLOAD}, **fields}


# -- the figures against the ground truth -------------------------------------------------


def test_a_frontends_figures_are_what_the_engines_stamps_make(
    processes: Callable[..., Any], tmp_path: Path
) -> None:
    """A batch of one, so that requests sent together queue in the engine: the metrics
    object, the stamps and the vLLM histograms agree exactly, and show the queue."""
    engine = processes("engine", "--endpoint", f"ipc://{tmp_path}/e", "--max-batch", "1", *FAST)
    stamps_path = tmp_path / "stamps.jsonl"
    with (tmp_path / "serve.log").open("wb") as log:
        server = frontend(
            processes,
            log,
            "http1",
            engine.endpoint,
            "--enable-per-request-metrics",
            "--stamps-file",
            str(stamps_path),
        )

    async def requests() -> tuple[list[Any], Any]:
        async with openai.AsyncOpenAI(
            base_url=f"http://{server.address}/v1", api_key="x", max_retries=0, timeout=WAIT_S
        ) as client:

            async def streamed(seed: int) -> Any:
                stream = await client.chat.completions.create(
                    **chat(stream=True, stream_options={"include_usage": True}, seed=seed)
                )
                return [event async for event in stream][-1]

            lasts = await asyncio.gather(*(streamed(seed) for seed in range(3)))
            whole = await client.chat.completions.create(**chat(seed=7))
            return list(lasts), whole

    lasts, whole = asyncio.run(requests())
    lines = read_lines(stamps_path, 4)
    answers = [(last.id, last.model_extra["metrics"]) for last in lasts]
    answers.append((whole.id, whole.model_extra["metrics"]))
    for answer_id, metrics in answers:
        line = lines[answer_id]
        in_order(line)
        assert (line["outcome"], line["tokens"], line["model"]) == ("ok", TOKENS, MODEL)
        assert metrics == metrics_object(stamps_of(line), TOKENS)
    assert max(metrics["queue_time_ms"] for _, metrics in answers) > 0  # one waited its turn
    for last in lasts:  # the usage chunk with its metrics is still OpenAI's chunk
        ChatCompletionChunk.model_validate(last.model_dump())
    scrape = Scrape.parse(httpx.get(f"http://{server.address}/metrics").text)
    for interval, name, _ in VLLM_HISTOGRAMS:
        assert scrape.value(f"{name}_count", model_name=MODEL, engine="0") == 4
        want = sum(stamps_of(line).intervals_s()[interval] for line in lines.values())
        got = scrape.value(f"{name}_sum", model_name=MODEL, engine="0")
        assert math.isclose(got, want, rel_tol=1e-9, abs_tol=1e-12), name
    assert scrape.value("vllm:request_queue_time_seconds_sum") > 0


# -- /health ------------------------------------------------------------------------------


def _health(server: ServerProcess, transport: str, path: str = "/health") -> int:
    with httpx.Client(http1=transport == "http1", http2=transport == "http2") as http:
        return http.get(f"http://{server.address}{path}", timeout=WAIT_S).status_code


def _until_health(server: ServerProcess, transport: str, status: int, within_s: float) -> None:
    """Until ``/health`` answers ``status``; KServe's readiness then agrees (400 for not
    ready, as Triton answers) while its liveness stays 200: the process is up."""
    deadline = time.monotonic() + within_s
    while (got := _health(server, transport)) != status:
        assert time.monotonic() < deadline, f"/health still {got}, not {status}"
        time.sleep(0.02)
    assert _health(server, transport, "/v2/health/ready") == (200 if status == 200 else 400)
    assert _health(server, transport, "/v2/health/live") == 200


@pytest.mark.parametrize("transport", ["http1", "http2"])
def test_health_is_503_while_the_engine_is_away(
    transport: str, processes: Callable[..., Any], tmp_path: Path
) -> None:
    endpoint = f"ipc://{tmp_path}/e"
    with (tmp_path / "serve.log").open("wb") as log:
        server = frontend(
            processes, log, transport, endpoint, "--engine-liveness-timeout", LIVENESS_S
        )
    assert _health(server, transport) == 503  # not up yet
    assert _health(server, transport, "/v2/health/ready") == 400
    engine = processes("engine", "--endpoint", endpoint, *FAST)
    _until_health(server, transport, 200, WAIT_S)
    engine.kill()
    _until_health(server, transport, 503, NOTICED_S)  # seen at once, not after the timeout
    processes("engine", "--endpoint", endpoint, *FAST)
    _until_health(server, transport, 200, WAIT_S)


def test_health_is_200_without_an_engine(processes: Callable[..., Any], tmp_path: Path) -> None:
    with (tmp_path / "serve.log").open("wb") as log:
        server = processes("serve", log, "--transport", "http1")
    assert _health(server, "http1") == 200


# -- a dropped stream in the log ----------------------------------------------------------


@pytest.mark.parametrize("transport", ["http1", "http2", "tcp", "grpc"])
def test_a_stream_the_engine_drops_is_one_log_line(
    transport: str, processes: Callable[..., Any], tmp_path: Path
) -> None:
    """The engine killed under load: each stream fails at its client, and is one line of the
    server's log naming the engine's error; no traceback."""
    engine = processes("engine", "--endpoint", f"ipc://{tmp_path}/e")  # streams take a while
    log_path = tmp_path / "serve.log"
    with log_path.open("wb") as log:
        server = frontend(
            processes, log, transport, engine.endpoint, "--engine-liveness-timeout", LIVENESS_S
        )
    streams = 4

    async def main() -> list[Any]:
        started = [asyncio.Event() for _ in range(streams)]

        async def one(seed: int) -> None:
            # a client each: tcp's takes its requests in turns on one connection
            async with it.connect(transport, server.address, codec="orjson") as client:
                request = it.GenerateRequest(workload="stream-2048", seed=seed)
                async for _ in client.generate(request):
                    started[seed].set()

        tasks = [asyncio.ensure_future(one(seed)) for seed in range(streams)]
        async with asyncio.timeout(WAIT_S):
            for event in started:
                await event.wait()
            engine.kill()
            return await asyncio.gather(*tasks, return_exceptions=True)

    outcomes = asyncio.run(main())
    assert all(isinstance(o, it.TransportError) for o in outcomes), outcomes
    server.stop()
    text = log_path.read_text()
    assert "Traceback" not in text, text
    dropped = [line for line in text.splitlines() if "EngineGoneError" in line]
    assert len(dropped) == streams, text
    assert all("the engine closed its connection" in line for line in dropped), text


# -- the client's trace -------------------------------------------------------------------


class _Receiver(http.server.ThreadingHTTPServer):
    """An OTLP/HTTP traces receiver on loopback: each exported span's name, kind, ids and
    attributes."""

    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), _Export)
        self.spans: list[dict[str, Any]] = []
        self.lock = threading.Lock()

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}/v1/traces"


class _Export(http.server.BaseHTTPRequestHandler):
    server: _Receiver

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers["content-length"]))
        if self.headers.get("content-encoding") == "gzip":
            body = gzip.decompress(body)
        request = trace_service_pb2.ExportTraceServiceRequest.FromString(body)
        spans = [
            {
                "name": span.name,
                "kind": span.kind,
                "trace_id": span.trace_id.hex(),
                "parent_span_id": span.parent_span_id.hex(),
                "attributes": {a.key: _value(a.value) for a in span.attributes},
            }
            for resource in request.resource_spans
            for scope in resource.scope_spans
            for span in scope.spans
        ]
        with self.server.lock:
            self.server.spans += spans
        answer = trace_service_pb2.ExportTraceServiceResponse().SerializeToString()
        self.send_response(200)
        self.send_header("content-type", "application/x-protobuf")
        self.send_header("content-length", str(len(answer)))
        self.end_headers()
        self.wfile.write(answer)

    def log_message(self, format: str, *args: Any) -> None:
        pass


def _value(value: common_pb2.AnyValue) -> Any:
    kind = value.WhichOneof("value")
    return getattr(value, kind) if kind else None


@contextlib.contextmanager
def receiver() -> Iterator[_Receiver]:
    server = _Receiver()
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server
    finally:
        server.shutdown()
        server.server_close()
        thread.join()


@pytest.mark.parametrize("engine", [False, True], ids=["local", "engine"])
def test_the_openai_path_continues_the_clients_trace_with_vllms_latencies(
    engine: bool, processes: Callable[..., Any], tmp_path: Path
) -> None:
    stamps_path = tmp_path / "stamps.jsonl"
    options = ["--transport", "http1", "--trace", "--stamps-file", str(stamps_path)]
    if engine:
        made = processes("engine", "--endpoint", f"ipc://{tmp_path}/e", *FAST)
        options += ["--engine", made.endpoint]
    else:
        options += ["--prefill-ms", "20", "--decode-ms", "1"]
    trace_id, parent_id = secrets.token_hex(16), secrets.token_hex(8)
    with receiver() as otlp:
        with (tmp_path / "serve.log").open("wb") as log:
            server = processes("serve", log, *options, "--trace-endpoint", otlp.endpoint)
        with openai.OpenAI(
            base_url=f"http://{server.address}/v1", api_key="x", max_retries=0, timeout=WAIT_S
        ) as client:
            stream = client.chat.completions.create(
                **chat(stream=True),
                extra_headers={"traceparent": f"00-{trace_id}-{parent_id}-01"},
            )
            answer_id = [event.id for event in stream][-1]
        server.stop()  # flushes its spans
        deadline = time.monotonic() + WAIT_S
        while not any(s["trace_id"] == trace_id for s in otlp.spans):
            assert time.monotonic() < deadline, "no span of the client's trace"
            time.sleep(0.05)
        with otlp.lock:
            spans = [s for s in otlp.spans if s["trace_id"] == trace_id]
    (root,) = [s for s in spans if s["name"] == "generate"]
    assert root["parent_span_id"] == parent_id  # the client's span is its parent
    attributes = root["attributes"]
    assert attributes["gen_ai.request.id"] == answer_id
    assert attributes["gen_ai.response.model"] == MODEL
    line = read_lines(stamps_path, 1)[answer_id]
    intervals = stamps_of(line).intervals_s()
    assert set(intervals) == set(GEN_AI)
    for interval, name in GEN_AI.items():
        assert attributes[name] == intervals[interval], name
    if not engine:
        assert attributes["gen_ai.latency.time_in_queue"] == 0.0
        assert attributes["gen_ai.latency.time_in_model_prefill"] >= 0.02 * 0.9


@pytest.mark.parametrize(
    "options",
    [
        ("--transport", "tcp", "--enable-per-request-metrics"),
        ("--transport", "grpc", "--stamps-file", "x.jsonl"),
        ("--transport", "http1", "--stamps-file", "/no/such/folder/x.jsonl"),
    ],
)
def test_the_openai_options_are_refused_where_they_cannot_work(options: tuple[str, ...]) -> None:
    refused = subprocess.run(
        [sys.executable, "-m", "inferwire.cli", "serve", *options],
        capture_output=True,
        text=True,
        timeout=WAIT_S,
        check=False,
    )
    assert refused.returncode == 2
    assert len(refused.stderr.strip().splitlines()) == 1, refused.stderr
    assert ("--stamps-file" in refused.stderr) or ("OpenAI API" in refused.stderr)
