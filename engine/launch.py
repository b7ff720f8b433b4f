"""The engine in a child process, for tests, benchmarks and a frontend that starts its own:
start ``python -m inferwire.cli engine`` with the given options, read the endpoint it
announces (``listening on ENDPOINT codec=NAME policy=POLICY session=ID``), stop it after.

    with EngineProcess("--endpoint", "tcp://127.0.0.1:0", "--step-scale", "0.1") as engine:
        client = EngineClient(engine.endpoint, codec, process=engine.process)

Started and stopped as every child is (:class:`~inferwire._runtime.child.ChildProcess`).
"""

from __future__ import annotations

import re
import sys
from typing import Final

from inferwire._runtime.child import ChildProcess

_ANNOUNCEMENT: Final = re.compile(r"listening on (\S+) codec=(\S+) policy=(\S+) session=(\S+)")


class EngineProcess(ChildProcess):
    """``inferwire engine`` (``python -m inferwire.cli engine``) as a child process; a
    context manager. ``args`` are its options; stderr is inherited unless ``stderr`` is
    given (e.g. ``subprocess.PIPE``)."""

    def __init__(self, *args: str, stderr: int | None = None) -> None:
        super().__init__(
            [sys.executable, "-m", "inferwire.cli", "engine", *args],
            _ANNOUNCEMENT,
            stderr=stderr,
        )
        self.endpoint = ""
        """Where the engine listens, as it announced (the port bound for ``tcp://HOST:0``)."""
        self.codec = ""
        self.policy = ""
        self.session = ""

    def started(self, announcement: re.Match[str]) -> None:
        self.endpoint, self.codec, self.policy, self.session = announcement.groups()
