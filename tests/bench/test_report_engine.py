"""The engine section of the report and the claims it judges (C8, C13, the split of C4, C9,
C10): each verdict rule at its thresholds, and the rows and tables from a raw file written here."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from inferwire.bench.report import claims, engine
from inferwire.bench.report.engine_verdicts import (
    BatchFigures,
    Split,
    c4_cpu_verdict,
    c4_verdict,
    c8_verdict,
    c9_verdict,
    c10_verdict,
    c13_verdict,
)


@pytest.mark.parametrize(
    ("continuous", "static", "starts"),
    [
        (32.0, 78.0, "holds: static"),  # the published figures: 2.44x
        (10.0, 20.0, "holds: static"),  # 2.0x, the band's lower edge
        (10.0, 30.0, "holds: static"),  # 3.0x, its upper edge
        (10.0, 30.5, "holds, and the gap is larger"),
        (10.0, 19.9, "holds only in direction"),
        (10.0, 11.0, "holds only in direction"),  # 1.1x
        (10.0, 10.9, "does not hold"),
        (10.0, 5.0, "does not hold"),
        (0.0, 5.0, "not measured"),
    ],
)
def test_c8_verdict_reads_the_static_to_continuous_ratio(
    continuous: float, static: float, starts: str
) -> None:
    assert c8_verdict(continuous, static).startswith(starts)


def _f(label: str, throughput: float, p99: float) -> BatchFigures:
    return BatchFigures(label=label, throughput=throughput, p99_ms=p99)


@pytest.mark.parametrize(
    ("adaptive", "fixed", "starts"),
    [
        # 2.4x the best fixed size and a lower P99: the claim as published
        (_f("a", 240, 180), [_f("B=8", 100, 230), _f("B=4", 50, 400)], "holds: against the best"),
        # 2.4x only against the worst
        (_f("a", 120, 180), [_f("B=8", 100, 230), _f("B=4", 50, 400)], "holds only against"),
        # the best fixed size's throughput, a lower P99
        (_f("a", 100, 180), [_f("B=8", 100, 230), _f("B=4", 60, 400)], "does not hold as a"),
        # the same throughput and P99 (within 5%)
        (_f("a", 99, 235), [_f("B=8", 100, 230), _f("B=4", 60, 400)], "does not hold: adaptive"),
        # worse
        (_f("a", 80, 300), [_f("B=8", 100, 230), _f("B=4", 60, 400)], "does not hold: a fixed"),
        (_f("a", 80, 300), [], "not measured"),
    ],
)
def test_c13_verdict_is_against_the_best_fixed_size(
    adaptive: BatchFigures, fixed: list[BatchFigures], starts: str
) -> None:
    assert c13_verdict(adaptive, fixed).startswith(starts)


def test_c13_2x_against_the_best_needs_a_lower_p99_too() -> None:
    verdict = c13_verdict(_f("a", 240, 300), [_f("B=8", 100, 230), _f("B=4", 100, 230)])
    assert not verdict.startswith("holds: against the best")


def _split(compute: float, scheduling: float, serialization: float) -> Split:
    return Split(
        compute=compute,
        scheduling=scheduling,
        serialization=serialization,
        network=1 - compute - scheduling - serialization,
    )


@pytest.mark.parametrize(
    ("serialization", "starts"),
    [
        (0.10, "holds"),
        (0.25, "holds"),
        (0.099, "does not hold: below"),
        (0.26, "does not hold: above"),
    ],
)
def test_c4_verdict_band(serialization: float, starts: str) -> None:
    assert c4_verdict(_split(0.3, 0.1, serialization)).startswith(starts)


def test_c4_cpu_verdict_groups_codecs_by_band() -> None:
    verdict = c4_cpu_verdict({"delta": 0.05, "protobuf": 0.10, "msgpack": 0.25, "orjson": 0.3})
    assert verdict == (
        "in the range with `protobuf`, `msgpack`; above it with `orjson`; below it with `delta`"
    )
    assert c4_cpu_verdict({}) == "not measured"


@pytest.mark.parametrize(
    ("serialization", "network", "starts"),
    [
        (0.20, 0.15, "holds"),  # 35%
        (0.30, 0.18, "holds"),  # 48%
        (0.20, 0.14, "does not hold: serialization + network are below"),
        (0.30, 0.19, "does not hold: serialization + network are above"),
    ],
)
def test_c9_verdict_band(serialization: float, network: float, starts: str) -> None:
    split = Split(
        compute=0.5,
        scheduling=0.5 - serialization - network,
        serialization=serialization,
        network=network,
    )
    assert c9_verdict(split).startswith(starts)


@pytest.mark.parametrize(
    ("compute", "scheduling", "serialization", "verdict"),
    [
        (0.40, 0.05, 0.30, "holds"),  # the published split
        (0.30, 0.15, 0.25, "holds"),  # every share at the edge of its tolerance
        (0.85, 0.05, 0.05, "does not hold: compute is the largest stage here"),
        (0.20, 0.70, 0.05, "does not hold: scheduling is the largest stage here"),
        (0.10, 0.05, 0.40, "does not hold: network + serialization is the largest stage here"),
        (0.40, 0.16, 0.30, "does not hold: network + serialization is the largest stage here"),
    ],
)
def test_c10_verdict(compute: float, scheduling: float, serialization: float, verdict: str) -> None:
    assert c10_verdict(_split(compute, scheduling, serialization)) == verdict


# -- rows and tables from a raw file -------------------------------------------------------------


def _pcts(p50: float, p99: float) -> dict[str, float]:
    return {"p50_ms": p50, "p90_ms": (p50 + p99) / 2, "p99_ms": p99}


def _policy(ttft: float, e2e: float, **extra: Any) -> dict[str, Any]:
    return {
        "requests": 100,
        "output_tokens": 13600,
        "duration_s": 2.0,
        "throughput_tok_s": 6800.0,
        "throughput_rps": 50.0,
        "ttft": _pcts(ttft, ttft * 3),
        "e2e": _pcts(e2e, e2e * 2),
        "queue": _pcts(1.0, 2.0),
        "tpot": _pcts(6.0, 7.0),
        "mean_batch": 20.0,
        "steps": 400,
        "preemptions": 0,
        "correct": True,
        **extra,
    }


STEP = {"parameters": {"decode_base_s": 0.00513}, "source": "Defaults: fitted to ..."}


def _c8(continuous_ttft: float, static_ttft: float) -> dict[str, Any]:
    return {
        "op": "c8-virtual",
        "clock": "virtual",
        "rate_rps": 50.0,
        "arrival": "poisson",
        "requests": 4000,
        "seed": 17,
        "workload": "stream-256",
        "output_tokens": [16, 256],
        "prompt_tokens": [64, 1024],
        "step": STEP,
        "policies": {
            "continuous": _policy(continuous_ttft, 800.0),
            "static": _policy(static_ttft, 1900.0),
        },
        "correct": True,
    }


def _c8_stack(policy: str, ttft: float) -> dict[str, Any]:
    return {
        "op": "c8-stack",
        "policy": policy,
        "rate_rps": 50.0,
        "window_s": 8.0,
        "requests_completed": 400,
        "requests_failed": 0,
        "ttft": _pcts(ttft, ttft * 2),
        "e2e": _pcts(900.0, 1800.0),
        "tpot": _pcts(6.0, 7.0),
        "output_token_throughput_tps": 6700.0,
        "correct": True,
    }


def _c13(trace: str, adaptive_tps: float) -> dict[str, Any]:
    configs = {
        "adaptive Bmax=64": {"policy": "adaptive", "batch": 64, **_policy(20, 500)},
        "continuous B=4": {"policy": "continuous", "batch": 4, **_policy(900, 9000)},
        "continuous B=64": {"policy": "continuous", "batch": 64, **_policy(20, 520)},
    }
    configs["adaptive Bmax=64"]["throughput_tok_s"] = adaptive_tps
    configs["continuous B=4"]["throughput_tok_s"] = 1000.0
    return {
        "op": "c13-virtual",
        "clock": "virtual",
        "trace": trace,
        "arrival": "gamma" if trace == "gamma-bursty" else "poisson",
        "burstiness": 0.25 if trace == "gamma-bursty" else 1.0,
        "capacity_rps": 120.0,
        "load": 0.9,
        "rate_rps": 108.0,
        "requests": 4000,
        "seed": 17,
        "bmax": 64,
        "admit_sizes": [4],
        "static_sizes": [],
        "step": STEP,
        "l_definition": "L is the predicted load: the running batch's next step time over ...",
        "configs": configs,
        "correct": True,
    }


def _stages(codec: str, serialization: float) -> dict[str, Any]:
    shares = {
        "compute": 0.6,
        "scheduling": 0.25 - serialization,
        "serialization": serialization,
        "engine_loop": 0.05,
        "network": 0.1,
    }
    return {
        "op": "engine-stages",
        "hop_codec": codec,
        "frontend_codec": "orjson",
        "policy": "continuous",
        "rate_rps": 10.0,
        "requests": 50,
        "stages_ms": {k: v * 1000 for k, v in shares.items()},
        "shares": shares,
        "serialization_ms": dict.fromkeys(engine.SERIALIZATION_PARTS, 1.0),
        "e2e_ms": 1000.0,
        "correct": True,
    }


def _point(
    rate: float, tokens: float, short: bool, busy: bool = False, us: float = 20.0
) -> dict[str, Any]:
    return {
        "rate_rps": rate,
        "tokens_s": tokens,
        "tokens_s_min": tokens * 0.9,
        "tokens_s_max": tokens * 1.1,
        "frontend_cpu_cores": 0.5,
        "engine_cpu_cores": 0.4,
        "client_cpu_cores": 0.3,
        "frontend_cpu_us_per_token": us,
        "hop_decode_us_per_chunk": 5.0,
        "serialization_share": 0.3,
        "serialization_share_isolated": 0.2,
        "fell_short": short,
        "frontend_core_busy": False,
        "other_core_busy": busy,
        "failed": 0,
    }


def _sweep() -> dict[str, Any]:
    return {
        "op": "hop-sweep",
        "frontend_transport": "http1",
        "frontend_codec": "orjson",
        "policy": "continuous",
        "step_scale": 0.01,
        "max_tokens": 64,
        "trials": 3,
        "trial_s": 2.0,
        "json_hop": "orjson",
        "saturation_gain": 0.9,
        "saturation_cores": 0.95,
        "points": {
            "orjson": {"50": _point(50, 3000, False), "100": _point(100, 4000, True)},
            "msgspec-msgpack": {
                "50": _point(50, 3200, False),
                "100": _point(100, 6400, False, busy=True, us=10.0),
            },
        },
        "correct": True,
    }


def _write(raw_dir: Path, infos: list[dict[str, Any]]) -> None:
    raw_dir.mkdir(parents=True, exist_ok=True)
    benchmarks = [{"extra_info": info, "stats": {"median": 1.0, "iqr": 0.1}} for info in infos]
    (raw_dir / engine.ENGINE_RAW).write_text(json.dumps({"benchmarks": benchmarks}))


def _claim(raw_dir: Path, claim_id: str) -> list[str]:
    return next(row for row in claims.rows([], raw_dir) if row[0] == claim_id)


def test_c8_row_reads_p50_ttft_and_its_ratio(tmp_path: Path) -> None:
    _write(tmp_path, [_c8(20.0, 60.0)])
    row = _claim(tmp_path, "C8")
    assert "static/continuous 3.00x" in row[3]
    assert row[4] == c8_verdict(20.0, 60.0)
    assert "no real-stack run" in row[2]


def test_c8_row_says_when_the_real_stack_disagrees(tmp_path: Path) -> None:
    _write(tmp_path, [_c8(20.0, 60.0), _c8_stack("continuous", 30.0), _c8_stack("static", 31.0)])
    row = _claim(tmp_path, "C8")
    assert "real stack" in row[3]
    assert "through the real stack: does not hold" in row[4]


def test_c13_row_judges_each_trace(tmp_path: Path) -> None:
    _write(tmp_path, [_c13("poisson-near-capacity", 6800.0), _c13("gamma-bursty", 2500.0)])
    row = _claim(tmp_path, "C13")
    assert "poisson-near-capacity: holds only against a poorly chosen" in row[4]
    assert "gamma-bursty: holds only against a poorly chosen" in row[4]
    assert "L is the predicted load" in row[2]


def test_split_rows_judge_the_largest_serialization_share(tmp_path: Path) -> None:
    _write(tmp_path, [_stages("msgspec-msgpack", 0.05), _stages("orjson", 0.12)])
    c4 = _claim(tmp_path, "C4")
    assert c4[4] == "through the engine: holds at this rate"
    assert "5% (`msgspec-msgpack` hop) to 12% (`orjson`)" in c4[3]
    assert "frontend's CPU" not in c4[4]  # no sweep in this run
    c10 = _claim(tmp_path, "C10")
    assert c10[4] == "through the engine: does not hold: compute is the largest stage here"


def test_c4_adds_the_sweep_share_of_frontend_cpu(tmp_path: Path) -> None:
    _write(tmp_path, [_stages("orjson", 0.12), _sweep()])
    c4 = _claim(tmp_path, "C4")
    assert (
        "of the frontend's CPU: `orjson` hop 30% at 100 req/s, `msgspec-msgpack` hop 30% at 100"
    ) in c4[3]
    assert c4[4].endswith(
        "of the frontend's CPU at high throughput: above it with `orjson`, `msgspec-msgpack`"
    )


def test_claims_without_the_engine_run_say_so(tmp_path: Path) -> None:
    _write(tmp_path, [])
    for claim_id in ("C8", "C13"):
        assert _claim(tmp_path, claim_id)[2:] == ["not in this run", "-", "-"]


def test_section_has_every_table_and_the_plot(tmp_path: Path) -> None:
    raw_dir = tmp_path / "raw"
    _write(
        raw_dir,
        [
            _c8(20.0, 60.0),
            _c8_stack("continuous", 30.0),
            _c8_stack("static", 90.0),
            _c13("poisson-near-capacity", 6800.0),
            _stages("orjson", 0.12),
            _sweep(),
        ],
    )
    text = engine.section(raw_dir)
    for heading in ("(C8)", "(C13)", "client -> frontend -> engine", "by hop codec", "| other |"):
        assert heading in text
    assert (
        "`msgspec-msgpack`: peak 6,400 tokens/s at 100 req/s (from 100 req/s the engine + load "
        "generator core was busy); there 10.0 us of frontend CPU a token, 30% of it "
        "serialization (20% with the isolated costs), so one frontend core would carry about "
        "100,000 tokens/s; 2.00x the tokens a frontend core carries over the `orjson` hop"
    ) in text
    assert (
        "`orjson`: peak 4,000 tokens/s at 100 req/s (from 100 req/s fell short of the offered "
        "tokens)"
    ) in text
    assert "Defaults: fitted to" in text
    paths = engine.plot(raw_dir, tmp_path)
    assert [p.name for p in paths] == ["engine_sweep.png"]
    assert paths[0].stat().st_size > 0


def test_sweep_outcomes_read_the_first_limit_and_the_peak() -> None:
    outcomes = engine.sweep_outcomes(_sweep())
    assert outcomes["orjson"].limit_rps == 100
    assert outcomes["orjson"].limits == ("fell short of the offered tokens",)
    assert outcomes["msgspec-msgpack"].limits == ("the engine + load generator core was busy",)
    assert outcomes["msgspec-msgpack"].peak_rps == 100
    assert outcomes["msgspec-msgpack"].core_tokens_s == pytest.approx(100_000)


def test_a_later_repeat_reads_the_one_engine_run(tmp_path: Path) -> None:
    raw_dir = tmp_path / "raw"
    _write(raw_dir, [_c8(20.0, 60.0)])
    _write(raw_dir / "repeats" / "1", [_c8(20.0, 60.0)])
    (raw_dir / "repeats" / "2").mkdir(parents=True)
    for repeat in ("1", "2"):
        assert _claim(raw_dir / "repeats" / repeat, "C8") == _claim(raw_dir, "C8")


def test_no_section_without_the_raw_file(tmp_path: Path) -> None:
    assert engine.section(tmp_path) == ""
    assert engine.plot(tmp_path, tmp_path) == []


def test_the_engine_loop_counts_as_scheduling_in_c10_and_not_as_network_in_c9() -> None:
    # the published split once the engine's own loop time is taken out of the network
    split = Split(compute=0.40, scheduling=0.0, serialization=0.30, network=0.25, engine_loop=0.05)
    assert c10_verdict(split) == "holds"
    assert c9_verdict(split).startswith("does not hold: serialization + network are above")
    assert Split.of(
        {"compute": 0.5, "scheduling": 0.2, "serialization": 0.1, "network": 0.2}
    ).engine_loop == pytest.approx(0.0)
