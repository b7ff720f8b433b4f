"""Fake vLLM, SGLang, TGI and Triton servers that report their time as the real ones do, with
known delays, for the attribution tests (``inferwire load --url``): servers inferwire did not
write, on the standard library only (the OTLP export alone uses ``opentelemetry-proto``'s
message classes, imported when it is asked for).

Run ``python -m tests.helpers.fake_engines --flavor vllm --queue-ms 30 ...`` from the repo's
root: it prints ``listening PORT`` (for ``triton`` also ``metrics PORT``: Triton serves its
metrics on a port of their own, 8002 beside 8000), flushed, and stops cleanly on SIGTERM.
:func:`running` starts one as a child process for a test.

What it serves: ``vllm``, ``sglang`` and ``tgi`` the OpenAI ``POST /v1/chat/completions``
(streamed or not; ``stream_options.include_usage`` adds the usage chunk, then ``[DONE]``) and
``GET /v1/models``; ``triton`` the KServe v2 generate extension (``POST
/v2/models/M/generate_stream``, events of ``text_output``, no end marker; ``/generate``),
``GET /v2`` and ``GET /v2/models/M``. Requests are served on threads, each through one
timeline, slept (not queued), stamped on ``time.monotonic_ns()``, so that what the server
reports is the sleep plus the scheduling noise:

=============  =========================================================================
stage          what the server does
=============  =========================================================================
frontend       ``--frontend-ms`` once the request is read (tokenization), then the head
queue          ``--queue-ms``
prefill        ``--prefill-ms``, then the first token, alone in its chunk (as vLLM's)
decode         ``--decode-ms`` per further token, ``--tokens-per-chunk`` tokens a chunk
=============  =========================================================================

``--tokens`` tokens (`` t0``, `` t1``, ...) unless the request's ``max_tokens`` says. Who
reports which stage, each as that engine's code records it (recorded before the last token's
chunk is written, so a scrape after the stream sees the request):

- ``vllm``: the ``metrics`` object (``--per-request-metrics``; docs.vllm.ai, *Per-Request
  Metrics*) on the usage chunk: queue, TTFT from scheduling (the prefill), generation;
  ``/metrics`` as ``vllm/v1/metrics/loggers.py`` (labels ``model_name``, ``engine``): queue,
  prefill, decode, inference, and e2e and TTFT from the engine's arrival, after the frontend;
  with ``--otlp-endpoint``, an ``llm_request`` span per request, the ``gen_ai.latency.*``
  attributes as ``OutputProcessor.do_tracing`` sets them. The frontend is in none.
- ``sglang`` (``python/sglang/srt/metrics/collector.py``): the queue (scheduler labels), and
  TTFT and e2e from the tokenizer manager's ``received_time``: those include the frontend.
- ``tgi`` (``router/src/server.rs``): validation, which *is* the frontend (the handler's start
  to queued), queue, inference (prefill and decode) and their total.
- ``triton`` (``docs/user_guide/metrics.md``): cumulative microsecond counters: queue, compute
  input and output (the microseconds between the fake's stamps), compute infer (prefill and
  decode), request (queue to last token); the first-response histogram. Not the frontend.

Each exposition is written as that engine's exporter writes it: prometheus_client's for vLLM
and SGLang (``_total`` counters, float values, ``_created`` gauges; SGLang's label sets only
once used), metrics-rs's for TGI (counters without ``_total``, no labels, a family only once
used), prometheus-cpp's for Triton.

Bad sources: ``--metrics-mode`` ``404``; ``garbage`` (a 200 that is not Prometheus); ``reset``
(every family back to zero, as a restarted server, when the request after the
``--reset-after``-th arrives); ``other-buckets`` (boundaries none of the engines uses).
``--metrics-object-mode`` ``nulls``, ``negative``, ``too-large`` (each stage twice the whole
request). ``--spans-mode never``.

``--prefix-cache`` (vllm): a toy prefix cache of the prompts' words (a word a token, the
messages' contents one after the other) in blocks of ``--prefix-block-tokens``, that keeps
every block and, as vLLM's, serves whole blocks of a prompt's leading tokens already seen, never
its last token; counted as ``vllm:prefix_cache_queries`` (the prompt's tokens) and
``vllm:prefix_cache_hits`` (those served): looked up as the request arrives, counted with its
other figures.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import queue
import re
import signal
import subprocess
import sys
import threading
import time
import urllib.request
import uuid
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, Final

FLAVORS: Final = ("vllm", "sglang", "tgi", "triton")
METRICS_MODES: Final = ("ok", "404", "garbage", "reset", "other-buckets")
METRICS_OBJECT_MODES: Final = ("ok", "nulls", "negative", "too-large")
SPANS_MODES: Final = ("ok", "never")

# vllm/v1/metrics/loggers.py (PrometheusStatLogger)
VLLM_TTFT_BUCKETS: Final = (
    0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
    20.0, 40.0, 80.0, 160.0, 640.0, 2560.0,
)  # fmt: skip
VLLM_REQUEST_LATENCY_BUCKETS: Final = (
    0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0,
    240.0, 480.0, 960.0, 1920.0, 7680.0,
)  # fmt: skip
# python/sglang/srt/metrics/collector.py (TokenizerMetricsCollector, SchedulerMetricsCollector)
SGLANG_TTFT_BUCKETS: Final = (
    0.1, 0.2, 0.4, 0.6, 0.8, 1, 2, 4, 6, 8, 10, 20, 40, 60, 80, 100, 200, 400,
)  # fmt: skip
SGLANG_E2E_BUCKETS: Final = (*SGLANG_TTFT_BUCKETS, 600, 1200, 1800, 2400)
SGLANG_QUEUE_BUCKETS: Final = (
    0.0, 0.1, 0.2, 0.5, 1, 2, 3, 4, 5, 10, 15, 20, 30, 40, 50, 60, 70, 80, 90, 100, 200, 300,
    400, 500, 600, 700, 800, 900, 1000, 1200, 1400, 1600, 1800, 2000, 2500, 3000,
)  # fmt: skip
# router/src/server.rs: every family whose name ends in "duration", 1e-4 * 1.5**k, k = 1..35
TGI_DURATION_BUCKETS: Final = tuple(0.0001 * 1.5**k for k in range(1, 36))
# Triton's default for its (experimental) first-response histogram, docs/user_guide/metrics.md
TRITON_FIRST_RESPONSE_BUCKETS_MS: Final = (100.0, 500.0, 2000.0, 5000.0)
OTHER_BUCKETS_S: Final = (0.0025, 0.025, 0.25, 2.5, 25.0)
"""``--metrics-mode other-buckets``: boundaries none of the engines uses (Triton's in ms x1000)."""

GARBAGE: Final = b"<html><body><h1>502 Bad Gateway</h1>upstream: {not metrics}</body></html>\n"
ROOT: Final = Path(__file__).resolve().parents[2]
_TRACEPARENT: Final = re.compile(r"00-([0-9a-f]{32})-([0-9a-f]{16})-[0-9a-f]{2}")
_EXTENSIONS: Final = (
    "classification", "sequence", "model_repository", "schedule_policy", "model_configuration",
    "binary_tensor_data", "parameters", "statistics", "trace", "logging", "generate",
)  # fmt: skip
_TRITON_PATH: Final = re.compile(
    r"/v2/models/([^/]+)(?:/versions/([^/]+))?(/generate|/generate_stream|/ready)?"
)


def _now() -> int:
    return time.monotonic_ns()


def _sleep_ms(ms: float) -> None:
    if ms > 0:
        time.sleep(ms / 1000)


@dataclass(frozen=True, slots=True, kw_only=True)
class Options:
    flavor: str
    model: str = "fake-model"
    frontend_ms: float = 5.0
    queue_ms: float = 10.0
    prefill_ms: float = 20.0
    decode_ms: float = 5.0
    tokens: int = 8
    tokens_per_chunk: int = 1
    per_request_metrics: bool = False
    metrics_mode: str = "ok"
    reset_after: int = 1
    metrics_object_mode: str = "ok"
    otlp_endpoint: str | None = None
    spans_mode: str = "ok"
    span_batch_ms: float = 200.0
    prefix_cache: bool = False
    prefix_block_tokens: int = 16


@dataclass(frozen=True, slots=True, kw_only=True)
class Stamps:
    """One request's timeline, ``time.monotonic_ns()`` throughout."""

    received_ns: int
    """The handler has the request's head (TGI's ``start_time``, SGLang's ``received_time``)."""
    arrived_ns: int
    """The frontend is done: the engine has it (vLLM's arrival, TGI's queued)."""
    scheduled_ns: int
    input_done_ns: int
    first_token_ns: int
    last_token_ns: int
    prompt_tokens: int
    output_tokens: int
    request_id: str
    traceparent: str | None
    cached_tokens: int = 0
    """Prompt tokens the prefix cache served (``--prefix-cache``)."""


# -- /metrics: families written as each engine's exporter writes them ------------------------

Labels = tuple[tuple[str, str], ...]


class _Histogram:
    __slots__ = ("bounds", "count", "counts", "total")

    def __init__(self, bounds: Sequence[float]) -> None:
        self.bounds = tuple(float(b) for b in bounds)
        self.counts = [0] * len(self.bounds)
        self.total = 0.0
        self.count = 0

    def observe(self, value: float) -> None:
        for i, bound in enumerate(self.bounds):
            if value <= bound:
                self.counts[i] += 1
                break
        self.total += value
        self.count += 1


@dataclass(slots=True)
class _Family:
    name: str
    kind: str  # "counter" or "histogram"
    help: str
    bounds: tuple[float, ...] = ()
    series: dict[Labels, _Histogram | list[float]] = field(default_factory=dict)
    created: dict[Labels, float] = field(default_factory=dict)

    def child(self, labels: Labels) -> _Histogram | list[float]:
        if labels not in self.series:
            self.series[labels] = _Histogram(self.bounds) if self.kind == "histogram" else [0.0]
            self.created[labels] = time.time()
        return self.series[labels]

    def add(self, labels: Labels, value: float) -> None:
        """Observes ``value`` (a histogram) or adds it (a counter)."""
        child = self.child(labels)
        if isinstance(child, _Histogram):
            child.observe(value)
        else:
            child[0] += value


@dataclass(frozen=True, slots=True)
class _Style:
    """What differs between prometheus_client (vLLM, SGLang), metrics-rs (TGI) and
    prometheus-cpp (Triton) in the text they write."""

    counter_suffix: str
    floats: bool  # prometheus_client writes every value as a float ("3.0")
    created: bool  # prometheus_client's ``_created`` gauges
    empty_families: bool  # HELP and TYPE of a family with no samples yet


PYTHON: Final = _Style("_total", floats=True, created=True, empty_families=True)
RUST: Final = _Style("", floats=False, created=False, empty_families=False)
CPP: Final = _Style("", floats=False, created=False, empty_families=True)


def _number(value: float, style: _Style) -> str:
    if value == float("inf"):
        return "+Inf"
    if style.floats or not float(value).is_integer():
        return repr(float(value))
    return str(int(value))


def _labels(labels: Labels, style: _Style, le: float | None = None) -> str:
    pairs = [*labels, ("le", _number(le, style))] if le is not None else list(labels)
    if not pairs:
        return ""
    return "{" + ",".join(f'{k}="{v}"' for k, v in pairs) + "}"


def render(families: Sequence[_Family], style: _Style) -> str:
    """The text exposition format (0.0.4) of ``families``."""
    lines: list[str] = []
    for fam in families:
        if not fam.series and not style.empty_families:
            continue
        name = fam.name + (style.counter_suffix if fam.kind == "counter" else "")
        lines += [f"# HELP {name} {fam.help}", f"# TYPE {name} {fam.kind}"]
        for labels, child in fam.series.items():
            if isinstance(child, list):
                lines.append(f"{name}{_labels(labels, style)} {_number(child[0], style)}")
                continue
            cumulative = 0
            for bound, n in zip((*child.bounds, float("inf")), (*child.counts, None), strict=True):
                cumulative = child.count if n is None else cumulative + n
                line = f"{name}_bucket{_labels(labels, style, bound)} {_number(cumulative, style)}"
                lines.append(line)
            lines.append(f"{name}_count{_labels(labels, style)} {_number(child.count, style)}")
            lines.append(f"{name}_sum{_labels(labels, style)} {_number(child.total, style)}")
        if style.created and fam.series:
            lines += [f"# HELP {fam.name}_created {fam.help}", f"# TYPE {fam.name}_created gauge"]
            for labels, created in fam.created.items():
                lines.append(f"{fam.name}_created{_labels(labels, style)} {created!r}")
    return "".join(line + "\n" for line in lines)


def _s(start_ns: int, end_ns: int) -> float:
    return (end_ns - start_ns) / 1e9


def _us(start_ns: int, end_ns: int) -> float:
    return float((end_ns - start_ns) // 1000)


Measure = Callable[[Stamps, int], float]
"""A family's value for one request, from its stamps and the time it is recorded."""


@dataclass(frozen=True, slots=True)
class Row:
    """One family an engine publishes and what it takes from each request."""

    name: str
    help: str
    measure: Measure
    bounds: tuple[float, ...] | None = None
    """A histogram's buckets; None for a counter."""
    labels: Labels = ()
    idle: tuple[Labels, ...] = ()
    """Further label sets, shown at zero from start-up (vLLM's finish reasons)."""
    at_arrival: bool = False
    """Counted when the request arrives, not when it ends (``tgi_request_count``)."""


def _one(s: Stamps, now_ns: int) -> float:
    return 1.0


def _vllm_rows(model: str, other: bool) -> list[Row]:
    labels = (("model_name", model), ("engine", "0"))
    latency = OTHER_BUCKETS_S if other else VLLM_REQUEST_LATENCY_BUCKETS
    reasons = tuple((*labels, ("finished_reason", r)) for r in ("stop", "length", "abort"))
    rows = [
        Row("vllm:request_success", "Count of successfully processed requests.", _one,
            labels=reasons[1], idle=reasons),
        Row("vllm:prompt_tokens", "Number of prefill tokens processed.",
            lambda s, _: s.prompt_tokens, labels=labels),
        Row("vllm:generation_tokens", "Number of generation tokens processed.",
            lambda s, _: s.output_tokens, labels=labels),
        Row("vllm:time_to_first_token_seconds", "Histogram of time to first token in seconds.",
            lambda s, _: _s(s.arrived_ns, s.first_token_ns),
            OTHER_BUCKETS_S if other else VLLM_TTFT_BUCKETS, labels),
    ]  # fmt: skip
    for name, phase, measure in (
        ("e2e_request_latency", "", lambda s, _: _s(s.arrived_ns, s.last_token_ns)),
        ("request_queue_time", "WAITING", lambda s, _: _s(s.arrived_ns, s.scheduled_ns)),
        ("request_inference_time", "RUNNING", lambda s, _: _s(s.scheduled_ns, s.last_token_ns)),
        ("request_prefill_time", "PREFILL", lambda s, _: _s(s.scheduled_ns, s.first_token_ns)),
        ("request_decode_time", "DECODE", lambda s, _: _s(s.first_token_ns, s.last_token_ns)),
    ):
        help = f"Histogram of time spent in {phase} phase for request."
        if not phase:
            help = "Histogram of e2e request latency in seconds."
        rows.append(Row(f"vllm:{name}_seconds", help, measure, latency, labels))
    return rows


def _sglang_rows(model: str, other: bool) -> list[Row]:
    tokenizer = (("model_name", model),)
    ranks = (("tp_rank", "0"), ("pp_rank", "0"), ("moe_ep_rank", "0"))
    scheduler = (*tokenizer, ("engine_type", "unified"), *ranks)
    return [
        Row("sglang:prompt_tokens", "Number of prefill tokens processed.",
            lambda s, _: s.prompt_tokens, labels=tokenizer),
        Row("sglang:generation_tokens", "Number of generation tokens processed.",
            lambda s, _: s.output_tokens, labels=tokenizer),
        Row("sglang:num_requests", "Number of requests processed.", _one, labels=tokenizer),
        Row("sglang:time_to_first_token_seconds", "Histogram of time to first token in seconds.",
            lambda s, _: _s(s.received_ns, s.first_token_ns),
            OTHER_BUCKETS_S if other else SGLANG_TTFT_BUCKETS, tokenizer),
        Row("sglang:e2e_request_latency_seconds",
            "Histogram of End-to-end request latency in seconds",
            lambda s, _: _s(s.received_ns, s.last_token_ns),
            OTHER_BUCKETS_S if other else SGLANG_E2E_BUCKETS, tokenizer),
        Row("sglang:queue_time_seconds", "Histogram of queueing time in seconds.",
            lambda s, _: _s(s.arrived_ns, s.scheduled_ns),
            OTHER_BUCKETS_S if other else SGLANG_QUEUE_BUCKETS, scheduler),
    ]  # fmt: skip


def _tgi_rows(model: str, other: bool) -> list[Row]:
    bounds = OTHER_BUCKETS_S if other else TGI_DURATION_BUCKETS
    return [
        Row("tgi_request_count", "Total number of requests", _one, at_arrival=True),
        Row("tgi_request_success", "Number of successful requests", _one),
        Row("tgi_request_duration", "Total time spent processing the request",
            lambda s, _: _s(s.received_ns, s.last_token_ns), bounds),
        Row("tgi_request_validation_duration", "Time spent validating the request",
            lambda s, _: _s(s.received_ns, s.arrived_ns), bounds),
        Row("tgi_request_queue_duration", "Time spent in the queue per request",
            lambda s, _: _s(s.arrived_ns, s.scheduled_ns), bounds),
        Row("tgi_request_inference_duration", "Request inference duration",
            lambda s, _: _s(s.scheduled_ns, s.last_token_ns), bounds),
        Row("tgi_request_mean_time_per_token_duration", "Mean time per token per request",
            lambda s, _: _s(s.scheduled_ns, s.last_token_ns) / s.output_tokens, bounds),
    ]  # fmt: skip


def _triton_rows(model: str, other: bool) -> list[Row]:
    labels = (("model", model), ("version", "1"))
    failures = tuple((labels[0], ("reason", r), labels[1])
                     for r in ("BACKEND", "CANCELED", "OTHER", "REJECTED"))  # fmt: skip
    cached = "(includes cached requests)"
    computed = "(does not include cached requests)"
    first_bounds = TRITON_FIRST_RESPONSE_BUCKETS_MS
    return [
        Row("nv_inference_request_success",
            "Number of successful inference requests, all batch sizes", _one, labels=labels),
        Row("nv_inference_request_failure", "Number of failed inference requests, all batch sizes",
            lambda s, _: 0.0, labels=failures[0], idle=failures),
        Row("nv_inference_count", f"Number of inferences performed {computed}", _one,
            labels=labels),
        Row("nv_inference_exec_count", f"Number of model executions performed {computed}", _one,
            labels=labels),
        Row("nv_inference_request_duration_us",
            f"Cumulative inference request duration in microseconds {cached}",
            lambda s, _: _us(s.arrived_ns, s.last_token_ns), labels=labels),
        Row("nv_inference_queue_duration_us",
            f"Cumulative inference queuing duration in microseconds {cached}",
            lambda s, _: _us(s.arrived_ns, s.scheduled_ns), labels=labels),
        Row("nv_inference_compute_input_duration_us",
            f"Cumulative compute input duration in microseconds {computed}",
            lambda s, _: _us(s.scheduled_ns, s.input_done_ns), labels=labels),
        Row("nv_inference_compute_infer_duration_us",
            f"Cumulative compute inference duration in microseconds {computed}",
            lambda s, _: _us(s.input_done_ns, s.last_token_ns), labels=labels),
        Row("nv_inference_compute_output_duration_us",
            f"Cumulative inference compute output duration in microseconds {computed}",
            lambda s, now_ns: _us(s.last_token_ns, now_ns), labels=labels),
        Row("nv_inference_first_response_histogram_ms",
            "Duration from request to first response in milliseconds",
            lambda s, _: (s.first_token_ns - s.arrived_ns) / 1e6,
            tuple(b * 1000 for b in OTHER_BUCKETS_S) if other else first_bounds, labels),
    ]  # fmt: skip


ENGINES: Final[dict[str, tuple[Callable[[str, bool], list[Row]], _Style, bool]]] = {
    "vllm": (_vllm_rows, PYTHON, True),
    "sglang": (_sglang_rows, PYTHON, False),
    "tgi": (_tgi_rows, RUST, False),
    "triton": (_triton_rows, CPP, True),
}
"""Per flavor: its families, how its exporter writes them, and whether its label sets exist
from start-up (vLLM's ``make_per_engine``, Triton's per-model reporter) or from first use."""


class Metrics:
    """One flavor's families, recorded from each request's stamps."""

    def __init__(self, options: Options) -> None:
        make_rows, self.style, eager = ENGINES[options.flavor]
        self.rows = make_rows(options.model, options.metrics_mode == "other-buckets")
        self.families = [_Family(r.name, "counter" if r.bounds is None else "histogram", r.help,
                                 r.bounds or ()) for r in self.rows]  # fmt: skip
        if options.prefix_cache:  # vllm/v1/metrics/loggers.py: per engine, tokens
            per_engine: Labels = (("model_name", options.model), ("engine", "0"))
            self.rows += [
                Row("vllm:prefix_cache_queries",
                    "Prefix cache queries, in terms of number of queried tokens.",
                    lambda s, _: s.prompt_tokens, labels=per_engine),
                Row("vllm:prefix_cache_hits",
                    "Prefix cache hits, in terms of number of cached tokens.",
                    lambda s, _: s.cached_tokens, labels=per_engine),
            ]  # fmt: skip
            self.families += [_Family(r.name, "counter", r.help) for r in self.rows[-2:]]
        for row, family in zip(self.rows, self.families, strict=True):
            for labels in row.idle or ((row.labels,) if eager else ()):
                family.child(labels)

    def arrived(self) -> None:
        for row, family in zip(self.rows, self.families, strict=True):
            if row.at_arrival:
                family.add(row.labels, 1.0)

    def record(self, stamps: Stamps, now_ns: int) -> None:
        for row, family in zip(self.rows, self.families, strict=True):
            if not row.at_arrival:
                family.add(row.labels, row.measure(stamps, now_ns))

    def text(self) -> str:
        return render(self.families, self.style)


# -- vLLM's per-request metrics object and its spans -------------------------------------------


def metrics_object(s: Stamps, mode: str) -> dict[str, float | None]:
    """vLLM's ``metrics`` (docs.vllm.ai, *Per-Request Metrics*), or a bad one by ``mode``."""
    ms = 1e6
    ttft = (s.first_token_ns - s.scheduled_ns) / ms
    generation = (s.last_token_ns - s.first_token_ns) / ms
    obj: dict[str, float | None] = {
        "time_to_first_token_ms": ttft,
        "generation_time_ms": generation,
        "queue_time_ms": (s.scheduled_ns - s.arrived_ns) / ms,
        "mean_itl_ms": generation / (s.output_tokens - 1) if s.output_tokens > 1 else None,
        "tokens_per_second": s.output_tokens / max(_s(s.scheduled_ns, s.last_token_ns), 1e-9),
    }
    if mode == "nulls":
        return dict.fromkeys(obj)
    if mode == "negative":
        return {k: None if v is None else -v - 1.0 for k, v in obj.items()}
    if mode == "too-large":
        whole = (s.last_token_ns - s.received_ns) / ms
        for key in ("time_to_first_token_ms", "generation_time_ms", "queue_time_ms"):
            obj[key] = 2 * whole + 1.0
    return obj


def parse_traceparent(value: str | None) -> tuple[bytes, bytes] | None:
    """W3C Trace Context: the trace id and parent span id, or None for a missing or bad one."""
    match = _TRACEPARENT.fullmatch((value or "").strip().lower())
    if not match or set(match[1]) == {"0"} or set(match[2]) == {"0"}:
        return None
    return bytes.fromhex(match[1]), bytes.fromhex(match[2])


def span_attributes(s: Stamps) -> dict[str, float]:
    """The ``gen_ai.latency.*`` attributes (seconds) as vLLM's ``do_tracing`` computes them."""
    return {
        "gen_ai.latency.time_to_first_token": _s(s.arrived_ns, s.first_token_ns),
        "gen_ai.latency.e2e": _s(s.arrived_ns, s.last_token_ns),
        "gen_ai.latency.time_in_queue": _s(s.arrived_ns, s.scheduled_ns),
        "gen_ai.latency.time_in_model_prefill": _s(s.scheduled_ns, s.first_token_ns),
        "gen_ai.latency.time_in_model_decode": _s(s.first_token_ns, s.last_token_ns),
        "gen_ai.latency.time_in_model_inference": _s(s.scheduled_ns, s.last_token_ns),
    }


class SpanExporter:
    """``llm_request`` spans as protobuf OTLP/HTTP, POSTed in batches from a thread (vLLM uses
    the SDK's batch processor); a failed POST drops its batch, as the SDK's exporter does."""

    def __init__(self, endpoint: str, interval_s: float, model: str) -> None:
        from opentelemetry.proto.collector.trace.v1 import trace_service_pb2
        from opentelemetry.proto.common.v1 import common_pb2
        from opentelemetry.proto.resource.v1 import resource_pb2
        from opentelemetry.proto.trace.v1 import trace_pb2

        self._pb = trace_pb2
        self._common = common_pb2
        self._request = trace_service_pb2.ExportTraceServiceRequest
        service = common_pb2.KeyValue(
            key="service.name", value=common_pb2.AnyValue(string_value="vllm")
        )
        self._resource = resource_pb2.Resource(attributes=[service])
        self._scope = common_pb2.InstrumentationScope(name="vllm.llm_engine")
        self._endpoint = endpoint
        self._interval_s = interval_s
        self._model = model
        self._pending: list[Any] = []
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="otlp-export", daemon=True)
        self._thread.start()

    def add(self, s: Stamps, end_ns: int) -> None:
        pb, common = self._pb, self._common
        context = parse_traceparent(s.traceparent)
        trace_id, parent = context if context else (os.urandom(16), b"")
        wall_offset = time.time_ns() - _now()

        def value(v: float | int | str) -> Any:
            if isinstance(v, str):
                return common.AnyValue(string_value=v)
            if isinstance(v, int):
                return common.AnyValue(int_value=v)
            return common.AnyValue(double_value=v)

        attributes: dict[str, float | int | str] = {
            **span_attributes(s),
            "gen_ai.request.id": s.request_id,
            "gen_ai.response.model": self._model,
            "gen_ai.usage.prompt_tokens": s.prompt_tokens,
            "gen_ai.usage.completion_tokens": s.output_tokens,
        }
        span = pb.Span(
            trace_id=trace_id,
            span_id=os.urandom(8),
            parent_span_id=parent,
            name="llm_request",
            kind=pb.Span.SPAN_KIND_SERVER,
            start_time_unix_nano=s.arrived_ns + wall_offset,
            end_time_unix_nano=end_ns + wall_offset,
            attributes=[common.KeyValue(key=k, value=value(v)) for k, v in attributes.items()],
        )
        with self._lock:
            self._pending.append(span)

    def _run(self) -> None:
        while not self._stop.wait(self._interval_s):
            self.flush()

    def flush(self) -> None:
        with self._lock:
            spans, self._pending = self._pending, []
        if not spans:
            return
        scope_spans = self._pb.ScopeSpans(scope=self._scope, spans=spans)
        resource_spans = self._pb.ResourceSpans(resource=self._resource, scope_spans=[scope_spans])
        body = self._request(resource_spans=[resource_spans]).SerializeToString()
        post = urllib.request.Request(
            self._endpoint, data=body, headers={"Content-Type": "application/x-protobuf"}
        )
        with contextlib.suppress(OSError), urllib.request.urlopen(post, timeout=10) as reply:
            reply.read()

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=10)
        self.flush()


# -- the engine: the timeline and what it records ----------------------------------------------


class PrefixCache:
    """Blocks of words seen, each keyed by its words and all before it (as vLLM chains block
    hashes): a prompt is served its leading whole blocks already seen, never its last token."""

    def __init__(self, block_tokens: int) -> None:
        self.block_tokens = block_tokens
        self.blocks: set[int] = set()

    def lookup(self, words: Sequence[str]) -> int:
        """Tokens of ``words`` served from the cache; then every whole block of it is kept."""
        size = self.block_tokens
        keys: list[int] = []
        key = 0
        for start in range(0, len(words) - size + 1, size):
            key = hash((key, tuple(words[start : start + size])))
            keys.append(key)
        servable = (len(words) - 1) // size  # the last token is always computed
        hits = 0
        while hits < min(servable, len(keys)) and keys[hits] in self.blocks:
            hits += 1
        self.blocks.update(keys)
        return hits * size


class Engine:
    def __init__(self, options: Options) -> None:
        self.options = options
        self.metrics = Metrics(options)
        self.cache = PrefixCache(options.prefix_block_tokens)
        self.lock = threading.Lock()
        self.arrivals = 0
        self.spans: SpanExporter | None = None
        if options.otlp_endpoint and options.spans_mode == "ok":
            self.spans = SpanExporter(
                options.otlp_endpoint, options.span_batch_ms / 1000, options.model
            )

    def metrics_text(self) -> str:
        with self.lock:
            return self.metrics.text()

    def cached(self, messages: object) -> int:
        """The prompt tokens (words) of ``messages`` the prefix cache serves (0 without one)."""
        if not self.options.prefix_cache or not isinstance(messages, list):
            return 0
        words = [
            word
            for m in messages
            if isinstance(m, dict) and isinstance(m.get("content"), str)
            for word in m["content"].split()
        ]
        with self.lock:
            return self.cache.lookup(words)

    def received(self) -> None:
        """A generation request arrived: the reset of ``--metrics-mode reset`` (as if the server
        restarted just before it), and TGI's request counter."""
        with self.lock:
            self.arrivals += 1
            reset = self.options.metrics_mode == "reset"
            if reset and self.arrivals == self.options.reset_after + 1:
                self.metrics = Metrics(self.options)
            self.metrics.arrived()

    def record(self, stamps: Stamps) -> None:
        now_ns = _now()
        with self.lock:
            self.metrics.record(stamps, now_ns)
        if self.spans is not None:
            self.spans.add(stamps, now_ns)

    def run(
        self,
        *,
        received_ns: int,
        tokens: int,
        prompt_tokens: int,
        traceparent: str | None,
        head: Callable[[], None],
        emit: Callable[[list[int], bool], None],
        cached_tokens: int = 0,
    ) -> Stamps:
        """Sleeps through the timeline, calling ``head()`` after the frontend and
        ``emit(token indexes, is_last)`` per chunk; records the request before its last chunk."""
        o = self.options
        _sleep_ms(o.frontend_ms)
        arrived = _now()
        head()
        _sleep_ms(o.queue_ms)
        scheduled = input_done = _now()
        _sleep_ms(o.prefill_ms)
        first = last = _now()
        step = max(o.tokens_per_chunk, 1)
        groups = [[0]] + [list(range(k, min(k + step, tokens))) for k in range(1, tokens, step)]
        for i, group in enumerate(groups):
            is_last = i == len(groups) - 1
            if i:
                _sleep_ms(o.decode_ms * len(group))
                last = _now()
            if is_last:
                stamps = Stamps(
                    received_ns=received_ns,
                    arrived_ns=arrived,
                    scheduled_ns=scheduled,
                    input_done_ns=input_done,
                    first_token_ns=first,
                    last_token_ns=last,
                    prompt_tokens=prompt_tokens,
                    output_tokens=tokens,
                    request_id=f"req-{uuid.uuid4().hex}",
                    traceparent=traceparent,
                    cached_tokens=cached_tokens,
                )
                self.record(stamps)
            emit(group, is_last)
        return stamps


def _text(group: list[int]) -> str:
    return "".join(f" t{k}" for k in group)


def _max_tokens(*candidates: object) -> int | None:
    for value in candidates:
        if isinstance(value, int) and not isinstance(value, bool) and value > 0:
            return value
    return None


def _prompt_tokens(messages: object) -> int:
    words = 0
    if isinstance(messages, list):
        for message in messages:
            content = message.get("content") if isinstance(message, dict) else None
            words += len(content.split()) if isinstance(content, str) else 0
    return max(words, 1)


# -- HTTP ---------------------------------------------------------------------------------------


class _Server(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, address: tuple[str, int], engine: Engine, role: str) -> None:
        super().__init__(address, _Handler)
        self.engine = engine
        self.role = role  # "api", or "metrics" for Triton's metrics port


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args: Any) -> None:
        pass

    @property
    def engine(self) -> Engine:
        assert isinstance(self.server, _Server)
        return self.server.engine

    def _reply(self, status: int, body: bytes, content_type: str = "application/json") -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def _json(self, status: int, obj: object) -> None:
        self._reply(status, json.dumps(obj).encode())

    def _start_stream(self) -> None:
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream; charset=utf-8")
        self.send_header("Cache-Control", "no-cache")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        self.wfile.flush()

    def _chunk(self, data: bytes) -> None:
        self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
        self.wfile.flush()

    def _event(self, obj: object) -> None:
        self._chunk(b"data: " + json.dumps(obj).encode() + b"\n\n")

    def _end_stream(self) -> None:
        self.wfile.write(b"0\r\n\r\n")
        self.wfile.flush()

    def do_GET(self) -> None:
        self._serve("GET", b"")

    def do_POST(self) -> None:
        received_ns = _now()
        length = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(length) if length else b""
        self._serve("POST", body, received_ns)

    def _serve(self, method: str, body: bytes, received_ns: int = 0) -> None:
        try:
            self._route(method, self.path.split("?", 1)[0], body, received_ns)
        except (BrokenPipeError, ConnectionResetError):
            self.close_connection = True  # the client went away mid-stream

    def _route(self, method: str, path: str, body: bytes, received_ns: int) -> None:
        assert isinstance(self.server, _Server)
        o = self.engine.options
        metrics_here = (self.server.role == "metrics") == (o.flavor == "triton")
        if method == "GET" and path == "/metrics" and metrics_here:
            self._metrics()
        elif self.server.role == "metrics":
            self._reply(404, b"Not Found", "text/plain")
        elif o.flavor == "triton":
            self._triton(method, path, body, received_ns)
        elif method == "GET" and path == "/v1/models":
            card = {"id": o.model, "object": "model", "created": int(time.time())}
            self._json(200, {"object": "list", "data": [{**card, "owned_by": o.flavor}]})
        elif method == "GET" and path in ("/health", "/health_generate"):
            self._reply(200, b"", "text/plain")
        elif method == "POST" and path == "/v1/chat/completions":
            self._chat(body, received_ns)
        else:
            self._json(404, {"error": {"message": f"{method} {path}: not found", "code": 404}})

    def _metrics(self) -> None:
        mode = self.engine.options.metrics_mode
        if mode == "404":
            self._reply(404, b"Not Found", "text/plain")
        elif mode == "garbage":
            self._reply(200, GARBAGE, "text/html")
        else:
            text = self.engine.metrics_text().encode()
            self._reply(200, text, "text/plain; version=0.0.4; charset=utf-8")

    def _request_json(self, body: bytes) -> dict[str, Any] | None:
        try:
            request = json.loads(body)
        except ValueError:
            request = None
        if not isinstance(request, dict):
            self._json(400, {"error": {"message": "the body is not a JSON object", "code": 400}})
            return None
        return request

    def _chat(self, body: bytes, received_ns: int) -> None:
        engine, o = self.engine, self.engine.options
        request = self._request_json(body)
        if request is None:
            return
        engine.received()
        cached_tokens = engine.cached(request.get("messages"))
        stream = bool(request.get("stream"))
        include_usage = bool((request.get("stream_options") or {}).get("include_usage"))
        tokens = _max_tokens(request.get("max_completion_tokens"), request.get("max_tokens"))
        tokens = tokens or o.tokens
        model = str(request.get("model") or o.model)
        base: dict[str, Any] = {"id": f"chatcmpl-{uuid.uuid4().hex}", "created": int(time.time())}
        base |= {"object": "chat.completion.chunk", "model": model}
        texts: list[str] = []

        def emit(group: list[int], is_last: bool) -> None:
            texts.append(_text(group))
            if not stream:
                return
            if group[0] == 0 and o.flavor != "tgi":  # vLLM and SGLang open with the role
                role = {"role": "assistant", "content": ""}
                self._event({**base, "choices": [_choice(role, None)]})
            delta: dict[str, str] = {"content": texts[-1]}
            if o.flavor == "tgi":  # TGI's every delta carries the role
                delta = {"role": "assistant", **delta}
            self._event({**base, "choices": [_choice(delta, "length" if is_last else None)]})

        stamps = engine.run(
            received_ns=received_ns,
            tokens=tokens,
            prompt_tokens=_prompt_tokens(request.get("messages")),
            traceparent=self.headers.get("traceparent"),
            head=self._start_stream if stream else lambda: None,
            emit=emit,
            cached_tokens=cached_tokens,
        )
        usage = {"prompt_tokens": stamps.prompt_tokens, "completion_tokens": tokens}
        usage["total_tokens"] = stamps.prompt_tokens + tokens
        extra: dict[str, Any] = {}
        if o.per_request_metrics:
            extra["metrics"] = metrics_object(stamps, o.metrics_object_mode)
        if stream:
            if include_usage:
                self._event({**base, "choices": [], "usage": usage, **extra})
            self._chunk(b"data: [DONE]\n\n")
            self._end_stream()
        else:
            message = {"role": "assistant", "content": "".join(texts)}
            choice = {"index": 0, "message": message, "logprobs": None, "finish_reason": "length"}
            reply = {**base, "object": "chat.completion", "choices": [choice], "usage": usage}
            self._json(200, {**reply, **extra})

    def _triton(self, method: str, path: str, body: bytes, received_ns: int) -> None:
        o = self.engine.options
        match = _TRITON_PATH.fullmatch(path)
        model, version, action = match.groups() if match else (None, None, None)
        if method == "GET" and path == "/v2":
            self._json(200, {"name": "triton", "version": "2.59.0", "extensions": _EXTENSIONS})
        elif method == "GET" and path in ("/v2/health/ready", "/v2/health/live"):
            self._reply(200, b"", "text/plain")
        elif match is None:
            self._json(404, {"error": "Not Found"})
        elif model != o.model or version not in (None, "1"):
            self._json(400, {"error": f"Request for unknown model: '{model}' is not found"})
        elif method == "GET" and action is None:
            self._json(200, _triton_metadata(o.model))
        elif method == "GET" and action == "/ready":
            self._reply(200, b"", "text/plain")
        elif method == "POST" and action in ("/generate", "/generate_stream"):
            self._generate(body, received_ns, stream=action == "/generate_stream")
        else:
            self._json(400, {"error": f"{method} {path}: not supported"})

    def _generate(self, body: bytes, received_ns: int, *, stream: bool) -> None:
        o = self.engine.options
        request = self._request_json(body)
        if request is None:
            return
        self.engine.received()
        parameters = request.get("parameters") or {}
        if not isinstance(parameters, dict):
            parameters = {}
        tokens = _max_tokens(parameters.get("max_tokens"), request.get("max_tokens")) or o.tokens
        base: dict[str, Any] = {"model_name": o.model, "model_version": "1"}
        if "id" in request:
            base = {"id": request["id"], **base}
        texts: list[str] = []

        def emit(group: list[int], is_last: bool) -> None:
            texts.append(_text(group))
            if stream:
                self._event({**base, "text_output": texts[-1]})

        text_input = request.get("text_input")
        self.engine.run(
            received_ns=received_ns,
            tokens=tokens,
            prompt_tokens=len(text_input.split()) if isinstance(text_input, str) else 1,
            traceparent=self.headers.get("traceparent"),
            head=self._start_stream if stream else lambda: None,
            emit=emit,
        )
        if stream:
            self._end_stream()  # Triton's generate_stream has no end marker: the body ends
        else:
            self._json(200, {**base, "text_output": "".join(texts)})


def _choice(delta: dict[str, str], finish: str | None) -> dict[str, Any]:
    return {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}


def _triton_metadata(model: str) -> dict[str, Any]:
    def tensor(name: str, datatype: str, shape: list[int]) -> dict[str, Any]:
        return {"name": name, "datatype": datatype, "shape": shape}

    return {
        "name": model,
        "versions": ["1"],
        "platform": "vllm",
        "inputs": [
            tensor("text_input", "BYTES", [1]),
            tensor("stream", "BOOL", [1]),
            tensor("sampling_parameters", "BYTES", [1]),
        ],
        "outputs": [tensor("text_output", "BYTES", [-1])],
    }


# -- the command --------------------------------------------------------------------------------


def parse_args(argv: Sequence[str] | None = None) -> tuple[Options, str, int, int]:
    default = Options(flavor="vllm")
    parser = argparse.ArgumentParser(prog="python -m tests.helpers.fake_engines")
    parser.add_argument("--flavor", choices=FLAVORS, required=True)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--metrics-port", type=int, default=0, help="triton only")
    parser.add_argument("--model", default=default.model)
    parser.add_argument("--frontend-ms", type=float, default=default.frontend_ms)
    parser.add_argument("--queue-ms", type=float, default=default.queue_ms)
    parser.add_argument("--prefill-ms", type=float, default=default.prefill_ms)
    parser.add_argument("--decode-ms", type=float, default=default.decode_ms)
    parser.add_argument("--tokens", type=int, default=default.tokens)
    parser.add_argument("--tokens-per-chunk", type=int, default=default.tokens_per_chunk)
    parser.add_argument("--per-request-metrics", action="store_true", help="vllm only")
    parser.add_argument("--metrics-mode", choices=METRICS_MODES, default="ok")
    parser.add_argument("--reset-after", type=int, default=default.reset_after)
    parser.add_argument("--metrics-object-mode", choices=METRICS_OBJECT_MODES, default="ok")
    parser.add_argument("--otlp-endpoint", help="vllm only: the full URL spans are POSTed to")
    parser.add_argument("--spans-mode", choices=SPANS_MODES, default="ok")
    parser.add_argument("--span-batch-ms", type=float, default=default.span_batch_ms)
    parser.add_argument("--prefix-cache", action="store_true", help="vllm only")
    parser.add_argument("--prefix-block-tokens", type=int, default=default.prefix_block_tokens)
    args = parser.parse_args(argv)
    if args.flavor != "vllm" and (args.per_request_metrics or args.otlp_endpoint):
        parser.error("--per-request-metrics and --otlp-endpoint are vLLM's (--flavor vllm)")
    if args.flavor != "vllm" and args.prefix_cache:
        parser.error("--prefix-cache is vLLM's (--flavor vllm)")
    if args.prefix_block_tokens < 1:
        parser.error("--prefix-block-tokens must be at least 1")
    if args.tokens < 1 or args.tokens_per_chunk < 1 or args.reset_after < 0:
        parser.error("--tokens and --tokens-per-chunk must be at least 1, --reset-after 0")
    options = Options(
        flavor=args.flavor,
        model=args.model,
        frontend_ms=args.frontend_ms,
        queue_ms=args.queue_ms,
        prefill_ms=args.prefill_ms,
        decode_ms=args.decode_ms,
        tokens=args.tokens,
        tokens_per_chunk=args.tokens_per_chunk,
        per_request_metrics=args.per_request_metrics,
        metrics_mode=args.metrics_mode,
        reset_after=args.reset_after,
        metrics_object_mode=args.metrics_object_mode,
        otlp_endpoint=args.otlp_endpoint,
        spans_mode=args.spans_mode,
        span_batch_ms=args.span_batch_ms,
        prefix_cache=args.prefix_cache,
        prefix_block_tokens=args.prefix_block_tokens,
    )
    return options, args.host, args.port, args.metrics_port


def main(argv: Sequence[str] | None = None) -> int:
    options, host, port, metrics_port = parse_args(argv)
    # blocked before any thread starts: every thread inherits the mask, so the signals wait for
    # sigwait in this one (a thread that did not block SIGTERM could take it and die unflushed)
    stop_signals = {signal.SIGTERM, signal.SIGINT}
    signal.pthread_sigmask(signal.SIG_BLOCK, stop_signals)
    engine = Engine(options)
    servers = [_Server((host, port), engine, "api")]
    if options.flavor == "triton":
        servers.append(_Server((host, metrics_port), engine, "metrics"))
    for server in servers:
        threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True).start()
    print(f"listening {servers[0].server_address[1]}", flush=True)
    if len(servers) > 1:
        print(f"metrics {servers[1].server_address[1]}", flush=True)
    signal.sigwait(stop_signals)
    for server in servers:
        server.shutdown()
        server.server_close()
    if engine.spans is not None:
        engine.spans.close()
    return 0


# -- for the tests: one as a child process -----------------------------------------------------


@dataclass(slots=True)
class Running:
    """A fake engine in a child process."""

    process: subprocess.Popen[str]
    port: int
    metrics_port: int
    """Triton's metrics port; the API's own for the others."""
    _lines: queue.Queue[str | None]
    _reader: threading.Thread

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def metrics_url(self) -> str:
        return f"http://127.0.0.1:{self.metrics_port}/metrics"

    def stop(self, timeout_s: float = 15.0) -> int:
        """SIGTERM, then SIGKILL after ``timeout_s``; the exit code."""
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(timeout=timeout_s)
        self._reader.join(timeout=timeout_s)
        if self.process.stdout is not None:
            self.process.stdout.close()
        return self.process.returncode


def _read_lines(stream: Any, lines: queue.Queue[str | None]) -> None:
    for line in stream:
        lines.put(line.strip())
    lines.put(None)


def _expect(lines: queue.Queue[str | None], word: str, timeout_s: float) -> int:
    try:
        line = lines.get(timeout=timeout_s)
    except queue.Empty:
        raise TimeoutError(f"the fake engine printed no {word!r} line in {timeout_s} s") from None
    if line is None or not line.startswith(word + " "):
        raise RuntimeError(f"the fake engine printed {line!r}, not {word!r} and a port")
    return int(line.split()[1])


@contextlib.contextmanager
def running(flavor: str, *args: str, timeout_s: float = 30.0) -> Iterator[Running]:
    """``python -m tests.helpers.fake_engines --flavor FLAVOR ARGS...`` on 127.0.0.1, stopped
    (SIGTERM) on leaving."""
    command = [sys.executable, "-m", "tests.helpers.fake_engines", "--flavor", flavor, *args]
    process = subprocess.Popen(command, cwd=ROOT, stdout=subprocess.PIPE, text=True)
    lines: queue.Queue[str | None] = queue.Queue()
    reader = threading.Thread(target=_read_lines, args=(process.stdout, lines), daemon=True)
    reader.start()
    engine = Running(process, 0, 0, lines, reader)
    try:
        engine.port = engine.metrics_port = _expect(lines, "listening", timeout_s)
        if flavor == "triton":
            engine.metrics_port = _expect(lines, "metrics", timeout_s)
        yield engine
    finally:
        engine.stop()


if __name__ == "__main__":
    sys.exit(main())
