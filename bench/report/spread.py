"""A figure's spread over the repeats of a run (``inferwire bench --repeat N``).

A repeated run publishes, in ``raw/<suite>.json``, each benchmark's figures as the median over
the repeats (each repeat a fresh process), and keeps every repeat's value of each number in
``extra_info["repeats"]``, keyed by the number's dotted path in ``extra_info`` (``"vs_tcp"``,
``"stages_us.serialize"``), plus ``"stats.median"`` for pytest-benchmark's own median. A run
of one repeat has no ``repeats`` key, and its cells carry no spread.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any, Final

REPEATS_KEY: Final = "repeats"


def values(info: Mapping[str, Any], path: str) -> list[float]:
    """Every repeat's value of the number at ``path`` (empty for a run of one repeat)."""
    recorded = info.get(REPEATS_KEY, {}).get(path)
    return [float(v) for v in recorded] if recorded else []


def relative_range(samples: Sequence[float], median: float) -> float:
    """(max - min) / median of a figure's repeats: 0.0 when there is nothing to compare."""
    if len(samples) < 2 or not median:
        return 0.0
    return (max(samples) - min(samples)) / abs(median)


def cell(
    info: Mapping[str, Any],
    path: str,
    value: float,
    fmt: Callable[[float], str],
) -> str:
    """``value`` formatted, followed by the range its repeats spanned: ``1.47x (1.44-1.52)``.

    The value is the median over repeats (the merged file's); one repeat prints it alone."""
    samples = values(info, path)
    text = fmt(value)
    if len(samples) < 2:
        return text
    return f"{text} ({fmt(min(samples))}-{fmt(max(samples))})"
