"""``python -m inferwire.bench.report.rerun``: a second run's targets, claims and advice beside
the published run's, judged by the report's own functions from each run's raw files."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from inferwire.bench.report import reproducibility, rerun
from inferwire.bench.report.results import CODECS_RAW


def _target(name: str, figure: str, verdict: str = "met") -> list[str]:
    return [name, "paired ratio", figure, "<= 1.5x", verdict]


@pytest.mark.parametrize(
    ("published", "other", "ratio", "past"),
    [
        ("1.00x (0.95x-1.05x)", "1.05x", 1.05, False),
        ("1.00x", "1.12x (1.10x-1.13x)", 1.12, True),
        ("1.00x", "0.89x", 0.89, True),
        ("1.00x", "1.10x", 1.10, False),  # at the tolerance: within
        # a cell's rounding is no change: 0.08x and 0.09x may be 0.0849 and 0.0851
        ("0.08x", "0.09x", 0.09 / 0.08, False),
        ("0.08x", "0.10x", 0.10 / 0.08, True),  # 0.095 / 0.085 at least: 1.12x
        ("5,051 req/s, P99 lag 0.13 ms", "4,500 req/s, P99 lag 0.13 ms", 4500 / 5051, True),
        ("4.5%", "4.6%", 4.6 / 4.5, False),
    ],
)
def test_a_figure_is_marked_only_past_the_tolerance_beyond_rounding(
    published: str, other: str, ratio: float, past: bool
) -> None:
    (found,) = rerun.targets([_target("T", published)], [_target("T", other)])
    assert found.ratio == pytest.approx(ratio)
    assert found.past_tolerance is past
    assert found.same_verdict


def test_targets_pair_by_name_and_count_what_differs() -> None:
    published = [
        _target("same", "1.21x (1.20x-1.22x)"),
        _target("flips", "1.19x", "met"),
        _target("moves", "2.00x"),
        _target("gone", "1.00x"),
    ]
    other = [
        _target("moves", "2.40x"),
        _target("flips", "1.21x", "**missed**"),
        _target("same", "1.22x"),
        _target("new", "3.00x"),
    ]
    found = rerun.targets(published, other)
    assert [t.name for t in found] == ["same", "flips", "moves", "gone", "new"]
    by_name = {t.name: t for t in found}
    assert not by_name["flips"].same_verdict
    assert not by_name["gone"].same_verdict
    assert by_name["gone"].ratio is None
    assert rerun.Target.cell(by_name["gone"].other) == "not measured"
    assert rerun.Target.cell(by_name["flips"].other) == "missed 1.21x"

    summary = rerun.summary(found, [], [])
    assert summary[0] == (
        "targets: 2/5 same verdict, 2/3 ratios within 10%; worst: moves 1.20x "
        "(met 2.00x -> met 2.40x)"
    )
    text = rerun.text(found, [], [])
    assert " !   1.20x  met 2.00x" in text
    assert "?    1.02x  met 1.19x" in text


def test_claims_and_answers_compare_their_verdicts() -> None:
    claims = rerun.verdicts(
        [["C1", "...", "holds"], ["C2", "...", "**does not hold**"], ["C3", "...", "holds"]],
        [["C1", "...", "holds"], ["C2", "...", "does not hold"], ["C3", "...", "holds only"]],
    )
    answers = rerun.verdicts(
        [["tensor, hop", "`flatbuffers` over `http1`"]],
        [["tensor, hop", "`tensor` over `http1`"]],
    )
    assert [c.same for c in claims] == [True, True, False]
    summary = rerun.summary([], claims, answers)
    assert summary[1:] == ["claims: 2/3 same verdict", "advice: 0/1 same choice"]
    text = rerun.text([], claims, answers)
    assert "claims differs: C3: holds -> holds only" in text
    assert (
        "advice differs: tensor, hop: `flatbuffers` over `http1` -> `tensor` over `http1`" in text
    )


def _codecs(delta_bytes: int) -> dict[str, Any]:
    """A run's ``codecs.json``: the encode and decode of the token-stream workloads that the
    delta bytes target, claim C3 and "What should I use?" read, and a FlatBuffers encode
    target."""
    interleaved = [
        {
            "name": f"bench_codecs_interleaved[{workload}-{op}]",
            "stats": {"median": 1e-3, "iqr": 0.0},
            "extra_info": {
                "workload": workload,
                "op": op,
                "messages": 256,
                "rounds": 9,
                "codecs": {
                    codec: {"median_s": s, "iqr_s": 0.0, "wire_bytes": b, "correct": True}
                    for codec, s, b in (
                        ("json", 10e-6, 10_000),
                        ("orjson", 2e-6, 10_000),
                        ("delta", 1e-6, delta_bytes),
                    )
                },
                "vs_json": {"json": 1.0, "orjson": 5.0, "delta": 5.0},
            },
        }
        for workload in ("stream-256", "stream-256-top5")
        for op in ("encode", "decode")
    ]
    target = {
        "name": "bench_flatbuffers_encode[stream-256-protobuf]",
        "stats": {"median": 1e-4, "iqr": 1e-6, "rounds": 21},
        "extra_info": {
            "codec": "flatbuffers",
            "workload": "stream-256",
            "op": "encode-vs-protobuf",
            "wire_bytes": 100,
            "messages": 256,
            "correct": True,
            "paired_ratio": 1.2,
            "upb_paired_ratio": 0.2,
        },
    }
    return {"benchmarks": [*interleaved, target], "machine_info": {}}


def _run(root: Path, delta_bytes: int) -> Path:
    raw = root / "raw"
    raw.mkdir(parents=True)
    (raw / CODECS_RAW).write_text(json.dumps(_codecs(delta_bytes)))
    return root


def test_the_command_compares_two_runs_from_their_raw_files(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    published = _run(tmp_path / "published", 600)
    other = _run(tmp_path / "other", 700)
    out = tmp_path / "rerun.md"

    assert rerun.main([str(published), str(other), "--out", str(out)]) == 0

    printed = capsys.readouterr().out
    # 700 B against 600 B of json's 10,000: 7.0% against 6.0% of its bytes
    row = next(line for line in printed.splitlines() if "SSE (`stream-256`)" in line)
    assert row.startswith(" !   1.17x  met 6.0%")
    assert "met 7.0%" in row
    assert printed.startswith("targets: other / published")
    assert "ratios within 10%; worst: `delta` stream bytes, header included" in printed
    assert "claims: " in printed
    assert "advice: " in printed
    page = out.read_text()
    assert page.startswith("# A second run beside the published one")
    assert "| met 6.0% | met 7.0% | 1.17x | past 10% |" in page


def test_a_run_against_itself_is_the_same_everywhere(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    published = _run(tmp_path / "published", 600)
    assert rerun.main([str(published), str(published / "raw")]) == 0
    summary = capsys.readouterr().out.strip().splitlines()[-3:]
    targets, claims, answers = summary
    count = targets.split()[1]
    assert count.split("/")[0] == count.split("/")[1]
    assert f"{count} same verdict, {count} ratios within 10%" in targets
    for line in (claims, answers):
        same, total = line.split()[1].split("/")
        assert same == total


def test_a_missing_run_is_exit_2_with_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    published = _run(tmp_path / "published", 600)
    assert rerun.main([str(published), str(tmp_path / "nowhere")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1
    assert "nowhere" in err


def test_a_cells_rounding_is_half_a_unit_of_its_last_digit() -> None:
    assert reproducibility.rounding("0.09x (0.08x-0.09x)") == pytest.approx(0.005)
    assert reproducibility.rounding("1.021x") == pytest.approx(0.0005)
    assert reproducibility.rounding("5,051 req/s, P99 lag 0.13 ms") == 0.5
    assert reproducibility.rounding("no figure") == 0.0
