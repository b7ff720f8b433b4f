"""Two runs of the benchmark matrix side by side: does a second run reproduce the published one?

``python -m inferwire.bench.report.rerun PUBLISHED OTHER [--out FILE]``: each argument a results
directory with ``raw/`` (or a ``raw/`` directory). Both are judged by the functions that write
the report (the targets table, the claims, "What should I use?"), from their raw files; for each
target it prints both verdicts, both figures and other / published, marking a figure more than
:data:`~.reproducibility.RATIO_TOLERANCE` away, then the counts and the worst figure. It reports
and does not judge: the exit status is 0 whatever it finds, 2 when an input is missing.

A figure is the first number its cell prints (``1.21x (1.20x-1.22x)`` -> 1.21, the median over
a run's repeats), as in the report's reproducibility section. A cell's rounding is no change:
``0.08x`` against ``0.09x`` may be 0.0849 against 0.0851, so a figure is marked only when every
pair of values the two cells can stand for is more than the tolerance apart, and the worst
figure is the one furthest apart in that sense.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from . import advice, readme
from .reproducibility import RATIO_TOLERANCE, first_number, plain_verdict, rounding
from .results import CODECS_RAW
from .tables import table

RAW: Final = "raw"
NOT_MEASURED: Final = "not measured"
Rows = Callable[[Path], list[list[str]]]


@dataclass(frozen=True, slots=True, kw_only=True)
class Target:
    """One target row in both runs (``None``: not in that run)."""

    name: str
    published: list[str] | None
    other: list[str] | None

    @staticmethod
    def cell(row: list[str] | None) -> str:
        """The verdict and the figure's first number: ``met 1.21x``."""
        if row is None:
            return NOT_MEASURED
        return f"{plain_verdict(row[4])} {row[2].split(' ', 1)[0].rstrip(',')}"

    @property
    def same_verdict(self) -> bool:
        if self.published is None or self.other is None:
            return False
        return plain_verdict(self.published[4]) == plain_verdict(self.other[4])

    @property
    def ratio(self) -> float | None:
        """other / published, as printed."""
        figures = self._figures()
        return figures[1] / figures[0] if figures else None

    @property
    def deviation(self) -> float | None:
        """How far other / published lies from 1 at the least, over the values the two cells
        can stand for (each within half a unit of its last printed digit)."""
        figures = self._figures()
        if figures is None:
            return None
        published, other = figures
        half_p = rounding(self._figure(self.published))
        half_o = rounding(self._figure(self.other))
        # published > 0 prints at least one unit of its last digit: published - half_p > 0
        low = (other - half_o) / (published + half_p)
        high = (other + half_o) / (published - half_p)
        return max(low - 1, 1 - high, 0.0)

    @property
    def past_tolerance(self) -> bool:
        return (self.deviation or 0.0) > RATIO_TOLERANCE

    @staticmethod
    def _figure(row: list[str] | None) -> str:
        return row[2] if row else ""

    def _figures(self) -> tuple[float, float] | None:
        published = first_number(self._figure(self.published))
        other = first_number(self._figure(self.other))
        if published is None or other is None or published <= 0:
            return None
        return published, other


@dataclass(frozen=True, slots=True, kw_only=True)
class Verdict:
    """One claim's verdict, or one situation's answer, in both runs."""

    name: str
    published: str
    other: str

    @property
    def same(self) -> bool:
        return self.published == self.other


def targets(published: list[list[str]], other: list[list[str]]) -> list[Target]:
    """The rows of both runs by name: the published run's in its order, then the other's own."""
    theirs = {row[0]: row for row in other}
    ours = {row[0]: row for row in published}
    names = list(ours) + [name for name in theirs if name not in ours]
    return [Target(name=n, published=ours.get(n), other=theirs.get(n)) for n in names]


def verdicts(published: list[list[str]], other: list[list[str]]) -> list[Verdict]:
    """Rows ([name, ..., verdict]) of both runs by name, as :func:`targets`."""
    ours = {row[0]: plain_verdict(row[-1]) for row in published}
    theirs = {row[0]: plain_verdict(row[-1]) for row in other}
    names = list(ours) + [name for name in theirs if name not in ours]
    return [
        Verdict(name=n, published=ours.get(n, NOT_MEASURED), other=theirs.get(n, NOT_MEASURED))
        for n in names
    ]


def _x(value: float | None) -> str:
    return f"{value:.2f}x" if value is not None else "-"


def _mark(target: Target) -> str:
    """``?``: the verdict differs; ``!``: the figure is past the tolerance."""
    return ("?" if not target.same_verdict else " ") + ("!" if target.past_tolerance else " ")


def summary(
    found_targets: list[Target], claims: list[Verdict], answers: list[Verdict]
) -> list[str]:
    """The counts, and the worst figure: the furthest from the published one beyond the cells'
    rounding (on a tie, as printed)."""
    compared = [t for t in found_targets if t.deviation is not None]
    within = sum(1 for t in compared if not t.past_tolerance)
    same = sum(1 for t in found_targets if t.same_verdict)
    line = (
        f"targets: {same}/{len(found_targets)} same verdict, {within}/{len(compared)} ratios "
        f"within {RATIO_TOLERANCE:.0%}"
    )
    if compared:
        worst = max(compared, key=lambda t: (t.deviation or 0.0, abs((t.ratio or 1.0) - 1)))
        line += (
            f"; worst: {worst.name} {_x(worst.ratio)} "
            f"({worst.cell(worst.published)} -> {worst.cell(worst.other)})"
        )
    return [
        line,
        f"claims: {sum(v.same for v in claims)}/{len(claims)} same verdict",
        f"advice: {sum(v.same for v in answers)}/{len(answers)} same choice",
    ]


def text(found_targets: list[Target], claims: list[Verdict], answers: list[Verdict]) -> str:
    """What the command prints: every target, the claims and answers that differ, the counts."""
    published = [t.cell(t.published) for t in found_targets]
    other = [t.cell(t.other) for t in found_targets]
    width_p = max(map(len, published), default=0)
    width_o = max(map(len, other), default=0)
    lines = [
        "targets: other / published; ? verdict differs, ! figure past "
        f"{RATIO_TOLERANCE:.0%} (beyond the cells' rounding)",
        *(
            f"{_mark(t)} {_x(t.ratio):>7}  {p:<{width_p}}  {o:<{width_o}}  {t.name}"
            for t, p, o in zip(found_targets, published, other, strict=True)
        ),
    ]
    for title, rows in (("claims", claims), ("advice", answers)):
        lines += [
            f"{title} differs: {v.name}: {v.published} -> {v.other}" for v in rows if not v.same
        ]
    return "\n".join([*lines, "", *summary(found_targets, claims, answers)])


def markdown(found_targets: list[Target], claims: list[Verdict], answers: list[Verdict]) -> str:
    """The same as tables, for ``--out``."""
    target_rows = [
        [
            t.name,
            t.cell(t.published),
            t.cell(t.other),
            _x(t.ratio),
            ("verdict differs; " if not t.same_verdict else "")
            + (f"past {RATIO_TOLERANCE:.0%}" if t.past_tolerance else ""),
        ]
        for t in found_targets
    ]

    def verdict_table(rows: list[Verdict], what: str) -> str:
        return table(
            [what, "published", "other", "same"],
            [[v.name, v.published, v.other, "yes" if v.same else "**no**"] for v in rows],
            left=range(3),
        )

    return "\n".join(
        [
            "# A second run beside the published one",
            "",
            *(f"- {line}" for line in summary(found_targets, claims, answers)),
            "",
            table(
                ["target", "published", "other", "other / published", "differs"],
                target_rows,
                left=(0,),
            ),
            "",
            verdict_table(claims, "claim"),
            "",
            verdict_table(answers, "payload, situation"),
            "",
        ]
    )


def raw_dir(path: Path) -> Path | None:
    """The ``raw/`` of a results directory (or ``path`` itself, a raw directory), if it holds
    the codec results every table needs."""
    for candidate in (path / RAW, path):
        if (candidate / CODECS_RAW).is_file():
            return candidate
    return None


def compare(
    published: Path,
    other: Path,
    target_rows: Rows = readme.target_rows,
    claim_rows: Rows = readme.claim_rows,
    advice_rows: Rows = advice.verdict_rows,
) -> tuple[list[Target], list[Verdict], list[Verdict]]:
    """Both raw directories judged by the report's own functions."""
    return (
        targets(target_rows(published), target_rows(other)),
        verdicts(claim_rows(published), claim_rows(other)),
        verdicts(advice_rows(published), advice_rows(other)),
    )


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m inferwire.bench.report.rerun",
        description="Compare a second run's targets, claims and advice with the published run.",
    )
    parser.add_argument("published", type=Path, help="the published results directory")
    parser.add_argument("other", type=Path, help="the second run's results directory")
    parser.add_argument("--out", type=Path, help="also write the comparison here as markdown")
    args = parser.parse_args(argv)
    dirs = [raw_dir(path) for path in (args.published, args.other)]
    missing = [str(p) for p, d in zip((args.published, args.other), dirs, strict=True) if not d]
    if missing:
        print(f"no raw/{CODECS_RAW} in: {', '.join(missing)}", file=sys.stderr)
        return 2
    published, other = (d for d in dirs if d is not None)
    found = compare(published, other)
    print(text(*found))
    if args.out:
        args.out.write_text(markdown(*found))
        print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
