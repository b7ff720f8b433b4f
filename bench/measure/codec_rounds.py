"""Interleaved rounds: every subject of a comparison timed once per round, in an order shuffled
per round, so the machine's drift (load, clock, a neighbour's cache traffic) lands on all of
them alike and a ratio taken within each round cancels it.

Each subject's sample is ``loops`` back-to-back calls, ``loops`` chosen once before the rounds
so that a sample lasts at least ``min_sample_s`` (a reading of a few microseconds is mostly
timer and interrupt noise); a sample is reported per call. Subjects can be grouped in blocks
run back to back (a codec's levels, whose ratio is what is read), the blocks and the subjects
inside each shuffled per round; with ``warm_blocks`` each block starts with an untimed call, so
that subjects within a few % of each other are compared from the same (warm) cache rather than
from whatever the block before left there. The shuffle is seeded from the benchmark's name: a
rerun runs the same orders.
"""

from __future__ import annotations

import gc
import math
import random
import statistics
import time
import zlib
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Any, Final

MIN_SAMPLE_S: Final = 50e-6
BUDGET_S: Final = 0.3
"""Time the rounds of one benchmark may take, whatever the machine (calibration excluded)."""
MIN_ROUNDS: Final = 7
WARM_S: Final = 0.01
WARM_TIMINGS: Final = 3
"""A first call shorter than ``WARM_S`` is timed this many times again, warm; the quickest
calibrates (a loaded machine's slow readings would make the samples too short)."""
MAX_ROUNDS: Final = 200


@contextmanager
def gc_off() -> Iterator[None]:
    # as pytest-benchmark does around each round: no collection billed to one sample
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


def iqr(samples: Sequence[float]) -> float:
    """Interquartile range (0.0 below two samples)."""
    if len(samples) < 2:
        return 0.0
    q1, _, q3 = statistics.quantiles(samples, n=4, method="inclusive")
    return q3 - q1


class Rounds:
    """The interleaved rounds of one benchmark over ``subjects`` (name -> call)."""

    def __init__(
        self,
        subjects: Mapping[str, Callable[[], Any]],
        *,
        seed: str,
        blocks: Sequence[Sequence[str]] | None = None,
        min_sample_s: float = MIN_SAMPLE_S,
        warm_blocks: bool = False,
    ) -> None:
        self._subjects = dict(subjects)
        self._blocks = [list(b) for b in blocks] if blocks else [[name] for name in subjects]
        assert sorted(n for b in self._blocks for n in b) == sorted(self._subjects)
        self._random = random.Random(zlib.crc32(seed.encode()))
        self._min_sample_s = min_sample_s
        self._warm_blocks = warm_blocks
        self._round_estimate_s = 0.0
        self.loops = dict.fromkeys(self._subjects, 1)
        self._call_s = dict.fromkeys(self._subjects, 0.0)
        """Calibration's reading of one call."""
        self.first: dict[str, Any] = {}
        """Each subject's result from calibration (none if not calibrated)."""
        self.last: dict[str, Any] = {}
        """Each subject's result from the last planned round (every round's, unplanned)."""
        self._planned: int | None = None
        self.per_call_s: dict[str, list[float]] = {name: [] for name in self._subjects}

    def calibrate(self) -> None:
        """Call every subject (warming it up, its result kept in ``first`` for checking) and
        choose its ``loops``; also estimates how long a round takes."""
        with gc_off():
            for name, call in self._subjects.items():
                start = time.perf_counter()
                self.first[name] = call()
                elapsed, calls = time.perf_counter() - start, 1
                for _ in range(WARM_TIMINGS if elapsed < WARM_S else 0):
                    # cheap enough to time again: calibrate on the quickest warm call
                    start = time.perf_counter()
                    call()
                    elapsed = min(elapsed, time.perf_counter() - start)
                while elapsed < self._min_sample_s / 2:  # too short to read from one call
                    calls *= 4
                    start = time.perf_counter()
                    for _ in range(calls):
                        call()
                    elapsed = time.perf_counter() - start
                per_call = self._call_s[name] = max(elapsed / calls, 1e-9)
                self.loops[name] = max(1, math.ceil(self._min_sample_s / per_call))
                self._round_estimate_s += self.loops[name] * per_call

    def plan(
        self,
        *,
        budget_s: float = BUDGET_S,
        min_rounds: int = MIN_ROUNDS,
        max_rounds: int = MAX_ROUNDS,
    ) -> int:
        """How many rounds fit ``budget_s`` (after :meth:`calibrate`), within the bounds."""
        planned = min_rounds
        if self._round_estimate_s > 0:
            planned = max(min_rounds, min(max_rounds, math.ceil(budget_s / self._round_estimate_s)))
        self._planned = planned
        return planned

    def one_round(self) -> None:
        """Time every subject once, in this round's order."""
        blocks = [list(b) for b in self._blocks]
        self._random.shuffle(blocks)
        # results kept from the last round only: outputs kept alive would shape the heap the
        # other subjects allocate in
        keep = self._planned is None or self.rounds + 1 >= self._planned
        for block in blocks:
            self._random.shuffle(block)
            warm = block[-1]
            if self._warm_blocks and self._call_s[warm] < WARM_S:
                # an untimed call first: the block's data in cache (a long call fills it itself)
                self._subjects[warm]()
            for name in block:
                call, loops = self._subjects[name], self.loops[name]
                out = None
                start = time.perf_counter()
                for _ in range(loops):
                    out = call()
                elapsed = time.perf_counter() - start
                self.per_call_s[name].append(elapsed / loops)
                if keep:
                    self.last[name] = out
                del out

    @property
    def rounds(self) -> int:
        return min(map(len, self.per_call_s.values()), default=0)

    def median_s(self, name: str) -> float:
        return statistics.median(self.per_call_s[name])

    def iqr_s(self, name: str) -> float:
        return iqr(self.per_call_s[name])

    def ratio(self, numerator: str, denominator: str) -> float:
        """Median over rounds of ``numerator``'s time / ``denominator``'s in the same round."""
        return statistics.median(
            a / b
            for a, b in zip(self.per_call_s[numerator], self.per_call_s[denominator], strict=True)
        )
