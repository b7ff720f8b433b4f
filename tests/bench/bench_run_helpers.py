"""Helpers for the tests of benchmark runs (calibration, the conftest hooks, ``inferwire bench``).

A *neighbour* is a CPU-bound process that is not a descendant of the test: a shell starts it in
the background and exits, so it is re-parented (to init or a subreaper) and the calibration must
count it among "other processes". A *suite* here is a tiny pytest-benchmark file written to a
temporary directory beside a ``conftest.py`` that loads ``bench/conftest.py`` as a plugin, so
its timed runs record a calibration as the real suites do, in a second or two.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Final

import psutil  # type: ignore[import-untyped, unused-ignore]

NEIGHBOUR_LIFETIME_S: Final = 120.0
"""The busy loop ends by itself after this, should the test's own kill never run."""
POINT_LOG_ENV: Final = "INFERWIRE_TEST_CALIBRATION_LOG"

# Loads the project's bench conftest as a plugin, and logs every calibration point taken (to
# the file named by POINT_LOG_ENV) so a test can see that none was taken.
SUITE_CONFTEST: Final = f'''
import os

from inferwire.bench.measure import calibration

pytest_plugins = ["inferwire.bench.conftest"]
_point = calibration.Calibration.point


def _logged_point(self, at):
    log = os.environ.get("{POINT_LOG_ENV}")
    if log:
        with open(log, "a") as f:
            f.write(at + "\\n")
    _point(self, at)


calibration.Calibration.point = _logged_point
'''

# Each benchmark records when its body started, so a test can place the middle calibration
# point between them.
TWO_BENCHMARKS: Final = """
import time
from datetime import UTC, datetime


def _stamped(benchmark):
    benchmark.extra_info["started"] = datetime.now(UTC).isoformat()
    benchmark(sum, range(100))


def bench_first(benchmark):
    _stamped(benchmark)


def bench_second(benchmark):
    _stamped(benchmark)
"""


def write_suite(
    directory: Path,
    name: str = "bench_two.py",
    body: str = TWO_BENCHMARKS,
    *,
    calibrated: bool = True,
) -> Path:
    """``directory/name`` holding ``body``; ``calibrated``: beside the conftest that loads the
    project's (without it a run is plain pytest-benchmark, and quicker)."""
    directory.mkdir(parents=True, exist_ok=True)
    if calibrated:
        (directory / "conftest.py").write_text(SUITE_CONFTEST)
    suite = directory / name
    suite.write_text(body)
    return suite


def clean_env(**extra: str) -> dict[str, str]:
    """This process's environment without xdist's markers (a worker's marker makes
    pytest-benchmark disable itself in the child)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_XDIST")}
    env.pop("PYTEST_ADDOPTS", None)
    return {**env, **extra}


def _cpu_s(pid: int) -> float:
    times = psutil.Process(pid).cpu_times()
    return float(times.user + times.system)


CPU_LOOP: Final = "while time.monotonic() < end:\n    pass\n"
MEMORY_LOOP: Final = (
    "import numpy as np\n"
    "a = np.ones(64 << 20, dtype=np.uint8)\nb = np.empty_like(a)\n"  # past a core's L2
    "while time.monotonic() < end:\n    np.copyto(b, a)\n"
)
"""A memory-bandwidth hog: copies of 64 MiB, back to back."""


@contextlib.contextmanager
def busy_neighbour(*, core: int | None = None, memory: bool = False) -> Iterator[int]:
    """A busy loop in a process that is not this one's descendant (on ``core`` only, when
    given; copying memory rather than spinning, with ``memory``); yields its pid once it has
    started burning CPU, and kills it on the way out."""
    pinned = f"import os\nos.sched_setaffinity(0, {{{core}}})\n" if core is not None else ""
    loop = f"{pinned}import time\nend = time.monotonic() + {NEIGHBOUR_LIFETIME_S}\n" + (
        MEMORY_LOOP if memory else CPU_LOOP
    )
    # its output goes to /dev/null: a pipe it inherited would hold subprocess.run until it ended
    started = subprocess.run(
        ["sh", "-c", '"$0" -c "$1" </dev/null >/dev/null 2>&1 & echo $!', sys.executable, loop],
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    )
    pid = int(started.stdout.strip())
    try:
        descendants = {p.pid for p in psutil.Process().children(recursive=True)}
        assert pid not in descendants, "the neighbour was not re-parented away from this process"
        deadline = time.monotonic() + 30.0
        while _cpu_s(pid) < 0.05:  # running, not still starting
            assert time.monotonic() < deadline, "the neighbour never started"
            time.sleep(0.02)
        yield pid
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


def result_file(
    benchmarks: list[dict[str, Any]], calibration: dict[str, Any] | None = None
) -> dict[str, Any]:
    """A suite's result file as pytest-benchmark writes it (the parts the code reads)."""
    run: dict[str, Any] = {
        "machine_info": {"node": "vm"},
        "commit_info": {"id": "abc"},
        "benchmarks": benchmarks,
        "datetime": "2026-01-01T00:00:00",
        "version": "5.1.0",
    }
    if calibration is not None:
        run["calibration"] = calibration
    return run


def verdict(stable: bool, *reasons: str) -> dict[str, Any]:
    """A calibration reduced to its verdict."""
    return {"points": [], "stable": stable, "reasons": list(reasons)}
