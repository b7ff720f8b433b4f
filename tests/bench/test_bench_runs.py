"""What ``inferwire bench --repeat N`` publishes or refuses to publish
(:mod:`inferwire.bench.runner.run`).
The merge of the repeats: test_bench_merge.py; how the report shows them:
test_bench_runs_report.py.

The refusal and the publishing are checked on constructed files; the command runs
end to end once for real (``--suite`` starts two suites, and a ``-k`` keeps the work to two
codec benchmarks: the other suite matches nothing, and keeps its results), and on tiny suites
written by the tests where a run must fail or be unstable.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
from pathlib import Path
from typing import Any, Final

import pytest

from inferwire._runtime.arguments import CommandError
from inferwire.bench.runner import merge
from inferwire.bench.runner import run as bench_run
from tests.bench.bench_run_helpers import (
    busy_neighbour,
    clean_env,
    result_file,
    verdict,
    write_suite,
)

TIMEOUT_S: Final = 600.0

# --- publishing: _refusal and _publish ----------------------------------------------------


def _write(path: Path, document: dict[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(document))


STABLE: Final = result_file([], verdict(True))
UNSTABLE: Final = result_file([], verdict(False, "other processes used 60% of the CPUs"))
OLD: Final = result_file([])


@pytest.mark.parametrize(
    ("published", "new", "refused"),
    [
        (STABLE, UNSTABLE, True),
        (STABLE, merge.merge([STABLE, UNSTABLE]), True),
        (STABLE, OLD, True),  # no calibration: nothing says it is stable
        (STABLE, STABLE, False),
        (UNSTABLE, UNSTABLE, False),
        (OLD, UNSTABLE, False),
        (None, UNSTABLE, False),
        ("not json", UNSTABLE, False),
    ],
    ids=[
        "unstable-over-stable",
        "one-unstable-repeat-over-stable",
        "uncalibrated-over-stable",
        "stable-over-stable",
        "unstable-over-unstable",
        "unstable-over-old",
        "unstable-over-nothing",
        "unstable-over-unreadable",
    ],
)
def test_an_unstable_run_is_refused_only_over_a_stable_one(
    tmp_path: Path, published: dict[str, Any] | str | None, new: dict[str, Any], refused: bool
) -> None:
    raw = tmp_path / "raw"
    raw.mkdir()
    if isinstance(published, dict):
        _write(raw / "codecs.json", published)
    elif published is not None:
        (raw / "codecs.json").write_text(published)
    merged = {"codecs.json": new, "transports.json": STABLE}

    reason = bench_run._refusal(raw, merged, force=False)
    assert bool(reason) is refused
    if refused:
        assert "codecs.json" in reason
        assert str(raw / "codecs.json") in reason
        assert "; ".join(merge.unstable_reasons(new)) in reason
    assert bench_run._refusal(raw, merged, force=True) == ""


def _staged(staging: Path, name: str, repeats: int, tag: str) -> list[Path]:
    paths = []
    for n in range(1, repeats + 1):
        path = staging / bench_run.REPEATS_DIR / str(n) / name
        _write(path, {"run": tag, "repeat": n})
        paths.append(path)
    _write(staging / name, {"run": tag, "merged": True})
    return paths


def _tree(directory: Path) -> dict[str, Any]:
    return {
        str(p.relative_to(directory)): json.loads(p.read_text())
        for p in sorted(directory.rglob("*.json"))
    }


def test_publishing_replaces_a_suite_and_its_repeats_and_leaves_the_others(
    tmp_path: Path,
) -> None:
    raw, staging = tmp_path / "raw", tmp_path / "staging"
    # the published run: 3 repeats of codecs, transports and stages; stages only 1
    for name, repeats in (("codecs.json", 3), ("transports.json", 3), ("stages.json", 1)):
        old_paths = _staged(raw, name, repeats, "old")
        assert len(old_paths) == repeats
    # this run: codecs only (a -k), 2 repeats
    ran = {"codecs.json": _staged(staging, "codecs.json", 2, "new")}

    bench_run._publish(staging, raw, ran)

    assert not staging.exists()
    assert _tree(raw) == {
        "codecs.json": {"run": "new", "merged": True},
        "repeats/1/codecs.json": {"run": "new", "repeat": 1},
        "repeats/2/codecs.json": {"run": "new", "repeat": 2},
        # the old run's third repeat of codecs is gone: it is not this run's
        "transports.json": {"run": "old", "merged": True},
        "repeats/1/transports.json": {"run": "old", "repeat": 1},
        "repeats/2/transports.json": {"run": "old", "repeat": 2},
        "repeats/3/transports.json": {"run": "old", "repeat": 3},
        "stages.json": {"run": "old", "merged": True},
        "repeats/1/stages.json": {"run": "old", "repeat": 1},
    }


def test_publishing_removes_a_repeat_directory_left_empty(tmp_path: Path) -> None:
    raw, staging = tmp_path / "raw", tmp_path / "staging"
    _staged(raw, "codecs.json", 3, "old")
    bench_run._publish(staging, raw, {"codecs.json": _staged(staging, "codecs.json", 1, "new")})
    assert sorted(p.name for p in (raw / bench_run.REPEATS_DIR).iterdir()) == ["1"]
    assert _tree(raw) == {
        "codecs.json": {"run": "new", "merged": True},
        "repeats/1/codecs.json": {"run": "new", "repeat": 1},
    }


# --- inferwire bench on tiny suites: a failing suite, an unstable run -------------------

FLAKY: Final = """
import os
import pathlib


def bench_flaky(benchmark):
    benchmark(sum, range(10))
    # a marker per suite file, in the directory the test names
    marker = pathlib.Path(os.environ["INFERWIRE_TEST_MARKERS"]) / pathlib.Path(__file__).name
    first = not marker.exists()
    marker.touch()
    assert first, "this suite fails from its second run on"
"""


@pytest.fixture
def tiny_suites(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Where ``inferwire bench`` (called in this process) finds its suites: a directory the
    test fills. Its suite processes run in ``tmp_path`` and see no xdist markers."""
    suites = tmp_path / "suites"
    suites.mkdir()
    monkeypatch.setattr(bench_run, "SUITES_DIR", suites)
    monkeypatch.chdir(tmp_path)  # pytest-benchmark saves each timed run in ./.benchmarks
    for name in [n for n in os.environ if n.startswith("PYTEST_XDIST")]:
        monkeypatch.delenv(name)
    monkeypatch.setenv("PYTEST_ADDOPTS", "-p no:hypothesispytest")  # seconds of imports
    return suites


def _published(out: Path) -> dict[str, Any]:
    return {str(p.relative_to(out)): p.read_text() for p in sorted(out.rglob("*")) if p.is_file()}


def test_a_failing_suite_publishes_nothing(
    tiny_suites: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """Repeat 1 of every suite passes and is staged; in repeat 2 the suite that is not
    repeated is skipped (it would fail, as the last one does): the published run is left as it
    was, nothing of this one stays."""
    write_suite(tiny_suites, "bench_good.py", calibrated=False)
    write_suite(tiny_suites, "bench_once.py", FLAKY, calibrated=False)
    write_suite(tiny_suites, "bench_flaky.py", FLAKY, calibrated=False)
    suites = (
        ("bench_good.py", "good.json", True),
        ("bench_once.py", "once.json", False),
        ("bench_flaky.py", "flaky.json", True),
    )
    monkeypatch.setattr(bench_run, "SUITES", suites)
    markers = tmp_path / "markers"
    markers.mkdir()
    monkeypatch.setenv("INFERWIRE_TEST_MARKERS", str(markers))
    out = tmp_path / "results"
    _write(out / "raw" / "good.json", STABLE)
    _write(out / "raw" / bench_run.REPEATS_DIR / "1" / "good.json", STABLE)
    before = _published(out)

    status = bench_run.run_matrix(out, max_time=0.01, repeats=2)

    assert status == 1
    assert sorted(p.name for p in markers.iterdir()) == ["bench_flaky.py", "bench_once.py"]
    assert _published(out) == before
    assert sorted(p.name for p in out.iterdir()) == ["raw"]  # no staging, README or kept run
    err = capsys.readouterr().err
    assert "bench_flaky.py (repeat 2 of 2) failed (exit 1); no results written" in err
    assert "bench_once.py" not in err


def test_an_unstable_run_is_not_published_over_a_stable_one(
    tiny_suites: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A busy neighbour runs all through the suite: its calibration reads other processes'
    CPU past the bound, and the stable published run stays; this one is kept aside."""
    write_suite(tiny_suites)
    monkeypatch.setattr(bench_run, "SUITES", (("bench_two.py", "two.json", True),))
    out = tmp_path / "results"
    _write(out / "raw" / "two.json", STABLE)
    before = _published(out / "raw")

    with busy_neighbour():
        status = bench_run.run_matrix(out, max_time=0.01)

    assert status == bench_run.UNSTABLE_EXIT == 3
    assert _published(out / "raw") == before
    kept = out / bench_run.UNSTABLE_DIR
    assert sorted(p.name for p in out.iterdir()) == sorted(["raw", kept.name])
    unstable = json.loads((kept / "two.json").read_text())
    assert merge.stable(unstable) is False
    assert any("other processes used" in r for r in merge.unstable_reasons(unstable))
    assert unstable["run"]["stable"] is False
    assert unstable["run"]["unstable"] == {"two.json": merge.unstable_reasons(unstable)}
    assert [b["name"] for b in unstable["benchmarks"]] == ["bench_first", "bench_second"]
    assert sorted(str(p.relative_to(kept)) for p in kept.rglob("*.json")) == [
        "repeats/1/two.json",
        "two.json",
    ]


# --- inferwire bench, the real suites, once -----------------------------------------------

SELECTED: Final = "bench_memcpy or bench_bytes_copy or (encode-tensor-image-fp32 and not wrapper)"
"""Two codec benchmarks, which make the memcpy target: nothing in the other suites."""


@pytest.fixture(scope="module")
def real_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("bench-run")
    command = [
        sys.executable,
        "-m",
        "inferwire.cli",
        "bench",
        "--out",
        str(out / "results"),
        "--repeat",
        "2",
        "--suite",
        "codecs",
        "--suite",
        "faults",
        "-k",
        SELECTED,
        "--max-time",
        "0.01",
    ]
    finished = subprocess.run(
        command,
        cwd=out,
        # without hypothesis's plugin: seconds of imports in each of the eight suite processes
        env=clean_env(PYTEST_ADDOPTS="-p no:hypothesispytest"),
        capture_output=True,
        text=True,
        timeout=TIMEOUT_S,
        check=False,
    )
    assert finished.returncode == 0, finished.stdout[-3000:] + finished.stderr[-3000:]
    (out / "stdout.txt").write_text(finished.stdout)
    return out / "results"


def test_the_command_publishes_the_merge_and_every_repeat(real_run: Path) -> None:
    raw = real_run / "raw"
    assert sorted(p.name for p in real_run.iterdir()) == ["README.md", "raw"]
    assert sorted(str(p.relative_to(raw)) for p in raw.rglob("*.json")) == [
        "codecs.json",
        "repeats/1/codecs.json",
        "repeats/2/codecs.json",
    ]
    merged = json.loads((raw / "codecs.json").read_text())
    repeats = [json.loads((raw / "repeats" / n / "codecs.json").read_text()) for n in "12"]

    assert merged["repeats"] == 2
    assert merged["run"]["repeats"] == 2
    assert merged["run"]["filter"] == SELECTED
    assert merged["run"]["suites"] == ["codecs.json"]
    printed = (real_run.parent / "stdout.txt").read_text()
    assert "bench_faults.py: nothing matches -k" in printed  # started, and kept its results
    assert "bench_transports.py" not in printed  # not one of the --suite
    names = sorted(b["name"] for b in merged["benchmarks"])
    # bench_codec[encode-tensor-image-fp32] matches -k too, but it is `standalone`: the
    # standard run leaves it to pytest --benchmark-compare
    assert names == ["bench_bytes_copy", "bench_memcpy"]
    for bench in merged["benchmarks"]:
        medians = [
            next(b for b in r["benchmarks"] if b["name"] == bench["name"])["stats"]["median"]
            for r in repeats
        ]
        assert bench["extra_info"]["repeats"]["stats.median"] == medians
        assert bench["stats"]["median"] == pytest.approx(statistics.median(medians))
        assert "data" not in bench["stats"]  # every round's time is dropped
        assert bench["extra_info"]["correct"] is True

    # each repeat's own calibration, taken at its start, middle and end
    assert merged["calibration"]["repeats"] == [r["calibration"] for r in repeats]
    for calibration in merged["calibration"]["repeats"]:
        assert [p["at"] for p in calibration["points"]] == ["start", "middle", "end"]
        assert calibration["stable"] is (not calibration["reasons"])
    assert merged["calibration"]["stable"] is all(r["calibration"]["stable"] for r in repeats)
    assert merged["run"]["stable"] is merged["calibration"]["stable"]


def test_the_command_writes_the_report_with_its_repeats(real_run: Path) -> None:
    readme = (real_run / "README.md").read_text()
    reproducibility_part = readme.split("## Reproducibility", 1)[1].split("\n## ", 1)[0]
    assert "Every suite ran 2 times" in reproducibility_part
    assert "| target | repeat 1 | repeat 2 |" in reproducibility_part
    assert "`tensor` encode of the fp32 image moves bytes near memcpy speed" in (
        reproducibility_part
    )
    machine_part = readme.split("## Machine", 1)[1]
    assert "2 repeat(s) of each suite" in machine_part
    assert "| `codecs` | 1 |" in machine_part
    assert "| `codecs` | 2 |" in machine_part


def test_a_run_of_suites_other_than_the_codecs_is_published(
    tiny_suites: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """No codec results (a -k that selected none, into a new OUT): the suites that ran are
    published, and the report waits for the codec file instead of failing after the fact."""
    write_suite(tiny_suites, calibrated=False)
    monkeypatch.setattr(bench_run, "SUITES", (("bench_two.py", "two.json", True),))
    out = tmp_path / "results"
    assert bench_run.run_matrix(out, max_time=0.01) == 0
    assert json.loads((out / "raw" / "two.json").read_text())["benchmarks"]
    assert not (out / "raw" / bench_run.REPEATS_DIR).exists()  # one repeat: its file is the merge


def test_an_unknown_suite_is_refused_before_any_runs(tmp_path: Path) -> None:
    with pytest.raises(CommandError, match="no suite nope"):
        bench_run.run_matrix(tmp_path / "out", suites=["codecs", "nope"])
    assert not (tmp_path / "out").exists()
