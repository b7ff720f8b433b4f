"""The attribution of one load run: which of the server's sources are on, and, per point, the
scrapes before, during and after it, the spans joined after it, and the point's account.

A source that fails (``/metrics`` missing or not Prometheus, a metrics object that cannot be
right, spans that never come) is a note in the point's account and the run goes on; a figure
is given only from a source that gave it whole.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import statistics
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Final
from urllib.parse import urlsplit

from inferwire._runtime.arguments import CommandError, split_address

from . import otlp, prometheus, scrape
from .reports import METRICS_OBJECT, OTLP, PROMETHEUS
from .split import PointSplit

DEFAULT_SPAN_WAIT_S: Final = 10.0
"""How long a point waits, after its last request, for spans still in flight: vLLM exports
them in batches (the OpenTelemetry SDK's batch processor sends every 5 s by default)."""
DEFAULT_SCRAPE_INTERVAL_S: Final = 5.0


def _traceparent() -> str:
    return otlp.new_traceparent()[0]


@dataclass(frozen=True, slots=True, kw_only=True)
class Options:
    """What ``inferwire load`` attributes with."""

    request_metrics: bool = True
    """Read the per-request ``metrics`` object when the server sends one."""
    metrics_url: str | None = None
    """The server's Prometheus endpoint; None: not scraped."""
    metrics_url_given: bool = False
    """The user named it (a failure is then worth a louder note)."""
    scrape_interval_s: float = DEFAULT_SCRAPE_INTERVAL_S
    span_wait_s: float = DEFAULT_SPAN_WAIT_S
    traceparent: bool = True


TRITON_METRICS_PORT: Final = 8002
"""Triton serves /metrics on a port of its own (``--metrics-port``, default 8002)."""


def metrics_url_of(
    args: argparse.Namespace, url: str | None, metrics_address: str = ""
) -> str | None:
    """Where ``--server-metrics`` says to scrape: None for off; auto: the server's own
    ``metrics_address`` when known (a spawned server's, inferwire's http1), else the target's
    ``/metrics`` (a Triton gRPC target: port 8002 of its host), else nowhere."""
    choice = args.server_metrics
    if choice == "off":
        return None
    if choice != "auto":
        parts = urlsplit(choice)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise CommandError(f"--server-metrics {choice!r}: give auto, off or an http(s) URL")
        return str(choice)
    if metrics_address:
        return f"http://{metrics_address}/metrics"
    if url is not None:
        parts = urlsplit(url)
        host = parts.hostname or "127.0.0.1"
        shown = f"[{host}]" if ":" in host else host
        if parts.scheme in ("grpc", "grpcs"):
            return f"http://{shown}:{TRITON_METRICS_PORT}/metrics"
        return f"{url.rstrip('/')}/metrics"
    return None


def attribution_from_args(
    args: argparse.Namespace, url: str | None, *, metrics_address: str = ""
) -> Attribution | None:
    """The run's attribution from ``inferwire load``'s options (None: ``--no-attribution``);
    ``url``: the API target's root URL (None: inferwire's own protocol, whose codec streams
    carry no metrics object); ``metrics_address``: where the server answers scrapes, if
    known."""
    if args.no_attribution:
        return None
    spans = None
    if args.otlp_listen:
        host, port = split_address(args.otlp_listen)
        spans = otlp.SpanReceiver(host=host, port=port)
    options = Options(
        request_metrics=args.request_metrics == "auto" and url is not None,
        metrics_url=metrics_url_of(args, url, metrics_address),
        metrics_url_given=args.server_metrics not in ("auto", "off"),
        span_wait_s=args.span_wait_s,
    )
    return Attribution(options, spans=spans)


class Attribution:
    """The run's sources: the scraper and the span receiver, opened once, used per point."""

    def __init__(self, options: Options, *, spans: Any = None) -> None:
        self.options = options
        self.spans = spans
        """The OTLP receiver (:class:`.otlp.SpanReceiver`), when ``--otlp-listen`` is given."""
        self.scraper: scrape.Scraper | None = None
        self._scrape_failed: str | None = None
        self.request_metrics_seen = 0

    async def open(self) -> None:
        if self.options.metrics_url is not None:
            self.scraper = scrape.Scraper(self.options.metrics_url)
        if self.spans is not None:
            self.spans.start()

    async def close(self) -> None:
        if self.scraper is not None:
            await self.scraper.close()
        if self.spans is not None:
            self.spans.close()

    def point(self) -> PointAttribution:
        return PointAttribution(self)


class PointAttribution:
    """One point's attribution: :meth:`start` before its first request, :meth:`finish` after
    its last, :meth:`summary` for its account."""

    def __init__(self, run: Attribution) -> None:
        self.run = run
        options = run.options
        self.split = PointSplit(read_metrics_object=options.request_metrics)
        self.new_traceparent: Callable[[], str] | None = (
            _traceparent if options.traceparent else None
        )
        self.spans_expected = run.spans is not None
        self._before: scrape.Snapshot | None = None
        self._after: scrape.Snapshot | None = None
        self._during: list[scrape.Snapshot] = []
        self._scrape_notes: list[str] = []
        self._ticker: asyncio.Task[None] | None = None
        self._spans_before = 0

    async def _scrape(self) -> scrape.Snapshot | None:
        scraper = self.run.scraper
        if scraper is None:
            return None
        try:
            return await scraper.scrape()
        except scrape.ScrapeError as exc:
            note = f"{scraper.url}: {exc}"
            if note not in self._scrape_notes:
                self._scrape_notes.append(note)
            return None

    async def start(self) -> None:
        self._before = await self._scrape()
        if self._before is not None:
            self._during.append(self._before)
            self._ticker = asyncio.create_task(self._tick())
        if self.run.spans is not None:
            self._spans_before = self.run.spans.spans_received

    async def _tick(self) -> None:
        while True:
            await asyncio.sleep(self.run.options.scrape_interval_s)
            snapshot = await self._scrape()
            if snapshot is not None:
                self._during.append(snapshot)

    async def finish(self) -> None:
        if self._ticker is not None:
            self._ticker.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._ticker
        if self._before is not None:
            self._after = await self._scrape()
            if self._after is not None:
                self._during.append(self._after)
        spans = self.run.spans
        if spans is not None:
            waiting = self.split.waiting_trace_ids()
            if waiting:
                await asyncio.to_thread(spans.wait_for, waiting, self.run.options.span_wait_s)
            self.split.join(spans.report_for)

    def summary(self, point: dict[str, Any]) -> dict[str, Any]:
        """The point's account (``point``: the point's metrics, for its E2E)."""
        out = self.split.summary()
        sources: dict[str, Any] = {}
        per_request = out["per_request"]["sources"]
        sources[METRICS_OBJECT] = _metrics_object_state(self, per_request.get(METRICS_OBJECT, 0))
        sources[PROMETHEUS] = self._prometheus_state(point, out)
        sources[OTLP] = self._otlp_state(per_request.get(OTLP, 0))
        out["sources"] = sources
        out["text"] = split_text(point, out)
        return out

    def _prometheus_state(self, point: dict[str, Any], out: dict[str, Any]) -> dict[str, Any]:
        scraper = self.run.scraper
        if scraper is None:
            return {"state": "off"}
        if self._before is None or self._after is None:
            return {"state": "failed", "url": scraper.url, "notes": self._scrape_notes}
        found = prometheus.delta(self._before, self._after).to_json()
        found["url"] = scraper.url
        found["notes"] = [*self._scrape_notes, *found.get("notes", [])]
        found["timeline"] = prometheus.timeline(self._during)
        if not found.get("stages"):
            found["state"] = "no stages"
            return found
        found["state"] = "used"
        found["split"] = point_split(point, out, found)
        scheduled = point.get("requests_scheduled")
        counts = [s.get("count") for s in found["stages"].values() if s.get("count") is not None]
        if scheduled is not None and counts and max(counts) != scheduled:
            found["notes"].append(
                f"the server counted {max(counts)} requests over the point, the generator sent"
                f" {scheduled} (warm-up, other clients, or requests still running): the"
                " server's means are over its own count"
            )
        return found

    def _otlp_state(self, joined: int) -> dict[str, Any]:
        spans = self.run.spans
        if spans is None:
            return {"state": "off"}
        received = spans.spans_received - self._spans_before
        checked = self.split.cross_check_ms
        state: dict[str, Any] = {
            "state": "used" if joined else ("cross-check" if checked else "no spans joined"),
            "endpoint": spans.endpoint,
            "spans_received": received,
            "requests_joined": joined,
            "requests_without_spans": self.split.spans_missing,
            # requests the metrics object reported, whose spans agree (or not) with it
            "cross_checked": len(checked),
            "cross_check_median_abs_ms": statistics.median(abs(d) for d in checked)
            if checked
            else None,
        }
        if self.split.spans_missing:
            state["notes"] = [
                f"{self.split.spans_missing} requests got no server span within"
                f" {self.run.options.span_wait_s:g} s (is the server exporting to"
                f" {spans.endpoint}?)"
            ]
        return state


def _metrics_object_state(point: PointAttribution, used: int) -> dict[str, Any]:
    if not point.run.options.request_metrics:
        return {"state": "off"}
    refused = sum(n for text, n in point.split.notes.items() if "metrics object" in text)
    if used:
        return {"state": "used", "requests": used, "refused": refused}
    return {
        "state": "refused" if refused else "absent",
        "requests": 0,
        "refused": refused,
        "notes": [
            "the server sent no per-request metrics object (vLLM: start it with"
            " --enable-per-request-metrics)"
        ]
        if not refused
        else [],
    }


def point_split(
    point: dict[str, Any], out: dict[str, Any], found: dict[str, Any]
) -> dict[str, Any] | None:
    """The point's split from the server's histogram means: the client's mean E2E, less the
    generator's own mean lag and pool wait, less the server's mean queue and model time."""
    e2e = (point.get("e2e") or {}).get("mean_ms")
    stages = found["stages"]

    def mean(stage: str) -> float | None:
        value = stages.get(stage, {}).get("mean_ms")
        return None if value is None else float(value)

    model = None
    prefill, decode = mean("prefill"), mean("decode")
    if prefill is not None and decode is not None:
        model = prefill + decode
    elif mean("inference") is not None:
        model = mean("inference")
    if e2e is None or model is None:
        return None
    client = out["client"]
    own = sum((client.get(s) or {}).get("mean_ms") or 0.0 for s in ("lag", "pool_wait"))
    queue = mean("queue") or 0.0
    outside = e2e - own - queue - model
    return {
        "e2e_mean_ms": e2e,
        "client_own_mean_ms": own,
        "queue_mean_ms": mean("queue"),
        "prefill_mean_ms": prefill,
        "decode_mean_ms": decode,
        "model_mean_ms": model,
        "outside_mean_ms": outside,
        "outside_share": outside / e2e if e2e else None,
    }


def _ms(value: float | None) -> str:
    if value is None:
        return "-"
    return f"{value:.3g}" if abs(value) < 10 else f"{value:.0f}"


def split_text(point: dict[str, Any], out: dict[str, Any]) -> str:
    """One line: where the point's time went, and the source of each figure."""
    per_request = out["per_request"]
    parse = (out["client"].get("parse") or {}).get("p50_ms")
    parse_text = f", client parse {_ms(parse)} (overlaps decode)" if parse is not None else ""
    if per_request["requests"]:
        p50 = {s: (per_request.get(s) or {}).get("p50_ms") for s in ("queue", "prefill", "decode")}
        outside = per_request["outside"]["p50_ms"]
        share = per_request["outside_share_of_e2e"]
        sources = "+".join(sorted(per_request["sources"]))
        model = (
            f"prefill {_ms(p50['prefill'])}, decode {_ms(p50['decode'])}"
            if p50["prefill"] is not None
            else f"model {_ms((per_request.get('inference') or {}).get('p50_ms'))}"
        )
        return (
            f"split ({sources}, {per_request['requests']} requests, P50 ms): E2E"
            f" {_ms(per_request['e2e']['p50_ms'])}: queue {_ms(p50['queue'])}, {model}, outside"
            f" the engine {_ms(outside)} ({share:.1%} of the time){parse_text}"
        )
    prom = out["sources"].get(PROMETHEUS, {})
    split = prom.get("split")
    if split:
        return (
            f"split (prometheus {prom.get('engine')}, means ms): E2E {_ms(split['e2e_mean_ms'])}:"
            f" queue {_ms(split['queue_mean_ms'])}, model {_ms(split['model_mean_ms'])}, outside"
            f" the engine {_ms(split['outside_mean_ms'])}"
            f" ({(split['outside_share'] or 0):.1%}){parse_text}"
        )
    client = out["client"]
    parts = [
        f"{label} {_ms((client.get(stage) or {}).get('p50_ms'))}"
        for stage, label in (
            ("connect", "connect"),
            ("write", "write"),
            ("wait_head", "wait for head"),
            ("first_event", "first event"),
        )
        if stage in client
    ]
    return "split: no server report; client only (P50 ms): " + ", ".join(parts) + parse_text
