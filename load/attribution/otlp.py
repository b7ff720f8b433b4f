"""The join of a server's spans to the requests ``inferwire load`` sent (``--otlp-listen
HOST:PORT``), over the OTLP/HTTP receiver of :mod:`.otlp_receiver`.

Every request the generator sends carries a W3C ``traceparent`` (:func:`new_traceparent`); a
server that traces exports a span of that trace with the request's stages as attributes;
:class:`SpanReceiver` keeps those stages by trace id and :meth:`SpanReceiver.report_for` gives
them as a :class:`ServerReport`. vLLM exports over OTLP/gRPC unless told otherwise, so::

    export OTEL_EXPORTER_OTLP_TRACES_PROTOCOL=http/protobuf
    vllm serve MODEL --otlp-traces-endpoint http://127.0.0.1:4318/v1/traces

The receiving itself (HTTP, the OTLP encodings, the statuses of what it refuses) is
:class:`~.otlp_receiver.TraceReceiver`'s.

vLLM's request span (``llm_request``, kind SERVER, from ``OutputProcessor.do_tracing`` in
https://github.com/vllm-project/vllm/blob/main/vllm/v1/engine/output_processor.py; names from
``SpanAttributes`` in ``vllm/tracing.py``) carries durations in **seconds** (floats, differences
of ``time.time()``/``time.monotonic()`` stamps), mapped so:

=========================================  ====================================  ==============
attribute (seconds)                        vLLM V1 sets it to                    stage
=========================================  ====================================  ==============
``gen_ai.latency.time_in_queue``           ``scheduled_ts - queued_ts``          ``queue``
``gen_ai.latency.time_in_model_prefill``   ``first_token_ts - scheduled_ts``     ``prefill``
``gen_ai.latency.time_in_model_decode``    ``last_token_ts - first_token_ts``    ``decode``
``gen_ai.latency.time_in_model_inference`` ``last_token_ts - scheduled_ts``      ``inference``
``gen_ai.latency.e2e``                     ``iteration_timestamp - arrival_time`` ``server_e2e``
=========================================  ====================================  ==============

Not mapped: ``gen_ai.latency.time_to_first_token`` (from the frontend's arrival: queue, prefill
and the frontend together, not one stage), and the V0 engine's ``time_in_scheduler``,
``time_in_model_forward`` and ``time_in_model_execute`` (``vllm/engine/llm_engine.py``, sums
over the request's steps, not spans of its time). A value that is not a finite non-negative
number is left out of its stage and counted in :attr:`SpanReceiver.notes`.
"""

from __future__ import annotations

import collections
import math
import os
import re
import threading
import time
from collections.abc import Collection
from typing import TYPE_CHECKING, Final

from .otlp_receiver import MAX_BODY_BYTES, TraceReceiver
from .reports import OTLP, ServerReport

if TYPE_CHECKING:
    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
        ExportTraceServiceRequest,
    )
    from opentelemetry.proto.trace.v1.trace_pb2 import Span

MAX_SPANS: Final = 1_000_000
"""Server spans kept by :class:`SpanReceiver` until asked for; past it the oldest go."""

LATENCY_PREFIX: Final = "gen_ai.latency."
VLLM_STAGES: Final = {
    "gen_ai.latency.time_in_queue": "queue_ms",
    "gen_ai.latency.time_in_model_prefill": "prefill_ms",
    "gen_ai.latency.time_in_model_decode": "decode_ms",
    "gen_ai.latency.time_in_model_inference": "inference_ms",
    "gen_ai.latency.e2e": "server_e2e_ms",
}
"""vLLM's span attribute (seconds) -> the :class:`ServerReport` field (ms; the module's table)."""

# W3C Trace Context, "traceparent Header Field Values": lower-case hex only; version ff is
# invalid; a later version may append fields after a dash, version 00 may not.
TRACEPARENT: Final = re.compile(
    r"(?!ff)([0-9a-f]{2})-(?!0{32})([0-9a-f]{32})-(?!0{16})([0-9a-f]{16})-([0-9a-f]{2})(-.*)?"
)


def new_traceparent() -> tuple[str, str]:
    """A W3C ``traceparent`` (version 00, sampled) with a fresh random trace and parent id, and
    its trace id: ``("00-<32 hex>-<16 hex>-01", "<32 hex>")``. About 1.5 us: one
    ``os.urandom`` call, which keeps no state for forked workers to share."""
    ids = os.urandom(24).hex()
    trace_id = ids[:32]
    if trace_id == "0" * 32 or ids[32:] == "0" * 16:  # all-zero ids are invalid (2^-64 odds)
        return new_traceparent()
    return f"00-{trace_id}-{ids[32:]}-01", trace_id


def trace_id_of(traceparent: str) -> str:
    """The trace id of a ``traceparent``; ``ValueError`` for one the W3C rules refuse."""
    match = TRACEPARENT.fullmatch(traceparent.strip(" \t"))
    if match is None or (match[1] == "00" and match[5] is not None):
        raise ValueError(f"not a W3C traceparent: {traceparent[:80]!r}")
    return match[2]


class SpanReceiver:
    """The load generator's receiver: keeps each trace's server span (one with
    ``gen_ai.latency.*`` attributes) as a :class:`ServerReport` until :meth:`report_for` takes
    it; at most ``max_spans`` at a time (the oldest go first, counted in
    :attr:`spans_dropped`). Thread-safe: exports arrive in the receiver's threads."""

    def __init__(
        self,
        host: str = "127.0.0.1",
        port: int = 0,
        *,
        max_spans: int = MAX_SPANS,
        max_body_bytes: int = MAX_BODY_BYTES,
    ) -> None:
        self.max_spans = max_spans
        self._changed = threading.Condition()
        self._reports: collections.OrderedDict[str, tuple[int, ServerReport | None]] = (
            collections.OrderedDict()
        )
        self._closed = False
        self.spans_dropped = 0
        """Server spans let go unasked for, the receiver being full."""
        self.requests_joined = 0
        """:meth:`report_for` calls that found the request's span, with a stage."""
        self.requests_without_spans = 0
        """:meth:`report_for` calls that found no span: spans that never came."""
        self.requests_without_stages = 0
        """:meth:`report_for` calls that found a span with no usable stage."""
        self.notes: collections.Counter[str] = collections.Counter()
        """Attribute values left out, and other oddities, by kind."""
        self._receiver = TraceReceiver(
            self._take, host, port, accept_json=True, max_body_bytes=max_body_bytes
        )
        self.address = self._receiver.address

    @property
    def endpoint(self) -> str:
        """The URL to give the server (``vllm serve --otlp-traces-endpoint``)."""
        return self._receiver.endpoint

    @property
    def spans_received(self) -> int:
        """Spans in every export accepted, the server's or not."""
        return self._receiver.spans

    @property
    def exports(self) -> int:
        return self._receiver.exports

    @property
    def refusals(self) -> dict[str, int]:
        """Exports refused, by ``"<status> <kind>"``."""
        return self._receiver.refusals

    def counts(self) -> dict[str, int]:
        """The receiver's counters, for a report."""
        with self._changed:
            return {
                "exports": self.exports,
                "exports_refused": self._receiver.refused,
                "spans_received": self.spans_received,
                "spans_waiting": len(self._reports),
                "spans_dropped": self.spans_dropped,
                "requests_joined": self.requests_joined,
                "requests_without_spans": self.requests_without_spans,
                "requests_without_stages": self.requests_without_stages,
            }

    def report_for(self, trace_id: str) -> ServerReport | None:
        """The stages of the request of ``trace_id`` (32 hex digits) from its server span, or
        None when no such span came or it has no usable stage. Takes the span: a second call
        for the same trace gets None."""
        with self._changed:
            found = self._reports.pop(trace_id.lower(), None)
            if found is None:
                self.requests_without_spans += 1
                return None
            report = found[1]
            if report is None:
                self.requests_without_stages += 1
            else:
                self.requests_joined += 1
            return report

    def wait_for(self, trace_ids: Collection[str], timeout_s: float) -> int:
        """Wait up to ``timeout_s`` until every trace of ``trace_ids`` has its server span
        (servers export in batches, every few seconds); how many have none at the end."""
        deadline = time.monotonic() + timeout_s
        with self._changed:
            missing = {t.lower() for t in trace_ids}
            while True:
                missing = {t for t in missing if t not in self._reports}
                left = deadline - time.monotonic()
                if not missing or left <= 0 or self._closed:
                    return len(missing)
                self._changed.wait(left)

    def _take(self, request: ExportTraceServiceRequest) -> None:
        found: list[tuple[str, int, ServerReport | None]] = []
        notes: list[str] = []
        for resource in request.resource_spans:
            for scope in resource.scope_spans:
                for span in scope.spans:
                    stages_ms = _stages_ms(span, notes)
                    if stages_ms is None:
                        continue
                    trace_id_bytes = span.trace_id
                    if len(trace_id_bytes) != 16:
                        notes.append("a server span whose trace id is not 16 bytes")
                        continue
                    report = ServerReport(source=OTLP, **stages_ms) if stages_ms else None
                    found.append((trace_id_bytes.hex(), span.end_time_unix_nano, report))
        with self._changed:
            self.notes.update(notes)
            for trace_id, end_ns, report in found:
                kept = self._reports.get(trace_id)
                if kept is not None:
                    # n > 1 sampling ends one span per sequence; the response ends with the last
                    self.notes["several server spans in a trace (the last to end is used)"] += 1
                    if kept[0] > end_ns:
                        continue
                elif len(self._reports) >= self.max_spans:
                    self._reports.popitem(last=False)
                    self.spans_dropped += 1
                self._reports[trace_id] = (end_ns, report)
            if found:
                self._changed.notify_all()

    def start(self) -> SpanReceiver:
        self._receiver.start()
        return self

    def close(self) -> None:
        """Stop listening, and wake whoever waits for spans."""
        self._receiver.close()
        with self._changed:
            self._closed = True
            self._changed.notify_all()

    def __enter__(self) -> SpanReceiver:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()


def _stages_ms(span: Span, notes: list[str]) -> dict[str, float] | None:
    """The stages of a span's attributes, as :class:`ServerReport` fields (ms); None for a span
    with no ``gen_ai.latency.*`` attribute (not a server's request span). One pass, as each
    attribute read makes Python objects: most spans are not the server's."""
    stages_ms: dict[str, float] | None = None
    for attribute in span.attributes:
        key = attribute.key
        if not key.startswith(LATENCY_PREFIX):
            continue
        if stages_ms is None:
            stages_ms = {}
        field = VLLM_STAGES.get(key)
        if field is None:
            continue
        value = attribute.value
        kind = value.WhichOneof("value")
        if kind == "double_value":
            seconds = value.double_value
        elif kind == "int_value":
            seconds = float(value.int_value)
        else:
            notes.append(f"{key} is {kind or 'empty'}, not a number of seconds")
            continue
        if not math.isfinite(seconds):
            notes.append(f"{key} is not finite")
        elif seconds < 0:
            notes.append(f"{key} is negative")
        else:
            stages_ms[field] = seconds * 1e3
    return stages_ms
