"""The fake engines (tests/helpers/fake_engines.py) that the attribution is tested against: each
flavor as a child process, read with clients inferwire did not write (the ``openai`` SDK,
``prometheus_client``'s parser, ``opentelemetry-proto``), and every bad-source switch doing
what it says. Durations are checked only as "at least the known delay"."""

from __future__ import annotations

import json
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import openai
import pytest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.trace.v1.trace_pb2 import Span
from prometheus_client.parser import text_string_to_metric_families

from tests.helpers import fake_engines
from tests.helpers.fake_engines import Running, running

FRONTEND_MS, QUEUE_MS, PREFILL_MS, DECODE_MS, TOKENS = 20.0, 30.0, 40.0, 10.0, 4
DELAYS = (
    f"--frontend-ms={FRONTEND_MS}",
    f"--queue-ms={QUEUE_MS}",
    f"--prefill-ms={PREFILL_MS}",
    f"--decode-ms={DECODE_MS}",
    f"--tokens={TOKENS}",
)
DECODE_S = DECODE_MS * (TOKENS - 1) / 1000
MODEL = "fake-model"
TIMEOUT_S = 30.0
TRACE_ID = "0af7651916cd43dd8448eb211c80319c"
PARENT_ID = "b7ad6b7169203331"
OPENAI_FLAVORS = ("vllm", "sglang", "tgi")


def _get(url: str) -> str:
    with urllib.request.urlopen(url, timeout=TIMEOUT_S) as reply:
        text: str = reply.read().decode()
        return text


def _get_status(url: str) -> int:
    with pytest.raises(urllib.error.HTTPError) as info:
        _get(url)
    info.value.close()
    return info.value.code


def _chat(
    engine: Running, max_tokens: int | None = None, *, traceparent: str | None = None
) -> list[Any]:
    """One streamed chat completion through the openai SDK: its chunks."""
    headers = {"traceparent": traceparent} if traceparent else None
    with openai.OpenAI(
        base_url=engine.url + "/v1", api_key="none", max_retries=0, timeout=TIMEOUT_S
    ) as client:
        stream = client.chat.completions.create(
            model=MODEL,
            messages=[{"role": "user", "content": "say four words"}],
            stream=True,
            stream_options={"include_usage": True},
            extra_headers=headers,
            max_tokens=max_tokens,  # None: the server's own --tokens
        )
        with stream:
            return list(stream)


def _content(chunks: list[Any]) -> str:
    return "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)


def _events(url: str, body: dict[str, Any]) -> list[str]:
    """The data of a stream of server-sent events, read by hand."""
    request = urllib.request.Request(url, data=json.dumps(body).encode())
    with urllib.request.urlopen(request, timeout=TIMEOUT_S) as reply:
        assert reply.headers["Content-Type"].startswith("text/event-stream")
        lines = reply.read().decode().splitlines()
    return [line[len("data: ") :] for line in lines if line.startswith("data: ")]


def _generate_stream(engine: Running, max_tokens: int | None = None) -> list[dict[str, Any]]:
    """Triton's generate_stream: the events' JSON objects."""
    parameters: dict[str, Any] = {"stream": True}
    if max_tokens:
        parameters["max_tokens"] = max_tokens
    body = {"text_input": "say four words", "parameters": parameters}
    return [json.loads(e) for e in _events(f"{engine.url}/v2/models/{MODEL}/generate_stream", body)]


def _request(engine: Running, flavor: str) -> None:
    """One request, streamed (read by hand: the SDK's client costs more than the request)."""
    if flavor == "triton":
        _generate_stream(engine)
    else:
        messages = [{"role": "user", "content": "say four words"}]
        body = {"model": MODEL, "messages": messages, "stream": True}
        assert _events(engine.url + "/v1/chat/completions", body)[-1] == "[DONE]"


def _samples(text: str) -> dict[str, float]:
    """Every sample of a scrape by name, summed over label sets but ``le``'s."""
    out: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            key = sample.name
            if "le" in sample.labels:
                key += f"[{sample.labels['le']}]"
            out[key] = out.get(key, 0.0) + sample.value
    return out


def _bounds(text: str, histogram: str) -> set[str]:
    return {k.split("[")[1][:-1] for k in _samples(text) if k.startswith(histogram + "_bucket[")}


REQUESTS = {
    "vllm": "vllm:request_success_total",
    "sglang": "sglang:num_requests_total",
    "tgi": "tgi_request_success_total",
    "triton": "nv_inference_request_success_total",
}
"""The counter of each flavor's requests, as the parser names its samples: it adds ``_total``
to a counter's that lacks it (TGI's, Triton's)."""

# (family, the stages it covers, in seconds; Triton's in microseconds or ms)
QUEUE, PREFILL, DECODE, FRONTEND = QUEUE_MS / 1000, PREFILL_MS / 1000, DECODE_S, FRONTEND_MS / 1000
REPORTED: dict[str, list[tuple[str, float]]] = {
    "vllm": [
        ("vllm:request_queue_time_seconds_sum", QUEUE),
        ("vllm:request_prefill_time_seconds_sum", PREFILL),
        ("vllm:request_decode_time_seconds_sum", DECODE),
        ("vllm:request_inference_time_seconds_sum", PREFILL + DECODE),
        ("vllm:time_to_first_token_seconds_sum", QUEUE + PREFILL),
        ("vllm:e2e_request_latency_seconds_sum", QUEUE + PREFILL + DECODE),
    ],
    "sglang": [
        ("sglang:queue_time_seconds_sum", QUEUE),
        ("sglang:time_to_first_token_seconds_sum", FRONTEND + QUEUE + PREFILL),
        ("sglang:e2e_request_latency_seconds_sum", FRONTEND + QUEUE + PREFILL + DECODE),
    ],
    "tgi": [
        ("tgi_request_validation_duration_sum", FRONTEND),
        ("tgi_request_queue_duration_sum", QUEUE),
        ("tgi_request_inference_duration_sum", PREFILL + DECODE),
        ("tgi_request_duration_sum", FRONTEND + QUEUE + PREFILL + DECODE),
    ],
    "triton": [
        ("nv_inference_queue_duration_us_total", QUEUE * 1e6),
        ("nv_inference_compute_infer_duration_us_total", (PREFILL + DECODE) * 1e6),
        ("nv_inference_request_duration_us_total", (QUEUE + PREFILL + DECODE) * 1e6),
        ("nv_inference_first_response_histogram_ms_sum", (QUEUE + PREFILL) * 1e3),
    ],
}


@dataclass
class Receiver:
    """An OTLP/HTTP receiver in this process: the bodies POSTed to :attr:`url`."""

    url: str
    bodies: list[bytes] = field(default_factory=list)

    def spans(self) -> list[Span]:
        out: list[Span] = []
        for body in list(self.bodies):
            for resource in ExportTraceServiceRequest.FromString(body).resource_spans:
                for scope in resource.scope_spans:
                    out.extend(scope.spans)
        return out

    def wait_for_spans(self, count: int, timeout_s: float = TIMEOUT_S) -> list[Span]:
        deadline = time.monotonic() + timeout_s
        while len(spans := self.spans()) < count and time.monotonic() < deadline:
            time.sleep(0.05)
        return spans


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    bodies: list[bytes] = []

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, format: str, *args: Any) -> None:
            pass

        def do_POST(self) -> None:
            bodies.append(self.rfile.read(int(self.headers["Content-Length"])))
            self.send_response(200)
            self.send_header("Content-Type", "application/x-protobuf")
            self.send_header("Content-Length", "0")
            self.end_headers()

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield Receiver(f"http://127.0.0.1:{server.server_address[1]}/v1/traces", bodies)
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=TIMEOUT_S)


# -- the streams ------------------------------------------------------------------------------


@pytest.mark.parametrize("flavor", OPENAI_FLAVORS)
def test_the_openai_sdk_reads_the_stream(flavor: str) -> None:
    with running(flavor, *DELAYS, "--tokens-per-chunk=2") as engine:
        chunks = _chat(engine)
        models = _get(engine.url + "/v1/models")
    ids = {c.id for c in chunks}
    assert len(ids) == 1
    assert ids.pop().startswith("chatcmpl-")
    assert all(c.object == "chat.completion.chunk" for c in chunks)
    assert _content(chunks) == " t0 t1 t2 t3"
    with_text = [c for c in chunks if c.choices and c.choices[0].delta.content]
    # the first token alone, then two a chunk
    assert [c.choices[0].delta.content for c in with_text] == [" t0", " t1 t2", " t3"]
    finishes = [c.choices[0].finish_reason for c in chunks if c.choices]
    assert finishes[-1] == "length"
    assert set(finishes[:-1]) == {None}
    usage = chunks[-1]
    assert usage.choices == []
    assert usage.usage is not None
    assert usage.usage.completion_tokens == TOKENS
    assert json.loads(models)["data"][0]["id"] == MODEL


@pytest.mark.parametrize("flavor", [*OPENAI_FLAVORS, "triton"])
def test_max_tokens_of_the_request_wins(flavor: str) -> None:
    with running(flavor, *DELAYS) as engine:
        if flavor == "triton":
            texts = [e["text_output"] for e in _generate_stream(engine, max_tokens=2)]
            assert texts == [" t0", " t1"]
        else:
            assert _content(_chat(engine, max_tokens=2)) == " t0 t1"


def test_triton_serves_the_generate_extension_and_metadata() -> None:
    with running("triton", *DELAYS) as engine:
        events = _generate_stream(engine)
        server = json.loads(_get(engine.url + "/v2"))
        metadata = json.loads(_get(f"{engine.url}/v2/models/{MODEL}"))
        assert _get_status(f"{engine.url}/v2/models/other") == 400
        assert _get_status(engine.url + "/metrics") == 404  # on its own port only
    assert [e["text_output"] for e in events] == [" t0", " t1", " t2", " t3"]
    assert all(e["model_name"] == MODEL and e["model_version"] == "1" for e in events)
    assert server["name"] == "triton"
    assert metadata["name"] == MODEL
    assert {t["name"] for t in metadata["outputs"]} == {"text_output"}


def test_without_stream_one_answer() -> None:
    messages = [{"role": "user", "content": "say four words"}]
    body = {"model": MODEL, "messages": messages, "max_tokens": 3}
    with running("vllm", *DELAYS, "--per-request-metrics") as engine:
        request = urllib.request.Request(
            engine.url + "/v1/chat/completions", data=json.dumps(body).encode()
        )
        with urllib.request.urlopen(request, timeout=TIMEOUT_S) as reply:
            answer = json.loads(reply.read())
    with running("triton", *DELAYS) as engine:
        request = urllib.request.Request(
            f"{engine.url}/v2/models/{MODEL}/generate",
            data=json.dumps(
                {"id": "42", "text_input": "x", "parameters": {"max_tokens": 3}}
            ).encode(),
        )
        with urllib.request.urlopen(request, timeout=TIMEOUT_S) as reply:
            generated = json.loads(reply.read())
    assert answer["object"] == "chat.completion"
    assert answer["choices"][0]["message"]["content"] == " t0 t1 t2"
    assert answer["usage"]["completion_tokens"] == 3
    assert answer["metrics"]["queue_time_ms"] >= QUEUE_MS
    assert generated == {
        "id": "42",
        "model_name": MODEL,
        "model_version": "1",
        "text_output": " t0 t1 t2",
    }


def test_requests_are_served_concurrently() -> None:
    with running("vllm", *DELAYS) as engine:
        threads = [threading.Thread(target=_request, args=(engine, "vllm")) for _ in range(4)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout=TIMEOUT_S)
        samples = _samples(_get(engine.metrics_url))
    assert samples["vllm:request_success_total"] == 4


def test_sigterm_stops_it_cleanly() -> None:
    with running("vllm", *DELAYS) as engine:
        _chat(engine)
        assert engine.stop() == 0


# -- vLLM's per-request metrics object ---------------------------------------------------------


def _metrics_object(*args: str) -> dict[str, Any]:
    with running("vllm", *DELAYS, "--per-request-metrics", *args) as engine:
        chunks = _chat(engine)
    assert chunks[-1].usage is not None
    extra = chunks[-1].model_extra or {}
    metrics: dict[str, Any] = extra["metrics"]
    return metrics


def test_the_metrics_object_reports_the_known_delays() -> None:
    metrics = _metrics_object()
    assert metrics["queue_time_ms"] >= QUEUE_MS
    assert metrics["time_to_first_token_ms"] >= PREFILL_MS  # from scheduling: the prefill
    assert metrics["generation_time_ms"] >= DECODE_MS * (TOKENS - 1)
    assert metrics["mean_itl_ms"] >= DECODE_MS
    total_s = (metrics["time_to_first_token_ms"] + metrics["generation_time_ms"]) / 1000
    assert metrics["tokens_per_second"] == pytest.approx(TOKENS / total_s, rel=0.01)


@pytest.mark.parametrize(
    ("mode", "check"),
    [
        ("nulls", lambda m: all(v is None for v in m.values())),
        ("negative", lambda m: all(v < 0 for v in m.values())),
        (
            "too-large",
            lambda m: (
                min(m["queue_time_ms"], m["time_to_first_token_ms"], m["generation_time_ms"])
                > 2 * (FRONTEND_MS + QUEUE_MS + PREFILL_MS + DECODE_MS * (TOKENS - 1))
            ),
        ),
    ],
)
def test_bad_metrics_objects(mode: str, check: Any) -> None:
    metrics = _metrics_object(f"--metrics-object-mode={mode}")
    assert set(metrics) == {
        "queue_time_ms",
        "time_to_first_token_ms",
        "generation_time_ms",
        "mean_itl_ms",
        "tokens_per_second",
    }
    assert check(metrics)


# -- /metrics -----------------------------------------------------------------------------------


@pytest.mark.parametrize("flavor", fake_engines.FLAVORS)
def test_metrics_count_the_requests_and_their_known_delays(flavor: str) -> None:
    with running(flavor, *DELAYS) as engine:
        before = _samples(_get(engine.metrics_url))
        for _ in range(2):
            _request(engine, flavor)
        after = _samples(_get(engine.metrics_url))
    assert before.get(REQUESTS[flavor], 0.0) == 0.0
    assert after[REQUESTS[flavor]] == 2
    for name, known in REPORTED[flavor]:
        assert after[name] >= 2 * known, name


OWN_BUCKETS: dict[str, dict[str, tuple[float, ...]]] = {
    "vllm": {
        "vllm:e2e_request_latency_seconds": fake_engines.VLLM_REQUEST_LATENCY_BUCKETS,
        "vllm:request_queue_time_seconds": fake_engines.VLLM_REQUEST_LATENCY_BUCKETS,
        "vllm:time_to_first_token_seconds": fake_engines.VLLM_TTFT_BUCKETS,
    },
    "sglang": {
        "sglang:queue_time_seconds": fake_engines.SGLANG_QUEUE_BUCKETS,
        "sglang:time_to_first_token_seconds": fake_engines.SGLANG_TTFT_BUCKETS,
        "sglang:e2e_request_latency_seconds": fake_engines.SGLANG_E2E_BUCKETS,
    },
    "tgi": {
        "tgi_request_queue_duration": fake_engines.TGI_DURATION_BUCKETS,
        "tgi_request_duration": fake_engines.TGI_DURATION_BUCKETS,
    },
    "triton": {
        "nv_inference_first_response_histogram_ms": fake_engines.TRITON_FIRST_RESPONSE_BUCKETS_MS,
    },
}


@pytest.mark.parametrize("flavor", fake_engines.FLAVORS)
@pytest.mark.parametrize("mode", ["ok", "other-buckets"])
def test_histograms_have_the_engines_buckets_unless_told_otherwise(flavor: str, mode: str) -> None:
    with running(flavor, *DELAYS, f"--metrics-mode={mode}") as engine:
        _request(engine, flavor)
        text = _get(engine.metrics_url)
    for histogram, own in OWN_BUCKETS[flavor].items():
        bounds = {float(b) for b in _bounds(text, histogram)}
        assert float("inf") in bounds
        if mode == "ok":
            assert bounds == {*own, float("inf")}, histogram
        else:
            assert len(bounds) > 1
            assert not bounds - {float("inf")} <= set(own), histogram


def test_tgi_shows_a_family_only_once_used() -> None:
    with running("tgi", *DELAYS) as engine:
        assert _samples(_get(engine.metrics_url)) == {}
        _chat(engine)
        assert _samples(_get(engine.metrics_url))["tgi_request_count_total"] == 1


@pytest.mark.parametrize("flavor", fake_engines.FLAVORS)
def test_metrics_404(flavor: str) -> None:
    with running(flavor, *DELAYS, "--metrics-mode=404") as engine:
        assert _get_status(engine.metrics_url) == 404


@pytest.mark.parametrize("flavor", fake_engines.FLAVORS)
def test_metrics_garbage_is_not_prometheus(flavor: str) -> None:
    with running(flavor, *DELAYS, "--metrics-mode=garbage") as engine:
        text = _get(engine.metrics_url)
    with pytest.raises(ValueError, match="Invalid"):
        _samples(text)


@pytest.mark.parametrize("flavor", fake_engines.FLAVORS)
def test_metrics_reset_as_a_restarted_server(flavor: str) -> None:
    with running(flavor, *DELAYS, "--metrics-mode=reset", "--reset-after=2") as engine:
        counts = []
        for _ in range(4):
            _request(engine, flavor)
            counts.append(_samples(_get(engine.metrics_url))[REQUESTS[flavor]])
    assert counts == [1, 2, 1, 2]


# -- spans --------------------------------------------------------------------------------------


def test_spans_carry_the_trace_and_vllms_latencies(receiver: Receiver) -> None:
    args = (*DELAYS, f"--otlp-endpoint={receiver.url}", "--span-batch-ms=100")
    with running("vllm", *args) as engine:
        _chat(engine, traceparent=f"00-{TRACE_ID}-{PARENT_ID}-01")
        _chat(engine)  # no traceparent: a root span of a trace of its own
        spans = receiver.wait_for_spans(2)
    assert len(spans) == 2
    joined, root = sorted(spans, key=lambda s: s.trace_id.hex() != TRACE_ID)
    assert joined.trace_id.hex() == TRACE_ID
    assert joined.parent_span_id.hex() == PARENT_ID
    assert root.trace_id.hex() != TRACE_ID
    assert root.parent_span_id == b""
    for span in spans:
        assert span.name == "llm_request"
        assert span.kind == Span.SPAN_KIND_SERVER
        assert span.end_time_unix_nano - span.start_time_unix_nano >= (
            (QUEUE + PREFILL + DECODE) * 1e9
        )
        attributes = {a.key: a.value for a in span.attributes}
        latency = {k: v.double_value for k, v in attributes.items() if "latency" in k}
        assert latency["gen_ai.latency.time_in_queue"] >= QUEUE
        assert latency["gen_ai.latency.time_in_model_prefill"] >= PREFILL
        assert latency["gen_ai.latency.time_in_model_decode"] >= DECODE
        assert latency["gen_ai.latency.time_in_model_inference"] >= PREFILL + DECODE
        assert latency["gen_ai.latency.time_to_first_token"] >= QUEUE + PREFILL
        assert latency["gen_ai.latency.e2e"] >= QUEUE + PREFILL + DECODE
        assert attributes["gen_ai.usage.completion_tokens"].int_value == TOKENS


def test_spans_never_sent(receiver: Receiver) -> None:
    args = (*DELAYS, f"--otlp-endpoint={receiver.url}", "--span-batch-ms=50", "--spans-mode=never")
    with running("vllm", *args) as engine:
        _chat(engine)
        time.sleep(0.5)  # ten batches' time
        assert engine.stop() == 0  # a clean stop flushes what is pending
    assert receiver.bodies == []


def test_a_clean_stop_flushes_the_last_spans(receiver: Receiver) -> None:
    args = (*DELAYS, f"--otlp-endpoint={receiver.url}", "--span-batch-ms=60000")
    with running("vllm", *args) as engine:
        _chat(engine)
        assert engine.stop() == 0
    assert len(receiver.spans()) == 1


@pytest.mark.parametrize("value", [None, "", "garbage", f"00-{'0' * 32}-{PARENT_ID}-01"])
def test_a_missing_or_bad_traceparent_starts_a_trace(value: str | None) -> None:
    assert fake_engines.parse_traceparent(value) is None


@pytest.mark.parametrize(
    "argv",
    [
        ["--flavor=tgi", "--per-request-metrics"],
        ["--flavor=sglang", "--otlp-endpoint=http://127.0.0.1:1/v1/traces"],
        ["--flavor=vllm", "--tokens=0"],
    ],
)
def test_options_refused(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        fake_engines.parse_args(argv)
    assert "error" in capsys.readouterr().err
