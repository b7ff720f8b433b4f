"""One report from the parts of a split run: ``inferwire load --part I/N`` run in N processes
(the Locust workers of :mod:`inferwire.load.locust_user`, or anything else) sends
the N shares of one seeded schedule from one start instant, and each writes the JSON report of
its share. Merging them gives the report one process would have written for the whole
schedule, with the same keys:

- the latency histograms are added bucket by bucket (each point's ``hdr``: HdrHistogram's own
  encoding, with the exact sum and max beside it), so every percentile is that of all the
  requests, not an average of the parts' percentiles;
- counts (requests, tokens, errors by name, integrity) are summed;
- the duration runs from the shared start to the last part's end, and every rate is divided by
  it; the offered rate is that of the whole schedule (its span is from the parts' first and
  last intended send times);
- ``client_cpu_s`` is the parts' sum; ``server_cpu_s`` is the largest of the parts'
  measurements, each of which saw the same server over nearly the same time;
- ``max_in_flight`` is the sum of the parts' maxima: an upper bound of the whole's;
- the ``timeline``'s counts are summed bucket by bucket (the parts' buckets cover the same
  times: they share the start); its per-bucket percentiles cannot be merged from percentiles,
  so each is the largest of the parts' (an upper bound of the whole's, which lies between the
  parts' smallest and largest) and the timeline says so (``"percentiles": "upper bound"``).
  Each part picks its bucket width from its own span, so parts that ended a little apart can
  differ in width: they are first re-bucketed to the narrowest round width that every part's
  width divides (e.g. 0.02 s and 0.05 s into 0.1 s), never split a bucket.

A key this module does not know whose values are counts by name (a mapping to integers, e.g.
``token_count``) is summed name by name; any other is kept when every part has the same value,
and otherwise becomes the list of the parts' values (in part order), never a guess.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, Final

from .metrics import Histogram
from .timeline import ROUND_WIDTHS_S

SUMMED: Final = (
    "requests_scheduled",
    "requests_excluded",
    "requests_measured",
    "requests_good",
    "requests_waited_for_bound",
    "requests_completed",
    "requests_failed",
    "output_tokens",
    "input_tokens",
    "inputs_completed",
    "reasoning_tokens",
    "tool_calls",
    "max_in_flight",
    "client_cpu_s",
)
SHARED: Final = ("rate_rps", "concurrency", "slo")
"""Keys that every part of one point has alike."""
DERIVED: Final = (
    "offered_rate_rps",
    "duration_s",
    "request_throughput_rps",
    "output_token_throughput_tps",
    "input_token_throughput_tps",
    "input_throughput_ips",
    "goodput_rps",
    "server_cpu_s",
    "client_cpu_s_per_1k_tokens",
    "server_cpu_s_per_1k_tokens",
    "errors",
    "error_examples",
    "integrity",
    "hdr",
    "part",
    "timeline",
)
TIMELINE_PERCENTILES: Final = ("itl_p50_ms", "itl_p99_ms", "ttft_p50_ms")


class MergeError(ValueError):
    """Parts that are not the shares of one schedule, or a report without what merging needs."""


def merge_points(parts: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """The point of the whole schedule from the points of its parts (any order)."""
    if not parts:
        raise MergeError("no parts to merge")
    ordered = sorted(parts, key=_part_index)
    _check_parts(ordered)
    for key in SHARED:
        if len({repr(p.get(key)) for p in ordered}) > 1:
            raise MergeError(f"the parts differ in {key!r}: not one schedule")
    histograms = _merged_histograms(ordered)
    merged: dict[str, Any] = {}
    for key in _keys(ordered):
        values = [p.get(key) for p in ordered]
        if key in SUMMED:
            given = [v for v in values if v is not None]
            merged[key] = sum(given) if given else None
        elif key in DERIVED or key in histograms:
            merged[key] = None  # filled below, in the parts' key order
        elif all(_is_counts(v) for v in values):  # equal or not: each part counted its own
            merged[key] = dict(_summed_counters(v for v in values if v is not None))
        elif all(v == values[0] for v in values):
            merged[key] = values[0]
        else:
            merged[key] = values
    duration_s = max(float(p["duration_s"]) for p in ordered)
    if merged.get("requests_good") is not None:
        good = merged["requests_good"]
    else:  # a report from before requests_good
        good = sum(round(p["goodput_rps"] * p["duration_s"]) for p in ordered if p["goodput_rps"])
    per_1k = 1000 / merged["output_tokens"] if merged["output_tokens"] else None
    servers = [p["server_cpu_s"] for p in ordered if p.get("server_cpu_s") is not None]
    server_cpu_s = max(servers) if servers else None
    merged.update(
        offered_rate_rps=_offered_rate_rps(ordered, merged["requests_scheduled"]),
        duration_s=duration_s,
        request_throughput_rps=merged["requests_completed"] / duration_s,
        output_token_throughput_tps=merged["output_tokens"] / duration_s,
        goodput_rps=good / duration_s if ordered[0]["goodput_rps"] is not None else None,
        server_cpu_s=server_cpu_s,
        client_cpu_s_per_1k_tokens=merged["client_cpu_s"] * per_1k if per_1k else None,
        server_cpu_s_per_1k_tokens=(
            server_cpu_s * per_1k if per_1k and server_cpu_s is not None else None
        ),
        errors=dict(_summed_counters(p["errors"] for p in ordered)),
        error_examples=_first_examples(p.get("error_examples", {}) for p in ordered),
        integrity=_merged_integrity([p["integrity"] for p in ordered]),
        timeline=_merged_timeline([p.get("timeline") for p in ordered]),
        **{name: h.summary_ms() for name, h in histograms.items()},
        hdr={name: h.encode() for name, h in histograms.items()},
    )
    for key, total in (
        ("input_token_throughput_tps", "input_tokens"),
        ("input_throughput_ips", "inputs_completed"),
    ):
        if key in merged:  # not in a report from before them
            merged[key] = None if merged[total] is None else merged[total] / duration_s
    del merged["part"]
    if all(p.get("timeline") is None for p in ordered) and "timeline" not in _keys(ordered):
        del merged["timeline"]  # a report from before timelines
    return merged


def merge_reports(
    reports: Sequence[Mapping[str, Any]], *, runner: Mapping[str, Any]
) -> dict[str, Any]:
    """The JSON report of the whole run from the reports of its parts; ``runner`` says what
    split it (e.g. ``{"kind": "locust", "workers": 2}``) and lands in the parameters."""
    if not reports:
        raise MergeError("no reports to merge")
    counts = {len(r.get("points", ())) for r in reports}
    if len(counts) != 1:
        raise MergeError(f"the parts' reports have different numbers of points: {counts}")
    (count,) = counts
    points = [merge_points([r["points"][i] for r in reports]) for i in range(count)]
    first = min(reports, key=lambda r: str(r.get("started", "")))
    parameters = dict(reports[0].get("parameters", {}))
    parameters["part"] = None
    parameters["split"] = {
        **runner,
        "parts": [
            {
                "part": report["points"][0]["part"]["index"] if report["points"] else None,
                "machine": report.get("machine"),
                "requests_scheduled": sum(p["requests_scheduled"] for p in report["points"]),
                "requests_completed": sum(p["requests_completed"] for p in report["points"]),
            }
            for report in sorted(reports, key=lambda r: _part_index(r["points"][0]))
        ],
    }
    return {
        "kind": reports[0].get("kind", "inferwire-load"),
        "started": first.get("started"),
        "parameters": parameters,
        "versions": reports[0].get("versions"),
        "machine": reports[0].get("machine"),
        "points": points,
    }


def _part_index(point: Mapping[str, Any]) -> int:
    part = point.get("part")
    if not isinstance(part, Mapping) or "index" not in part or "parts" not in part:
        raise MergeError("a point without its part (run with --part I/N)")
    return int(part["index"])


def _check_parts(ordered: Sequence[Mapping[str, Any]]) -> None:
    totals = {int(p["part"]["parts"]) for p in ordered}
    indices = [int(p["part"]["index"]) for p in ordered]
    if len(totals) != 1 or indices != list(range(len(ordered))) or totals != {len(ordered)}:
        raise MergeError(f"parts {indices} of {sorted(totals)}: need each of 0..N-1 once")
    if any("hdr" not in p for p in ordered):
        raise MergeError("a point without its histograms ('hdr')")


def _keys(points: Iterable[Mapping[str, Any]]) -> list[str]:
    keys: dict[str, None] = {}
    for point in points:
        keys.update(dict.fromkeys(point))
    return list(keys)


def _merged_histograms(ordered: Sequence[Mapping[str, Any]]) -> dict[str, Histogram]:
    names = _keys(p["hdr"] for p in ordered)
    merged: dict[str, Histogram] = {}
    for name in names:
        if any(name not in p["hdr"] for p in ordered):
            raise MergeError(f"histogram {name!r} is missing from a part")
        total = Histogram.decode(ordered[0]["hdr"][name])
        for point in ordered[1:]:
            total.add(Histogram.decode(point["hdr"][name]))
        merged[name] = total
    return merged


def _offered_rate_rps(ordered: Sequence[Mapping[str, Any]], scheduled: int) -> float | None:
    firsts = [
        p["part"]["first_offset_s"] for p in ordered if p["part"]["first_offset_s"] is not None
    ]
    lasts = [p["part"]["last_offset_s"] for p in ordered if p["part"]["last_offset_s"] is not None]
    span_s = max(lasts) - min(firsts) if firsts else 0.0
    return (scheduled - 1) / span_s if span_s > 0 else None


def _is_counts(value: Any) -> bool:
    return isinstance(value, Mapping) and all(
        isinstance(n, int) and not isinstance(n, bool) for n in value.values()
    )


def _summed_counters(counters: Iterable[Mapping[str, int]]) -> Counter[str]:
    total: Counter[str] = Counter()
    for counter in counters:
        total.update(counter)
    return total


def _first_examples(examples: Iterable[Mapping[str, str]]) -> dict[str, str]:
    first: dict[str, str] = {}
    for part in examples:
        for name, text in part.items():
            first.setdefault(name, text)
    return first


def _merged_integrity(parts: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    merged: dict[str, Any] = {}
    for key in _keys(parts):
        values = [p.get(key) for p in parts]
        if all(isinstance(v, bool) for v in values):
            merged[key] = all(values)  # content_checked: only if every part checked content
        else:
            merged[key] = sum(int(v or 0) for v in values)
    return merged


def _merged_timeline(parts: Sequence[Mapping[str, Any] | None]) -> dict[str, Any] | None:
    if any(t is None for t in parts):
        return None
    timelines = [t for t in parts if t is not None]
    width = _common_width([float(t["bucket_s"]) for t in timelines])
    if width is None:
        return None
    timelines = [_rebucketed(t, width) for t in timelines]
    buckets = max(int(t["buckets"]) for t in timelines)
    merged: dict[str, Any] = {"bucket_s": width, "buckets": buckets}
    for key in _keys(timelines):
        if key in merged or not isinstance(timelines[0][key], list):
            continue
        series = [list(t[key]) + [None] * (buckets - len(t[key])) for t in timelines]
        if key in TIMELINE_PERCENTILES:
            merged[key] = [
                max((v for v in at if v is not None), default=None)
                for at in zip(*series, strict=True)
            ]
        else:
            merged[key] = [sum(v or 0 for v in at) for at in zip(*series, strict=True)]
    merged["percentiles"] = "upper bound"
    return merged


def _whole(ratio: float) -> int | None:
    """``ratio`` as a whole number, if it is one (widths are round decimals: 0.1 / 0.02)."""
    rounded = round(ratio)
    return rounded if rounded >= 1 and abs(ratio - rounded) < 1e-6 else None


def _common_width(widths: Sequence[float]) -> float | None:
    """The narrowest round width (:data:`~.timeline.ROUND_WIDTHS_S`) at least the widest of
    ``widths`` that each of them divides; None if there is none."""
    widest = max(widths)
    for candidate in (widest, *(w for w in ROUND_WIDTHS_S if w > widest)):
        if all(_whole(candidate / w) is not None for w in widths):
            return candidate
    return None


def _rebucketed(timeline: Mapping[str, Any], width: float) -> Mapping[str, Any]:
    """``timeline`` in buckets of ``width`` (a whole multiple of its own): counts summed and
    percentiles the largest (an upper bound) over the buckets each new one covers."""
    factor = _whole(width / float(timeline["bucket_s"]))
    if factor is None or factor == 1:
        return timeline
    out: dict[str, Any] = dict(timeline)
    out["bucket_s"] = width
    out["buckets"] = -(-int(timeline["buckets"]) // factor)
    for key, values in timeline.items():
        if not isinstance(values, list):
            continue
        groups = [values[i : i + factor] for i in range(0, len(values), factor)]
        if key in TIMELINE_PERCENTILES:
            out[key] = [max((v for v in g if v is not None), default=None) for g in groups]
        else:
            out[key] = [sum(v or 0 for v in g) for g in groups]
    return out
