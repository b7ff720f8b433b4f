"""The embedded OTLP/HTTP receiver of ``inferwire load --otlp-listen``
(inferwire.load.attribution.otlp_receiver, .otlp): real exports from the OpenTelemetry SDK and raw
bodies (protobuf, JSON, gzip, chunked) joined to requests by trace id; the statuses of what is not
an export, after which the receiver goes on; vLLM's attributes, nonsense ones included; spans that
never come; the W3C ``traceparent``. No wall-clock assertions: every wait has a generous cap."""

from __future__ import annotations

import gzip
import http.client
import math
import os
import re
import socket
import sys
import threading
import zlib
from collections.abc import Iterator
from typing import Any, Final
from urllib.parse import urlsplit

import orjson
import pytest
from google.rpc import status_pb2  # type: ignore[import-untyped]
from hypothesis import given
from hypothesis import strategies as st
from opentelemetry.exporter.otlp.proto.http import Compression
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue
from opentelemetry.proto.trace.v1.trace_pb2 import ResourceSpans, ScopeSpans
from opentelemetry.proto.trace.v1.trace_pb2 import Span as PbSpan
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.trace import SpanKind
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from inferwire._runtime.extras import MissingExtraError
from inferwire.load.attribution import otlp_receiver
from inferwire.load.attribution.otlp import SpanReceiver, new_traceparent, trace_id_of
from inferwire.load.attribution.otlp_receiver import JSON, PROTOBUF, ExportRefused, TraceReceiver
from inferwire.load.attribution.reports import OTLP, ServerReport

TIMEOUT_S: Final = 60.0
# W3C Trace Context, "traceparent Header": version 00, trace id and parent id not all zeros
TRACEPARENT_00: Final = re.compile(r"00-(?!0{32})[0-9a-f]{32}-(?!0{16})[0-9a-f]{16}-[0-9a-f]{2}")
# as vLLM V1's OutputProcessor.do_tracing sets them: durations in seconds
VLLM_ATTRIBUTES: Final[dict[str, float | int | str]] = {
    "gen_ai.latency.time_to_first_token": 0.075,
    "gen_ai.latency.e2e": 0.265,
    "gen_ai.latency.time_in_queue": 0.010,
    "gen_ai.usage.prompt_tokens": 12,
    "gen_ai.usage.completion_tokens": 40,
    "gen_ai.latency.time_in_model_prefill": 0.050,
    "gen_ai.latency.time_in_model_decode": 0.200,
    "gen_ai.latency.time_in_model_inference": 0.250,
    "gen_ai.request.id": "chatcmpl-1",
    "gen_ai.response.finish_reasons": '["length"]',
}
VLLM_REPORT: Final = ServerReport(
    source=OTLP,
    queue_ms=10.0,
    prefill_ms=50.0,
    decode_ms=200.0,
    inference_ms=250.0,
    server_e2e_ms=265.0,
)


@pytest.fixture
def receiver() -> Iterator[SpanReceiver]:
    with SpanReceiver() as spans:
        yield spans


def _assert_report(report: ServerReport | None, expected: ServerReport) -> None:
    assert report is not None
    assert report.source == expected.source
    for stage in ("queue_ms", "prefill_ms", "decode_ms", "inference_ms", "server_e2e_ms"):
        want = getattr(expected, stage)
        assert getattr(report, stage) == (None if want is None else pytest.approx(want)), stage


def _any(value: object) -> AnyValue:
    if isinstance(value, bool):
        return AnyValue(bool_value=value)
    if isinstance(value, int):
        return AnyValue(int_value=value)
    if isinstance(value, float):
        return AnyValue(double_value=value)
    if value is None:
        return AnyValue()
    return AnyValue(string_value=str(value))


def _span(trace_id: str, attributes: dict[str, Any], *, end_ns: int = 2_000) -> PbSpan:
    return PbSpan(
        trace_id=bytes.fromhex(trace_id),
        span_id=os.urandom(8),
        name="llm_request",
        kind=PbSpan.SPAN_KIND_SERVER,
        start_time_unix_nano=1_000,
        end_time_unix_nano=end_ns,
        attributes=[KeyValue(key=k, value=_any(v)) for k, v in attributes.items()],
    )


def _export(*spans: PbSpan) -> bytes:
    request = ExportTraceServiceRequest(
        resource_spans=[ResourceSpans(scope_spans=[ScopeSpans(spans=list(spans))])]
    )
    data: bytes = request.SerializeToString()
    return data


def _json_export(trace_id: str) -> bytes:
    """OTLP JSON as an SDK sends it: hex ids (any case), int64 as strings, enums as integers,
    and a field this receiver does not know (to be ignored)."""
    span = {
        "traceId": trace_id.upper(),
        "spanId": "00f067aa0ba902b7",
        "parentSpanId": "",
        "name": "llm_request",
        "kind": 2,
        "startTimeUnixNano": "1000",
        "endTimeUnixNano": 2000,
        "attributes": [
            {"key": "gen_ai.latency.time_in_queue", "value": {"doubleValue": 0.01}},
            {"key": "gen_ai.latency.e2e", "value": {"intValue": "2"}},
            {"key": "gen_ai.request.id", "value": {"stringValue": "cmpl-9"}},
        ],
        "links": [{"traceId": "ab" * 16, "spanId": "cd" * 8}],
        "aFieldOfTomorrow": {"x": 1},
    }
    resource = {"attributes": [{"key": "service.name", "value": {"stringValue": "vllm"}}]}
    return orjson.dumps(
        {"resourceSpans": [{"resource": resource, "scopeSpans": [{"spans": [span]}]}]}
    )


def _post(
    endpoint: str,
    body: bytes | Iterator[bytes],
    content_type: str = PROTOBUF,
    *,
    method: str = "POST",
    **headers: str,
) -> tuple[int, str, bytes]:
    """One request on a connection of its own: status, content type, body."""
    url = urlsplit(endpoint)
    assert url.hostname is not None
    connection = http.client.HTTPConnection(url.hostname, url.port, timeout=TIMEOUT_S)
    try:
        connection.request(
            method,
            url.path,
            body=body,
            headers={"content-type": content_type, **headers},
            encode_chunked=not isinstance(body, bytes),
        )
        answer = connection.getresponse()
        return answer.status, answer.getheader("content-type", ""), answer.read()
    finally:
        connection.close()


def test_traceparents_are_w3c_version_00_sampled_and_fresh() -> None:
    seen = set()
    for _ in range(1000):
        header, trace_id = new_traceparent()
        assert TRACEPARENT_00.fullmatch(header), header
        assert header.endswith("-01")  # sampled: the server's SDK records the span
        assert header[3:35] == trace_id == trace_id_of(header)
        seen.add(trace_id)
    assert len(seen) == 1000


TRACE_ID: Final = "4bf92f3577b34da6a3ce929d0e0e4736"


@pytest.mark.parametrize(
    "header",
    [
        f"00-{TRACE_ID}-00f067aa0ba902b7-01",
        f"00-{TRACE_ID}-00f067aa0ba902b7-00",
        # a later version may append fields; its first four read as version 00's
        f"cc-{TRACE_ID}-00f067aa0ba902b7-09-what-the-future-holds",
    ],
)
def test_trace_id_of_a_valid_traceparent(header: str) -> None:
    assert trace_id_of(header) == TRACE_ID


@pytest.mark.parametrize(
    "header",
    [
        "",
        "00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01",  # upper case
        "ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",  # version ff
        "00-00000000000000000000000000000000-00f067aa0ba902b7-01",  # all-zero trace id
        "00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01",  # all-zero parent id
        "00-4bf92f3577b34da6a3ce929d0e0e473-00f067aa0ba902b7-01",  # 31 digits
        "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-x",  # 00 has four fields
        "00_4bf92f3577b34da6a3ce929d0e0e4736_00f067aa0ba902b7_01",
        "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7",
    ],
)
def test_trace_id_of_refuses_what_w3c_refuses(header: str) -> None:
    with pytest.raises(ValueError, match="not a W3C traceparent"):
        trace_id_of(header)


@pytest.mark.parametrize(
    "compression", [Compression.NoCompression, Compression.Gzip, Compression.Deflate]
)
def test_the_sdks_exports_are_joined_to_requests_by_trace_id(
    receiver: SpanReceiver, compression: Compression
) -> None:
    """What vLLM does: a TracerProvider exporting over OTLP/HTTP, a SERVER span per request
    whose parent is the request's traceparent, its stages as gen_ai.latency.* attributes."""
    provider = TracerProvider(resource=Resource({"service.name": "vllm"}), shutdown_on_exit=False)
    exporter = OTLPSpanExporter(endpoint=receiver.endpoint, compression=compression)
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tracer = provider.get_tracer("vllm.v1.engine.output_processor")
    propagator = TraceContextTextMapPropagator()
    requests = [new_traceparent() for _ in range(5)]
    try:
        with tracer.start_as_current_span("a span of another trace, no stages"):
            pass
        for header, _ in requests:
            context = propagator.extract({"traceparent": header})
            span = tracer.start_span(
                "llm_request", context=context, kind=SpanKind.SERVER, attributes=VLLM_ATTRIBUTES
            )
            span.end()
        assert receiver.wait_for([t for _, t in requests], TIMEOUT_S) == 0
    finally:
        provider.shutdown()
    for _, trace_id in requests:
        _assert_report(receiver.report_for(trace_id), VLLM_REPORT)
    counts = receiver.counts()
    assert counts["spans_received"] == 6
    assert counts["requests_joined"] == 5
    assert counts["requests_without_spans"] == 0
    assert counts["spans_waiting"] == 0
    assert receiver.refusals == {}
    assert receiver.notes == {}


@pytest.mark.parametrize("encoding", ["", "gzip", "deflate"])
@pytest.mark.parametrize("media", [PROTOBUF, JSON])
def test_raw_bodies_of_either_encoding_compressed_or_not(
    receiver: SpanReceiver, media: str, encoding: str
) -> None:
    _, trace_id = new_traceparent()
    if media == JSON:
        body = _json_export(trace_id)
        expected = ServerReport(source=OTLP, queue_ms=10.0, server_e2e_ms=2000.0)
    else:
        body = _export(_span(trace_id, VLLM_ATTRIBUTES))
        expected = VLLM_REPORT
    headers = {}
    if encoding:
        body = gzip.compress(body) if encoding == "gzip" else zlib.compress(body)
        headers["content-encoding"] = encoding
    status, content_type, answer = _post(
        receiver.endpoint, body, f"{media}; charset=utf-8", **headers
    )
    assert status == 200, answer
    assert content_type == media  # the answer is in the request's encoding
    assert answer == (b"{}" if media == JSON else b"")  # an empty ExportTraceServiceResponse
    _assert_report(receiver.report_for(trace_id), expected)


def test_a_chunked_body_and_gzip_of_several_members(receiver: SpanReceiver) -> None:
    """Some SDKs stream a compressed body chunked, without Content-Length."""
    (_, first), (_, second) = new_traceparent(), new_traceparent()
    body = gzip.compress(_export(_span(first, VLLM_ATTRIBUTES))) + gzip.compress(
        _export(_span(second, VLLM_ATTRIBUTES))
    )  # two members: two messages concatenated, which protobuf reads as their merge
    chunks = iter([body[:7], body[7:100], body[100:]])
    status, _, answer = _post(receiver.endpoint, chunks, **{"content-encoding": "gzip"})
    assert status == 200, answer
    _assert_report(receiver.report_for(first), VLLM_REPORT)
    _assert_report(receiver.report_for(second), VLLM_REPORT)


BOMB: Final = gzip.compress(b"\0" * 8192)
BAD_BODIES: Final = [
    # (id, body, content type, headers, status, kind)
    ("not protobuf", b"\xff\xff\xff not protobuf", PROTOBUF, {}, 400, "not protobuf"),
    ("text", b"hello", "text/plain", {}, 415, "content type"),
    ("no content type", b"", "", {}, 415, "content type"),
    ("json, not an object", b"[1, 2]", JSON, {}, 400, "not OTLP JSON"),
    ("json, not json", b"{not json", JSON, {}, 400, "not OTLP JSON"),
    ("json, spans not a list", b'{"resourceSpans": 5}', JSON, {}, 400, "not OTLP JSON"),
    ("json, base64 id", b'{"resourceSpans": [{"scopeSpans": [{"spans": [{"traceId": '
     b'"S/kvNXezTaajzpKdDg5HNg=="}]}]}]}', JSON, {}, 400, "not OTLP JSON"),
    ("not gzip", b"not gzip", PROTOBUF, {"content-encoding": "gzip"}, 400, "bad gzip"),
    ("gzip cut short", gzip.compress(b"x" * 100)[:-9], PROTOBUF, {"content-encoding": "gzip"},
     400, "bad gzip"),
    ("gzip then garbage", gzip.compress(b"") + b"garbage", PROTOBUF,
     {"content-encoding": "gzip"}, 400, "bad gzip"),
    ("unknown coding", b"", PROTOBUF, {"content-encoding": "br"}, 415, "content encoding"),
    ("oversized", b"\n" * 4097, PROTOBUF, {}, 413, "too large"),
    ("gzip bomb", BOMB, PROTOBUF, {"content-encoding": "gzip"}, 413, "too large"),
    ("bad length", b"", PROTOBUF, {"content-length": "x"}, 400, "framing"),
    ("not ascii length", b"", PROTOBUF, {"content-length": "\u00b2"}, 400, "framing"),
]  # fmt: skip


@pytest.fixture(scope="module")
def small_receiver() -> Iterator[SpanReceiver]:
    with SpanReceiver(max_body_bytes=4096) as spans:
        yield spans


@pytest.mark.parametrize(
    ("body", "content_type", "headers", "status", "kind"),
    [pytest.param(*case[1:], id=case[0]) for case in BAD_BODIES],
)
def test_what_is_not_an_export_gets_its_status_and_the_receiver_goes_on(
    small_receiver: SpanReceiver,
    body: bytes,
    content_type: str,
    headers: dict[str, str],
    status: int,
    kind: str,
) -> None:
    refused = small_receiver.refusals.get(f"{status} {kind}", 0)
    got, answer_type, answer = _post(small_receiver.endpoint, body, content_type, **headers)
    assert got == status
    assert small_receiver.refusals[f"{status} {kind}"] == refused + 1
    # OTLP/HTTP's failure body: a google.rpc.Status in the request's encoding
    if answer_type == JSON:
        assert orjson.loads(answer)["message"]
    else:
        assert answer_type == PROTOBUF
        assert status_pb2.Status.FromString(answer).message
    _, trace_id = new_traceparent()
    assert _post(small_receiver.endpoint, _export(_span(trace_id, VLLM_ATTRIBUTES)))[0] == 200
    _assert_report(small_receiver.report_for(trace_id), VLLM_REPORT)


def test_another_path_or_method_and_a_refusal_on_a_kept_alive_connection(
    receiver: SpanReceiver,
) -> None:
    assert _post(receiver.endpoint.replace("traces", "logs"), _export())[0] == 404
    status, _, answer = _post(receiver.endpoint, b"", method="GET")
    assert status == 405
    assert b"takes POST" in status_pb2.Status.FromString(answer).message.encode()
    url = urlsplit(receiver.endpoint)
    assert url.hostname is not None
    connection = http.client.HTTPConnection(url.hostname, url.port, timeout=TIMEOUT_S)
    try:
        for body, status in [(b"\xff\xff", 400), (_export(), 200), (b"\xff", 400), (b"", 200)]:
            connection.request("POST", url.path, body, {"content-type": PROTOBUF})
            response = connection.getresponse()
            response.read()
            assert response.status == status
    finally:
        connection.close()
    with socket.create_connection((url.hostname, url.port), timeout=TIMEOUT_S) as raw:
        raw.sendall(
            b"POST /v1/traces HTTP/1.1\r\nhost: x\r\ncontent-type: %b\r\n\r\n" % PROTOBUF.encode()
        )
        with raw.makefile("rb") as reply:
            assert reply.readline().split()[1] == b"411"  # no Content-Length
    assert receiver.refusals == {
        "404 no route": 1,
        "405 method": 1,
        "400 not protobuf": 2,
        "411 no length": 1,
    }
    assert receiver.exports == 2


@pytest.mark.parametrize(
    ("value", "note"),
    [
        (-0.5, "gen_ai.latency.time_in_queue is negative"),
        (math.nan, "gen_ai.latency.time_in_queue is not finite"),
        (math.inf, "gen_ai.latency.time_in_queue is not finite"),
        ("0.5", "gen_ai.latency.time_in_queue is string_value, not a number of seconds"),
        (True, "gen_ai.latency.time_in_queue is bool_value, not a number of seconds"),
        (None, "gen_ai.latency.time_in_queue is empty, not a number of seconds"),
    ],
)
def test_a_nonsense_stage_is_left_out_with_a_note(
    receiver: SpanReceiver, value: object, note: str
) -> None:
    _, trace_id = new_traceparent()
    attributes = {**VLLM_ATTRIBUTES, "gen_ai.latency.time_in_queue": value}
    assert _post(receiver.endpoint, _export(_span(trace_id, attributes)))[0] == 200
    _assert_report(receiver.report_for(trace_id), VLLM_REPORT._replace(queue_ms=None))
    assert receiver.notes == {note: 1}


def test_a_span_with_no_usable_stage_is_a_request_without_stages(receiver: SpanReceiver) -> None:
    _, trace_id = new_traceparent()
    attributes = {
        "gen_ai.latency.e2e": -1.0,
        "gen_ai.latency.time_in_model_decode": "soon",
        "gen_ai.latency.time_to_first_token": 0.1,  # of interest, not a stage
    }
    assert _post(receiver.endpoint, _export(_span(trace_id, attributes)))[0] == 200
    assert receiver.wait_for([trace_id], TIMEOUT_S) == 0  # it came
    assert receiver.report_for(trace_id) is None
    assert receiver.counts()["requests_without_stages"] == 1
    assert receiver.counts()["requests_without_spans"] == 0
    assert sum(receiver.notes.values()) == 2


def test_a_span_that_never_comes_is_counted(receiver: SpanReceiver) -> None:
    (_, came), (_, never) = new_traceparent(), new_traceparent()
    assert _post(receiver.endpoint, _export(_span(came, VLLM_ATTRIBUTES)))[0] == 200
    assert receiver.wait_for([came, never], 0.2) == 1
    assert receiver.report_for(never) is None
    _assert_report(receiver.report_for(came), VLLM_REPORT)
    assert receiver.report_for(came) is None  # taken once
    counts = receiver.counts()
    assert counts["requests_joined"] == 1
    assert counts["requests_without_spans"] == 2


def test_wait_for_wakes_when_the_span_arrives(receiver: SpanReceiver) -> None:
    _, trace_id = new_traceparent()
    missing: list[int] = []
    waiter = threading.Thread(target=lambda: missing.append(receiver.wait_for([trace_id], 600)))
    waiter.start()
    assert _post(receiver.endpoint, _export(_span(trace_id, VLLM_ATTRIBUTES)))[0] == 200
    waiter.join(TIMEOUT_S)
    assert missing == [0]


def test_close_wakes_a_waiter() -> None:
    spans = SpanReceiver().start()
    missing: list[int] = []
    waiter = threading.Thread(target=lambda: missing.append(spans.wait_for(["ab" * 16], 600)))
    waiter.start()
    spans.close()
    waiter.join(TIMEOUT_S)
    assert missing == [1]


def test_spans_without_stages_are_not_kept_and_the_oldest_go_when_full() -> None:
    with SpanReceiver(max_spans=2) as spans:
        ids = [new_traceparent()[1] for _ in range(3)]
        other = _span(new_traceparent()[1], {"http.route": "/v1/chat/completions"})
        for trace_id in ids:
            assert _post(spans.endpoint, _export(_span(trace_id, VLLM_ATTRIBUTES), other))[0] == 200
        counts = spans.counts()
        assert counts["spans_received"] == 6
        assert counts["spans_waiting"] == 2
        assert counts["spans_dropped"] == 1
        assert spans.report_for(ids[0]) is None
        _assert_report(spans.report_for(ids[2]), VLLM_REPORT)


def test_of_several_server_spans_in_a_trace_the_last_to_end_counts(receiver: SpanReceiver) -> None:
    _, trace_id = new_traceparent()
    late = _span(trace_id, {**VLLM_ATTRIBUTES, "gen_ai.latency.e2e": 0.5}, end_ns=9_000)
    early = _span(trace_id, VLLM_ATTRIBUTES, end_ns=5_000)
    assert _post(receiver.endpoint, _export(late))[0] == 200
    assert _post(receiver.endpoint, _export(early))[0] == 200
    report = receiver.report_for(trace_id)
    assert report is not None
    assert report.server_e2e_ms == pytest.approx(500.0)
    assert sum(receiver.notes.values()) == 1


def test_exports_from_many_threads_at_once(receiver: SpanReceiver) -> None:
    ids = [[new_traceparent()[1] for _ in range(20)] for _ in range(6)]

    def send(batch: list[str]) -> None:
        for trace_id in batch:
            assert _post(receiver.endpoint, _export(_span(trace_id, VLLM_ATTRIBUTES)))[0] == 200

    senders = [threading.Thread(target=send, args=(batch,)) for batch in ids]
    for sender in senders:
        sender.start()
    for sender in senders:
        sender.join(TIMEOUT_S)
    every = [t for batch in ids for t in batch]
    assert receiver.wait_for(every, TIMEOUT_S) == 0
    assert all(receiver.report_for(t) is not None for t in every)
    assert receiver.counts()["requests_joined"] == 120


def _ipv6_loopback() -> bool:
    if not socket.has_ipv6:
        return False
    try:
        with socket.socket(socket.AF_INET6) as probe:
            probe.bind(("::1", 0))
    except OSError:
        return False
    return True


@pytest.mark.skipif(not _ipv6_loopback(), reason="no IPv6 loopback here")
def test_ipv6() -> None:
    with SpanReceiver("::1") as spans:
        assert spans.endpoint.startswith("http://[::1]:")
        assert spans.endpoint.endswith("/v1/traces")
        _, trace_id = new_traceparent()
        assert _post(spans.endpoint, _export(_span(trace_id, VLLM_ATTRIBUTES)))[0] == 200
        _assert_report(spans.report_for(trace_id), VLLM_REPORT)


def test_a_receiver_that_is_closing_answers_503() -> None:
    receiver = TraceReceiver(lambda request: None)
    receiver.close()
    with pytest.raises(ExportRefused) as refused:
        receiver.receive(_export(), PROTOBUF)
    assert refused.value.status == 503


@given(
    body=st.binary(max_size=300),
    media=st.sampled_from([PROTOBUF, JSON]),
    encoding=st.sampled_from(["", "gzip", "deflate"]),
)
def test_any_body_is_an_export_or_refused_with_a_4xx(
    body: bytes, media: str, encoding: str
) -> None:
    status = 200
    try:
        otlp_receiver.decode_export(
            body, media_type=media, content_encoding=encoding, max_body_bytes=4096
        )
    except ExportRefused as exc:
        status = exc.status
    assert status == 200 or 400 <= status < 500


def test_a_missing_trace_extra_names_what_to_install(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(
        sys.modules, "opentelemetry.proto.collector.trace.v1.trace_service_pb2", None
    )
    with pytest.raises(MissingExtraError, match=r"pip install 'inferwire\[trace\]'"):
        SpanReceiver()
