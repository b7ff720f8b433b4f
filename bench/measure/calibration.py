"""Whether a suite's run is one to trust: calibration workloads and what else the machine did.

This machine is shared: a neighbour process, another VM on the same host (CPU steal) or a
busy memory bus moves every figure, and unevenly (memory-heavy workloads more). A suite
therefore times two fixed workloads at its start, middle and end:

- ``cpu``: pure-Python integer and dict work, the interpreter's own speed;
- ``memory``: copying a buffer far larger than the caches, the memory bus.

Each point is the fastest of several timings. If either workload's time moves by more than
``MOVED_BOUND`` between the points, the conditions changed during the run. The suite also reads
``/proc/stat`` at its start and end: the share of the CPUs' time the hypervisor gave to other
guests (*steal*), and the share other processes of this machine used (busy time minus this
process tree's CPU time). A run where any of the three passes its bound is *unstable*: its
figures are kept, marked, and ``inferwire bench`` will not publish it over a stable run unless
forced (:mod:`inferwire.bench.runner.run`).
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Final

import numpy as np
import psutil  # type: ignore[import-untyped, unused-ignore]

MOVED_BOUND: Final = 0.10
"""Largest change of a calibration workload's time between a suite's points, as a share."""
OTHERS_CPU_BOUND: Final = 0.10
"""Largest share of the machine's CPU time other processes may use during a stable run."""
STEAL_BOUND: Final = 0.05
"""Largest share of the CPUs' time the hypervisor may give to other guests in a stable run."""
REPEATS: Final = 15
"""Timings per workload at each point; the point records the fastest (see ``_fastest_time``)."""
CPU_ITERATIONS: Final = 40_000
MEMORY_BYTES: Final = 64 * 1024 * 1024
"""Far past the last-level cache of any machine this runs on, so the copy runs at memory speed."""
PROC_STAT: Final = Path("/proc/stat")
_BUSY_FIELDS: Final = (0, 1, 2)  # user nice system
# irq and softirq are left out: the kernel's loopback networking for the suite's own sockets
# runs there and belongs to no process, so it would read as a neighbour's CPU
_STEAL_FIELD: Final = 7


def cpu_workload() -> int:
    """Fixed interpreter work: integer arithmetic and a dict (some tens of ms here)."""
    table: dict[int, int] = {}
    total = 0
    for i in range(CPU_ITERATIONS):
        key = (i * 7919) % 1021
        table[key] = table.get(key, 0) + i
        total ^= key << (i & 15)
    return total + len(table)


class _MemoryWorkload:
    """Copies ``MEMORY_BYTES`` into a second buffer of the same size, allocated once."""

    def __init__(self) -> None:
        self.source = np.arange(MEMORY_BYTES // 8, dtype=np.int64)
        self.target = np.empty_like(self.source)

    def __call__(self) -> int:
        np.copyto(self.target, self.source)
        return int(self.target[-1])


def _fastest_time(work: Any) -> float:
    """The fastest of ``REPEATS`` timings: the machine's speed at that moment. Interference
    only ever adds time, so the fastest is the steadiest statistic (on this machine, quiet,
    the median of 7 moved by up to 17% between points a few seconds apart, the fastest of 15
    by 5%); a slowdown that lasts through all of them, the kind that skews a suite, still
    shows."""
    work()  # warm: first-touch page faults and the interpreter's specialization
    samples = []
    for _ in range(REPEATS):
        start = time.perf_counter()
        work()
        samples.append(time.perf_counter() - start)
    return min(samples)


@dataclass(frozen=True, slots=True, kw_only=True)
class CpuTimes:
    """The machine's CPU time counters (seconds, all CPUs) and this process tree's CPU time."""

    busy_s: float
    steal_s: float
    total_s: float
    own_s: float


def cpu_times() -> CpuTimes | None:
    """Now's counters, or None where ``/proc/stat`` cannot be read (not Linux)."""
    try:
        first = PROC_STAT.read_text().splitlines()[0].split()
    except (OSError, IndexError):
        return None
    ticks = [int(v) for v in first[1:]]
    hz = os.sysconf("SC_CLK_TCK")
    times = os.times()
    own = times.user + times.system + times.children_user + times.children_system
    for child in psutil.Process().children(recursive=True):  # alive: not yet in children_*
        try:
            cpu = child.cpu_times()
        except psutil.Error:
            continue
        # its children_* hold the descendants it has waited for, which are no longer listed
        own += cpu.user + cpu.system + cpu.children_user + cpu.children_system
    return CpuTimes(
        busy_s=sum(ticks[i] for i in _BUSY_FIELDS) / hz,
        steal_s=ticks[_STEAL_FIELD] / hz if len(ticks) > _STEAL_FIELD else 0.0,
        total_s=sum(ticks[:8]) / hz,
        own_s=own,
    )


class Calibration:
    """The calibration of one suite's run: ``point()`` at its start, middle and end, then
    ``summary()`` for the raw JSON."""

    def __init__(self) -> None:
        self._memory = _MemoryWorkload()
        self.points: list[dict[str, Any]] = []
        self._first: CpuTimes | None = None
        self._last: CpuTimes | None = None

    def point(self, at: str) -> None:
        now = cpu_times()
        if self._first is None:
            self._first = now
        self._last = now
        self.points.append(
            {
                "at": at,
                "time": datetime.now(UTC).isoformat(),
                "cpu_s": _fastest_time(cpu_workload),
                "memory_s": _fastest_time(self._memory),
                "load_average": list(os.getloadavg()),
            }
        )

    def summary(self) -> dict[str, Any]:
        """What the raw JSON records: the points, how far each workload moved, the CPU time
        of others and of steal over the run, and the verdict with its reasons."""
        moved = {kind: _moved([p[f"{kind}_s"] for p in self.points]) for kind in ("cpu", "memory")}
        shares = _shares(self._first, self._last)
        reasons = [
            f"the {kind} calibration moved {value:.1%} during the run (bound {MOVED_BOUND:.0%})"
            for kind, value in moved.items()
            if value > MOVED_BOUND
        ]
        if shares.get("others_cpu_share", 0.0) > OTHERS_CPU_BOUND:
            reasons.append(
                f"other processes used {shares['others_cpu_share']:.1%} of the CPUs "
                f"(bound {OTHERS_CPU_BOUND:.0%})"
            )
        if shares.get("steal_share", 0.0) > STEAL_BOUND:
            reasons.append(
                f"CPU steal was {shares['steal_share']:.1%} of the CPUs' time "
                f"(bound {STEAL_BOUND:.0%})"
            )
        return {
            "points": self.points,
            "cpu_moved": moved["cpu"],
            "memory_moved": moved["memory"],
            "bounds": {
                "moved": MOVED_BOUND,
                "others_cpu_share": OTHERS_CPU_BOUND,
                "steal_share": STEAL_BOUND,
            },
            **shares,
            "cpus": os.cpu_count(),
            "stable": not reasons,
            "reasons": reasons,
        }


def _moved(times_s: list[float]) -> float:
    """(slowest - fastest) / fastest over the points: 0.0 with fewer than two."""
    if len(times_s) < 2 or min(times_s) <= 0:
        return 0.0
    return max(times_s) / min(times_s) - 1.0


def _shares(first: CpuTimes | None, last: CpuTimes | None) -> dict[str, float]:
    if first is None or last is None:
        return {}
    total = last.total_s - first.total_s
    if total <= 0:
        return {}
    others = (last.busy_s - first.busy_s) - (last.own_s - first.own_s)
    return {
        "steal_share": (last.steal_s - first.steal_s) / total,
        "others_cpu_share": max(0.0, others) / total,
        "own_cpu_share": (last.own_s - first.own_s) / total,
        "wall_s": total / (os.cpu_count() or 1),
    }
