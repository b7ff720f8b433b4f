"""A child process that announces where it listens on its first line of stdout, for the tests,
the benchmarks and anything that starts a server or an engine of its own:

    with ChildProcess([sys.executable, "-m", "inferwire.cli", "serve"], ANNOUNCEMENT) as child:
        child.announcement.group(1)  # what the line said

Started, it is waited for until that line arrives (or :data:`START_TIMEOUT_S` passes, or it
exits); stopped, it gets SIGTERM and, if it has not ended within :data:`STOP_TIMEOUT_S`,
SIGKILL. Every pipe it was given is closed when it is stopped, so nothing leaks across tests.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import threading
from collections.abc import Sequence
from types import TracebackType
from typing import IO, Any, Final, Self

START_TIMEOUT_S: Final = 60.0
"""Generous: a cold interpreter on a busy 2-core machine can take seconds to import a server."""
STOP_TIMEOUT_S: Final = 10.0


class ChildStartError(RuntimeError):
    """The child exited, or said something else, before announcing itself."""


class ChildProcess:
    """``command`` as a child process whose first stdout line matches ``announcement``; a context
    manager. stderr is inherited unless ``stderr`` is given (e.g. ``subprocess.DEVNULL`` or a
    file); stdin is empty."""

    def __init__(
        self,
        command: Sequence[str],
        announcement: re.Pattern[str],
        *,
        stderr: int | IO[Any] | None = None,
        env: dict[str, str] | None = None,
    ) -> None:
        self.args = list(command)
        self.pattern = announcement
        self.stderr = stderr
        self.env = env
        self.process: subprocess.Popen[str] | None = None
        self._announcement: re.Match[str] | None = None

    @property
    def pid(self) -> int:
        if self.process is None:
            raise RuntimeError("not started")
        return self.process.pid

    @property
    def announcement(self) -> re.Match[str]:
        """The match of the child's first line, once started."""
        if self._announcement is None:
            raise RuntimeError("not started")
        return self._announcement

    def start(self) -> Self:
        process = subprocess.Popen(
            self.args,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=self.stderr,
            text=True,
            env={**(self.env if self.env is not None else os.environ), "PYTHONUNBUFFERED": "1"},
        )
        self.process = process
        line: list[str] = []
        # read in a thread: a child that neither prints nor exits must not hang the caller
        reader = threading.Thread(
            target=lambda: line.append(process.stdout.readline() if process.stdout else ""),
            daemon=True,
        )
        reader.start()
        reader.join(START_TIMEOUT_S)
        match = self.pattern.search(line[0]) if line else None
        if match is None:
            self.stop()
            said = repr(line[0]) if line else f"nothing within {START_TIMEOUT_S:.0f} s"
            raise ChildStartError(f"{' '.join(self.args)} did not start: it said {said}")
        self._announcement = match
        self.started(match)
        return self

    def started(self, announcement: re.Match[str]) -> None:
        """Read what the announcement says (a subclass's hook)."""

    def stop(self) -> None:
        """SIGTERM (SIGKILL if it has not ended within :data:`STOP_TIMEOUT_S`), wait, and close
        its pipes."""
        process, self.process = self.process, None
        if process is None:
            return
        if process.poll() is None:
            process.send_signal(signal.SIGTERM)
            try:
                process.wait(STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait(STOP_TIMEOUT_S)
        for pipe in (process.stdout, process.stderr):
            if pipe is not None:
                pipe.close()

    def kill(self) -> None:
        """End it at once (SIGKILL), as a crash would, and wait."""
        if self.process is not None and self.process.poll() is None:
            self.process.kill()
            self.process.wait(STOP_TIMEOUT_S)
        self.stop()

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()
