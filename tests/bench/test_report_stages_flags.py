"""The report's stage tables never print a stage below zero as a duration: such a cell (a
broken run's: each stage is a difference of stamps in causal order) is printed flagged and
named under its table, and records of the older stage definitions are left out, with a line
that says so."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from inferwire.bench.report import stages
from inferwire.bench.report.results import STAGES_RAW
from inferwire.transports.timing import REQUEST_STAGES

CHUNK = ("serialize", "network", "parse", "end_to_end", "write")


def _record(codec: str, **overrides: dict[str, float]) -> dict[str, Any]:
    record: dict[str, Any] = {
        "transport": "tcp",
        "codec": codec,
        "op": "stages",
        "workload": "stream-256",
        "decode_ms": 1.0,
        "chunks": 256,
        "streams": 3,
        "warmup_streams": 1,
        "pooled_chunks": 768,
        "stages_us": dict.fromkeys(CHUNK, 10.0),
        "stages_p90_us": dict.fromkeys(CHUNK, 20.0),
        "shares": {"serialize_parse": 0.1},
        "requests": 40,
        "warmup_requests": 5,
        "request_tokens": 4,
        "idle_gap_ms": 10.0,
        "request_stages_us": dict.fromkeys(REQUEST_STAGES, 30.0),
        "request_stages_p90_us": dict.fromkeys(REQUEST_STAGES, 40.0),
        "correct": True,
    }
    for key, values in overrides.items():
        record[key] = {**record[key], **values}
    return record


def _section(tmp_path: Path, *records: dict[str, Any]) -> str:
    benchmarks = [{"extra_info": r, "stats": {"median": 1.0, "iqr": 0.1}} for r in records]
    (tmp_path / STAGES_RAW).write_text(json.dumps({"benchmarks": benchmarks}))
    return stages.section(tmp_path)


def _row(text: str, codec: str) -> str:
    return next(line for line in text.splitlines() if line.startswith(f"| `tcp` | `{codec}` |"))


def test_a_clean_run_prints_plain_durations(tmp_path: Path) -> None:
    text = _section(tmp_path, _record("orjson"))
    assert "**below zero" not in text
    assert "**Below zero" not in text
    assert "older run" not in text


@pytest.mark.parametrize(
    ("key", "stage", "table"),
    [
        ("request_stages_us", "network back", "### One request"),
        ("request_stages_p90_us", "network to server", "### One request"),
        ("stages_us", "network", "## Per-stage time"),
    ],
)
def test_a_stage_below_zero_is_flagged_and_named(
    tmp_path: Path, key: str, stage: str, table: str
) -> None:
    text = _section(tmp_path, _record("orjson", **{key: {stage: -27.4}}), _record("delta"))
    request_part = text.index("### One request")
    part = text[request_part:] if table == "### One request" else text[:request_part]
    row = _row(part, "orjson")
    cells = [cell.strip() for cell in row.strip("|").split("|")]
    flagged = [cell for cell in cells if "-27.4" in cell]
    assert len(flagged) == 1
    assert flagged[0].startswith("**below zero: ")
    assert flagged[0].endswith("**")
    assert "**below zero" not in _row(part, "delta")  # the other row is untouched
    assert f"**Below zero, so not a duration:** `tcp`/`orjson` {stage}." in part


def test_a_record_of_the_older_definitions_is_left_out(tmp_path: Path) -> None:
    old_names = [n for n in REQUEST_STAGES if n != "client dispatch"] + ["write"]
    old = _record("protobuf")
    old["request_stages_us"] = {name: -27.4 for name in old_names}
    text = _section(tmp_path, _record("orjson"), old)
    assert "`protobuf`" not in text
    assert "-27.4" not in text
    assert "1 cell of an older run left out" in text
    assert [p.name for p in stages.plot(tmp_path, tmp_path / "out")] == [
        "stages.png",
        "request_stages.png",
    ]
