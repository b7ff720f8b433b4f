"""OpenTelemetry traces across processes (``--trace``): a real ``inferwire serve --trace``, our
client (or ``inferwire load --trace``) against it, and the OTLP/HTTP receiver of ``inferwire
trace collect`` on loopback between them; then ``inferwire trace report`` on what it wrote.
Off, neither command imports OpenTelemetry."""

from __future__ import annotations

import asyncio
import gzip
import itertools
import json
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Final

import pytest

import inferwire.transports as it
from inferwire.cli.main import main as cli
from inferwire.observe.traces import otlp_json
from inferwire.observe.traces import stages as trace_stages
from inferwire.observe.traces.collector import Collector
from inferwire.observe.traces.otlp_json import SPAN_KIND_CLIENT, SPAN_KIND_SERVER, Span
from inferwire.transports import server_process
from inferwire.transports.tracing import (
    CLIENT_SERVICE,
    CLIENT_STAGES,
    SERVER_SERVICE,
    SERVER_STAGES,
    Tracer,
    default_endpoint,
)

TIMEOUT_S: Final = 60.0
REQUESTS: Final = 3
MAX_TOKENS: Final = 24


@pytest.fixture
def collector(tmp_path: Path) -> Iterator[Collector]:
    with Collector(tmp_path / "spans.jsonl") as receiver:
        yield receiver


def _wait_for(collector: Collector, spans: int) -> None:
    deadline = time.monotonic() + TIMEOUT_S
    while collector.spans < spans and time.monotonic() < deadline:
        time.sleep(0.05)


async def _traced_requests(
    transport: str, address: str, endpoint: str, **options: Any
) -> list[str]:
    """REQUESTS traced streams from this process; their traceparents."""
    tracer = Tracer.open(CLIENT_SERVICE, endpoint, transport=transport, codec="orjson")
    sent = []
    try:
        async with it.connect(transport, address, codec="orjson", **options) as client:
            for seed in range(REQUESTS):
                trace = tracer.client_request("stream-256")
                request = it.GenerateRequest(seed=seed, max_tokens=MAX_TOKENS)
                chunks = [c async for c in client.generate(request, timing=trace.timing)]
                assert chunks[-1].finish_reason is not None
                trace.finish()
                sent.append(trace.traceparent)
    finally:
        tracer.close()
    return sent


def _ints(packed: str) -> list[int]:
    return [int(v) for v in packed.split(",")]


def _roots(spans: list[Span], kind: int) -> dict[str, Span]:
    return {s.trace_id: s for s in spans if s.name == "generate" and s.kind == kind}


def _children(spans: list[Span], root: Span) -> dict[str, Span]:
    return {s.name: s for s in spans if s.parent_span_id == root.span_id and s.name != "generate"}


@pytest.mark.parametrize(
    ("transport", "options"),
    [
        ("http1", {}),
        ("http2", {}),
        ("grpc", {}),
        pytest.param("grpc", {"batched": True}, id="grpc-GenerateBatched"),
        ("tcp", {}),
    ],
)
def test_a_request_is_one_trace_across_client_and_server(
    transport: str, options: dict[str, Any], collector: Collector
) -> None:
    serve = ("--trace", "--trace-endpoint", collector.endpoint, "--decode-ms", "1")
    with server_process.serve(transport, "orjson", *serve) as process:
        traceparents = asyncio.run(
            _traced_requests(transport, process.address, collector.endpoint, **options)
        )
    # the server flushed on SIGTERM: every span of both processes is in
    _wait_for(collector, REQUESTS * (1 + len(CLIENT_STAGES) + 1 + len(SERVER_STAGES)))
    spans = otlp_json.read_spans(collector.out)
    assert {s.service for s in spans} == {CLIENT_SERVICE, SERVER_SERVICE}
    clients, servers = _roots(spans, SPAN_KIND_CLIENT), _roots(spans, SPAN_KIND_SERVER)
    assert len(clients) == REQUESTS
    assert set(servers) == set(clients)  # the trace id crossed the process boundary
    assert {tp.split("-")[1] for tp in traceparents} == set(clients)
    for trace_id, client in clients.items():
        server = servers[trace_id]
        assert server.parent_span_id == client.span_id  # traceparent carried
        assert server.service == SERVER_SERVICE
        assert client.service == CLIENT_SERVICE
        assert server.attributes["inferwire.transport"] == transport
        assert server.attributes["inferwire.outcome"] == "ok"
        client_stages, server_stages = _children(spans, client), _children(spans, server)
        assert set(client_stages) == set(CLIENT_STAGES)
        assert set(server_stages) == set(SERVER_STAGES)
        # in order within each process, each stage ending where the next begins; the client's
        # send (its write call) starts where its dispatch ended, at or after its encode
        for stages, names in ((client_stages, CLIENT_STAGES[:1]), (server_stages, SERVER_STAGES)):
            ordered = [stages[name] for name in names]
            assert all(s.start_ns <= s.end_ns for s in ordered)
            assert all(a.end_ns == b.start_ns for a, b in itertools.pairwise(ordered))
        assert client_stages["client serialize"].end_ns <= client_stages["send"].start_ns
        assert client.start_ns <= client_stages["client serialize"].start_ns
        assert client_stages["client parse"].end_ns <= client.end_ns
        assert server.start_ns == server_stages["server parse"].start_ns
        assert server_stages["write"].end_ns <= server.end_ns
        # across the processes (one host, one clock): the server's span inside the client's
        assert client.start_ns < server.start_ns < client.end_ns
        chunks = server.attributes["inferwire.chunks"]
        assert chunks == client.attributes["inferwire.chunks"] > 1
        produced = _ints(server.attributes["inferwire.chunk.produced_ns"])
        assert len(produced) == chunks
        assert produced == sorted(produced)
        received = _ints(client.attributes["inferwire.chunk.received_ns"])
        assert received == sorted(received)
        assert len(received) == chunks
    # the derived stages, on the roots' monotonic starts: none below zero
    result = trace_stages.breakdown(spans)
    assert {row.stage for row in result.request} == set(trace_stages.REQUEST_STAGES)
    assert [row.stage for row in (*result.request, *result.token) if row.median_ns < 0] == []


def test_load_traces_its_requests_and_the_spawned_server(
    collector: Collector, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    status = cli(
        [
            "load",
            "--transport",
            "http2",
            "--spawn",
            "--decode-ms",
            "1",
            "--rate",
            "50",
            "--requests",
            "6",
            "--warmup",
            "0",
            "--max-tokens",
            "16",
            "--quiet",
            "--trace",
            "--trace-endpoint",
            collector.endpoint,
        ]
    )
    assert status == 0
    _wait_for(collector, 6 * 10)
    spans = otlp_json.read_spans(collector.out)
    clients, servers = _roots(spans, SPAN_KIND_CLIENT), _roots(spans, SPAN_KIND_SERVER)
    assert len(clients) == 6
    assert set(servers) == set(clients)
    assert all(servers[t].parent_span_id == c.span_id for t, c in clients.items())
    capsys.readouterr()

    plot = tmp_path / "where.png"
    assert cli(["trace", "report", str(collector.out), "--plot", str(plot)]) == 0
    printed = capsys.readouterr().out
    assert "6 traces, 6 with client and server spans (6 of them parented" in printed
    for stage in ("client serialize", "network to server", "queue", "compute", "client parse"):
        assert f"  {stage} " in printed
    assert "a token (every chunk after the first)" in printed
    assert plot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def _post(
    endpoint: str, body: bytes, content_type: str = "application/x-protobuf", **headers: str
) -> tuple[int, bytes]:
    request = urllib.request.Request(
        endpoint, data=body, headers={"content-type": content_type, **headers}, method="POST"
    )
    try:
        with urllib.request.urlopen(request, timeout=TIMEOUT_S) as answer:
            return answer.status, answer.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()


def _export_bytes() -> bytes:
    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
        ExportTraceServiceRequest,
    )
    from opentelemetry.proto.trace.v1.trace_pb2 import ResourceSpans, ScopeSpans
    from opentelemetry.proto.trace.v1.trace_pb2 import Span as PbSpan

    span = PbSpan(
        trace_id=bytes(range(16)),
        span_id=bytes(range(8)),
        name="generate",
        kind=PbSpan.SPAN_KIND_SERVER,
        start_time_unix_nano=1_700_000_000_000_000_000,
        end_time_unix_nano=1_700_000_000_000_001_000,
    )
    request = ExportTraceServiceRequest(
        resource_spans=[ResourceSpans(scope_spans=[ScopeSpans(spans=[span])])]
    )
    data: bytes = request.SerializeToString()
    return data


def test_the_receiver_refuses_what_is_not_an_export_and_goes_on(
    collector: Collector, capsys: pytest.CaptureFixture[str]
) -> None:
    status, body = _post(collector.endpoint, b"\xff\xff\xff not protobuf")
    assert status == 400
    assert b"not an ExportTraceServiceRequest" in body
    status, body = _post(collector.endpoint, b"{}", "application/json")
    assert status == 415
    assert b"application/x-protobuf" in body
    status, _ = _post(collector.endpoint.replace("/v1/traces", "/v1/logs"), _export_bytes())
    assert status == 404
    status, _ = _post(collector.endpoint, b"not gzip", **{"content-encoding": "gzip"})
    assert status == 400
    assert collector.exports == 0
    assert collector.refused == 4
    assert _post(collector.endpoint, _export_bytes())[0] == 200
    assert (
        _post(collector.endpoint, gzip.compress(_export_bytes()), **{"content-encoding": "gzip"})[0]
        == 200
    )
    assert collector.exports == 2
    (line, _) = collector.out.read_text().splitlines()
    span = json.loads(line)["resourceSpans"][0]["scopeSpans"][0]["spans"][0]
    # OTLP JSON, as the Collector's file exporter writes it: hex ids, int64 as strings
    assert span["traceId"] == bytes(range(16)).hex()
    assert span["spanId"] == bytes(range(8)).hex()
    assert span["startTimeUnixNano"] == "1700000000000000000"
    assert span["kind"] == 2
    (read,) = otlp_json.read_spans(collector.out)[:1]
    assert read.duration_ns == 1000
    assert "400" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ("not json at all\n", "spans.jsonl:2: not JSON"),
        ('{"resourceSpans": [{"scopeSpans": [{"spans": [{"name": "x"}]}]}]}\n', "spans.jsonl:2"),
        ("[1, 2]\n", "not an OTLP JSON ExportTraceServiceRequest"),
        # protobuf's default JSON mapping (base64 ids) is not OTLP JSON: named, not misread
        (
            '{"resourceSpans": [{"scopeSpans": [{"spans": [{"traceId": "AAECAwQFBgcICQoLDA0ODw==",'
            ' "spanId": "AAECAwQFBgc=", "name": "g", "startTimeUnixNano": "1",'
            ' "endTimeUnixNano": "2"}]}]}]}\n',
            "is not 32 hex digits",
        ),
    ],
)
def test_report_names_a_corrupt_file_and_its_line(
    tmp_path: Path, content: str, message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "spans.jsonl"
    good = json.dumps({"resourceSpans": []})
    path.write_text(f"{good}\n{content}")
    assert cli(["trace", "report", str(path)]) == 2
    (line,) = capsys.readouterr().err.splitlines()
    assert line.startswith("inferwire trace: error: ")
    assert message in line


def test_report_of_a_missing_or_empty_file(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    for path in (tmp_path / "absent.jsonl", tmp_path / "empty.jsonl"):
        if path.name == "empty.jsonl":
            path.write_text("")
        assert cli(["trace", "report", str(path)]) == 2
    err = capsys.readouterr().err
    assert "cannot read" in err
    assert "holds no spans" in err


def test_the_endpoint_follows_the_opentelemetry_environment() -> None:
    assert default_endpoint({}) == "http://127.0.0.1:4318/v1/traces"
    base = {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://collector:4318/"}
    assert default_endpoint(base) == "http://collector:4318/v1/traces"
    traces = {**base, "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://other:9/x"}
    assert default_endpoint(traces) == "http://other:9/x"


WATCH_IMPORTS: Final = """\
import atexit, sys
atexit.register(lambda: print(
    "opentelemetry imported:", any(m.split(".")[0] == "opentelemetry" for m in sys.modules),
    flush=True,
))
from inferwire.cli.main import main
sys.exit(main())
"""


def _served_once(*options: str) -> str:
    """``inferwire serve`` with ``options``: one stream from it, then SIGTERM; its stdout."""
    process = subprocess.Popen(
        [sys.executable, "-c", WATCH_IMPORTS, "serve", "--transport", "http1", *options],
        stdout=subprocess.PIPE,
        text=True,
    )
    assert process.stdout is not None
    try:
        first = process.stdout.readline()
        address = first.split()[2]

        async def one() -> None:
            async with it.connect("http1", address, codec="orjson") as client:
                async for _ in client.generate(it.GenerateRequest(max_tokens=4)):
                    pass

        asyncio.run(one())
        process.send_signal(signal.SIGTERM)
        rest, _ = process.communicate(timeout=TIMEOUT_S)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    return first + rest


def test_without_trace_neither_command_imports_opentelemetry(collector: Collector) -> None:
    assert "opentelemetry imported: False" in _served_once()
    # the control: the same check sees it when it is there
    assert "opentelemetry imported: True" in _served_once(
        "--trace", "--trace-endpoint", collector.endpoint
    )
    load = subprocess.run(
        [
            sys.executable,
            "-c",
            WATCH_IMPORTS,
            "load",
            "--transport",
            "http1",
            "--spawn",
            "--requests",
            "3",
            "--rate",
            "50",
            "--warmup",
            "0",
            "--quiet",
        ],
        capture_output=True,
        text=True,
        timeout=TIMEOUT_S,
        check=True,
    )
    assert "opentelemetry imported: False" in load.stdout


def test_trace_endpoint_needs_trace(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli(["serve", "--transport", "tcp", "--trace-endpoint", "http://x:1/v1/traces"]) == 2
    assert "--trace-endpoint is for --trace" in capsys.readouterr().err


def _root_line(trace: int, transport: str, kind: int) -> str:
    span = {
        "traceId": f"{trace:032x}",
        "spanId": f"{trace * 2 + kind:016x}",
        "name": "generate",
        "kind": kind,
        "startTimeUnixNano": "1000",
        "endTimeUnixNano": "5000",
        "attributes": [
            {"key": "inferwire.transport", "value": {"stringValue": transport}},
            {
                "key": "inferwire.chunk.produced_ns",
                "value": {"arrayValue": {"values": [{"intValue": "100"}, {"intValue": "1100"}]}},
            },
            {
                "key": "inferwire.chunk.serialize_ns",
                "value": {"arrayValue": {"values": [{"intValue": "10"}, {"intValue": "10"}]}},
            },
            {
                "key": "inferwire.chunk.write_ns",
                "value": {"arrayValue": {"values": [{"intValue": "20"}, {"intValue": "20"}]}},
            },
        ],
    }
    return json.dumps({"resourceSpans": [{"scopeSpans": [{"spans": [span]}]}]})


def test_report_splits_a_file_by_transport(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "spans.jsonl"
    lines = [_root_line(1, "http1", SPAN_KIND_SERVER), _root_line(2, "grpc", SPAN_KIND_SERVER)]
    path.write_text("\n".join(lines) + "\n")
    assert cli(["trace", "report", str(path)]) == 0
    printed = capsys.readouterr().out
    assert "== grpc: 1 traces" in printed
    assert "== http1: 1 traces" in printed
    assert "== all transports: 2 traces" in printed
    # per token: the second chunk produced 1,100 - 100 - 30 ns after the first was written
    assert cli(["trace", "report", str(path), "--transport", "grpc"]) == 0
    (compute,) = [line for line in capsys.readouterr().out.splitlines() if "compute" in line]
    assert compute.split()[1] == f"{970 / 1e6:.3f}"
    assert cli(["trace", "report", str(path), "--transport", "tcp"]) == 2
    assert "no trace of tcp" in capsys.readouterr().err
