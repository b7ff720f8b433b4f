"""Merging the repeats of a suite (``inferwire bench --repeat N``,
:mod:`inferwire.bench.runner.merge`): medians of the float figures with every repeat's value
kept, everything else from one representative repeat, the calibration of every repeat."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from inferwire.bench.report import spread
from inferwire.bench.runner import merge
from tests.bench.bench_run_helpers import result_file, verdict


def _benchmark(
    name: str, median: float, extra_info: dict[str, Any], rounds: int = 10
) -> dict[str, Any]:
    return {
        "group": None,
        "name": name,
        "fullname": f"bench/bench_x.py::{name}",
        "params": None,
        "extra_info": extra_info,
        "stats": {"min": median / 2, "max": median * 2, "median": median, "rounds": rounds},
    }


def _info(vs_tcp: float, serialize_us: float, orjson_s: float, **more: Any) -> dict[str, Any]:
    return {
        "vs_tcp": vs_tcp,
        "stages_us": {"serialize": serialize_us, "parse": 1.5},
        "codecs": {"orjson": {"median_s": orjson_s, "frames": 16}},
        **more,
    }


def test_float_leaves_are_medians_over_the_repeats_and_each_repeat_is_kept() -> None:
    repeats = [
        result_file([_benchmark("a", 3e-6, _info(1.0, 3.0, 0.2))]),
        result_file([_benchmark("a", 1e-6, _info(1.3, 5.0, 0.1))]),
        result_file([_benchmark("a", 2e-6, _info(1.1, 4.0, 0.3))]),
    ]
    (merged,) = merge.merge(repeats)["benchmarks"]
    info = merged["extra_info"]

    assert info["vs_tcp"] == 1.1
    assert info["stages_us"] == {"serialize": 4.0, "parse": 1.5}
    assert info["codecs"]["orjson"]["median_s"] == 0.2
    assert merged["stats"]["median"] == 2e-6
    assert info["repeats"] == {
        "stats.median": [3e-6, 1e-6, 2e-6],
        "vs_tcp": [1.0, 1.3, 1.1],
        "stages_us.serialize": [3.0, 5.0, 4.0],
        "stages_us.parse": [1.5, 1.5, 1.5],
        "codecs.orjson.median_s": [0.2, 0.1, 0.3],
    }
    # the report's cells read exactly these
    fmt = "{:.2f}x".format
    assert spread.cell(info, "vs_tcp", info["vs_tcp"], fmt) == "1.10x (1.00x-1.30x)"
    assert spread.values(info, "stages_us.serialize") == [3.0, 5.0, 4.0]


def test_everything_else_comes_from_the_repeat_whose_median_is_the_median() -> None:
    """Counts that must add up (scheduled = completed + failed) come from one repeat, never
    a mix; so do strings, bools, lists and pytest-benchmark's other statistics."""

    def counts(median: float, completed: int, failed: int, rounds: int, tag: str) -> dict[str, Any]:
        info = {
            "requests_scheduled": 100,
            "requests_completed": completed,
            "requests_failed": failed,
            "errors": {"timeout": failed},
            "correct": failed == 0,
            "transport": tag,
            "rates_rps": [10.0, 20.0 + failed],
            "achieved_rps": 20.0 - failed,
        }
        return _benchmark("load", median, info, rounds=rounds)

    repeats = [
        result_file([counts(0.9, 100, 0, 5, "first")]),
        result_file([counts(1.1, 97, 3, 7, "second")]),
        result_file([counts(1.0, 98, 2, 6, "third")]),  # its median, 1.0, is the median
    ]
    (merged,) = merge.merge(repeats)["benchmarks"]
    info = merged["extra_info"]

    assert info["requests_completed"] + info["requests_failed"] == info["requests_scheduled"]
    assert (info["requests_completed"], info["requests_failed"]) == (98, 2)
    assert info["errors"] == {"timeout": 2}
    assert info["correct"] is False
    assert info["transport"] == "third"
    assert info["rates_rps"] == [10.0, 22.0]  # a list is not merged
    assert info["achieved_rps"] == 18.0  # a float is: the median of 20, 17, 18
    assert merged["stats"] == {"min": 0.5, "max": 2.0, "median": 1.0, "rounds": 6}
    assert set(info["repeats"]) == {"stats.median", "achieved_rps"}


def test_two_repeats_take_the_lower_as_representative_and_the_mean_as_median() -> None:
    repeats = [
        result_file([_benchmark("a", 4.0, {"rounds_done": 4, "ratio": 2.0})]),
        result_file([_benchmark("a", 2.0, {"rounds_done": 2, "ratio": 1.0})]),
    ]
    (merged,) = merge.merge(repeats)["benchmarks"]
    assert merged["stats"]["median"] == 3.0
    assert merged["stats"]["min"] == 1.0  # the lower repeat's, whole
    assert merged["extra_info"]["rounds_done"] == 2
    assert merged["extra_info"]["ratio"] == 1.5


def test_a_benchmark_missing_from_a_repeat_merges_over_the_others() -> None:
    repeats = [
        result_file([_benchmark("a", 1.0, {"x": 1.0}), _benchmark("b", 5.0, {"x": 10.0})]),
        result_file([_benchmark("a", 2.0, {"x": 2.0})]),
        result_file([_benchmark("a", 3.0, {"x": 3.0}), _benchmark("b", 7.0, {"x": 30.0})]),
    ]
    merged = {b["name"]: b for b in merge.merge(repeats)["benchmarks"]}
    assert set(merged) == {"a", "b"}
    assert merged["a"]["extra_info"]["repeats"]["x"] == [1.0, 2.0, 3.0]
    assert merged["b"]["extra_info"]["repeats"] == {"stats.median": [5.0, 7.0], "x": [10.0, 30.0]}
    assert merged["b"]["stats"]["median"] == 6.0
    assert merged["b"]["extra_info"]["x"] == 20.0


def test_one_repeat_is_the_file_unchanged() -> None:
    one = result_file([_benchmark("a", 1.0, _info(1.0, 3.0, 0.2))], verdict(True))
    kept = copy.deepcopy(one)
    assert merge.merge([one]) == kept
    assert "repeats" not in merge.merge([one])["benchmarks"][0]["extra_info"]
    assert merge.stable(merge.merge([one])) is True


def test_the_repeats_are_not_changed_by_merging() -> None:
    repeats = [result_file([_benchmark("a", m, _info(m, m, m))], verdict(True)) for m in (1.0, 2.0)]
    kept = copy.deepcopy(repeats)
    merge.merge(repeats)
    assert repeats == kept
    with pytest.raises(ValueError, match="no repeats"):
        merge.merge([])


def test_calibration_lists_every_repeat_and_is_stable_only_if_all_are() -> None:
    def merged(*calibrations: dict[str, Any] | None) -> dict[str, Any]:
        return merge.merge([result_file([_benchmark("a", 1.0, {})], c) for c in calibrations])

    stable = verdict(True)
    unstable = verdict(False, "the cpu calibration moved 14% during the run (bound 10%)")

    both = merged(stable, stable)
    assert both["calibration"] == {"repeats": [stable, stable], "stable": True}
    assert both["repeats"] == 2
    assert merge.stable(both) is True
    assert merge.unstable_reasons(both) == []

    one_unstable = merged(stable, unstable, stable)
    assert one_unstable["calibration"]["repeats"] == [stable, unstable, stable]
    assert merge.stable(one_unstable) is False
    assert merge.unstable_reasons(one_unstable) == [
        "repeat 2: the cpu calibration moved 14% during the run (bound 10%)"
    ]

    # a repeat that recorded none cannot vouch for the run
    uncalibrated = merged(stable, None)
    assert uncalibrated["calibration"]["repeats"] == [stable, None]
    assert merge.stable(uncalibrated) is False


def test_stability_of_one_run_and_of_an_older_file() -> None:
    assert merge.stable(result_file([])) is None  # made before calibration
    assert merge.stable(result_file([], verdict(True))) is True
    unstable = result_file([], verdict(False, "CPU steal was 9%"))
    assert merge.stable(unstable) is False
    assert merge.unstable_reasons(unstable) == ["CPU steal was 9%"]  # one run: not tagged
