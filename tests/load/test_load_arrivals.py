"""The load generator's arrival processes: constant rate, and a linear ramp under each process
(time-rescaling through the integrated rate)."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pytest

from inferwire.load import openloop

RAMPS = [  # (from, to, seconds): up from zero, up from a rate, down
    (0.0, 1000.0, 8.0),
    (200.0, 1000.0, 5.0),
    (1000.0, 100.0, 6.0),
]


def integrated(from_rps: float, to_rps: float, ramp_s: float, t_s: np.ndarray) -> Any:
    """Lambda(t), written out independently of the code under test."""
    within = np.minimum(t_s, ramp_s)
    ramp = from_rps * within + (to_rps - from_rps) / ramp_s * within**2 / 2
    return ramp + to_rps * np.maximum(t_s - ramp_s, 0.0)


def window_counts(offsets_ns: np.ndarray, edges_s: np.ndarray) -> np.ndarray:
    counts: np.ndarray = np.histogram(offsets_ns / 1e9, bins=edges_s)[0]
    return counts


def test_constant_has_exact_gaps() -> None:
    offsets = openloop.arrival_offsets_ns(250.0, arrival="constant", duration_s=4.0)
    assert len(offsets) == 1000  # 0, 4 ms, ... 3.996 s
    assert np.all(np.diff(offsets) == 4_000_000)
    by_count = openloop.arrival_offsets_ns(250.0, arrival="constant", requests=7, seed=9)
    assert by_count.tolist() == [i * 4_000_000 for i in range(7)]
    # no drift over a long schedule: the millionth request is where it should be
    long = openloop.arrival_offsets_ns(3.0, arrival="constant", requests=1_000_000)
    assert long[-1] == round(999_999 / 3 * 1e9)


@pytest.mark.parametrize(("from_rps", "to_rps", "ramp_s"), RAMPS)
@pytest.mark.parametrize(
    ("arrival", "burstiness"), [("poisson", 1.0), ("gamma", 0.5), ("gamma", 4.0)]
)
def test_ramp_counts_follow_the_integrated_rate(
    arrival: Any, burstiness: float, from_rps: float, to_rps: float, ramp_s: float
) -> None:
    """Half-second windows over the ramp and the hold: each count within 5 standard deviations
    of the integrated rate. A renewal process of gap CV c has a count variance of about
    c^2 times its mean; c^2 = 1 / shape for gamma."""
    duration_s = ramp_s + 3.0
    offsets = openloop.arrival_offsets_ns(
        to_rps,
        arrival=arrival,
        burstiness=burstiness,
        seed=11,
        duration_s=duration_s,
        ramp_from_rps=from_rps,
        ramp_s=ramp_s,
    )
    assert offsets[0] == 0
    assert np.all(np.diff(offsets) >= 0)
    assert offsets[-1] < duration_s * 1e9
    edges_s = np.arange(0.0, duration_s + 1e-9, 0.5)
    expected = np.diff(integrated(from_rps, to_rps, ramp_s, edges_s))
    counts = window_counts(offsets, edges_s)
    tolerance = 5 * np.sqrt(expected / burstiness) + 2  # +2: the window edges
    assert np.all(np.abs(counts - expected) <= tolerance), (counts, expected)
    # and in total, tighter
    total = integrated(from_rps, to_rps, ramp_s, np.array([duration_s]))[0]
    assert len(offsets) == pytest.approx(total, rel=0.05)


@pytest.mark.parametrize(("from_rps", "to_rps", "ramp_s"), RAMPS)
def test_constant_ramp_counts_are_exact(from_rps: float, to_rps: float, ramp_s: float) -> None:
    """Constant arrivals at the current rate: the k-th request is where Lambda reaches k, so
    every window holds its integrated rate to within one request."""
    duration_s = ramp_s + 2.0
    offsets = openloop.arrival_offsets_ns(
        to_rps, arrival="constant", duration_s=duration_s, ramp_from_rps=from_rps, ramp_s=ramp_s
    )
    reached = integrated(from_rps, to_rps, ramp_s, offsets / 1e9)
    assert np.allclose(reached, np.arange(len(offsets)), atol=1e-3)
    edges_s = np.arange(0.0, duration_s + 1e-9, 0.25)
    expected = np.diff(integrated(from_rps, to_rps, ramp_s, edges_s))
    assert np.all(np.abs(window_counts(offsets, edges_s) - expected) <= 1)
    # after the ramp, the gaps are exactly the target rate's
    held = np.diff(offsets[offsets > (ramp_s + 0.01) * 1e9])
    assert np.all(np.abs(held - 1e9 / to_rps) <= 1)


def test_a_ramp_is_seeded_and_shares_the_steady_draw() -> None:
    kwargs: dict[str, Any] = {"duration_s": 6.0, "ramp_from_rps": 50.0, "ramp_s": 3.0}
    first = openloop.arrival_offsets_ns(500.0, seed=4, **kwargs)
    assert np.array_equal(first, openloop.arrival_offsets_ns(500.0, seed=4, **kwargs))
    assert not np.array_equal(first[:50], openloop.arrival_offsets_ns(500.0, seed=5, **kwargs)[:50])
    # the ramp only moves the times of the same draw: after the ramp, the gaps are the steady
    # schedule's own gaps
    steady = openloop.arrival_offsets_ns(500.0, seed=4, duration_s=6.0)
    steady_gaps = np.diff(steady)
    ramp_gaps = np.diff(first)
    tail = 200
    assert np.allclose(
        ramp_gaps[-tail:], steady_gaps[len(ramp_gaps) - tail : len(ramp_gaps)], atol=2
    )


def test_no_ramp_is_the_steady_schedule() -> None:
    """A flat ramp (from the same rate) gives the very schedule that no ramp gives."""
    plain = openloop.arrival_offsets_ns(
        300.0, arrival="gamma", burstiness=2.0, seed=3, requests=900
    )
    flat = openloop.arrival_offsets_ns(
        300.0,
        arrival="gamma",
        burstiness=2.0,
        seed=3,
        requests=900,
        ramp_from_rps=300.0,
        ramp_s=2.0,
    )
    assert np.allclose(plain, flat, atol=2)


@pytest.mark.parametrize(
    "kwargs",
    [
        {"rate_rps": 10.0, "requests": 5, "arrival": "constant", "burstiness": 2.0},
        {"rate_rps": 10.0, "requests": 5, "ramp_s": 3.0},  # a ramp from nowhere
        {"rate_rps": 10.0, "requests": 5, "ramp_from_rps": 1.0},  # a ramp of no length
        {"rate_rps": 10.0, "requests": 5, "ramp_from_rps": -1.0, "ramp_s": 1.0},
        {"rate_rps": 10.0, "requests": 5, "ramp_from_rps": math.inf, "ramp_s": 1.0},
        {"rate_rps": math.inf, "requests": 5, "ramp_from_rps": 1.0, "ramp_s": 1.0},
    ],
)
def test_bad_ramps_are_refused(kwargs: dict[str, Any]) -> None:
    with pytest.raises(ValueError):  # noqa: PT011
        openloop.arrival_offsets_ns(**kwargs)
