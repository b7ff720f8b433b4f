"""The split of each request's end-to-end latency: the client's own stages, what the server
reported, and what lies outside the engine.

Every figure is a duration. The client's come from ``time.monotonic_ns()`` stamps taken in
causal order on one clock (:class:`~inferwire.transports.timing.StreamTiming`):

==============  ==========================================================================
client stage    from -> to
==============  ==========================================================================
``lag``         the intended send time -> the generator started the request (its own lag)
``pool_wait``   started -> a connection in hand, less ``connect`` (the bound on connections)
``connect``     opening the connection it took (TCP and TLS), when it opened one (else 0)
``write``       connection in hand -> the request written (encoding included)
``wait_head``   written -> the response's head arrived (HTTP; the server's admission)
``first_event`` the head (else the write) -> the first token-carrying event parsed
``parse``       the client's CPU to read and parse the stream's events, all of them
==============  ==========================================================================

The split of one request, where its server reported it (:mod:`.reports`):

    outside the engine = E2E - lag - pool_wait - (queue + prefill + decode)

that is the server's frontend (HTTP, tokenization, detokenization), serialization both ways,
the hop to the engine, and the network: all that is neither the generator's own doing nor the
engine's. The client's parse runs while the server decodes the next token, so it is reported
beside the split, not subtracted (the last event's parse, a few microseconds, stays in
"outside"). Where the server reports only an inference time, that is the model's.
"""

from __future__ import annotations

from array import array
from collections import Counter
from collections.abc import Callable
from typing import Any, Final

from inferwire.transports.timing import StreamTiming

from ..metrics import Histogram
from .reports import BadReport, ServerReport, from_metrics_object

CLIENT_STAGES: Final = ("lag", "pool_wait", "connect", "write", "wait_head", "first_event", "parse")
SPLIT_STAGES: Final = ("queue", "prefill", "decode", "inference", "outside")
"""The per-request split's parts, in the order a request meets them."""


def client_stages_ns(
    timing: StreamTiming, *, intended_ns: int, sent_ns: int, first_ns: int, parse_ns: int
) -> dict[str, int]:
    """One request's client stages (see the module docstring) from its stamps; a stage whose
    stamps are missing (the transport has no head, the stream no token) is left out."""
    if not parse_ns and timing.decoded_ns:  # inferwire's own clients stamp each read's decode
        parse_ns = _decode_ns(timing)
    out = {"lag": sent_ns - intended_ns, "parse": parse_ns}
    acquired = timing.acquired_ns or timing.request_start_ns
    if acquired:
        out["pool_wait"] = max(acquired - sent_ns - timing.connect_ns, 0)
        out["connect"] = timing.connect_ns
        if timing.request_sent_ns:
            out["write"] = timing.request_sent_ns - acquired
    if timing.head_ns and timing.request_sent_ns:
        out["wait_head"] = timing.head_ns - timing.request_sent_ns
    after = timing.head_ns or timing.request_sent_ns
    if first_ns and after:
        out["first_event"] = first_ns - after
    return out


def _decode_ns(timing: StreamTiming) -> int:
    """The client's decode time over a stream of inferwire's own clients: each read's bytes
    (``received_ns``) to its chunks decoded (``decoded_ns``), once per read."""
    total = 0
    last = -1
    for received, decoded in zip(timing.received_ns, timing.decoded_ns, strict=False):
        if decoded != last:
            total += decoded - received
            last = decoded
    return total


class PointSplit:
    """One point's client stages and per-request split: the generator calls :meth:`request`
    once per completed, measured request, and :meth:`summary` at the end."""

    def __init__(self, *, read_metrics_object: bool = True) -> None:
        self.read_metrics_object = read_metrics_object
        # the values, in nanoseconds, counted into histograms at the summary: an append is the
        # cheapest record there is, and the generator pays for every one
        self.client = {stage: array("q") for stage in CLIENT_STAGES}
        self.split = {stage: array("q") for stage in SPLIT_STAGES}
        self.e2e = array("q")
        """E2E of the requests with a split (a subset of the point's, when not all had one)."""
        self.sources: Counter[str] = Counter()
        self.notes: Counter[str] = Counter()
        self._outside_sum_ns = 0
        self._e2e_sum_ns = 0
        self._pending: list[tuple[str, int, dict[str, int], Callable[[dict[str, Any]], None]]] = []
        self._cross_check: list[tuple[str, float]] = []
        self.cross_check_ms: list[float] = []
        """Per request reported twice (metrics object and spans): the spans' engine time less
        the metrics object's."""
        self.spans_missing = 0
        """Requests that waited for their spans (:meth:`join`) and got none."""

    def request(
        self,
        timing: StreamTiming,
        *,
        intended_ns: int,
        sent_ns: int,
        first_ns: int,
        done_ns: int,
        parse_ns: int,
        metrics_object: object,
        deferred: Callable[[dict[str, Any]], None] | None = None,
        fields: bool = True,
    ) -> dict[str, Any] | None:
        """Record one completed, measured request: its client stages, and its split when its
        server reported it. Returns the fields of its record; or, given ``deferred`` (spans may
        still come) and no report in hand, None, and ``deferred`` gets them at :meth:`join`.
        ``fields``: whether anyone reads them (the records); if not, an empty dict."""
        client_ns = client_stages_ns(
            timing, intended_ns=intended_ns, sent_ns=sent_ns, first_ns=first_ns, parse_ns=parse_ns
        )
        self.record_client(client_ns)
        e2e_ns = done_ns - intended_ns
        report = self.server_report(metrics_object, e2e_ns / 1e6)
        trace_id = _trace_id(timing.traceparent)
        if deferred is not None and trace_id:
            if report is None:
                self._pending.append((trace_id, e2e_ns, client_ns, deferred))
                return None
            engine_ms = report.engine_ms()
            if engine_ms is not None:  # its spans, when they come, check the first source
                self._cross_check.append((trace_id, engine_ms))
        parts = (
            {} if report is None else self.record_split(report, e2e_ns=e2e_ns, client_ns=client_ns)
        )
        if not fields:
            return {}
        return record_fields(client_ns, trace_id, report if parts else None, parts)

    def waiting_trace_ids(self) -> list[str]:
        """The trace ids of the requests whose spans are awaited (to report them, or to check
        another source's report)."""
        return [t for t, *_ in self._pending] + [t for t, _ in self._cross_check]

    def join(self, report_for: Callable[[str], ServerReport | None]) -> None:
        """The deferred requests' split, from their spans (``report_for(trace_id)``)."""
        pending, self._pending = self._pending, []
        for trace_id, e2e_ns, client_ns, deferred in pending:
            report = report_for(trace_id)
            parts: dict[str, float | None] = {}
            if report is None:
                self.spans_missing += 1
            else:
                parts = self.record_split(report, e2e_ns=e2e_ns, client_ns=client_ns)
            deferred(record_fields(client_ns, trace_id, report if parts else None, parts))
        checks, self._cross_check = self._cross_check, []
        for trace_id, engine_ms in checks:
            report = report_for(trace_id)
            spans_ms = None if report is None else report.engine_ms()
            if spans_ms is not None:
                self.cross_check_ms.append(spans_ms - engine_ms)

    def record_client(self, stages_ns: dict[str, int]) -> None:
        client = self.client
        for stage, value_ns in stages_ns.items():
            client[stage].append(value_ns)

    def server_report(self, metrics_object: object, e2e_ms: float) -> ServerReport | None:
        """The request's report from its ``metrics`` object, or None (a bad one is noted)."""
        if metrics_object is None or not self.read_metrics_object:
            return None
        try:
            report = from_metrics_object(metrics_object, e2e_ms=e2e_ms)
        except BadReport as exc:
            self.notes[f"a metrics object was refused ({exc.kind})"] += 1
            return None
        if report is None:  # one was sent, all null: not "the server sent none"
            self.notes["a metrics object was refused (every stage null)"] += 1
        return report

    def record_split(
        self, report: ServerReport, *, e2e_ns: int, client_ns: dict[str, int]
    ) -> dict[str, float | None]:
        """Record one request's split; returns it (ms) for the request's record. A report whose
        engine time is more than the time left after the client's own stages is refused and
        noted (the figures cannot all be right), and nothing is recorded for it."""
        model_ms = report.model_ms()
        if model_ms is None:
            self.notes[f"{report.source}: no model time reported"] += 1
            return {}
        queue_ms = report.queue_ms
        own_ns = client_ns["lag"] + client_ns.get("pool_wait", 0)
        outside_ns = e2e_ns - own_ns - round((model_ms + (queue_ms or 0.0)) * 1e6)
        if outside_ns < -1_000_000:  # a millisecond of rounding in the server's figures
            self.notes[
                f"{report.source}: the server's stages exceed the request's time less the"
                " client's own"
            ] += 1
            return {}
        outside_ns = max(outside_ns, 0)
        self.sources[report.source] += 1
        split = self.split
        if queue_ms is not None:
            split["queue"].append(round(queue_ms * 1e6))
        if report.prefill_ms is not None:
            split["prefill"].append(round(report.prefill_ms * 1e6))
        if report.decode_ms is not None:
            split["decode"].append(round(report.decode_ms * 1e6))
        split["inference"].append(round(model_ms * 1e6))
        split["outside"].append(outside_ns)
        self.e2e.append(e2e_ns)
        self._outside_sum_ns += outside_ns
        self._e2e_sum_ns += e2e_ns
        return {
            "queue": queue_ms,
            "prefill": report.prefill_ms,
            "decode": report.decode_ms,
            "inference": model_ms,
            "outside": outside_ns / 1e6,
        }

    def summary(self) -> dict[str, Any]:
        attributed = len(self.e2e)
        return {
            "client": {stage: _summary(v) for stage, v in self.client.items() if v},
            "per_request": {
                "requests": attributed,
                "sources": dict(self.sources),
                "e2e": _summary(self.e2e) if attributed else None,
                **{stage: _summary(v) for stage, v in self.split.items() if v},
                "outside_share_of_e2e": (
                    self._outside_sum_ns / self._e2e_sum_ns if self._e2e_sum_ns else None
                ),
            },
            "notes": [f"{text} ({count}x)" for text, count in self.notes.items()],
        }


def _summary(values_ns: array[int]) -> dict[str, Any]:
    histogram = Histogram()
    histogram.record_all_ns(values_ns.tolist())
    return histogram.summary_ms()


def _trace_id(traceparent: str) -> str | None:
    """The trace id of a W3C ``traceparent`` (``00-<32 hex>-<16 hex>-<2 hex>``)."""
    return traceparent[3:35] if len(traceparent) == 55 else None


def record_fields(
    client_ns: dict[str, int],
    trace_id: str | None,
    report: ServerReport | None,
    parts: dict[str, float | None],
) -> dict[str, Any]:
    """A request's fields of :class:`~inferwire.load.metrics.RequestRecord` for its stages."""

    def ms(stage: str) -> float | None:
        value = client_ns.get(stage)
        return None if value is None else value / 1e6

    return {
        "pool_wait_ms": ms("pool_wait"),
        "connect_ms": ms("connect"),
        "write_ms": ms("write"),
        "wait_head_ms": ms("wait_head"),
        "first_event_ms": ms("first_event"),
        "client_parse_ms": ms("parse"),
        "trace_id": trace_id,
        "server_source": None if report is None else report.source,
        "server_queue_ms": parts.get("queue"),
        "server_prefill_ms": parts.get("prefill"),
        "server_decode_ms": parts.get("decode"),
        "server_model_ms": parts.get("inference"),
        "outside_engine_ms": parts.get("outside"),
    }
