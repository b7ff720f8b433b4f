"""The engine's clocks: a virtual one for simulation and tests, the real one for serving.

:class:`~inferwire.engine.EngineCore` reads time only through a clock. On a
:class:`VirtualClock` each :meth:`~inferwire.engine.EngineCore.step` advances the clock by the
step's modelled duration itself, so a whole trace runs in microseconds and gives the same
numbers on every machine. On the :class:`RealClock` the core never sleeps: the caller (the
engine process) waits the step's ``duration_s`` while it does its I/O, then sends the outputs.
"""

from __future__ import annotations

import time
from typing import Protocol, runtime_checkable


@runtime_checkable
class Clock(Protocol):
    """Anything that tells the time in seconds (monotonic, arbitrary origin)."""

    def now(self) -> float: ...


class VirtualClock:
    """Simulated time: it moves only when told to (:meth:`advance`, :meth:`advance_to`)."""

    __slots__ = ("_now_s",)

    def __init__(self, start_s: float = 0.0) -> None:
        self._now_s = float(start_s)

    def now(self) -> float:
        return self._now_s

    def advance(self, dt_s: float) -> None:
        """Move forward by ``dt_s`` seconds (never backwards)."""
        if dt_s < 0:
            raise ValueError(f"a clock cannot go back ({dt_s} s)")
        self._now_s += dt_s

    def advance_to(self, t_s: float) -> None:
        """Jump to ``t_s`` if it is later than now (an idle engine waiting for an arrival)."""
        self._now_s = max(self._now_s, t_s)

    def __repr__(self) -> str:
        return f"VirtualClock(now={self._now_s!r})"


class RealClock:
    """Wall time: :func:`time.monotonic`."""

    __slots__ = ()

    def now(self) -> float:
        return time.monotonic()

    def __repr__(self) -> str:
        return "RealClock()"
