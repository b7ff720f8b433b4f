"""A suite's calibration (``inferwire.bench.measure.calibration``) and the hooks of
``bench/conftest.py`` that take its points and write it into the benchmark JSON.

The verdict is checked from constructed points and counters; what counts as *other processes*
is checked with real processes: a busy neighbour that is not a descendant of the test, and the
test's own busy descendants, which must not count. Shares are only compared with the bounds
(this machine is shared, so the exact figures are anyone's).
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path
from typing import Any, Final

import pytest

from inferwire.bench.measure import calibration
from inferwire.bench.measure.calibration import (
    MAX_MEMORY_BYTES,
    MOVED_BOUND,
    OTHERS_CPU_BOUND,
    STEAL_BOUND,
    Calibration,
    cpu_times,
)
from tests.bench.bench_run_helpers import POINT_LOG_ENV, busy_neighbour, clean_env, write_suite

TIMEOUT_S: Final = 300.0
BURN_S: Final = 0.4
"""CPU seconds a busy descendant burns (its own clock, so a loaded machine only makes it
slower, not shorter)."""
BURN: Final = (
    f"import time\nwhile time.process_time() < {BURN_S}:\n    pass\nprint(time.process_time())"
)


def _point(at: str, cpu_s: float, memory_s: float) -> dict[str, Any]:
    return {
        "at": at,
        "time": "2026-01-01T00:00:00+00:00",
        "cpu_s": cpu_s,
        "memory_s": memory_s,
        "load_average": [0.5, 0.5, 0.5],
    }


@pytest.fixture(scope="module", autouse=True)
def _small_copies() -> Iterator[None]:
    """Copies of the floor's size: these tests judge verdicts, not the probe's reach, and two
    buffers of four last-level caches per calibration (840 MiB here) would raise this test
    process's peak memory, which every process it starts inherits as its own (Linux keeps
    ``ru_maxrss`` across fork and exec; libFuzzer's RSS limit reads it)."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(calibration, "MAX_MEMORY_BYTES", calibration.MIN_MEMORY_BYTES)
        yield


@pytest.fixture(scope="module")
def constructed() -> Calibration:
    """One calibration (it allocates two buffers of four last-level caches) whose points the
    tests set."""
    return Calibration()


@pytest.mark.parametrize(
    ("cpu_s", "memory_s", "moved"),
    [
        ((0.020, 0.021, 0.0205), (0.010, 0.0102, 0.0101), ()),
        ((0.020, 0.026, 0.021), (0.010, 0.010, 0.010), ("cpu",)),
        ((0.020, 0.020, 0.020), (0.012, 0.010, 0.0101), ("memory",)),
        ((0.020, 0.030, 0.020), (0.010, 0.010, 0.015), ("cpu", "memory")),
    ],
)
def test_a_workload_that_moved_is_drift_not_instability(
    constructed: Calibration,
    cpu_s: tuple[float, ...],
    memory_s: tuple[float, ...],
    moved: tuple[str, ...],
) -> None:
    """The host's speed, which the workloads read, moves on this machine with nothing of ours
    running (the module docstring): a move is noted as drift, and a run with no neighbour to
    blame stays stable."""
    constructed.points = [
        _point(at, c, m)
        for at, c, m in zip(("start", "middle", "end"), cpu_s, memory_s, strict=True)
    ]
    summary = constructed.summary()

    assert summary["cpu_moved"] == pytest.approx(max(cpu_s) / min(cpu_s) - 1)
    assert summary["memory_moved"] == pytest.approx(max(memory_s) / min(memory_s) - 1)
    assert len(summary["drift"]) == len(moved)
    for kind, note in zip(moved, summary["drift"], strict=True):
        assert note.startswith(f"the {kind} calibration moved")
    assert summary["stable"] is (not summary["reasons"])
    assert not any("calibration moved" in reason for reason in summary["reasons"])
    assert summary["points"] == constructed.points
    assert summary["bounds"]["moved"] == MOVED_BOUND


def test_the_memory_copy_is_four_last_level_caches(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(calibration, "MAX_MEMORY_BYTES", MAX_MEMORY_BYTES)  # the real bound
    for index, (level, size) in enumerate([(1, "48K"), (2, "2048K"), (3, "107520K")]):
        folder = tmp_path / f"index{index}"
        folder.mkdir()
        (folder / "level").write_text(f"{level}\n")
        (folder / "size").write_text(f"{size}\n")
    cache = calibration.last_level_cache_bytes(tmp_path)
    assert cache == 107520 * 1024  # the L3, the highest level
    assert calibration.memory_bytes(cache) == 4 * cache
    assert calibration.memory_bytes(None) == calibration.MIN_MEMORY_BYTES  # sysfs lists none
    assert calibration.memory_bytes(1 << 30) == calibration.MAX_MEMORY_BYTES
    assert calibration.last_level_cache_bytes(tmp_path / "absent") is None


def test_one_point_has_moved_nothing(constructed: Calibration) -> None:
    constructed.points = [_point("start", 0.02, 0.01)]
    summary = constructed.summary()
    assert (summary["cpu_moved"], summary["memory_moved"]) == (0.0, 0.0)
    assert summary["stable"] is True
    assert summary["reasons"] == []


def _proc_stat(path: Path, busy: int, idle: int, steal: int) -> None:
    # user nice system idle iowait irq softirq steal guest guest_nice, in USER_HZ ticks
    path.write_text(f"cpu  {busy} 0 0 {idle} 0 0 0 {steal} 0 0\ncpu0 0 0 0 0 0 0 0 0 0 0\n")


def test_steal_and_others_are_read_from_proc_stat(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Over counters this large (10,000 s of CPU time) the test's own CPU time between the
    points (the calibration workloads: seconds on a slow machine, which once read 50% as 49.6%
    over 1,000 s) is noise: half the time busy and a tenth stolen read as such, and each passes
    its bound."""
    stat = tmp_path / "stat"
    monkeypatch.setattr(calibration, "PROC_STAT", stat)
    hz = os.sysconf("SC_CLK_TCK")
    run = Calibration()
    _proc_stat(stat, busy=10_000 * hz, idle=10_000 * hz, steal=0)
    run.point("start")
    _proc_stat(stat, busy=15_000 * hz, idle=14_000 * hz, steal=1_000 * hz)
    run.point("end")
    summary = run.summary()

    assert summary["steal_share"] == pytest.approx(0.10)
    assert summary["others_cpu_share"] == pytest.approx(0.50, abs=0.01)
    assert summary["wall_s"] == pytest.approx(10_000 / summary["cpus"])
    assert summary["stable"] is False
    assert any(
        f"CPU steal was 10.0% of the CPUs' time (bound {STEAL_BOUND:.0%})" == r
        for r in summary["reasons"]
    ), summary["reasons"]
    assert any(r.startswith("other processes used 5") for r in summary["reasons"])


def test_without_proc_stat_there_are_no_shares(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(calibration, "PROC_STAT", tmp_path / "absent")
    assert cpu_times() is None
    run = Calibration()
    run.point("start")
    run.point("end")
    summary = run.summary()
    assert not {"steal_share", "others_cpu_share", "own_cpu_share", "wall_s"} & set(summary)
    assert not any("other processes" in r or "steal" in r for r in summary["reasons"])
    assert [p["at"] for p in summary["points"]] == ["start", "end"]


@contextlib.contextmanager
def _on_core(core: int) -> Iterator[None]:
    before = os.sched_getaffinity(0)
    os.sched_setaffinity(0, {core})
    try:
        yield
    finally:
        os.sched_setaffinity(0, before)


@pytest.mark.parametrize(
    "neighbour",
    ["a busy loop", "a busy loop on the suite's core", "a memory-bandwidth hog"],
)
def test_a_neighbour_makes_the_run_unstable(neighbour: str) -> None:
    """A neighbour this machine can see is judged unstable every time, whatever the host's
    drift (a busier machine only makes the neighbour's share larger)."""
    core = min(os.sched_getaffinity(0))
    pinned = core if "core" in neighbour else None
    run = Calibration()
    with (
        _on_core(core) if pinned is not None else contextlib.nullcontext(),
        busy_neighbour(core=pinned, memory="memory" in neighbour),
    ):
        run.point("start")
        time.sleep(2.0)
        run.point("end")
    summary = run.summary()
    assert summary["others_cpu_share"] > OTHERS_CPU_BOUND, summary
    assert summary["stable"] is False
    assert any(r.startswith("other processes used") for r in summary["reasons"])


def test_a_neighbour_is_not_this_process_tree() -> None:
    with busy_neighbour():
        first = cpu_times()
        time.sleep(1.0)
        last = cpu_times()
    assert first is not None
    assert last is not None
    # the neighbour burned most of a core for a second; this process slept
    assert last.busy_s - first.busy_s > 0.3
    assert last.own_s - first.own_s < 0.2


def _burn_cpu_s(output: str) -> float:
    return float(output.split()[-1])


def test_a_descendant_that_was_waited_for_is_this_run_not_others() -> None:
    run = Calibration()
    run.point("start")
    burned_s = _burn_cpu_s(
        subprocess.run(
            [sys.executable, "-c", BURN], capture_output=True, text=True, check=True
        ).stdout
    )
    run.point("end")
    summary = run.summary()
    own_s = summary["own_cpu_share"] * summary["wall_s"] * summary["cpus"]
    assert own_s >= 0.8 * burned_s, summary


# A descendant alive at both readings: it burns CPU itself, then runs a grandchild to its end
# and waits for it (the grandchild's time is then in the child's children_* times only), and
# stays alive until told to exit.
CHILD: Final = f"""
import subprocess, sys, time
print("ready", time.process_time(), flush=True)
sys.stdin.readline()
while time.process_time() < {BURN_S}:
    pass
own = time.process_time()
grandchild = subprocess.run([sys.executable, "-c", {BURN!r}], capture_output=True, text=True)
print(own, grandchild.stdout.split()[-1], flush=True)
sys.stdin.readline()
"""


def test_a_live_descendant_and_what_it_waited_for_are_this_run_not_others() -> None:
    child = subprocess.Popen(
        [sys.executable, "-c", CHILD],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert child.stdin is not None
    assert child.stdout is not None
    try:
        ready, started_text = child.stdout.readline().split()
        assert ready == "ready"
        first = cpu_times()
        child.stdin.write("go\n")
        child.stdin.flush()
        own_text, grandchild_text = child.stdout.readline().split()
        last = cpu_times()  # the child is alive, blocked on its stdin
        assert child.poll() is None
    finally:
        child.communicate("exit\n", timeout=TIMEOUT_S)
    assert first is not None
    assert last is not None
    counted_s = last.own_s - first.own_s
    # what the child burned after the first reading (not its start-up), and its grandchild
    burned_s = float(own_text) - float(started_text) + float(grandchild_text)
    assert counted_s >= 0.8 * burned_s, (counted_s, started_text, own_text, grandchild_text)


# --- the conftest hooks, in a pytest run of a suite of two tiny benchmarks -----------------


def _run_suite(
    tmp_path: Path, *args: str, env: dict[str, str] | None = None
) -> tuple[dict[str, Any] | None, list[str]]:
    """The run's benchmark JSON (None if it wrote none) and the calibration points taken;
    ``env``: more variables for the run's environment."""
    suite = write_suite(tmp_path / "suite")
    out = tmp_path / "out.json"
    log = tmp_path / "points.log"
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            str(suite),
            "-p",
            "no:cacheprovider",
            "-p",
            "no:xdist",
            "-p",
            "no:hypothesispytest",  # seconds of imports the suite does not use
            "-q",
            "-o",
            "python_files=bench_*.py",
            "-o",
            "python_functions=bench_*",
            "--benchmark-max-time=0.001",
            "--benchmark-min-rounds=1",
            "--benchmark-warmup=off",
            f"--benchmark-json={out}",
            *args,
        ],
        cwd=tmp_path,
        env=clean_env(**{POINT_LOG_ENV: str(log)}, **(env or {})),
        capture_output=True,
        text=True,
        timeout=TIMEOUT_S,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    written = json.loads(out.read_text()) if out.exists() else None
    return written, log.read_text().split() if log.exists() else []


def _stamp(text: str) -> datetime:
    return datetime.fromisoformat(text)


def test_a_timed_run_records_start_middle_and_end(tmp_path: Path) -> None:
    written, taken = _run_suite(tmp_path)
    assert written is not None
    recorded = written["calibration"]
    points = recorded["points"]
    assert [p["at"] for p in points] == taken == ["start", "middle", "end"]
    for point in points:
        assert point["cpu_s"] > 0
        assert point["memory_s"] > 0
        assert len(point["load_average"]) == 3
    assert recorded["stable"] is (not recorded["reasons"])
    assert {"cpu_moved", "memory_moved", "others_cpu_share", "steal_share", "bounds"} <= set(
        recorded
    )
    # the middle is taken once half the benchmarks have run: between the two
    first, second = (_stamp(b["extra_info"]["started"]) for b in written["benchmarks"])
    start, middle, end = (_stamp(p["time"]) for p in points)
    assert start <= first <= middle <= second <= end, (start, first, middle, second, end)


def test_a_run_of_one_benchmark_has_no_middle(tmp_path: Path) -> None:
    written, taken = _run_suite(tmp_path, "-k", "bench_first")
    assert written is not None
    assert [b["name"] for b in written["benchmarks"]] == ["bench_first"]
    assert [p["at"] for p in written["calibration"]["points"]] == taken == ["start", "end"]


def test_an_untimed_run_takes_no_calibration(tmp_path: Path) -> None:
    written, taken = _run_suite(tmp_path, "--benchmark-disable")
    assert written is None  # pytest-benchmark writes no JSON for an untimed run
    assert taken == []


def test_a_run_pytest_benchmark_turned_off_takes_no_calibration(tmp_path: Path) -> None:
    """In an xdist worker pytest-benchmark times nothing (and writes no JSON), even without
    --benchmark-disable: no calibration is taken for it."""
    written, taken = _run_suite(tmp_path, env={"PYTEST_XDIST_WORKER": "gw0"})
    assert written is None
    assert taken == []
