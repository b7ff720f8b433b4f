"""What a server's Prometheus request families say about a load point, from two scrapes of
:mod:`.scrape` (before and after it, and those during it, for a timeline): per stage of
:mod:`.reports`, the number of requests the server counted, their mean and, from histogram
buckets, P50/P90/P99.

- :func:`delta`: two snapshots into a :class:`PointMetrics`, read through the table of
  :mod:`.families`. What cannot be right is a note and no figure, never an exception: a counter
  or bucket that went down (a reset, or the server restarted mid-point), bucket boundaries that
  changed, a series that vanished, a histogram with no finite bucket, no request counted.
- :func:`timeline`: consecutive snapshots into per-interval counts and means.
- :func:`prefix_cache`: the prefix cache's hit rate over the point, where the engine
  publishes one (:data:`~.families.PREFIX_CACHE`), in :class:`PointMetrics`' ``prefix_cache``.

Percentiles are interpolated as Prometheus' ``histogram_quantile`` does (promql/quantile.go):
the bucket holding the rank ``q * count`` is found, and the value is placed linearly between its
lower and upper bounds (the first bucket's lower bound is 0, or the bound itself if it is not
above 0). A rank in the ``+Inf`` bucket has no upper bound to interpolate to: the answer is the
highest finite bound, a lower bound of the true value, and the figures say so
(``above_top_bucket``). Series of one family (label sets) are summed first, as
``sum by (le)`` would.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any, Final

from .families import COUNTER, ENGINES, FAMILIES, HISTOGRAM, PREFIX_CACHE, SUMMARY, Family
from .reports import STAGES
from .scrape import HistogramSeries, LabelSet, Snapshot

QUANTILES: Final = ((0.5, "p50_ms"), (0.9, "p90_ms"), (0.99, "p99_ms"))
_RESTART_GAUGE: Final = "process_start_time_seconds"


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
    prefix_cache: Mapping[str, Any] | None = None
    """The prefix cache's hit rate over the point (:func:`prefix_cache`), if published."""

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
        if self.prefix_cache is not None:
            out["prefix_cache"] = dict(self.prefix_cache)
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


def _recreated(name: str, before: Snapshot, after: Snapshot) -> None:
    """prometheus_client's ``NAME_created`` gauge (vLLM, SGLang) is when a series started: a new
    one is a reset, even when the counts have since climbed past the old ones."""
    created = f"{name.removesuffix('_total')}_created"
    old, new = before.gauges.get(created, {}), after.gauges.get(created, {})
    if any(key in new and new[key] != value for key, value in old.items()):
        raise _LeftOut(f"{name} was reset during the point ({created} changed)")


def _figures(family: Family, before: Snapshot, after: Snapshot, notes: list[str]) -> Figures | None:
    _recreated(family.name, before, after)
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
        prefix_cache=prefix_cache(before, after),
    )


def prefix_cache(before: Snapshot, after: Snapshot) -> dict[str, Any] | None:
    """The prefix cache's hit rate over the point, from the first row of
    :data:`~.families.PREFIX_CACHE` the endpoint exposes: the counters' deltas (tokens), or the
    gauge at ``after``; None when none is exposed. A counter that went down or was recreated
    gives no rate and a note."""
    for row in PREFIX_CACHE:
        found: dict[str, Any] = {"engine": row.engine, "meaning": row.meaning, "url": row.url}
        if row.hits and row.queries:
            hits_after, queries_after = after.counter(row.hits), after.counter(row.queries)
            if hits_after is None or queries_after is None:
                continue
            found.update(source="counters", families=[row.hits, row.queries])
            try:
                _recreated(row.hits, before, after)
                _recreated(row.queries, before, after)
                hits = _scalar_delta(row.hits, before.counter(row.hits), hits_after)
                queries = _scalar_delta(row.queries, before.counter(row.queries), queries_after)
            except _LeftOut as exc:
                return {**found, "hit_rate": None, "note": str(exc)}
            rate = hits / queries if queries else None
            return {**found, "hit_tokens": hits, "queried_tokens": queries, "hit_rate": rate}
        if row.rate_gauge and row.rate_gauge in after.gauges:
            values = [v for v in after.gauges[row.rate_gauge].values() if math.isfinite(v)]
            rate = sum(values) / len(values) if values else None
            return {**found, "source": "gauge", "families": [row.rate_gauge], "hit_rate": rate}
    return None


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
