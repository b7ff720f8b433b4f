"""Capacity search for ``inferwire load --capacity``: the highest rate at which a point meets
the SLOs.

A point **passes** when the generator kept up (its send lag P99 is under a bound: else its
latencies hold the generator's lateness, and the point says nothing about the server), no
request failed, and the share of the measured requests that met every SLO (goodput / offered)
is at least the goal. The search starts at the given rate, multiplies it by ``growth`` while
points pass (divides while they fail) until one passes and one fails, then bisects the bracket
geometrically until the lowest failing rate is within the precision above the highest passing
one, in at most ``max_points`` points. Every point tried is in the report, with why it failed.

It assumes what a capacity is: that a rate that passes has every lower rate passing too. A
noisy point can break that; the points are all there to see it.
"""

from __future__ import annotations

import argparse
import math
from collections.abc import Awaitable, Callable
from dataclasses import asdict, dataclass
from typing import Any, Final, Literal

from inferwire._runtime.arguments import CommandError

DEFAULT_GOODPUT_FRACTION: Final = 0.99
DEFAULT_PRECISION: Final = 0.1
DEFAULT_GROWTH: Final = 2.0
DEFAULT_MAX_POINTS: Final = 12
DEFAULT_MAX_SEND_LAG_MS: Final = 5.0
"""The send lag P99 over which the generator, not the server, is the limit: small beside the
latencies an SLO sets, and far above what the generator shows when it keeps up (well under a
millisecond with select(), about one with epoll's millisecond timeouts)."""

Limit = Literal["server", "generator"]
Measure = Callable[[float], Awaitable[dict[str, Any]]]
"""Runs one point at a rate and returns its metrics (``openloop.run_point``'s dict)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class CapacitySpec:
    start_rps: float
    goodput_fraction: float = DEFAULT_GOODPUT_FRACTION
    """The share of the measured requests that must meet every SLO."""
    precision: float = DEFAULT_PRECISION
    """Stop when the lowest failing rate is within this fraction above the highest passing."""
    growth: float = DEFAULT_GROWTH
    max_points: int = DEFAULT_MAX_POINTS
    max_send_lag_p99_ms: float = DEFAULT_MAX_SEND_LAG_MS

    def __post_init__(self) -> None:
        if not (math.isfinite(self.start_rps) and self.start_rps > 0):
            raise ValueError("the capacity search starts at a finite, positive rate")
        if not 0 < self.goodput_fraction <= 1:
            raise ValueError("the goodput fraction is in (0, 1]")
        if not self.precision > 0:
            raise ValueError("the precision must be positive")
        if not self.growth > 1:
            raise ValueError("the growth factor must be above 1")
        if self.max_points < 2:
            raise ValueError("a capacity search needs at least two points")
        if not self.max_send_lag_p99_ms > 0:
            raise ValueError("the send lag bound must be positive")


def spec_from_args(args: argparse.Namespace) -> CapacitySpec:
    """The search ``inferwire load --capacity`` asks for; raises ``CommandError``."""
    try:
        return CapacitySpec(
            start_rps=args.rate[0],
            goodput_fraction=args.capacity_goodput,
            precision=args.capacity_precision,
            max_points=args.capacity_max_points,
            max_send_lag_p99_ms=args.capacity_max_lag_ms,
        )
    except ValueError as exc:
        raise CommandError(f"--capacity: {exc}") from None


def fraction(text: str) -> float:
    """An argparse type: a number above 0 and at most 1."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if not 0 < value <= 1:
        raise argparse.ArgumentTypeError("a fraction is above 0 and at most 1")
    return value


@dataclass(frozen=True, slots=True, kw_only=True)
class Verdict:
    rate_rps: float
    passed: bool
    reason: str | None
    """Why it failed (None: it passed)."""
    limited_by: Limit | None
    goodput_fraction: float | None
    send_lag_p99_ms: float | None
    requests_failed: int
    requests_waited_for_bound: int


def judge(point: dict[str, Any], spec: CapacitySpec) -> Verdict:
    """Whether one point meets the search's criteria, and if not, the first reason."""
    lag_ms: float | None = point["send_lag"]["p99_ms"]
    failed = int(point["requests_failed"])
    measured = int(point.get("requests_measured", point["requests_scheduled"]))
    good = point.get("requests_good")
    fraction = good / measured if good is not None and measured else None
    waited = int(point.get("requests_waited_for_bound", 0))
    reason: str | None = None
    limit: Limit | None = None
    if lag_ms is not None and lag_ms > spec.max_send_lag_p99_ms:
        reason = (
            f"send lag P99 {lag_ms:.2f} ms > {spec.max_send_lag_p99_ms:g} ms:"
            " the generator fell behind, not the server"
        )
        limit = "generator"
    elif failed:
        errors = ", ".join(f"{n} {name}" for name, n in point["errors"].items())
        reason = f"{failed} of {measured} requests failed ({errors})"
        limit = "server"
    elif fraction is None:
        reason = "no SLO to judge the point by"
    elif fraction < spec.goodput_fraction:
        reason = f"goodput {fraction:.3f} of the offered requests < {spec.goodput_fraction:g}"
        limit = "server"
    if reason is not None and waited:
        reason += f"; {waited} requests waited for the bound on requests in flight"
    return Verdict(
        rate_rps=float(point["rate_rps"]),
        passed=reason is None,
        reason=reason,
        limited_by=limit,
        goodput_fraction=fraction,
        send_lag_p99_ms=lag_ms,
        requests_failed=failed,
        requests_waited_for_bound=waited,
    )


async def search(
    measure: Measure,
    spec: CapacitySpec,
    *,
    on_verdict: Callable[[Verdict], object] | None = None,
) -> dict[str, Any]:
    """Run points (through ``measure``) to find the capacity; returns the report's
    ``capacity`` section."""
    verdicts: list[Verdict] = []
    passing: float | None = None  # the highest rate that passed
    failing: Verdict | None = None  # the lowest rate that failed

    async def attempt(rate_rps: float) -> bool:
        nonlocal passing, failing
        verdict = judge(await measure(rate_rps), spec)
        verdicts.append(verdict)
        if on_verdict is not None:
            on_verdict(verdict)
        if verdict.passed:
            passing = rate_rps if passing is None else max(passing, rate_rps)
        elif failing is None or rate_rps < failing.rate_rps:
            failing = verdict
        return verdict.passed

    rate = spec.start_rps
    while len(verdicts) < spec.max_points and (passing is None or failing is None):
        rate = rate * spec.growth if await attempt(rate) else rate / spec.growth
    while (
        passing is not None
        and failing is not None
        and failing.rate_rps / passing - 1 > spec.precision
        and len(verdicts) < spec.max_points
    ):
        await attempt(math.sqrt(passing * failing.rate_rps))
    return _section(spec, verdicts, passing, failing)


def _section(
    spec: CapacitySpec, verdicts: list[Verdict], passing: float | None, failing: Verdict | None
) -> dict[str, Any]:
    if passing is None:
        note = "no rate tried met the criteria"
    elif failing is None:
        note = f"every rate tried met the criteria: the capacity is above {passing:g} req/s"
    elif failing.limited_by == "generator":
        note = (
            f"the generator, not the server, was the limit: the server's capacity is at least"
            f" {passing:g} req/s (more generator CPU or a lighter client would tell more)"
        )
    else:
        note = f"between {passing:g} and {failing.rate_rps:g} req/s"
    precise = (
        passing is not None
        and failing is not None
        and failing.rate_rps / passing - 1 <= spec.precision
    )
    return {
        "rate_rps": passing,
        "bracket_rps": [passing, None if failing is None else failing.rate_rps],
        "limited_by": None if failing is None else failing.limited_by,
        "precision_reached": precise,
        "note": note,
        "criteria": asdict(spec),
        "points": [asdict(v) for v in verdicts],
    }


def verdict_line(verdict: Verdict) -> str:
    return f"  capacity search: {verdict.rate_rps:g} req/s " + (
        "passed" if verdict.passed else f"failed: {verdict.reason}"
    )


def result_line(section: dict[str, Any]) -> str:
    found = section["rate_rps"]
    head = "capacity: none found" if found is None else f"capacity: {found:g} req/s"
    return f"{head} ({section['note']}; {len(section['points'])} points)"
