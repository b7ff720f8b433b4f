"""Saved benchmark runs: under ./.benchmarks of the directory pytest runs in, named as
pytest-benchmark names them (``NNNN_<commit>_<date>_<time>[_uncommitted-changes].json``), so a
run can be picked by its commit with ``--benchmark-compare`` and ``pytest-benchmark compare``.

One real benchmark of the suite runs, with the project's settings and ``bench/conftest.py``,
from a temporary git repository with one commit.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Final

import pytest

SUITE: Final = Path(__file__).resolve().parents[2] / "bench" / "bench_codecs.py"
BENCHMARK: Final = f"{SUITE}::bench_codec[encode-json-stream-16]"
TIMEOUT_S: Final = 300.0
GIT_ENV: Final = {
    "GIT_CONFIG_GLOBAL": os.devnull,
    "GIT_CONFIG_NOSYSTEM": "1",
    "GIT_AUTHOR_NAME": "t",
    "GIT_AUTHOR_EMAIL": "t@example.invalid",
    "GIT_COMMITTER_NAME": "t",
    "GIT_COMMITTER_EMAIL": "t@example.invalid",
}


def _pytest(cwd: Path, *args: str) -> str:
    """pytest's output (pytest-benchmark's notes go to stderr)."""
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            BENCHMARK,
            "-p",
            "no:cacheprovider",
            "-p",
            "no:xdist",  # this test may itself run under xdist, which disables benchmarks
            "-p",
            "no:hypothesispytest",  # seconds of imports a run, and no benchmark uses it
            "--benchmark-max-time=0.001",
            "--benchmark-min-rounds=1",
            "--benchmark-warmup=off",
            *args,
        ],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=TIMEOUT_S,
        check=False,
        env={k: v for k, v in os.environ.items() if not k.startswith("PYTEST_XDIST")},
    )
    assert result.returncode == 0, result.stdout + result.stderr
    return result.stdout + result.stderr


def _saved(storage: Path) -> list[Path]:
    return sorted(storage.glob("*/*.json"))


@pytest.mark.skipif(shutil.which("git") is None, reason="needs git")
def test_a_saved_run_is_named_by_commit_in_the_working_directory(tmp_path: Path) -> None:
    env = {**os.environ, **GIT_ENV}
    subprocess.run(["git", "init", "-q"], cwd=tmp_path, env=env, check=True)
    subprocess.run(
        ["git", "commit", "-q", "--allow-empty", "-m", "one"], cwd=tmp_path, env=env, check=True
    )
    commit = subprocess.run(
        ["git", "rev-parse", "HEAD"], cwd=tmp_path, capture_output=True, text=True, check=True
    ).stdout.strip()

    _pytest(tmp_path)
    (first,) = _saved(tmp_path / ".benchmarks")
    assert re.fullmatch(rf"0001_{commit}_\d{{8}}_\d{{6}}\.json", first.name), first.name

    # a later run picks that one by its commit (a glob, as pytest-benchmark takes it)
    compared = _pytest(tmp_path, f"--benchmark-compare=*_{commit[:12]}")
    assert f"Comparing against benchmarks from: {first.parent.name}/{first.name}" in compared
    assert [p.name[:5] for p in _saved(tmp_path / ".benchmarks")] == ["0001_", "0002_"]

    # and so does pytest-benchmark's own command
    compare = "from pytest_benchmark.cli import main; main()"
    listed = subprocess.run(
        [sys.executable, "-c", compare, "compare", f"*_{commit[:12]}*"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        check=True,
    )
    assert f"(0001_{commit[:7]})" in listed.stdout
    assert f"(0002_{commit[:7]})" in listed.stdout


def test_an_untimed_run_saves_nothing(tmp_path: Path) -> None:
    _pytest(tmp_path, "--benchmark-disable")
    assert _saved(tmp_path / ".benchmarks") == []
