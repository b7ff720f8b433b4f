"""Waking the scheduler at a request's intended send time, to the microsecond, on any loop.

An event loop's own timers are too coarse for an open-loop schedule of thousands of requests a
second: asyncio's epoll loop waits in whole milliseconds (rounded up), and uvloop keeps time in
milliseconds (libuv's ``uv_now``), so ``asyncio.sleep(0.0004)`` on uvloop returns at once, a
request early, and ``sleep(0.0006)`` a millisecond or two late. A Linux ``timerfd`` armed at the
absolute instant (``CLOCK_MONOTONIC``, the clock of ``time.monotonic_ns``) becomes readable when
it is due, and every loop wakes on a readable descriptor at once, whatever its timer
granularity: the wake-up is as precise as the kernel's high-resolution timers on both loops.

The standard library gained ``os.timerfd_create`` in Python 3.13; on older Pythons the two
calls go through ``ctypes`` to libc (no maintained package wraps them: ``linuxfd`` and
``pytimerfd`` are years without a release). Elsewhere (not Linux) the scheduler falls back to
the loop's timers, and says so: :attr:`Alarm.kind` is recorded with every result.
"""

from __future__ import annotations

import asyncio
import ctypes
import os
import sys
import time
from collections.abc import Callable
from typing import Final, Literal

TimerKind = Literal["timerfd", "loop"]
_CLOCK_MONOTONIC: Final = getattr(time, "CLOCK_MONOTONIC", 1)
_TFD_TIMER_ABSTIME: Final = 1
_NS: Final = 1_000_000_000
now_ns: Final = time.monotonic_ns


class _Itimerspec(ctypes.Structure):
    """``struct itimerspec``, its two ``timespec``s flattened (the same layout), so that arming
    sets two fields rather than building nested objects."""

    _fields_ = (
        ("interval_s", ctypes.c_long),
        ("interval_ns", ctypes.c_long),
        ("value_s", ctypes.c_long),
        ("value_ns", ctypes.c_long),
    )


def _timerfd() -> tuple[int, Callable[[int, int], None]] | None:
    """A non-blocking timerfd and the function that arms it at an absolute monotonic instant
    (ns), or None where there is none."""
    if not sys.platform.startswith("linux"):
        return None
    flags = os.O_NONBLOCK | os.O_CLOEXEC  # TFD_NONBLOCK and TFD_CLOEXEC have these values
    create = getattr(os, "timerfd_create", None)
    settime_ns = getattr(os, "timerfd_settime_ns", None)
    if create is not None and settime_ns is not None:  # Python 3.13+
        fd = create(_CLOCK_MONOTONIC, flags=flags)

        def arm_os(fd: int, when_ns: int) -> None:
            settime_ns(fd, flags=_TFD_TIMER_ABSTIME, initial=max(when_ns, 1))

        return fd, arm_os
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        timerfd_create, timerfd_settime = libc.timerfd_create, libc.timerfd_settime
    except (OSError, AttributeError):
        return None
    fd = timerfd_create(_CLOCK_MONOTONIC, flags)
    if fd < 0:
        return None
    spec = _Itimerspec()
    spec_ref = ctypes.byref(spec)

    def arm_ctypes(fd: int, when_ns: int) -> None:
        # a zero it_value disarms: an instant at or before the clock's zero is "now"
        spec.value_s, spec.value_ns = divmod(max(when_ns, 1), _NS)
        if timerfd_settime(fd, _TFD_TIMER_ABSTIME, spec_ref, None) != 0:
            errno = ctypes.get_errno()
            raise OSError(errno, os.strerror(errno))

    return fd, arm_ctypes


class Alarm:
    """One timer for the running loop's scheduler: ``await alarm.sleep_until(t)`` returns at or
    after ``now_ns() == t``. One waiter at a time (the scheduler). Close it when done."""

    __slots__ = ("_arm", "_fd", "_loop", "_waiter", "kind")

    def __init__(self, *, use_timerfd: bool = True) -> None:
        self._loop = asyncio.get_running_loop()
        self._waiter: asyncio.Future[None] | None = None
        made = _timerfd() if use_timerfd else None
        self.kind: TimerKind = "loop" if made is None else "timerfd"
        self._fd = -1
        if made is not None:
            self._fd, self._arm = made
            self._loop.add_reader(self._fd, self._fired)

    async def sleep_until(self, when_ns: int) -> None:
        if self._fd < 0:
            # the loop's timers may wake early (uvloop rounds below half a millisecond to 0)
            while (delay_ns := when_ns - now_ns()) > 0:
                await asyncio.sleep(delay_ns / 1e9)
            return
        self._arm(self._fd, when_ns)
        self._waiter = waiter = self._loop.create_future()
        try:
            await waiter
        finally:
            self._waiter = None

    def _fired(self) -> None:
        try:
            os.read(self._fd, 8)  # the expiry count; reading it clears the readiness
        except BlockingIOError:  # re-armed since it fired
            return
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    def close(self) -> None:
        if self._fd >= 0:
            self._loop.remove_reader(self._fd)
            os.close(self._fd)
            self._fd = -1
