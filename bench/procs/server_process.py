"""Servers in their own processes, for benchmarks (and anyone else who needs one): start
``inferwire serve`` (:mod:`inferwire.transports.serve`) on a free loopback port, read the
address it prints, stop it after.

A server process shares no interpreter, GIL or event loop with the client that measures it, so
the client's timings include what a real deployment pays: a socket between two processes.

The event loop of a benchmark run, its servers' and its clients' alike, is
:func:`requested_loop`: ``$INFERWIRE_LOOP`` (``inferwire bench --loop`` sets it), ``auto``
when unset. :func:`serve` and :func:`proxy` pass it on as ``--loop``; a started process's
``loop`` is what the process announced it runs, which is what results record.

:func:`serve`'s servers record no metrics (``--no-metrics``) unless asked to: a benchmark's
figures are the transport's and the codec's alone, and the cost of metrics is measured on its
own, as a paired ratio (``bench/bench_observe.py``).
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import tempfile
import threading
from pathlib import Path
from types import TracebackType
from typing import Final

from inferwire.transports import loops

_ADDRESS: Final = re.compile(
    r"listening on \[?([0-9a-fA-F.:]+?)\]?:(\d+)(?: ca=(\S+))?(?: loop=(\w+))?"
    r"(?: metrics=(\S+))?"
)
START_TIMEOUT_S: Final = 60.0
LOOP_ENV: Final = "INFERWIRE_LOOP"
"""The environment variable that chooses a benchmark run's event loop (``auto``, ``asyncio``
or ``uvloop``)."""


def requested_loop() -> str:
    """``"asyncio"`` or ``"uvloop"``: the loop ``$INFERWIRE_LOOP`` names (``auto`` when unset)
    resolved; the one place the bench reads it. An unknown name is a ValueError, uvloop asked
    for but not installed a :class:`~inferwire.transports.extras.MissingExtraError`."""
    return loops.resolve(os.environ.get(LOOP_ENV) or "auto")


def with_loop(options: tuple[str, ...]) -> tuple[str, ...]:
    """``options`` with ``--loop`` of :func:`requested_loop`, unless they name one."""
    return options if "--loop" in options else (*options, "--loop", requested_loop())


class ServerProcess:
    """``inferwire serve`` (or ``proxy``) as a child process; a context manager."""

    def __init__(self, *args: str) -> None:
        self.args = [sys.executable, "-m", "inferwire.transports.serve", *args]
        self.process: subprocess.Popen[str] | None = None
        self.host = ""
        self.port = 0
        self.ca_pem: bytes | None = None
        self.loop = ""
        """The event loop the process announced it runs (``loop=``), "" if it did not say."""
        self.metrics_address = ""
        """Where its ``--metrics-port`` answers scrapes (``metrics=HOST:PORT``), "" if none."""
        self._ca_dir: tempfile.TemporaryDirectory[str] | None = None

    @property
    def address(self) -> str:
        return f"[{self.host}]:{self.port}" if ":" in self.host else f"{self.host}:{self.port}"

    def start(self) -> ServerProcess:
        args = list(self.args)
        if "--tls" in args:
            self._ca_dir = tempfile.TemporaryDirectory(prefix="inferwire-ca-")
            args += ["--ca-out", str(Path(self._ca_dir.name, "ca.pem"))]
        self.process = subprocess.Popen(
            args,
            stdout=subprocess.PIPE,
            text=True,
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
        )
        line: list[str] = []
        reader = threading.Thread(
            target=lambda: line.append(
                self.process.stdout.readline() if self.process and self.process.stdout else ""
            ),
            daemon=True,
        )
        reader.start()
        reader.join(START_TIMEOUT_S)
        match = _ADDRESS.search(line[0]) if line else None
        if match is None:
            self.stop()
            raise RuntimeError(f"{' '.join(self.args)} did not start: {line[:1]!r}")
        self.host, self.port = match.group(1), int(match.group(2))
        if match.group(3):
            self.ca_pem = Path(match.group(3)).read_bytes()
        self.loop = match.group(4) or ""
        self.metrics_address = match.group(5) or ""
        return self

    def stop(self) -> None:
        process, self.process = self.process, None
        if process is not None and process.poll() is None:
            process.send_signal(signal.SIGTERM)
            try:
                process.wait(10)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait(10)
        if process is not None and process.stdout is not None:
            process.stdout.close()
        if self._ca_dir is not None:
            self._ca_dir.cleanup()
            self._ca_dir = None

    def kill(self) -> None:
        """End it at once (SIGKILL), as a crash would."""
        if self.process is not None and self.process.poll() is None:
            self.process.kill()
        self.stop()

    def __enter__(self) -> ServerProcess:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()


def serve(transport: str, codec: str, *options: str, metrics: bool = False) -> ServerProcess:
    """A server of ``transport`` speaking ``codec`` (not started; use ``with``), on the run's
    loop unless ``options`` name one; recording no metrics unless ``metrics`` (or ``options``
    ask for a ``--metrics-port``)."""
    if not metrics and "--metrics-port" not in options:
        options = (*options, "--no-metrics")
    return ServerProcess("serve", "--transport", transport, "--codec", codec, *with_loop(options))


def proxy(upstream: str, delay_ms: float, *options: str) -> ServerProcess:
    return ServerProcess(
        "proxy", "--upstream", upstream, "--delay-ms", str(delay_ms), *with_loop(options)
    )


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
