"""Measurement helpers shared by the benchmark suites."""

from __future__ import annotations

import gc
import statistics
import time
from collections.abc import Callable
from typing import Any


def _loops(work: Callable[[], Any], min_sample_s: float) -> int:
    """How many calls of ``work`` one sample needs to last ``min_sample_s`` (at least 1),
    from its quickest of three warm calls."""
    if min_sample_s <= 0:
        return 1
    quickest = float("inf")
    for _ in range(3):
        start = time.perf_counter()
        work()
        quickest = min(quickest, time.perf_counter() - start)
    return max(1, min(1000, round(min_sample_s / max(quickest, 1e-9))))


def paired_ratio(
    subject: Callable[[], Any],
    baseline: Callable[[], Any],
    pairs: int,
    *,
    min_sample_s: float = 0.0,
) -> float:
    """Median over ``pairs`` back-to-back runs of ``subject`` time / ``baseline`` time.

    Benchmarks timed one after the other drift with this machine's load and clock; a pair run
    within milliseconds of each other, in alternating order, cancels most of that. With
    ``min_sample_s``, each side of a pair is as many calls as make it last that long (timed
    per call): a side of a few hundred microseconds beside one of tens of milliseconds would
    otherwise carry a single scheduler wake-up's noise into every ratio.
    """
    subject_loops = _loops(subject, min_sample_s)
    baseline_loops = _loops(baseline, min_sample_s)

    def timed(work: Callable[[], Any], loops: int) -> float:
        start = time.perf_counter()
        for _ in range(loops):
            work()
        return (time.perf_counter() - start) / loops

    ratios = []
    gc.collect()
    enabled = gc.isenabled()
    gc.disable()  # as pytest-benchmark does while timing: no collection billed to one side
    try:
        for i in range(pairs):
            if i % 2:
                a = timed(subject, subject_loops)
                b = timed(baseline, baseline_loops)
            else:
                b = timed(baseline, baseline_loops)
                a = timed(subject, subject_loops)
            ratios.append(a / b)
    finally:
        if enabled:
            gc.enable()
    return statistics.median(ratios)
