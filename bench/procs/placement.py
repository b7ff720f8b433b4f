"""Where a benchmark's processes run and what CPU they use: the two cores of a client and its
server, pinning a process's threads to one, and a process's CPU clock.
"""

from __future__ import annotations

import os


def pin_threads(pid: int, core: int) -> None:
    """Every thread of ``pid`` to ``core`` (``sched_setaffinity`` of a pid is one thread);
    threads made later inherit it from their maker."""
    import psutil  # type: ignore[import-untyped, unused-ignore]

    for thread in psutil.Process(pid).threads():
        os.sched_setaffinity(thread.id, {core})


def cpu_clock(pid: int) -> int:
    """The clock id of process ``pid``'s CPU time (every thread's), for
    ``time.clock_gettime_ns``: nanoseconds where psutil's CPU times count the scheduler's
    10 ms ticks. Linux's ``MAKE_PROCESS_CPUCLOCK(pid, CPUCLOCK_SCHED)``, the id
    ``clock_getcpuclockid(3)`` returns, which Python does not expose."""
    return ((~pid) << 3) | 2


def split_cores() -> tuple[int, int] | None:
    """A (server, client) pair of the cores this process may use, or None with fewer than two.

    On a 2-core machine, whether the kernel puts a client and its server on one core or two
    changes every round trip (context switches against cross-core wake-ups), and it decides
    afresh in every process: unpinned, a ratio moves between repeats by that choice."""
    cores = sorted(os.sched_getaffinity(0))
    return (cores[0], cores[-1]) if len(cores) >= 2 else None
