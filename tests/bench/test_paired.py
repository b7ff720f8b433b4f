"""The paired ratio of two callables: alternating order, and per-call times when a side is
made of several calls."""

from __future__ import annotations

import time
from collections.abc import Callable

from inferwire.bench.measure.paired import paired_ratio


def _sleeper(seconds: float, calls: list[str], name: str) -> Callable[[], None]:
    def work() -> None:
        calls.append(name)
        time.sleep(seconds)

    return work


def test_the_ratio_is_of_times_per_call_whatever_the_loops() -> None:
    calls: list[str] = []
    slow = _sleeper(0.004, calls, "slow")
    fast = _sleeper(0.001, calls, "fast")
    ratio = paired_ratio(slow, fast, 5, min_sample_s=0.004)
    # sleep overshoots by a similar absolute amount on both sides: the ratio stays well
    # above 1 and below the 4 it would be without overshoot
    assert 1.5 < ratio < 4.5
    # the fast side ran several calls per sample, the slow one about one
    assert calls.count("fast") > 2 * calls.count("slow")


def test_pairs_alternate_which_side_runs_first() -> None:
    calls: list[str] = []
    a = _sleeper(0.0, calls, "a")
    b = _sleeper(0.0, calls, "b")
    paired_ratio(a, b, 4)
    firsts = calls[0::2]
    assert firsts == ["b", "a", "b", "a"]
