"""The figures of ``results/load-agreement.md``, computed from the raw file's runs: one row of
figures a tool's round (:func:`inferwire_row`, :func:`guidellm_row`, both with what the relay
saw, :func:`wire_figures`) and the agreement checks over the rounds (:func:`verdicts`); the
page (:mod:`.load_agreement`) says what each means."""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Sequence
from typing import Any, Final

import numpy as np

UNIX_EPOCH_FLOOR_S: Final = 1e9
"""A ``targeted_start`` below this (2001) is not a Unix time: guidellm's Poisson offset was
read before it was set (see the page's note on it)."""
TPOT_RELATIVE_TOLERANCE: Final = 0.01


def percentile(values: Sequence[float], q: float) -> float | None:
    return float(np.percentile(np.asarray(values, dtype=float), q)) if values else None


def fmt(value: float | None, digits: int = 2) -> str:
    return "-" if value is None or not math.isfinite(value) else f"{value:,.{digits}f}"


def _interpolate(samples: Sequence[Sequence[float]], at: float) -> float:
    """CPU seconds at wall time ``at`` from (time, seconds) samples, linear in between."""
    times = [s[0] for s in samples]
    values = [s[1] for s in samples]
    return float(np.interp(at, times, values))


def wire_figures(run: dict[str, Any], skip: int = 0) -> dict[str, float | None]:
    """What the relay saw of a run's streams (after the first ``skip``, a warm-up), p50s in
    ms: first request byte to first event (the tool's TTFT as the wire sees it), first to
    last request byte (the client writing its request), last request byte to first event
    (the server's TTFT); and the rate requests reached the server at."""
    columns = run.get("wire_columns", ["request_in", "first_event_out", "done_out"])
    rows = [dict(zip(columns, row, strict=True)) for row in run.get("wire", [])]
    streams = [r for r in rows if r["first_event_out"]][skip:]
    whole = [r for r in streams if r.get("request_whole")]
    starts = [r["request_in"] for r in streams]
    span_s = starts[-1] - starts[0] if len(starts) > 1 else 0.0
    return {
        "wire_ttft_p50": percentile(
            [1e3 * (r["first_event_out"] - r["request_in"]) for r in streams], 50
        ),
        "wire_write_p50": percentile(
            [1e3 * (r["request_whole"] - r["request_in"]) for r in whole], 50
        ),
        "wire_server_p50": percentile(
            [1e3 * (r["first_event_out"] - r["request_whole"]) for r in whole], 50
        ),
        "wire_rate_rps": (len(starts) - 1) / span_s if span_s else None,
        "wire_streams": len(streams),
    }


def _per_request(seconds: float | None, requests: int) -> float | None:
    return None if seconds is None or not requests else 1e3 * seconds / requests


def _distinct_gaps(rows: Sequence[dict[str, Any]]) -> tuple[int, int]:
    """(distinct values, count) of the gaps between scheduled send times, to the microsecond
    (a Unix time as a float resolves about 0.24 us; two of 600 exponential gaps at 10/s
    fall within a microsecond of each other about twice in a run)."""
    targets = sorted(float(r["targeted_start"]) for r in rows)
    gaps = [round(b - a, 6) for a, b in itertools.pairwise(targets)]
    return len(set(gaps)), len(gaps)


def inferwire_row(run: dict[str, Any]) -> dict[str, Any]:
    """The figures of one ``inferwire load`` round (its one point)."""
    (point,) = run["report"]["points"]
    sent = point["requests_completed"] + point["requests_failed"]
    warmup = run["report"].get("parameters", {}).get("warmup_requests", 0)
    columns = run.get("request_columns", [])
    records = [dict(zip(columns, row, strict=True)) for row in run.get("requests", [])]
    ok = [r for r in records if r["ok"] and r["ttft_ms"] is not None]
    # per request when the records are there: the p50 of a difference, not a difference of p50s
    from_send = (
        percentile([r["ttft_ms"] - r["queue_wait_ms"] for r in ok], 50)
        if ok
        else point["ttft"]["p50_ms"] - point["queue_wait"]["p50_ms"]
    )
    sends = sorted(r["intended_s"] + r["queue_wait_ms"] / 1e3 for r in records)
    return {
        **wire_figures(run, skip=warmup),
        "load_average": run.get("load_average_after", [None])[0],
        "server_cpu_ms_per_request": _per_request(run.get("server_cpu_s"), sent),
        "cpu_cores": point["client_cpu_s"] / point["duration_s"] if point["duration_s"] else None,
        "tool": "inferwire load",
        "round": run["round"] + 1,
        "sent": sent,
        "completed": point["requests_completed"],
        "rate_rps": point["offered_rate_rps"],
        "ttft_p50": point["ttft"]["p50_ms"],
        "ttft_p99": point["ttft"]["p99_ms"],
        "tpot_p50": point["tpot"]["p50_ms"],
        "itl_p50": point["itl_per_chunk"]["p50_ms"],
        "e2e_p50": point["e2e"]["p50_ms"],
        "lag_p50": point["queue_wait"]["p50_ms"],
        "lag_p99": point["queue_wait"]["p99_ms"],
        "cpu_ms_per_request": 1e3 * point["client_cpu_s"] / sent if sent else None,
        "process_cpu_ms_per_request": 1e3 * run["process_cpu_s"] / sent if sent else None,
        "lag_invalid": 0,
        "ttft_from_send_p50": from_send,
        "sent_rate_rps": (len(sends) - 1) / (sends[-1] - sends[0]) if len(sends) > 1 else None,
    }


def guidellm_row(run: dict[str, Any]) -> dict[str, Any]:
    """The figures of one guidellm round, computed from its per-request timings (and its own
    summary, for the reader to check against)."""
    digest = run["digest"]
    columns = digest["request_columns"]
    rows = [dict(zip(columns, row, strict=True)) for row in digest["requests"]]
    ok = [r for r in rows if r["status"] == "successful"]
    started = sorted(r["request_start"] for r in rows if r["request_start"] is not None)
    valid = [r for r in ok if r["targeted_start"] >= UNIX_EPOCH_FLOOR_S]

    def of(values: Callable[[dict[str, Any]], float | None], q: float) -> float | None:
        found = [v for r in ok if (v := values(r)) is not None]
        return percentile(found, q)

    def lag_ms(r: dict[str, Any]) -> float:
        return 1e3 * (float(r["request_start"]) - float(r["targeted_start"]))

    lags = [lag_ms(r) for r in valid]
    window_start = started[0] if started else 0.0
    window_end = max((r["request_end"] or 0.0) for r in rows) if rows else 0.0
    samples = run["cpu_samples"]
    window_cpu_s = _interpolate(samples, window_end) - _interpolate(samples, window_start)
    sent = len(started)
    ttft_p50 = of(lambda r: r["time_to_first_token_ms"], 50)
    return {
        **wire_figures(run),
        "load_average": run.get("load_average_after", [None])[0],
        "server_cpu_ms_per_request": _per_request(run.get("server_cpu_s"), sent),
        "distinct_gaps": _distinct_gaps(valid),
        "cpu_cores": window_cpu_s / (window_end - window_start)
        if window_end > window_start
        else None,
        "ttft_from_send_p50": ttft_p50,
        "tool": f"guidellm {digest['guidellm_version']}",
        "round": run["round"] + 1,
        "sent": sent,
        "completed": len(ok),
        "rate_rps": (sent - 1) / (started[-1] - started[0]) if sent > 1 else None,
        "sent_rate_rps": (sent - 1) / (started[-1] - started[0]) if sent > 1 else None,
        "ttft_p50": ttft_p50,
        "ttft_p99": of(lambda r: r["time_to_first_token_ms"], 99),
        "tpot_p50": of(lambda r: r["inter_token_latency_ms"], 50),
        "itl_p50": of(lambda r: r["inter_token_latency_ms"], 50),
        "e2e_p50": of(lambda r: 1e3 * r["request_latency"], 50),
        "lag_p50": percentile(lags, 50),
        "lag_p99": percentile(lags, 99),
        "lag_invalid": len(ok) - len(valid),
        "ttft_from_target_p50": percentile(
            [1e3 * (r["first_token_iteration"] - r["targeted_start"]) for r in valid], 50
        ),
        "own_ttft_p50": digest["metrics"]["time_to_first_token_ms"]["percentiles"]["p50"],
        "own_itl_p50": digest["metrics"]["inter_token_latency_ms"]["percentiles"]["p50"],
        "own_tpot_p50": digest["metrics"]["time_per_output_token_ms"]["percentiles"]["p50"],
        "own_rps": digest["metrics"]["requests_per_second"]["mean"],
        "strategy": digest["strategy"],
        "cpu_ms_per_request": 1e3 * window_cpu_s / sent if sent else None,
        "process_cpu_ms_per_request": 1e3 * run["process_cpu_s"] / sent if sent else None,
    }


def mean(rows: Sequence[dict[str, Any]], key: str) -> float | None:
    values = [r[key] for r in rows if r.get(key) is not None]
    return sum(values) / len(values) if values else None


def _spread(rows: Sequence[dict[str, Any]], key: str) -> float:
    values = [r[key] for r in rows if r.get(key) is not None]
    return max(values) - min(values) if values else 0.0


def verdicts(ours: Sequence[dict[str, Any]], theirs: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """The agreement checks of the module docstring, on the means over rounds."""
    ttft_gap = (mean(ours, "ttft_p50") or 0.0) - (mean(theirs, "ttft_p50") or 0.0)
    clock = mean(ours, "lag_p50") or 0.0
    ttft_noise = max(_spread(ours, "ttft_p50"), _spread(theirs, "ttft_p50"))
    tpot_ours = mean(ours, "tpot_p50") or 0.0
    tpot_gap = tpot_ours - (mean(theirs, "tpot_p50") or 0.0)
    tpot_noise = max(
        _spread(ours, "tpot_p50"), _spread(theirs, "tpot_p50"), TPOT_RELATIVE_TOLERANCE * tpot_ours
    )
    return {
        "ttft_gap": ttft_gap,
        "clock": clock,
        "ttft_noise": ttft_noise,
        "ttft_residual": ttft_gap - clock,
        "ttft_agrees": abs(ttft_gap) <= clock + ttft_noise,
        "tpot_gap": tpot_gap,
        "tpot_noise": tpot_noise,
        "tpot_agrees": abs(tpot_gap) <= tpot_noise,
    }
