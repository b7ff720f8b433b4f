"""The arrival schedules of the load generator: when each request of a point is meant to
leave, drawn before the run from a seeded process (Poisson, gamma, or constant gaps), at a
fixed rate or on a linear ramp. Vectorised with numpy: a million requests take milliseconds."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Final, Literal

import numpy as np

Arrival = Literal["poisson", "gamma", "constant"]
ARRIVALS: Final[tuple[Arrival, ...]] = ("poisson", "gamma", "constant")


def arrival_offsets_ns(
    rate_rps: float,
    *,
    arrival: Arrival = "poisson",
    burstiness: float = 1.0,
    seed: int = 0,
    requests: int | None = None,
    duration_s: float | None = None,
    ramp_from_rps: float | None = None,
    ramp_s: float = 0.0,
) -> np.ndarray:
    """Intended send times in nanoseconds after the start, the first at 0: gaps drawn from a
    gamma distribution of mean ``1 / rate_rps`` and shape ``burstiness`` (Poisson: shape 1), or
    exactly ``1 / rate_rps`` apart (constant).

    A ramp (``ramp_from_rps``, ``ramp_s``): the rate rises (or falls) linearly from
    ``ramp_from_rps`` to ``rate_rps`` over the first ``ramp_s`` seconds, then holds. The
    schedule is the same process drawn at ``rate_rps``, its times mapped through the inverse of
    the integrated rate (time-rescaling: a renewal process at a constant rate, run on the
    clock ``Lambda(t) / rate_rps``, has at each moment the gaps of the process at the rate of
    that moment). Without a ramp the mapping is the identity.

    The schedule ends after ``requests`` requests or before ``duration_s``, whichever is first;
    an infinite rate sends every request at once. Same arguments, same schedule."""
    if requests is None and duration_s is None:
        raise ValueError("give a number of requests or a duration")
    if not rate_rps > 0:
        raise ValueError("the rate must be positive")
    if (requests is not None and requests < 1) or (duration_s is not None and not duration_s > 0):
        raise ValueError("the number of requests and the duration must be positive")
    if arrival in ("poisson", "constant") and burstiness != 1.0:
        raise ValueError("burstiness is the gamma shape: it needs the gamma arrival process")
    if not burstiness > 0:
        raise ValueError("burstiness must be positive")
    ramp = _Ramp.checked(rate_rps, ramp_from_rps, ramp_s)
    if math.isinf(rate_rps):
        if requests is None:
            raise ValueError("an infinite rate needs a number of requests")
        return np.zeros(requests, dtype=np.int64)
    limit = requests if requests is not None else math.inf
    # the schedule is drawn on the steady clock (seconds at rate_rps), then mapped to real time
    horizon_s = ramp.steady_s(duration_s) if duration_s is not None else math.inf
    if arrival == "constant":
        count = limit if math.isinf(horizon_s) else min(limit, math.ceil(horizon_s * rate_rps) + 1)
        steady_s = np.arange(count) / rate_rps  # not a cumulative sum: no drift
    else:
        steady_s = _gamma_offsets_s(rate_rps, burstiness, seed, limit, horizon_s)
    steady_s = steady_s[steady_s < horizon_s]
    return np.round(ramp.real_s(steady_s) * 1e9).astype(np.int64)


def _gamma_offsets_s(
    rate_rps: float, burstiness: float, seed: int, limit: float, horizon_s: float
) -> np.ndarray:
    rng = np.random.default_rng(seed)
    scale_s = 1.0 / (rate_rps * burstiness)
    block = int(min(limit, rate_rps * min(horizon_s, 3600.0) * 1.1 + 64))
    gaps: list[np.ndarray] = []
    drawn = 0
    total_s = 0.0
    while drawn < limit and total_s < horizon_s:  # one block suffices but for bad luck
        more = rng.gamma(burstiness, scale_s, size=block)
        gaps.append(more)
        drawn += block
        total_s += float(more.sum())
    offsets_s = np.concatenate([[0.0], np.cumsum(np.concatenate(gaps))])
    return offsets_s[: int(min(limit, len(offsets_s)))]


@dataclass(frozen=True, slots=True, kw_only=True)
class _Ramp:
    """A rate that goes linearly from ``from_rps`` to ``to_rps`` over ``ramp_s``, then holds;
    its integral ``Lambda(t)``, divided by ``to_rps``, is the steady clock."""

    from_rps: float
    to_rps: float
    ramp_s: float

    @classmethod
    def checked(cls, rate_rps: float, from_rps: float | None, ramp_s: float) -> _Ramp:
        if from_rps is None:
            if ramp_s:
                raise ValueError("a ramp needs the rate it starts from")
            return cls(from_rps=rate_rps, to_rps=rate_rps, ramp_s=0.0)
        if not (math.isfinite(from_rps) and from_rps >= 0):
            raise ValueError("the ramp's starting rate must be finite and not negative")
        if not (math.isfinite(ramp_s) and ramp_s > 0):
            raise ValueError("the ramp's duration must be positive")
        if math.isinf(rate_rps):
            raise ValueError("an infinite rate cannot be ramped to")
        return cls(from_rps=from_rps, to_rps=rate_rps, ramp_s=ramp_s)

    def steady_s(self, real_s: float) -> float:
        """``Lambda(real_s) / to_rps``."""
        if not self.ramp_s:
            return real_s
        within_s = min(real_s, self.ramp_s)
        slope = (self.to_rps - self.from_rps) / self.ramp_s
        integral = self.from_rps * within_s + slope * within_s**2 / 2
        return integral / self.to_rps + max(real_s - self.ramp_s, 0.0)

    def real_s(self, steady_s: np.ndarray) -> np.ndarray:
        """The inverse of :meth:`steady_s`, element-wise."""
        if not self.ramp_s:
            return steady_s
        from_rps, to_rps = self.from_rps, self.to_rps
        ramp_steady_s = self.steady_s(self.ramp_s)
        # within the ramp: the root of slope/2 t^2 + from t - u = 0 (u = steady_s * to_rps),
        # written 2u / (from + sqrt(from^2 + 2 slope u)): exact for a flat ramp, no 0/0
        units = np.minimum(steady_s, ramp_steady_s) * to_rps
        slope = (to_rps - from_rps) / self.ramp_s
        root = np.sqrt(np.maximum(from_rps**2 + 2 * slope * units, 0.0))
        with np.errstate(divide="ignore", invalid="ignore"):
            within_s = np.where(units > 0, 2 * units / (from_rps + root), 0.0)
        after_s = np.maximum(steady_s - ramp_steady_s, 0.0)
        return np.where(steady_s <= ramp_steady_s, within_s, self.ramp_s + after_s)
