"""Whether a suite's run is one to trust: what else this machine did while it ran, and how the
host's speed drifted.

This machine is shared, at two levels, and they call for different readings:

- **Inside it**, other processes (a neighbour on the suite's core, a memory-bandwidth hog) and
  the hypervisor taking the CPUs away (*steal*) are visible in ``/proc/stat``. The suite reads
  it at its start and end: the share of the CPUs' time that processes outside the suite's
  process tree used (busy time minus this tree's CPU time) and the share stolen. A run where
  either passes its bound is *unstable*: its figures are kept, marked, and ``inferwire bench``
  will not publish it over a stable run unless forced (:mod:`inferwire.bench.runner.run`).
- **Below it**, the host's other guests share the physical cores (their hyperthread siblings),
  the last-level cache and the memory bus. None of that shows in ``/proc/stat``. Measured here
  (a 2-vCPU guest, nothing else running, steal 0.0%): the ``cpu`` workload below ran at 8.5 ms
  for some seconds and 15-16 ms for the next, in phases of a few to over twenty seconds, pinned
  to one vCPU or not, whether or not a process of ours kept the other vCPU busy; a copy past
  the last-level cache moved 54-67 ms in the same way. That is the host's speed, not ours and
  not a neighbour we can see.

So the suite also times two fixed workloads at its start, middle and end, pinned to the core it
runs on, each point the fastest of several timings:

- ``cpu``: pure-Python integer and dict work, the interpreter's own speed;
- ``memory``: copying a buffer four times the last-level cache (read from sysfs; 64 MiB to
  512 MiB), so it runs at memory speed. It was 64 MiB, which on a host with a 105 MiB shared
  L3 partly fits in the cache, and then measured how much of the L3 the other guests were
  using: it moved 15-78% between points seconds apart, and made a third of the published
  suite runs "unstable" with nothing of ours to blame.

How far each moved is the run's *drift*: the absolute times of a run that drifted mix the
host's speeds, while the ratios the report judges are paired within one run and are not
affected. Drift is recorded and printed beside each run, and said in a note when it passes
``MOVED_BOUND``; it does not make a run unstable, because on this host it passes the bound in
most runs (it would cry wolf) and nothing in the run can tell it from the host's normal state.
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Final

import numpy as np
import psutil  # type: ignore[import-untyped, unused-ignore]

MOVED_BOUND: Final = 0.10
"""A calibration workload's change between a suite's points past which its drift is noted."""
OTHERS_CPU_BOUND: Final = 0.10
"""Largest share of the machine's CPU time other processes may use during a stable run."""
STEAL_BOUND: Final = 0.05
"""Largest share of the CPUs' time the hypervisor may give to other guests in a stable run."""
REPEATS: Final = 15
"""Timings per workload at each point; the point records the fastest (see ``_fastest_time``)."""
MEMORY_REPEATS: Final = 7
"""Timings of the memory copy per point: each is some tens of ms, past the cache."""
CPU_ITERATIONS: Final = 40_000
CACHE_MULTIPLE: Final = 4
"""The memory copy's buffer, in last-level caches: a quarter of it at most can be cached."""
MIN_MEMORY_BYTES: Final = 64 * 1024 * 1024
MAX_MEMORY_BYTES: Final = 512 * 1024 * 1024
"""Bounds of the buffer (two of it are allocated): the floor where sysfs gives no cache size."""
CACHE_DIR: Final = Path("/sys/devices/system/cpu/cpu0/cache")
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


def last_level_cache_bytes(cache_dir: Path = CACHE_DIR) -> int | None:
    """The size of the highest-level cache sysfs lists for CPU 0, or None where it lists none."""
    sizes: dict[int, int] = {}
    for index in cache_dir.glob("index*"):
        try:
            level = int((index / "level").read_text())
            text = (index / "size").read_text().strip()
        except (OSError, ValueError):
            continue
        unit = {"K": 1024, "M": 1024 * 1024}.get(text[-1:].upper(), 1)
        digits = text.rstrip("KkMm")
        if digits.isdigit():
            sizes[level] = max(sizes.get(level, 0), int(digits) * unit)
    return sizes[max(sizes)] if sizes else None


def memory_bytes(cache_bytes: int | None) -> int:
    """The copy's buffer: :data:`CACHE_MULTIPLE` last-level caches, within the bounds."""
    wanted = CACHE_MULTIPLE * (cache_bytes or 0)
    return max(MIN_MEMORY_BYTES, min(MAX_MEMORY_BYTES, wanted))


class _MemoryWorkload:
    """Copies ``size`` bytes into a second buffer of the same size, both allocated and written
    once (no page faults while timed) and reused at every point."""

    def __init__(self, size: int) -> None:
        self.source = np.arange(size // 8, dtype=np.int64)
        self.target = np.empty_like(self.source)
        self.target.fill(0)

    def __call__(self) -> int:
        np.copyto(self.target, self.source)
        return int(self.target[-1])


@contextlib.contextmanager
def _on_this_core() -> Iterator[None]:
    """This thread pinned to the core it is on while the workloads run: a migration mid-probe
    (to a core whose caches are cold, or whose sibling is busy) reads as a slower machine."""
    try:
        before = os.sched_getaffinity(0)
        core = psutil.Process().cpu_num()
        os.sched_setaffinity(0, {core})
    except (AttributeError, OSError, psutil.Error):  # not Linux, or not allowed
        yield
        return
    try:
        yield
    finally:
        os.sched_setaffinity(0, before)


def _fastest_time(work: Any, repeats: int = REPEATS) -> float:
    """The fastest of ``repeats`` timings: the machine's speed at that moment. Interference
    only ever adds time, so the fastest is the steadiest statistic (on this machine, quiet,
    the median of 7 moved by up to 17% between points a few seconds apart, the fastest of 15
    by 5%); a slowdown that lasts through all of them, the kind that skews a suite, still
    shows."""
    work()  # warm: the interpreter's specialization, the buffers' TLB entries
    samples = []
    for _ in range(repeats):
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
        self.cache_bytes = last_level_cache_bytes()
        self._memory = _MemoryWorkload(memory_bytes(self.cache_bytes))
        self.points: list[dict[str, Any]] = []
        self._first: CpuTimes | None = None
        self._last: CpuTimes | None = None

    def point(self, at: str) -> None:
        now = cpu_times()
        if self._first is None:
            self._first = now
        self._last = now
        with _on_this_core():
            cpu_s = _fastest_time(cpu_workload)
            memory_s = _fastest_time(self._memory, MEMORY_REPEATS)
        self.points.append(
            {
                "at": at,
                "time": datetime.now(UTC).isoformat(),
                "cpu_s": cpu_s,
                "memory_s": memory_s,
                "load_average": list(os.getloadavg()),
            }
        )

    def summary(self) -> dict[str, Any]:
        """What the raw JSON records: the points, how far each workload moved (the drift, with
        its notes), the CPU time of others and of steal over the run, and the verdict with its
        reasons."""
        moved = {kind: _moved([p[f"{kind}_s"] for p in self.points]) for kind in ("cpu", "memory")}
        shares = _shares(self._first, self._last)
        reasons = []
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
        cause = "" if reasons else " with no other process or steal to account for it"
        drift = [
            f"the {kind} calibration moved {value:.1%} during the run{cause}"
            for kind, value in moved.items()
            if value > MOVED_BOUND
        ]
        return {
            "points": self.points,
            "cpu_moved": moved["cpu"],
            "memory_moved": moved["memory"],
            "memory_bytes": self._memory.source.nbytes,
            "last_level_cache_bytes": self.cache_bytes,
            "bounds": {
                "moved": MOVED_BOUND,
                "others_cpu_share": OTHERS_CPU_BOUND,
                "steal_share": STEAL_BOUND,
            },
            **shares,
            "cpus": os.cpu_count(),
            "stable": not reasons,
            "reasons": reasons,
            "drift": drift,
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
