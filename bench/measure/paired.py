"""Measurement helpers shared by the benchmark suites."""

from __future__ import annotations

import statistics
import time
from typing import Any


def paired_ratio(subject: Any, baseline: Any, pairs: int) -> float:
    """Median over ``pairs`` back-to-back runs of ``subject`` time / ``baseline`` time.

    Benchmarks timed one after the other drift with this machine's load and clock; a pair run
    within milliseconds of each other, in alternating order, cancels most of that.
    """
    ratios = []
    for i in range(pairs):
        first, second = (subject, baseline) if i % 2 else (baseline, subject)
        start = time.perf_counter()
        first()
        middle = time.perf_counter()
        second()
        end = time.perf_counter()
        a, b = middle - start, end - middle
        ratios.append(b / a if i % 2 == 0 else a / b)
    return statistics.median(ratios)
