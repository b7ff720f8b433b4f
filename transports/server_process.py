"""inferwire's servers in their own processes, for the benchmarks, the load generator and the
tests: start ``inferwire serve`` (``python -m inferwire.cli serve``) on a free loopback port,
read the address it prints, stop it after (:class:`~inferwire._runtime.child.ChildProcess`).

A server process shares no interpreter, GIL or event loop with the client that measures it, so
the client's timings include what a real deployment pays: a socket between two processes.

:func:`serve` and :func:`proxy` run on the loop ``$INFERWIRE_LOOP`` names
(:func:`~inferwire._runtime.loops.requested_loop`) unless their options name one; a started
process's ``loop`` is what the process announced it runs, which is what results record.

:func:`serve`'s servers record no metrics (``--no-metrics``) unless asked to: a benchmark's
figures are the transport's and the codec's alone, and the cost of metrics is measured on its
own, as a paired ratio (``bench/bench_observe.py``).
"""

from __future__ import annotations

import re
import sys
import tempfile
from pathlib import Path
from typing import IO, Any, Final

from inferwire._runtime.child import ChildProcess
from inferwire._runtime.loops import with_loop

_ADDRESS: Final = re.compile(
    r"listening on \[?([0-9a-fA-F.:]+?)\]?:(\d+)(?: ca=(\S+))?(?: loop=(\w+))?"
    r"(?: metrics=(\S+))?"
)
"""The first line of ``inferwire serve``, ``proxy`` and the bench's own servers."""


class ServerProcess(ChildProcess):
    """``inferwire serve ARGS`` (or ``proxy``) as a child process; a context manager. A server
    of another make that announces itself the same way is one too, its command set in
    ``args`` before it is started."""

    def __init__(self, *args: str, stderr: int | IO[Any] | None = None) -> None:
        super().__init__([sys.executable, "-m", "inferwire.cli", *args], _ADDRESS, stderr=stderr)
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
        if "--tls" in self.args and "--ca-out" not in self.args:
            self._ca_dir = tempfile.TemporaryDirectory(prefix="inferwire-ca-")
            self.args += ["--ca-out", str(Path(self._ca_dir.name, "ca.pem"))]
        return super().start()

    def started(self, announcement: re.Match[str]) -> None:
        self.host, self.port = announcement.group(1), int(announcement.group(2))
        if announcement.group(3):
            self.ca_pem = Path(announcement.group(3)).read_bytes()
        self.loop = announcement.group(4) or ""
        self.metrics_address = announcement.group(5) or ""

    def stop(self) -> None:
        super().stop()
        if self._ca_dir is not None:
            self._ca_dir.cleanup()
            self._ca_dir = None


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
