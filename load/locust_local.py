"""A headless Locust master and N workers on this machine, as child processes, driving
:mod:`inferwire.load.locust_user`: how the split run's test and benchmark start one,
and a way to use every core of one machine.

Every process starts in a process group of its own, and each group (a worker's ``inferwire
load`` child included) is ended when the run returns or fails, whatever happened.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

from inferwire._runtime import extras

LOCUSTFILE: Final = Path(__file__).with_name("locust_user.py")
STOP_WAIT_S: Final = 20.0


@dataclass(frozen=True, slots=True, kw_only=True)
class LocalRun:
    """A finished run: the master's exit status, and where everything was written."""

    status: int
    folder: Path
    """Holds ``master.log``, ``workerI.log``, ``merged.json`` and each worker's part files
    (``workerI/part-I-of-N.json``, ``.jsonl``, ``.log``)."""

    @property
    def report(self) -> dict[str, Any]:
        """The merged JSON report (raises ``FileNotFoundError`` if the master wrote none)."""
        return dict(json.loads((self.folder / "merged.json").read_text()))

    def part_points(self) -> list[dict[str, Any]]:
        """Each part's point, as its own generator wrote it."""
        paths = sorted(self.folder.glob("worker*/part-*-of-*.json"))
        return [json.loads(path.read_text())["points"][0] for path in paths]

    def log(self, name: str = "master") -> str:
        return (self.folder / f"{name}.log").read_text(errors="replace")


def run_local(
    load: str,
    *,
    workers: int,
    folder: Path,
    lead_s: float = 8.0,
    timeout_s: float = 300.0,
    master_options: Sequence[str] = (),
) -> LocalRun:
    """Runs ``inferwire load`` ``load`` (its arguments, as ``--inferwire-load`` takes them)
    split across ``workers`` Locust workers, headless, and waits for the master to end;
    raises ``TimeoutError`` if it has not after ``timeout_s``, and ``MissingExtraError``
    without Locust."""
    extras.require("locust", "a split run on Locust")
    folder.mkdir(parents=True, exist_ok=True)
    port = _free_port()
    with _groups() as started:
        master = _locust(
            folder / "master.log",
            "--master",
            "--headless",
            "--master-bind-host=127.0.0.1",
            f"--master-bind-port={port}",
            f"--expect-workers={workers}",
            f"--users={workers}",
            f"--spawn-rate={workers}",
            f"--inferwire-load={load}",
            f"--inferwire-out={folder / 'merged.json'}",
            f"--inferwire-lead-s={lead_s}",
            *master_options,
        )
        started.append(master)
        for index in range(workers):
            started.append(
                _locust(
                    folder / f"worker{index}.log",
                    "--worker",
                    "--master-host=127.0.0.1",
                    f"--master-port={port}",
                    f"--inferwire-parts-dir={folder / f'worker{index}'}",
                )
            )
        try:
            status = master.wait(timeout_s)
        except subprocess.TimeoutExpired:
            raise TimeoutError(f"the Locust master ran over {timeout_s:g} s") from None
        for worker in started[1:]:
            with contextlib.suppress(subprocess.TimeoutExpired):
                worker.wait(STOP_WAIT_S)  # they quit when the master does
    return LocalRun(status=status, folder=folder)


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def _locust(log: Path, *args: str) -> subprocess.Popen[bytes]:
    with log.open("wb") as out:
        return subprocess.Popen(
            [sys.executable, "-m", "locust", "-f", str(LOCUSTFILE), *args],
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            cwd=log.parent,
            start_new_session=True,
        )


@contextlib.contextmanager
def _groups() -> Iterator[list[subprocess.Popen[bytes]]]:
    started: list[subprocess.Popen[bytes]] = []
    try:
        yield started
    finally:
        for process in started:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGTERM)
        for process in started:
            try:
                process.wait(STOP_WAIT_S)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait(STOP_WAIT_S)
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGKILL)  # a child the leader left behind
