"""How the report shows a repeated run (``inferwire bench --repeat N``): the reproducibility
section (:mod:`inferwire.bench.report.reproducibility`), the calibration table of the machine
section (``machine.calibration_section``) and a figure's range over the repeats
(:mod:`inferwire.bench.report.spread`), on constructed files and fake row functions.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from inferwire.bench.report import machine, reproducibility, spread
from inferwire.bench.report.results import REPEATS_DIR
from inferwire.bench.runner import merge
from tests.bench.bench_run_helpers import result_file


def _write(path: Path, document: dict[str, Any]) -> None:
    path.write_text(json.dumps(document))


def _repeat_dirs(raw: Path, count: int) -> None:
    for n in range(1, count + 1):
        (raw / REPEATS_DIR / str(n)).mkdir(parents=True)


def _target(name: str, figure: str, verdict: str) -> list[str]:
    return [name, "paired ratio", figure, "<= 1.5x", verdict]


class _Judged:
    """Fake row functions: each repeat directory's rows, by its number."""

    def __init__(self, by_repeat: dict[str, list[list[str]]]) -> None:
        self.by_repeat = by_repeat
        self.asked: list[str] = []

    def __call__(self, raw_dir: Path) -> list[list[str]]:
        self.asked.append(raw_dir.name)
        return self.by_repeat.get(raw_dir.name, [])


def _claim(name: str, verdict: str) -> list[str]:
    return [name, "what it says", verdict]


def test_identical_verdicts_read_n_of_n(tmp_path: Path) -> None:
    _repeat_dirs(tmp_path, 3)
    targets = _Judged(
        {
            n: [_target("T1", f, "met"), _target("T2", "2.00x", "**missed**")]
            for n, f in (("1", "1.00x"), ("2", "1.05x"), ("3", "0.95x"))
        }
    )
    claims = _Judged({n: [_claim("C1", "holds"), _claim("C2", "**refuted**")] for n in "123"})
    published_targets = [_target("T1", "1.00x (0.95x-1.05x)", "met"), _target("T2", "2.00x", "x")]
    published_claims = [_claim("C1", "holds"), _claim("C2", "refuted")]

    text = reproducibility.section(tmp_path, published_targets, targets, published_claims, claims)

    assert targets.asked == claims.asked == ["1", "2", "3"]
    assert text.startswith("## Reproducibility")
    assert "Targets: 2 of 2 have the same verdict in all 3 repeats" in text
    assert "every figure is within 10% of its median over the repeats" in text
    assert "(largest deviation 5.0%: T1)" in text
    assert "Claims: 2 of 2 have the same verdict in every repeat." in text
    assert "| T1 | met, 1.00x | met, 1.05x | met, 0.95x | met | 5.0% |" in text
    assert "| C1 | holds | 3 of 3 |  |" in text
    assert "| C2 | refuted | 3 of 3 |  |" in text


def test_a_verdict_that_flips_is_counted_and_shown(tmp_path: Path) -> None:
    _repeat_dirs(tmp_path, 3)
    targets = _Judged(
        {
            "1": [_target("T1", "1.40x", "met"), _target("T2", "1.00x", "met")],
            "2": [_target("T1", "1.60x", "**missed**"), _target("T2", "1.00x", "met")],
            "3": [_target("T1", "1.45x", "met")],  # T2 not measured
        }
    )
    claims = _Judged({"1": [_claim("C1", "holds")], "2": [_claim("C1", "**refuted**")], "3": []})

    text = reproducibility.section(
        tmp_path,
        [_target("T1", "1.45x", "met"), _target("T2", "1.00x", "met")],
        targets,
        [_claim("C1", "holds")],
        claims,
    )

    assert "Targets: 0 of 2 have the same verdict in all 3 repeats" in text
    assert "| T1 | met, 1.40x | missed, 1.60x | met, 1.45x | met | 10.3% |" in text
    assert "| T2 | met, 1.00x | met, 1.00x | not measured | met | 0.0% |" in text
    assert "the largest deviation from a median is 10.3% (T1), past the 10%" in text
    assert "Claims: 0 of 1 have the same verdict in every repeat." in text
    assert "| C1 | holds | 1 of 3 | repeat 2: refuted; repeat 3: not measured |" in text


def test_the_deviation_is_of_the_first_number_of_the_figure(tmp_path: Path) -> None:
    _repeat_dirs(tmp_path, 3)
    rates = {"1": "1,000", "2": "1,200", "3": "1,100"}
    targets = _Judged(
        {n: [_target("rate", f"{r} req/s, P99 lag 0.30 ms", "met")] for n, r in rates.items()}
    )
    text = reproducibility.section(
        tmp_path, [_target("rate", "1,100 req/s", "met")], targets, [], _Judged({})
    )
    assert "| 9.1% |" in text  # (1,200 - 1,100) / 1,100, the lag ignored
    assert reproducibility.first_number("1.47x (1.44x-1.52x)") == 1.47
    assert reproducibility.first_number("-3.5% of it") == -3.5
    assert reproducibility.first_number("no figure") is None


def test_the_what_to_use_answers_are_counted_when_given(tmp_path: Path) -> None:
    _repeat_dirs(tmp_path, 2)
    nothing = _Judged({})
    answers = _Judged(
        {
            "1": [["stream, browser", "http1 orjson"], ["tensors, hop", "grpc tensor"]],
            "2": [["stream, browser", "http1 orjson"], ["tensors, hop", "http2 tensor"]],
        }
    )
    published = [["stream, browser", "http1 orjson"], ["tensors, hop", "grpc tensor"]]

    text = reproducibility.section(tmp_path, [], nothing, [], nothing, published, answers)
    assert "What to use: 1 of 2 answers are the same in every repeat." in text
    # and which answer differs, in which repeat
    assert "| tensors, hop | grpc tensor | 1 of 2 | repeat 2: http2 tensor |" in text
    assert "| stream, browser | http1 orjson | 2 of 2 |  |" in text
    without = reproducibility.section(tmp_path, [], nothing, [], nothing)
    assert "What to use" not in without


def test_fewer_than_two_repeats_have_no_section(tmp_path: Path) -> None:
    every = _Judged({"1": [_target("T1", "1.00x", "met")]})
    assert reproducibility.section(tmp_path, [], every, [], every) == ""
    _repeat_dirs(tmp_path, 1)
    assert reproducibility.section(tmp_path, [_target("T1", "1x", "met")], every, [], every) == ""
    assert every.asked == []


def test_repeat_directories_are_in_numeric_order(tmp_path: Path) -> None:
    for name in ("10", "2", "1", "notes"):
        (tmp_path / REPEATS_DIR / name).mkdir(parents=True)
    (tmp_path / REPEATS_DIR / "3").write_text("a file, not a repeat")
    assert [p.name for p in reproducibility.repeat_dirs(tmp_path)] == ["1", "2", "10"]


def _suite_calibration(
    stable: bool, *reasons: str, cpu_ms: tuple[float, ...] = (20, 22, 21)
) -> dict[str, Any]:
    return {
        "points": [
            {
                "at": at,
                "time": "2026-01-01T00:00:00+00:00",
                "cpu_s": ms / 1e3,
                "memory_s": 0.0105,
                "load_average": [1.25, 1.0, 0.5],
            }
            for at, ms in zip(("start", "middle", "end"), cpu_ms, strict=False)
        ],
        "cpu_moved": max(cpu_ms) / min(cpu_ms) - 1,
        "memory_moved": 0.0,
        "others_cpu_share": 0.04,
        "steal_share": 0.001,
        "bounds": {"moved": 0.1, "others_cpu_share": 0.1, "steal_share": 0.05},
        "stable": stable,
        "reasons": list(reasons),
    }


def test_the_calibration_section_has_a_row_per_suite_and_repeat(tmp_path: Path) -> None:
    unstable = _suite_calibration(False, "other processes used 25.0% of the CPUs", cpu_ms=(20, 25))
    _write(
        tmp_path / "codecs.json",
        merge.merge(
            [
                result_file([], _suite_calibration(True)),
                result_file([], unstable),
            ]
        ),
    )
    _write(tmp_path / "transports.json", result_file([], _suite_calibration(True)))
    _write(tmp_path / "load-agreement.json", {"rows": []})  # no calibration: not a suite's run
    (tmp_path / "broken.json").write_text("{")

    text = machine.calibration_section(tmp_path)

    rows = [line for line in text.splitlines() if line.startswith("| `")]
    assert rows == [
        "| `codecs` | 1 | 20.0 / 22.0 / 21.0 | 10.5 / 10.5 / 10.5 (64 MiB) | 10% / 0% | 4% | 0.1% "
        "| 1.2 / 1.2 / 1.2 | stable |",
        "| `codecs` | 2 | 20.0 / 25.0 | 10.5 / 10.5 (64 MiB) | 25% / 0% | 4% | 0.1% | 1.2 / 1.2 "
        "| **unstable** |",
        "| `transports` | 1 | 20.0 / 22.0 / 21.0 | 10.5 / 10.5 / 10.5 (64 MiB) | 10% / 0% | 4% "
        "| 0.1% | 1.2 / 1.2 / 1.2 | stable |",
    ]
    assert (
        "1 of 3 suite runs were **unstable**: `codecs` repeat 2: other processes used 25.0% of "
        "the CPUs." in text
    )
    assert "when others used more than 10% or steal passed 5%" in text
    # 25% is past the bound; 22 / 20 ms is 10% and a rounding past it
    assert "drifted past 10% in 3 of 3 suite runs" in text
    assert "the *cpu* workload took 20.0 to 25.0 ms" in text


def test_a_steady_run_says_so_and_an_old_run_has_no_calibration_section(tmp_path: Path) -> None:
    assert machine.calibration_section(tmp_path) == ""
    _write(tmp_path / "codecs.json", result_file([]))
    assert machine.calibration_section(tmp_path) == ""
    assert machine.machine_section(result_file([]), tmp_path).startswith("- run: ")
    _write(tmp_path / "codecs.json", result_file([], _suite_calibration(True)))
    text = machine.machine_section(result_file([]), tmp_path)
    assert "Stable by these bounds: all 1 suite runs." in text
    assert "| **unstable** |" not in text


@pytest.mark.parametrize(
    ("info", "expected"),
    [
        ({}, "1.47x"),
        ({"repeats": {}}, "1.47x"),
        ({"repeats": {"vs_tcp": [1.5]}}, "1.47x"),
        ({"repeats": {"vs_tcp": [1.52, 1.44, 1.47]}}, "1.47x (1.44x-1.52x)"),
        ({"repeats": {"vs_tcp": [1.4, 1.5]}}, "1.47x (1.40x-1.50x)"),
        ({"repeats": {"other": [1.0, 2.0]}}, "1.47x"),
    ],
)
def test_a_cell_shows_a_range_only_over_two_or_more_repeats(
    info: dict[str, Any], expected: str
) -> None:
    assert spread.cell(info, "vs_tcp", 1.47, "{:.2f}x".format) == expected


def test_relative_range() -> None:
    assert spread.relative_range([1.0, 1.2, 1.1], 1.1) == pytest.approx(0.2 / 1.1)
    assert spread.relative_range([1.0], 1.0) == 0.0
    assert spread.relative_range([1.0, 2.0], 0.0) == 0.0
