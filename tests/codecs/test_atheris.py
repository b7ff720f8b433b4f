"""A short coverage-guided run of tests/codecs/fuzz/fuzz_codecs.py (atheris), bounded for CI.

The fuzzer runs in a subprocess (libFuzzer exits the process it runs in) for 20,000 inputs or
20 s, whichever comes first, with a per-input timeout of 10 s (a hang is a failure) and a
memory cap. It passes if the fuzzer exits 0; otherwise the failure shows its output, which
holds the exception, and names the crash file that holds the input.
"""

from __future__ import annotations

import resource
import subprocess
import sys
from pathlib import Path

import pytest

HARNESS = Path(__file__).parent / "fuzz" / "fuzz_codecs.py"
RUNS = 20_000
RSS_LIMIT_MB = 2048


def _peak_rss_mb() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss // 1024  # KiB on Linux


MAX_SECONDS = 20


def test_a_short_coverage_guided_run_finds_nothing(tmp_path: Path) -> None:
    artifacts = tmp_path / "artifacts"
    artifacts.mkdir()
    command = [
        sys.executable,
        str(HARNESS),
        str(tmp_path / "corpus"),
        f"-runs={RUNS}",
        f"-max_total_time={MAX_SECONDS}",
        "-timeout=10",
        # libFuzzer judges its RSS limit on ru_maxrss, which Linux carries across fork and
        # exec: a child of this process starts at this process's peak (another test in it
        # may have held gigabytes), so the limit is 2 GiB past that floor
        f"-rss_limit_mb={RSS_LIMIT_MB + _peak_rss_mb()}",
        "-print_final_stats=1",
        f"-artifact_prefix={artifacts}/",
    ]
    result = subprocess.run(
        command,
        capture_output=True,
        text=True,
        errors="replace",
        timeout=MAX_SECONDS + 120,  # start-up, seed loading, and a slow machine
        check=False,
    )
    found = sorted(artifacts.iterdir())
    if result.returncode != 0 or found:
        inputs = "\n".join(f"{path.name}: {path.read_bytes()[:512]!r}" for path in found)
        pytest.fail(
            f"fuzzer exited {result.returncode}\n{inputs}\n{result.stderr[-6000:]}",
            pytrace=False,
        )
    assert "Done" in result.stderr, result.stderr[-2000:]
