"""A server's Prometheus endpoint, scraped before and after a load point (and during it, for a
timeline), and what its request families say about the point: per stage of :mod:`.reports`,
the number of requests the server counted, their mean and, from histogram buckets, P50/P90/P99.

- :func:`parse_exposition`: Prometheus text (``prometheus_client``'s parser) into a
  :class:`Snapshot`; anything else is a :class:`ScrapeError`, and so is a body over
  :data:`MAX_BODY_BYTES`.
- :class:`Scraper`: one endpoint, scraped over the project's HTTP/1.1 pool; every failure
  (unreachable, a timeout, a status other than 2xx, a body that is not Prometheus text) is a
  :class:`ScrapeError` whose message says which.
- :func:`delta`: two snapshots into a :class:`PointMetrics`, read through the table of
  :mod:`.families`. What cannot be right is a note and no figure, never an exception: a counter
  or bucket that went down (a reset, or the server restarted mid-point), bucket boundaries that
  changed, a series that vanished, a histogram with no finite bucket, no request counted.
- :func:`timeline`: consecutive snapshots into per-interval counts and means.

Percentiles are interpolated as Prometheus' ``histogram_quantile`` does (promql/quantile.go):
the bucket holding the rank ``q * count`` is found, and the value is placed linearly between its
lower and upper bounds (the first bucket's lower bound is 0, or the bound itself if it is not
above 0). A rank in the ``+Inf`` bucket has no upper bound to interpolate to: the answer is the
highest finite bound, a lower bound of the true value, and the figures say so
(``above_top_bucket``). Series of one family (label sets) are summed first, as
``sum by (le)`` would.
"""

from __future__ import annotations

import asyncio
import itertools
import math
import ssl
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any, Final
from urllib.parse import urljoin, urlsplit

from prometheus_client.parser import text_string_to_metric_families

from inferwire.transports.errors import (
    ConnectError,
    MessageTooLargeError,
    TransportError,
)
from inferwire.transports.http1.pool import HttpPool, Origin
from inferwire.transports.timing import now_ns

from .families import COUNTER, ENGINES, FAMILIES, HISTOGRAM, SUMMARY, Family
from .reports import STAGES

MAX_BODY_BYTES: Final = 16 << 20
"""A body over this is refused: vLLM's /metrics is tens of kilobytes, one with thousands of
label sets a few megabytes."""
DEFAULT_TIMEOUT_S: Final = 10.0
"""Prometheus' own default ``scrape_timeout``."""
QUANTILES: Final = ((0.5, "p50_ms"), (0.9, "p90_ms"), (0.99, "p99_ms"))
_ACCEPT: Final = "text/plain; version=0.0.4"
"""The classic text format (not OpenMetrics), which every engine's exporter serves."""
_RESTART_GAUGE: Final = "process_start_time_seconds"
_REDIRECTS: Final = frozenset({301, 302, 303, 307, 308})

LabelSet = tuple[tuple[str, str], ...]
"""A series' labels, sorted (a histogram's ``le`` and a summary's ``quantile`` left out)."""


class ScrapeError(ValueError):
    """The endpoint gave no Prometheus text: the message says why."""


@dataclass(frozen=True, slots=True, kw_only=True)
class HistogramSeries:
    buckets: tuple[tuple[float, float], ...]
    """(upper bound ``le``, cumulative count), by bound; the last bound is ``math.inf``."""
    sum: float
    count: float


@dataclass(frozen=True, slots=True, kw_only=True)
class SummarySeries:
    sum: float
    count: float


@dataclass(frozen=True, slots=True, kw_only=True)
class Snapshot:
    """One scrape: per family name, per label set."""

    taken_ns: int
    """Monotonic clock (``time.monotonic_ns``) when the body had been read."""
    source_url: str | None = None
    histograms: Mapping[str, Mapping[LabelSet, HistogramSeries]]
    summaries: Mapping[str, Mapping[LabelSet, SummarySeries]]
    counters: Mapping[str, Mapping[LabelSet, float]]
    """By the family's name without ``_total`` (as ``prometheus_client`` names it)."""
    gauges: Mapping[str, Mapping[LabelSet, float]]
    untyped: Mapping[str, Mapping[LabelSet, float]]

    def counter(self, name: str) -> Mapping[LabelSet, float] | None:
        """A counter by the name it is exposed under (with or without ``_total``); a sample
        without a ``# TYPE`` line counts too."""
        found = self.counters.get(name.removesuffix("_total"))
        return found if found is not None else self.untyped.get(name)

    def has(self, family: Family) -> bool:
        if family.kind == HISTOGRAM:
            return family.name in self.histograms
        if family.kind == SUMMARY:
            return family.name in self.summaries
        return self.counter(family.name) is not None


def _labels(labels: Mapping[str, str], *drop: str) -> LabelSet:
    return tuple(sorted((k, v) for k, v in labels.items() if k not in drop))


def _histogram(parts: dict[str, Any]) -> HistogramSeries | None:
    buckets = sorted(parts["buckets"].items())
    count = parts.get("count")
    if buckets and math.isinf(buckets[-1][0]):
        count = buckets[-1][1] if count is None else count
    elif count is not None:
        buckets.append((math.inf, count))  # the format requires +Inf; _count is its value
    if count is None:
        return None
    return HistogramSeries(buckets=tuple(buckets), sum=parts.get("sum", math.nan), count=count)


def parse_exposition(
    text: str | bytes, *, taken_ns: int | None = None, source_url: str | None = None
) -> Snapshot:
    """Prometheus text exposition into a :class:`Snapshot` (``taken_ns``: now, if not given).
    Raises :class:`ScrapeError` for text that is not Prometheus, names no family, or is over
    :data:`MAX_BODY_BYTES`."""
    if len(text) > MAX_BODY_BYTES:
        raise ScrapeError(f"a metrics body of {len(text)} bytes, over {MAX_BODY_BYTES}")
    if isinstance(text, bytes):
        try:
            text = text.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise ScrapeError(f"not Prometheus text (not UTF-8: {exc.reason})") from None
    hist: dict[str, dict[LabelSet, dict[str, Any]]] = {}
    summ: dict[str, dict[LabelSet, dict[str, float]]] = {}
    scalars: dict[str, dict[str, dict[LabelSet, float]]] = {"counter": {}, "gauge": {}, "": {}}
    families = 0
    try:
        for family in text_string_to_metric_families(text):
            families += 1
            for sample in family.samples:
                name, value = sample.name, float(sample.value)
                suffix = name[len(family.name) :]
                if family.type == "histogram":
                    parts = hist.setdefault(family.name, {}).setdefault(
                        _labels(sample.labels, "le"), {"buckets": {}}
                    )
                    if suffix == "_bucket":
                        parts["buckets"][float(sample.labels["le"])] = value
                    elif suffix in ("_sum", "_count"):
                        parts[suffix[1:]] = value
                elif family.type == "summary" and suffix in ("_sum", "_count"):
                    key = _labels(sample.labels, "quantile")
                    summ.setdefault(family.name, {}).setdefault(key, {})[suffix[1:]] = value
                elif family.type in ("counter", "gauge") and suffix != "_created":
                    by_name = scalars[family.type].setdefault(family.name, {})
                    by_name[_labels(sample.labels)] = value
                elif family.type in ("unknown", "untyped"):
                    scalars[""].setdefault(name, {})[_labels(sample.labels)] = value
    except (ValueError, IndexError, KeyError, TypeError) as exc:
        raise ScrapeError(f"not Prometheus text ({str(exc)[:120]})") from exc
    if not families:  # an exporter with nothing observed yet still prints # TYPE lines
        raise ScrapeError("not Prometheus text (no metric family in the body)")
    histograms: dict[str, dict[LabelSet, HistogramSeries]] = {}
    for family_name, by_labels in hist.items():
        for key, parts in by_labels.items():
            series = _histogram(parts)
            if series is not None:
                histograms.setdefault(family_name, {})[key] = series
    return Snapshot(
        taken_ns=now_ns() if taken_ns is None else taken_ns,
        source_url=source_url,
        histograms=histograms,
        summaries={
            name: {
                k: SummarySeries(sum=p.get("sum", math.nan), count=p["count"])
                for k, p in s.items()
                if "count" in p
            }
            for name, s in summ.items()
        },
        counters=scalars["counter"],
        gauges=scalars["gauge"],
        untyped=scalars[""],
    )


class Scraper:
    """GETs one metrics endpoint (a URL without a path: ``/metrics``); one redirect to the same
    origin is followed (and kept for later scrapes). A connection per scrape: scrapes are
    seconds apart, and a kept one would race the server's idle timeout (uvicorn's is 5 s, the
    scrape interval's default too) and fail as closed before the answer."""

    def __init__(
        self,
        url: str,
        *,
        timeout_s: float = DEFAULT_TIMEOUT_S,
        ssl_context: ssl.SSLContext | None = None,
        headers: Sequence[tuple[str, str]] = (),
        max_bytes: int = MAX_BODY_BYTES,
    ) -> None:
        try:
            origin = Origin.parse(url)
        except ValueError as exc:
            raise ScrapeError(str(exc)) from None
        self.url = url
        self.timeout_s = timeout_s
        self.max_bytes = max_bytes
        self._origin = replace(origin, base_path="")
        self._target = _target(url, default="/metrics")
        self._pool = HttpPool(
            self._origin,
            headers=headers,
            ssl_context=ssl_context,
            max_connections=1,
            new_connection_per_request=True,
            timeout_s=timeout_s,
        )

    async def scrape(self) -> Snapshot:
        """One scrape; raises :class:`ScrapeError` with what went wrong."""
        try:
            async with asyncio.timeout(self.timeout_s):
                body = await self._get()
        except TimeoutError:  # the transports' TransportTimeoutError included
            raise ScrapeError(f"no answer within {self.timeout_s:g} s") from None
        except ConnectError as exc:
            raise ScrapeError(f"unreachable: {exc}") from exc
        except MessageTooLargeError:
            raise ScrapeError(f"a metrics body over {self.max_bytes} bytes: refused") from None
        except TransportError as exc:
            raise ScrapeError(f"the scrape failed: {exc}") from exc
        return parse_exposition(body, taken_ns=now_ns(), source_url=self.url)

    async def _get(self) -> bytes:
        for _ in range(2):
            response = await self._pool.request("GET", self._target, accept=_ACCEPT)
            if 200 <= response.status < 300:
                return await response.read(self.max_bytes)
            location = response.headers.get("location", "")
            error = await response.fail()
            if response.status in _REDIRECTS and self._follow(location):
                continue
            raise ScrapeError(_status_message(response.status, self._target, error.detail))
        raise ScrapeError(f"redirected again from {self._target}")

    def _follow(self, location: str) -> bool:
        """Take a redirect to the same origin; False for one elsewhere (or none)."""
        if not location:
            return False
        here = f"{self._origin.scheme}://{self._origin.authority}{self._target}"
        there = urlsplit(urljoin(here, location))
        try:
            same = Origin.parse(there.geturl())
        except ValueError:
            return False
        if replace(same, base_path="") != self._origin:
            return False
        self._target = _target(there.geturl(), default="/")
        return True

    async def close(self) -> None:
        await self._pool.close()


def _target(url: str, *, default: str) -> str:
    parts = urlsplit(url)
    return (parts.path or default) + (f"?{parts.query}" if parts.query else "")


def _status_message(status: int, target: str, detail: str) -> str:
    if status == 404:
        return (
            f"404 Not Found at {target}: no metrics there (vLLM and TGI serve /metrics on"
            " their API port, SGLang only with --enable-metrics, Triton on port 8002)"
        )
    return f"HTTP {status} from {target}: {detail[:200]}"


def bucket_quantile(q: float, buckets: Sequence[tuple[float, float]]) -> tuple[float, bool] | None:
    """The ``q`` quantile of cumulative ``(le, count)`` buckets (sorted, the last ``+Inf``), as
    Prometheus' ``histogram_quantile`` computes it, and whether the rank fell in the ``+Inf``
    bucket (the value is then the highest finite bound). None when nothing can be said: no
    observation, no finite bucket, no ``+Inf`` bucket."""
    if len(buckets) < 2 or not math.isinf(buckets[-1][0]):
        return None
    counts: list[float] = []
    for _, count in buckets:  # Prometheus forces the counts monotonic the same way
        counts.append(max(count, counts[-1]) if counts else count)
    if counts[-1] <= 0:
        return None
    rank = q * counts[-1]
    top = len(buckets) - 1
    b = next((i for i in range(top) if counts[i] >= rank), top)
    if b == top:
        return buckets[top - 1][0], True
    upper = buckets[b][0]
    if b == 0 and upper <= 0:
        return upper, False
    lower, below = (0.0, 0.0) if b == 0 else (buckets[b - 1][0], counts[b - 1])
    return lower + (upper - lower) * (rank - below) / (counts[b] - below), False


@dataclass(frozen=True, slots=True, kw_only=True)
class Figures:
    """One family's delta over a point, in milliseconds."""

    family: str
    kind: str
    count: int
    """Requests the server counted in the family over the point."""
    mean_ms: float | None
    p50_ms: float | None = None
    p90_ms: float | None = None
    p99_ms: float | None = None
    above_top_bucket: tuple[str, ...] = ()
    """Percentiles that fell in the ``+Inf`` bucket: the highest finite bound, a lower bound."""

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"family": self.family, "count": self.count}
        out["mean_ms"] = self.mean_ms
        if self.kind == HISTOGRAM:
            out.update(p50_ms=self.p50_ms, p90_ms=self.p90_ms, p99_ms=self.p99_ms)
            if self.above_top_bucket:
                out["above_top_bucket"] = list(self.above_top_bucket)
        return out


@dataclass(frozen=True, slots=True, kw_only=True)
class PointMetrics:
    """What the server's families say about one point."""

    engine: str | None
    """The engine whose families were read (the most of them on the endpoint), or None."""
    source_url: str | None
    interval_s: float
    stages: Mapping[str, Figures]
    """By stage of :data:`~inferwire.load.attribution.reports.STAGES`."""
    extra: Mapping[str, Figures]
    """Measures beside the stages (TTFT), never part of the split."""
    notes: tuple[str, ...] = ()
    dropped: tuple[str, ...] = ()
    """Families whose figures were left out (a reset, changed buckets, a vanished series)."""

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "engine": self.engine,
            "source_url": self.source_url,
            "interval_s": self.interval_s,
            "stages": {stage: f.to_json() for stage, f in self.stages.items()},
            "extra": {measure: f.to_json() for measure, f in self.extra.items()},
            "notes": list(self.notes),
        }
        if self.dropped:
            out["dropped"] = list(self.dropped)
        return out


class _LeftOut(Exception):
    """A family's figures cannot be right for the point; the message is the note."""


def _change(name: str, old: float, new: float) -> float:
    change = new - old
    if not math.isfinite(change):
        raise _LeftOut(f"{name}: a value that is not a finite number")
    if change < 0:
        raise _LeftOut(f"{name} went down during the point (a counter reset or a server restart)")
    return change


def _vanished(name: str, before: Mapping[LabelSet, Any], after: Mapping[LabelSet, Any]) -> None:
    if before.keys() - after.keys():
        raise _LeftOut(f"{name}: a series of it vanished during the point (a server restart?)")


def _scalar_delta(
    name: str, before: Mapping[LabelSet, float] | None, after: Mapping[LabelSet, float]
) -> float:
    """The sum over label sets of after - before (a series new in ``after`` started at 0)."""
    before = before or {}
    _vanished(name, before, after)
    return sum(_change(name, before.get(key, 0.0), value) for key, value in after.items())


def _histogram_figures(
    family: Family, before: Snapshot, after: Snapshot, notes: list[str]
) -> Figures | None:
    name = family.name
    old, new = before.histograms.get(name, {}), after.histograms[name]
    _vanished(name, old, new)
    merged: dict[float, float] = {}
    bounds: set[tuple[float, ...]] = set()
    count = total = 0.0
    for key, series in new.items():
        prior = old.get(key, HistogramSeries(buckets=(), sum=0.0, count=0.0))
        les = tuple(le for le, _ in series.buckets)
        if prior.buckets and tuple(le for le, _ in prior.buckets) != les:
            raise _LeftOut(f"{name}: its bucket boundaries changed during the point")
        bounds.add(les)
        start = dict(prior.buckets)
        for le, cumulative in series.buckets:
            merged[le] = merged.get(le, 0.0) + _change(name, start.get(le, 0.0), cumulative)
        count += _change(name, prior.count, series.count)
        total += _change(name, prior.sum, series.sum)
    if count <= 0:
        return None
    figures = Figures(
        family=name, kind=HISTOGRAM, count=round(count), mean_ms=total / count * family.to_ms
    )
    buckets = sorted(merged.items())
    if len(bounds) > 1:
        notes.append(f"{name}: its series have different buckets: count and mean only")
        return figures
    if len(buckets) < 2:
        notes.append(f"{name} has no finite bucket (only +Inf): count and mean only")
        return figures
    found = {field: bucket_quantile(q, buckets) for q, field in QUANTILES}
    capped = tuple(field for field, value in found.items() if value is not None and value[1])
    if capped:
        notes.append(
            f"{name}: {', '.join(capped)} fell above its highest finite bucket: reported as"
            f" that bound ({buckets[-2][0] * family.to_ms:g} ms), a lower bound of the true value"
        )

    def ms(field: str) -> float | None:
        value = found[field]
        return None if value is None else value[0] * family.to_ms

    return replace(
        figures,
        p50_ms=ms("p50_ms"),
        p90_ms=ms("p90_ms"),
        p99_ms=ms("p99_ms"),
        above_top_bucket=capped,
    )


def _summary_figures(family: Family, before: Snapshot, after: Snapshot) -> Figures | None:
    name = family.name
    old, new = before.summaries.get(name, {}), after.summaries[name]
    count = _scalar_delta(
        name, {k: s.count for k, s in old.items()}, {k: s.count for k, s in new.items()}
    )
    total = _scalar_delta(
        name, {k: s.sum for k, s in old.items()}, {k: s.sum for k, s in new.items()}
    )
    if count <= 0:
        return None
    return Figures(
        family=name, kind=SUMMARY, count=round(count), mean_ms=total / count * family.to_ms
    )


def _counter_figures(family: Family, before: Snapshot, after: Snapshot) -> Figures | None:
    name, requests_name = family.name, family.count_family or ""
    duration = _scalar_delta(name, before.counter(name), after.counter(name) or {})
    requests_after = after.counter(requests_name)
    if requests_after is None:
        raise _LeftOut(f"{name}: no {requests_name} on the endpoint to divide it by")
    requests = _scalar_delta(requests_name, before.counter(requests_name), requests_after)
    excluded = after.counter(family.count_excludes or "")
    if family.count_excludes and excluded is not None:
        requests -= _scalar_delta(
            family.count_excludes, before.counter(family.count_excludes), excluded
        )
    if requests <= 0:
        return None
    return Figures(
        family=name, kind=COUNTER, count=round(requests), mean_ms=duration / requests * family.to_ms
    )


def _figures(family: Family, before: Snapshot, after: Snapshot, notes: list[str]) -> Figures | None:
    if family.kind == HISTOGRAM:
        return _histogram_figures(family, before, after, notes)
    if family.kind == SUMMARY:
        return _summary_figures(family, before, after)
    return _counter_figures(family, before, after)


def detect_engine(
    snapshot: Snapshot, families: Sequence[Family] = FAMILIES
) -> tuple[str | None, list[str]]:
    """The engine with the most of its families on the endpoint (the table's order breaks a
    tie), and every engine with any."""
    present = {e: sum(snapshot.has(f) for f in families if f.engine == e) for e in ENGINES}
    found = [e for e in ENGINES if present[e]]
    return (max(found, key=present.__getitem__) if found else None), found


def _restarted(before: Snapshot, after: Snapshot) -> bool:
    old, new = before.gauges.get(_RESTART_GAUGE, {}), after.gauges.get(_RESTART_GAUGE, {})
    return any(key in new and new[key] != value for key, value in old.items())


def delta(before: Snapshot, after: Snapshot, families: Sequence[Family] = FAMILIES) -> PointMetrics:
    """What the server's families say about the point between two scrapes. Never raises: a
    family that cannot be right is a note (and in ``dropped``), not a figure."""
    notes: list[str] = []
    dropped: list[str] = []
    stages: dict[str, Figures] = {}
    extra: dict[str, Figures] = {}
    engine, found = detect_engine(after, families)
    if engine is None:
        notes.append(
            "none of the vLLM, SGLang, TGI or Triton families the split reads are on the"
            " endpoint (is it the engine's own metrics? SGLang needs --enable-metrics)"
        )
    elif len(found) > 1:
        notes.append(f"families of {', '.join(found)} are on the endpoint: {engine}'s are read")
    mine = [f for f in families if f.engine == engine]
    if engine is not None and _restarted(before, after):
        notes.append(
            f"the server restarted during the point ({_RESTART_GAUGE} changed): no figures"
        )
        dropped = [f.name for f in mine if after.has(f)]
        mine = []
    missing: dict[str, str] = {}
    idle: list[str] = []
    for stage in dict.fromkeys(f.stage for f in mine):
        candidates = [f for f in mine if f.stage == stage]
        family = next((f for f in candidates if after.has(f)), None)
        if family is None:
            missing[stage] = candidates[0].name
            continue
        try:
            figures = _figures(family, before, after, notes)
        except _LeftOut as exc:
            notes.append(f"{exc}: its figures are left out of the point")
            dropped.append(family.name)
            continue
        if figures is None:
            idle.append(family.name)
        else:
            (stages if stage in STAGES else extra)[stage] = figures
    if mine and not {"prefill", "decode", "inference"} & {f.stage for f in mine}:
        notes.append(f"{engine} publishes no per-request time of the model (prefill, decode)")
    if missing:
        notes.append(
            f"{engine}: no {', '.join(missing.values())} on the endpoint: no figures for"
            f" {', '.join(missing)}"
        )
    if idle:
        notes.append(f"no request counted during the point by {', '.join(idle)}")
    return PointMetrics(
        engine=engine,
        source_url=after.source_url,
        interval_s=(after.taken_ns - before.taken_ns) / 1e9,
        stages=stages,
        extra=extra,
        notes=tuple(notes),
        dropped=tuple(dropped),
    )


def timeline(
    snapshots: Sequence[Snapshot], families: Sequence[Family] = FAMILIES
) -> list[dict[str, Any]]:
    """Per interval between consecutive snapshots (taken during a point): its end ``t_s``
    (seconds after the first snapshot), and per stage the requests counted and their mean."""
    out: list[dict[str, Any]] = []
    for before, after in itertools.pairwise(snapshots):
        point = delta(before, after, families)
        entry: dict[str, Any] = {
            "t_s": (after.taken_ns - snapshots[0].taken_ns) / 1e9,
            "interval_s": point.interval_s,
            "stages": {
                stage: {"count": f.count, "mean_ms": f.mean_ms} for stage, f in point.stages.items()
            },
        }
        if point.dropped:
            entry["dropped"] = list(point.dropped)
        out.append(entry)
    return out
