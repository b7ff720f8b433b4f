"""The engine in a child process, for tests, benchmarks and a frontend that starts its own:
start ``python -m inferwire.engine.process`` with the given options, read the endpoint it
announces (``listening on ENDPOINT codec=NAME policy=POLICY session=ID``), stop it after.

    with EngineProcess("--endpoint", "tcp://127.0.0.1:0", "--step-scale", "0.1") as engine:
        client = EngineClient(engine.endpoint, codec, process=engine.process)

The same form as :mod:`inferwire.bench.procs.server_process` reads ``inferwire serve``'s first
line (the engine layer cannot import the bench's).
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading
from types import TracebackType
from typing import Final

_ANNOUNCEMENT: Final = re.compile(r"listening on (\S+) codec=(\S+) policy=(\S+) session=(\S+)")
START_TIMEOUT_S: Final = 60.0


class EngineProcess:
    """``inferwire engine`` (``python -m inferwire.engine.process``) as a child process; a
    context manager. ``args`` are its options; stderr is inherited unless ``stderr`` is
    given (e.g. ``subprocess.PIPE``)."""

    def __init__(self, *args: str, stderr: int | None = None) -> None:
        self.args = [sys.executable, "-m", "inferwire.engine.process", *args]
        self.stderr = stderr
        self.process: subprocess.Popen[str] | None = None
        self.endpoint = ""
        """Where the engine listens, as it announced (the port bound for ``tcp://HOST:0``)."""
        self.codec = ""
        self.policy = ""
        self.session = ""

    @property
    def pid(self) -> int:
        assert self.process is not None, "not started"
        return self.process.pid

    def start(self) -> EngineProcess:
        self.process = subprocess.Popen(
            self.args,
            stdout=subprocess.PIPE,
            stderr=self.stderr,
            text=True,
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
        )
        line: list[str] = []
        stdout = self.process.stdout
        reader = threading.Thread(
            target=lambda: line.append(stdout.readline() if stdout else ""), daemon=True
        )
        reader.start()
        reader.join(START_TIMEOUT_S)
        match = _ANNOUNCEMENT.search(line[0]) if line else None
        if match is None:
            self.stop()
            raise RuntimeError(f"{' '.join(self.args)} did not start: {line[:1]!r}")
        self.endpoint, self.codec, self.policy, self.session = match.groups()
        return self

    def stop(self) -> None:
        """SIGTERM (SIGKILL if it does not end within 10 s) and wait."""
        process, self.process = self.process, None
        if process is None:
            return
        if process.poll() is None:
            process.send_signal(signal.SIGTERM)
            try:
                process.wait(10)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait(10)
        for pipe in (process.stdout, process.stderr):
            if pipe is not None:
                pipe.close()

    def kill(self) -> None:
        """End it at once (SIGKILL), as a crash would, and wait."""
        if self.process is not None and self.process.poll() is None:
            self.process.kill()
            self.process.wait(10)
        self.stop()

    def __enter__(self) -> EngineProcess:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()
