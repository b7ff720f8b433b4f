"""``results/load-agreement.md`` from ``results/raw/load-agreement.json``: ``inferwire load``
and guidellm on the same server and schedule (the run of
:mod:`inferwire.bench.loadgen.guidellm_compare`). Every figure is read or computed from the
raw file; nothing is typed in.

The two clocks start at different moments. ``inferwire load`` times each request from its
*intended* send time and records its own lateness, the queue wait (intended time to the moment
it started the request). guidellm times from the *actual* send (its ``request_start``, stamped
when httpx starts writing the request's headers) and leaves out its own lateness, which its
per-request timings still hold: ``targeted_start`` (the schedule's time) beside
``request_start``. So the gap between the tools' TTFT is expected to be about inferwire's queue
wait, and the page checks that: TTFT p50 agrees when ``|TTFT_inferwire - TTFT_guidellm| <=
queue_wait_inferwire + noise``, noise being the larger of the two tools' round-to-round spread
of TTFT p50. TPOT does not depend on where the clock starts: it agrees when the difference is
within the larger round-to-round spread of TPOT p50 (or 1%, if larger).
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, Final

import numpy as np

from .tables import table

UNIX_EPOCH_FLOOR_S: Final = 1e9
"""A ``targeted_start`` below this (2001) is not a Unix time: guidellm's Poisson offset was
read before it was set (see the page's note on it)."""
TPOT_RELATIVE_TOLERANCE: Final = 0.01


def _percentile(values: Sequence[float], q: float) -> float | None:
    return float(np.percentile(np.asarray(values, dtype=float), q)) if values else None


def _fmt(value: float | None, digits: int = 2) -> str:
    return "-" if value is None or not math.isfinite(value) else f"{value:,.{digits}f}"


def _interpolate(samples: Sequence[Sequence[float]], at: float) -> float:
    """CPU seconds at wall time ``at`` from (time, seconds) samples, linear in between."""
    times = [s[0] for s in samples]
    values = [s[1] for s in samples]
    return float(np.interp(at, times, values))


def wire_figures(run: dict[str, Any], skip: int = 0) -> dict[str, float | None]:
    """What the relay saw of a run's streams (after the first ``skip``, a warm-up): time to
    the first event p50/p99 (ms) and the rate requests reached the server at."""
    streams = [row for row in run.get("wire", []) if row[1]][skip:]
    ttft = [1e3 * (first - start) for start, first, _ in streams]
    starts = [row[0] for row in streams]
    span_s = starts[-1] - starts[0] if len(starts) > 1 else 0.0
    return {
        "wire_ttft_p50": _percentile(ttft, 50),
        "wire_ttft_p99": _percentile(ttft, 99),
        "wire_rate_rps": (len(starts) - 1) / span_s if span_s else None,
        "wire_streams": len(streams),
    }


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
        _percentile([r["ttft_ms"] - r["queue_wait_ms"] for r in ok], 50)
        if ok
        else point["ttft"]["p50_ms"] - point["queue_wait"]["p50_ms"]
    )
    sends = sorted(r["intended_s"] + r["queue_wait_ms"] / 1e3 for r in records)
    return {
        **wire_figures(run, skip=warmup),
        "load_average": run.get("load_average_after", [None])[0],
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
        return _percentile(found, q)

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
        "lag_p50": _percentile(lags, 50),
        "lag_p99": _percentile(lags, 99),
        "lag_invalid": len(ok) - len(valid),
        "ttft_from_target_p50": _percentile(
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


def _mean(rows: Sequence[dict[str, Any]], key: str) -> float | None:
    values = [r[key] for r in rows if r.get(key) is not None]
    return sum(values) / len(values) if values else None


def _spread(rows: Sequence[dict[str, Any]], key: str) -> float:
    values = [r[key] for r in rows if r.get(key) is not None]
    return max(values) - min(values) if values else 0.0


def verdicts(ours: Sequence[dict[str, Any]], theirs: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """The agreement checks of the module docstring, on the means over rounds."""
    ttft_gap = (_mean(ours, "ttft_p50") or 0.0) - (_mean(theirs, "ttft_p50") or 0.0)
    clock = _mean(ours, "lag_p50") or 0.0
    ttft_noise = max(_spread(ours, "ttft_p50"), _spread(theirs, "ttft_p50"))
    tpot_ours = _mean(ours, "tpot_p50") or 0.0
    tpot_gap = tpot_ours - (_mean(theirs, "tpot_p50") or 0.0)
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


def _figures_table(rows: Sequence[dict[str, Any]]) -> str:
    header = [
        "tool",
        "round",
        "sent",
        "completed",
        "req/s sent",
        "req/s at the server",
        "TTFT p50",
        "TTFT p99",
        "TPOT p50",
        "ITL p50",
        "E2E p50",
        "own lag p50 / p99",
        "client CPU ms/request (run / whole process)",
        "load average",
    ]
    body = [
        [
            r["tool"],
            str(r["round"]),
            str(r["sent"]),
            str(r["completed"]),
            _fmt(r["sent_rate_rps"]),
            _fmt(r["wire_rate_rps"]),
            _fmt(r["ttft_p50"]),
            _fmt(r["ttft_p99"]),
            _fmt(r["tpot_p50"], 3),
            _fmt(r["itl_p50"], 3),
            _fmt(r["e2e_p50"], 1),
            f"{_fmt(r['lag_p50'])} / {_fmt(r['lag_p99'])}",
            f"{_fmt(r['cpu_ms_per_request'])} / {_fmt(r['process_cpu_ms_per_request'])}",
            _fmt(r["load_average"], 1),
        ]
        for r in rows
    ]
    return table(header, body, left=(0,))


def _gap_table(rows: Sequence[dict[str, Any]], prefill_ms: float) -> str:
    header = [
        "tool",
        "round",
        "TTFT p50 as reported",
        "own lag p50",
        "TTFT p50 from the actual send",
        "TTFT p50 at the wire",
        "client's share",
        "the server's pacing",
        "client CPU, cores busy",
    ]
    body = [
        [
            r["tool"],
            str(r["round"]),
            _fmt(r["ttft_p50"]),
            _fmt(r["lag_p50"]),
            _fmt(r["ttft_from_send_p50"]),
            _fmt(r["wire_ttft_p50"]),
            _fmt(r["client_share"]),
            _fmt(prefill_ms),
            _fmt(r["cpu_cores"]),
        ]
        for r in rows
    ]
    return table(header, body, left=(0,))


def page(raw_path: Path) -> str:
    raw = json.loads(raw_path.read_text())
    spec = raw["spec"]
    ours = [inferwire_row(r) for r in raw["runs"] if r["tool"] == "inferwire"]
    theirs = [guidellm_row(r) for r in raw["runs"] if r["tool"] == "guidellm"]
    for r in ours + theirs:
        sent, wire = r["ttft_from_send_p50"], r["wire_ttft_p50"]
        r["client_share"] = None if sent is None or wire is None else sent - wire
    v = verdicts(ours, theirs)
    order = sorted(ours + theirs, key=lambda r: (r["round"], r["tool"] != "inferwire load"))
    machine = raw["machine"]
    floor_ms = spec["prefill_ms"]
    ideal_e2e_ms = spec["prefill_ms"] + spec["decode_ms"] * (spec["output_tokens"] - 1)
    invalid = sum(r["lag_invalid"] for r in theirs)
    lines = [
        "# `inferwire load` beside guidellm: agreement on one server",
        "",
        f"Generated by `make compare-guidellm` from `{raw_path.name}` (run {raw['started']}); "
        "no figure on this page is typed by hand.",
        "",
        "## Set-up",
        "",
        f"- server: `inferwire serve --transport {raw['server']['transport']} --codec "
        f"{raw['server']['codec']} --prefill-ms {spec['prefill_ms']:g} --decode-ms "
        f"{spec['decode_ms']:g}`, its `{raw['server']['workload']}` streams (one token a chunk), "
        "on loopback; one server process for every run.",
        f"- schedule: Poisson arrivals at {spec['rate_rps']:g} requests/s for "
        f"{spec['duration_s']:g} s, each tool with its own seeded schedule (round i: seed "
        f"{spec['seed']} + i); synthetic prompts of {spec['input_tokens']} tokens (the same "
        f"local tokenizer for both), {spec['output_tokens']} output tokens asked for.",
        f"- order: {spec['rounds']} rounds, each `inferwire load` then guidellm (ABAB), so that "
        "a drift of the machine hits both.",
        f"- machine: {machine.get('cpus', '?')} logical CPUs ({machine.get('cpus_usable', '?')}"
        f" usable), shared with other jobs; Python {raw['versions'].get('python', '?')}.",
        "- `inferwire load --url URL --api openai-chat`; guidellm `run` with the `openai_http` "
        "backend (chat completions, HTTP/1.1, `validate_backend=false`: the server has no "
        "`/health` route), `--profile kind=poisson`, `--constraint kind=max_duration`.",
        "",
        "## Ground truth",
        "",
        f"The server paces every stream: the first token {spec['prefill_ms']:g} ms after it "
        f"has read the request, then one every {spec['decode_ms']:g} ms on an absolute "
        f"schedule. So TTFT >= {floor_ms:g} ms (plus loopback and parsing), TPOT and ITL "
        f"~{spec['decode_ms']:g} ms, E2E >= {ideal_e2e_ms:g} ms.",
        "",
        "## Figures",
        "",
        "Milliseconds unless named. TTFT: inferwire from the intended send time, guidellm "
        "from the actual send. TPOT: (last token - first token) / (tokens - 1), per request "
        '(guidellm calls this ITL; its own "TPOT" divides by all tokens and includes the '
        "TTFT). ITL p50: inferwire's median gap between chunks; guidellm records no gaps, "
        "only each request's mean, so its column repeats TPOT. E2E: inferwire from the "
        "intended send, guidellm from the actual send. Req/s sent: (requests - 1) over the "
        "span of the tool's own actual send times; at the server: the same over the times the "
        "relay saw the requests arrive (one clock for both). Own lag: inferwire's queue wait "
        "(intended time to start); guidellm's dispatch delay "
        "(`request_start - targeted_start`). Client CPU: user + system of the tool's whole "
        "process tree, over the measured run (from the first request's start to the last "
        "one's end; inferwire: its own report's figure) and over the whole process (start-up "
        "and exit included), per request sent.",
        "",
        _figures_table(order),
        "",
        "guidellm's own summaries of the same runs (successful requests), for checking the "
        "computation above: "
        + "; ".join(
            f"round {r['round']}: TTFT p50 {_fmt(r['own_ttft_p50'])}, ITL p50 "
            f"{_fmt(r['own_itl_p50'], 3)}, its TPOT p50 {_fmt(r['own_tpot_p50'], 3)}, "
            f"{_fmt(r['own_rps'])} successful req/s ({r['strategy']['worker_count']} worker "
            "processes)"
            for r in theirs
        )
        + ".",
        "",
        "## Agreement",
        "",
        f"- **TPOT p50**: inferwire {_fmt(_mean(ours, 'tpot_p50'), 3)}, guidellm "
        f"{_fmt(_mean(theirs, 'tpot_p50'), 3)} (means over rounds): a difference of "
        f"{_fmt(v['tpot_gap'], 3)} ms against a tolerance of {_fmt(v['tpot_noise'], 3)} ms "
        f"(the larger round-to-round spread, or 1%): "
        f"**{'agree' if v['tpot_agrees'] else 'disagree'}**.",
        f"- **TTFT p50**: inferwire {_fmt(_mean(ours, 'ttft_p50'))}, guidellm "
        f"{_fmt(_mean(theirs, 'ttft_p50'))}: a gap of {_fmt(v['ttft_gap'])} ms. The measured "
        f"difference of their clocks is inferwire's queue wait p50, {_fmt(v['clock'])} ms (time "
        "that inferwire counts and guidellm's clock leaves out); the round-to-round noise of "
        f"TTFT p50 is {_fmt(v['ttft_noise'])} ms. |gap| <= clock difference + noise: "
        f"**{'agree' if v['ttft_agrees'] else 'disagree'}**; the gap left once the clock "
        f"difference is taken off: {_fmt(v['ttft_residual'])} ms.",
        "- **Measured from the same origin** (the intended send time): guidellm's TTFT plus "
        "its own dispatch delay, per request (`first_token - targeted_start`), has p50 "
        + ", ".join(f"{_fmt(r['ttft_from_target_p50'])}" for r in theirs)
        + " (rounds in order), beside inferwire's "
        + ", ".join(f"{_fmt(r['ttft_p50'])}" for r in ours)
        + ".",
        "",
        "## Where the TTFT gap comes from",
        "",
        "The same relay sits in front of the server for both tools (`stream_tap`: it stamps "
        "when a request's first bytes reach it and when the first event of its answer passes "
        'back), so "at the wire" is one clock for both, outside both. A tool\'s TTFT from '
        "its actual send, less the wire's, is the time spent in the client: writing the "
        "request after the clock started, and reading, parsing and handing over the first "
        "event. Cores busy: the tool's client CPU seconds per second of its run.",
        "",
        _gap_table(order, floor_ms),
        "",
        "- the client's share, means over rounds: inferwire "
        f"{_fmt(_mean(ours, 'client_share'))} ms, guidellm "
        f"{_fmt(_mean(theirs, 'client_share'))} ms; the wire's TTFT p50 under each: "
        f"{_fmt(_mean(ours, 'wire_ttft_p50'))} and {_fmt(_mean(theirs, 'wire_ttft_p50'))} ms "
        f"(the server's pacing: {floor_ms:g} ms).",
        "",
        "## Notes",
        "",
        "- guidellm's dispatch delay (p50 / p99 per round: "
        + "; ".join(f"{_fmt(r['lag_p50'])} / {_fmt(r['lag_p99'])}" for r in theirs)
        + " ms) is the lateness its TTFT and E2E leave out: a request that leaves late is "
        "timed as if it had been on time.",
        f"- {invalid} successful guidellm request(s) over all rounds carry a `targeted_start` "
        "that is not a Unix time. When this happens (it is a race): the Poisson strategy's "
        "shared offset starts at -1.0 and its start event is set before the offset is written "
        "(`guidellm/scheduler/strategies.py`, `AsyncPoissonStrategy.init_processes_start`), so "
        "a worker that draws first schedules from -1 s and sends at once, before the "
        "benchmark's start. Such requests are left out of the dispatch-delay figures, kept in "
        "the rest.",
        "- guidellm stops at its duration and cancels what is in flight (its `incomplete` "
        "requests: about the last E2E's worth of arrivals); inferwire lets the requests of "
        "its schedule finish. So `completed` differs by design; the percentiles are over "
        "completed requests of each.",
        "- inferwire sends 8 untimed warm-up requests before its schedule (left out of its "
        "wire figures too); guidellm has no warm-up here, so its first seconds are in its "
        "figures.",
        "- guidellm counts output tokens from the server's `usage` (the server reports "
        "its seeded stream's counts; its prompt_tokens is the workload's, not the prompt's), "
        'as inferwire does ("tokens counted by usage").',
        "",
    ]
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    """Write the page again from a raw file: ``python -m inferwire.bench.report.load_agreement
    RAW PAGE``."""
    import argparse

    parser = argparse.ArgumentParser(prog="python -m inferwire.bench.report.load_agreement")
    parser.add_argument(
        "raw", type=Path, nargs="?", default=Path("results/raw/load-agreement.json")
    )
    parser.add_argument("page", type=Path, nargs="?", default=Path("results/load-agreement.md"))
    args = parser.parse_args(argv)
    args.page.write_text(page(args.raw))
    print(f"wrote {args.page}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
