"""The report's reproducibility section: every target and claim verdict, repeat by repeat.

A run of ``inferwire bench --repeat N`` keeps each repeat's files under ``raw/repeats/<n>/``
(:data:`~inferwire.bench.report.results.REPEATS_DIR`); the targets and claims are judged on each
repeat alone, by the same rules as on the published medians, so a reader sees whether a verdict
depends on which run it came from. A target's *deviation* is how far its figure (the first
number the figure cell prints: the ratio, share or rate the verdict reads) lands from the
median over repeats.
"""

from __future__ import annotations

import re
import statistics
from collections.abc import Callable
from pathlib import Path
from typing import Final

from .results import REPEATS_DIR
from .tables import table

RATIO_TOLERANCE: Final = 0.10
"""How far from its median a repeated target's figure may land for the run to call it
reproduced."""
_NUMBER: Final = re.compile(r"-?\d[\d,]*(?:\.\d+)?")

Rows = Callable[[Path], list[list[str]]]
"""Rows of a table judged from one run's raw directory: [name, ..., figure?, ..., verdict]."""


def repeat_dirs(raw_dir: Path) -> list[Path]:
    """``raw/repeats/1``, ``2``, ... in order (none for a run of one repeat)."""
    base = raw_dir / REPEATS_DIR
    if not base.is_dir():
        return []
    found = [p for p in base.iterdir() if p.is_dir() and p.name.isdigit()]
    return sorted(found, key=lambda p: int(p.name))


def first_number(cell: str) -> float | None:
    match = _NUMBER.search(cell)
    return float(match.group().replace(",", "")) if match else None


def plain_verdict(cell: str) -> str:
    """A verdict cell without its markdown emphasis (``**missed**`` -> ``missed``)."""
    return cell.replace("*", "").strip()


def section(
    raw_dir: Path,
    published_targets: list[list[str]],
    targets: Rows,
    published_claims: list[list[str]],
    claims: Rows,
    published_advice: list[list[str]] | None = None,
    advice: Rows | None = None,
) -> str:
    """The section, or "" when the run has fewer than two repeats.

    ``targets(dir)`` gives target rows ([target, measured as, figure, target, verdict]) and
    ``claims(dir)`` claim rows ([claim, ..., verdict]) judged from one repeat's files."""
    dirs = repeat_dirs(raw_dir)
    if len(dirs) < 2:
        return ""
    per_repeat_targets = [{row[0]: row for row in targets(d)} for d in dirs]
    rows = []
    differing_verdicts = 0
    worst: tuple[float, str] | None = None
    for published in published_targets:
        name = published[0]
        seen = [repeat.get(name) for repeat in per_repeat_targets]
        figures = [first_number(row[2]) for row in seen if row]
        numbers = [f for f in figures if f is not None]
        deviation = None
        if len(numbers) >= 2 and statistics.median(numbers):
            median = statistics.median(numbers)
            deviation = max(abs(n - median) for n in numbers) / abs(median)
            if worst is None or deviation > worst[0]:
                worst = (deviation, name)
        verdicts = {plain_verdict(row[4]) for row in seen if row}
        if len(verdicts) > 1 or any(row is None for row in seen):
            differing_verdicts += 1
        rows.append(
            [
                name,
                *(f"{plain_verdict(row[4])}, {row[2]}" if row else "not measured" for row in seen),
                plain_verdict(published[4]),
                f"{deviation:.1%}" if deviation is not None else "",
            ]
        )
    header = [
        "target",
        *(f"repeat {d.name}" for d in dirs),
        "published (medians)",
        "largest deviation from the median",
    ]
    claim_rows = _claim_rows(dirs, published_claims, claims)
    differing_claims = sum(1 for row in claim_rows if row[2] != f"{len(dirs)} of {len(dirs)}")
    advice_rows = _claim_rows(dirs, published_advice or [], advice) if advice else []
    differing_advice = sum(1 for row in advice_rows if row[2] != f"{len(dirs)} of {len(dirs)}")
    within = worst is None or worst[0] <= RATIO_TOLERANCE
    summary = [
        f"Targets: {len(published_targets) - differing_verdicts} of {len(published_targets)} "
        f"have the same verdict in all {len(dirs)} repeats; "
        + (
            f"every figure is within {RATIO_TOLERANCE:.0%} of its median over the repeats "
            f"(largest deviation {worst[0]:.1%}: {worst[1]})."
            if within and worst
            else f"the largest deviation from a median is {worst[0]:.1%} ({worst[1]}), past "
            f"the {RATIO_TOLERANCE:.0%} this report holds a reproduced figure to."
            if worst
            else "no figure to compare."
        ),
        f"Claims: {len(claim_rows) - differing_claims} of {len(claim_rows)} have the same "
        f"verdict in every repeat.",
    ]
    if advice_rows:
        summary.append(
            f"What to use: {len(advice_rows) - differing_advice} of {len(advice_rows)} answers "
            "are the same in every repeat."
        )
    return "\n".join(
        [
            "## Reproducibility",
            "",
            f"Every suite ran {len(dirs)} times, each in a fresh process (memory layout and hash "
            "randomization differ per process), the repeats interleaved over the session. The "
            "figures above are the medians over the repeats, with the range they spanned in "
            "parentheses. Here each target and claim is judged on each repeat alone, by the "
            "same rules. *deviation*: the largest distance of a repeat's figure from the "
            "median of the repeats.",
            "",
            " ".join(summary),
            "",
            table(header, rows),
            "",
            table(
                ["claim", "published verdict", "repeats with that verdict", "differing"], claim_rows
            ),
            "",
            *(
                [
                    table(
                        ["payload, situation", "published answer", "repeats with it", "differing"],
                        advice_rows,
                    ),
                    "",
                ]
                if advice_rows
                else []
            ),
        ]
    )


def _claim_rows(dirs: list[Path], published: list[list[str]], claims: Rows) -> list[list[str]]:
    per_repeat = [{row[0]: plain_verdict(row[-1]) for row in claims(d)} for d in dirs]
    rows = []
    for row in published:
        name, verdict = row[0], plain_verdict(row[-1])
        seen = [repeat.get(name, "not measured") for repeat in per_repeat]
        same = sum(1 for v in seen if v == verdict)
        differing = "; ".join(
            f"repeat {d.name}: {v}" for d, v in zip(dirs, seen, strict=True) if v != verdict
        )
        rows.append([name, verdict, f"{same} of {len(dirs)}", differing])
    return rows


def rounding(cell: str) -> float:
    """Half a unit of the last digit of the first number ``cell`` prints: how far the figure
    it stands for may lie from it (0.005 for ``0.09x``, 0.5 for ``5,051 req/s``)."""
    match = _NUMBER.search(cell)
    if match is None:
        return 0.0
    _, _, decimals = match.group().partition(".")
    return 0.5 * 10.0 ** -len(decimals)
