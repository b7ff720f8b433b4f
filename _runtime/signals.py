"""Ending a long-running command on SIGINT or SIGTERM, whatever it inherited.

A shell starts ``cmd &`` with SIGINT ignored, and Python then leaves it ignored (it installs
its KeyboardInterrupt handler only over the default disposition), so a command that relies on
KeyboardInterrupt never ends on Ctrl-C or a job runner's SIGINT. Every long-running command
installs its own handlers instead, as uvicorn does, in one of two shapes:

- around blocking code, :func:`handled`: the signals call a function in the main thread; by
  default :func:`raise_stop`, which raises :class:`Stopped` where the main thread is, or a
  :class:`StopSignal`, which records the signal for code that looks (or waits) for it;
- on an event loop, :func:`stop_event`: an :class:`asyncio.Event` the signals set.

Both put back the dispositions they found when their block ends, so the two nest: a command
can note a signal while it writes its outputs, and wait on it in a loop in between.
"""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Callable, Iterator
from types import FrameType
from typing import TYPE_CHECKING, Final

if TYPE_CHECKING:  # imported when used: a command without a loop (the engine) pays nothing
    import asyncio

STOP_SIGNALS: Final = (signal.SIGINT, signal.SIGTERM)


class Stopped(BaseException):
    """SIGINT or SIGTERM arrived. A BaseException, as KeyboardInterrupt is, so that no
    ``except Exception`` of the code it interrupts swallows it."""

    def __init__(self, signum: int) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


def raise_stop(signum: int) -> None:
    raise Stopped(signum)


class StopSignal:
    """A handler for :func:`handled` and :func:`stop_event` that records the first signal,
    and lets the main thread wait for one."""

    def __init__(self) -> None:
        self.signum: int | None = None
        self._event = threading.Event()

    def __call__(self, signum: int) -> None:
        if self.signum is None:
            self.signum = signum
        self._event.set()

    @property
    def received(self) -> bool:
        return self.signum is not None

    @property
    def name(self) -> str:
        """``"SIGINT"`` or ``"SIGTERM"``; "" before one arrived."""
        return "" if self.signum is None else signal.Signals(self.signum).name

    def wait(self, timeout_s: float) -> bool:
        """Sleep until a signal arrives (True) or ``timeout_s`` passes (False)."""
        # a lock wait in the main thread is interrupted by a signal, its handler run, then
        # resumed (PEP 475), so the handler's set() ends it
        return self._event.wait(timeout_s)


def _disposition(sig: signal.Signals) -> signal._HANDLER:
    previous = signal.getsignal(sig)
    return signal.SIG_DFL if previous is None else previous  # None: not set from Python


@contextlib.contextmanager
def handled(on_signal: Callable[[int], None] = raise_stop) -> Iterator[None]:
    """Inside the block, SIGINT and SIGTERM call ``on_signal(signum)`` in the main thread;
    the dispositions from before are restored after."""

    def handler(signum: int, frame: FrameType | None) -> None:
        on_signal(signum)

    previous = {sig: _disposition(sig) for sig in STOP_SIGNALS}
    for sig in STOP_SIGNALS:
        signal.signal(sig, handler)
    try:
        yield
    finally:
        for sig, disposition in previous.items():
            signal.signal(sig, disposition)


@contextlib.contextmanager
def stop_event(on_signal: Callable[[int], None] | None = None) -> Iterator[asyncio.Event]:
    """An event that SIGINT and SIGTERM set, on the running loop (its handlers replace any
    disposition, an ignored SIGINT included), calling ``on_signal(signum)`` too if given; the
    dispositions from before are restored after. Enter it before the command announces
    itself, so a parent that stops it as soon as it has read the announcement gets a clean
    end."""
    import asyncio

    stop = asyncio.Event()
    loop = asyncio.get_running_loop()

    def received(signum: int) -> None:
        if on_signal is not None:
            on_signal(signum)
        stop.set()

    previous = {sig: _disposition(sig) for sig in STOP_SIGNALS}
    for sig in STOP_SIGNALS:
        loop.add_signal_handler(sig, received, sig)
    try:
        yield stop
    finally:
        for sig, disposition in previous.items():
            loop.remove_signal_handler(sig)  # which sets the default disposition: put back ours
            signal.signal(sig, disposition)
