"""The FlatBuffers encode targets and the finding beside them (bench/report/flatbuffers_encode.py):
token chunks are judged against protobuf as users get it (upb's messages); the comparison with
inferwire's compiled protobuf is a finding whose figures come from the run's raw JSON."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest

from inferwire.bench.measure import codec_ops
from inferwire.bench.report import flatbuffers_encode
from inferwire.bench.report.results import CODECS_RAW, Result, codec_results

SCHEMA = Path(__file__).resolve().parents[2] / flatbuffers_encode.SCHEMA


def _record(
    workload: str,
    baseline: str,
    ratio: float,
    *,
    upb: float | None = None,
    bytes_per_chunk: dict[str, int] | None = None,
) -> dict[str, Any]:
    """``bench_flatbuffers_encode``'s record, as a run of three repeats writes it."""
    messages = 256 if workload.startswith("stream") else 1
    info: dict[str, Any] = {
        "codec": "flatbuffers",
        "workload": workload,
        "op": f"encode-vs-{baseline}",
        "wire_bytes": 100,
        "messages": messages,
        "correct": True,
        "baseline": baseline,
        "paired_ratio": ratio,
        "upb_paired_ratio": upb,
        "repeats": {"paired_ratio": [ratio * 0.99, ratio, ratio * 1.01]},
    }
    if upb is not None:
        info["repeats"]["upb_paired_ratio"] = [upb, upb, upb * 1.02]
    if bytes_per_chunk is not None:
        info["wire_bytes_by_codec"] = {c: b * messages for c, b in bytes_per_chunk.items()}
    return {
        "name": f"bench_flatbuffers_encode[{workload}-{baseline}]",
        "extra_info": info,
        "stats": {"median": 256e-6, "iqr": 1e-6, "rounds": 21},
    }


def _results(tmp_path: Path, benchmarks: list[dict[str, Any]]) -> list[Result]:
    path = tmp_path / CODECS_RAW
    path.write_text(json.dumps({"benchmarks": benchmarks, "machine_info": {}}))
    return codec_results(path)[0]


def _rows(tmp_path: Path, benchmarks: list[dict[str, Any]]) -> dict[str, list[str]]:
    return {row[0]: row for row in flatbuffers_encode.target_rows(_results(tmp_path, benchmarks))}


def test_the_variant_is_named_as_the_benchmarks_name_it() -> None:
    assert flatbuffers_encode.PROTOBUF_UPB == codec_ops.PROTOBUF_UPB


@pytest.mark.parametrize(
    ("compiled", "upb", "verdict"),
    [
        (1.4, 0.2, "met"),  # slower than inferwire's compiled protobuf: not what is judged
        (0.5, 1.3, "**missed**"),  # faster than the compiled path, slower than upb's
    ],
)
def test_a_token_chunk_target_is_judged_against_protobuf_through_upb(
    tmp_path: Path, compiled: float, upb: float, verdict: str
) -> None:
    rows = _rows(tmp_path, [_record("stream-256", "protobuf", compiled, upb=upb)])
    (row,) = rows.values()
    assert row[0] == (
        "`flatbuffers` encode <= `protobuf` encode as users get it (upb's messages), per chunk "
        "(`stream-256`)"
    )
    assert row[1].startswith("1.00 us per chunk; paired ratio flatbuffers / `protobuf (upb)`")
    assert row[2] == f"{upb:.2f}x ({upb:.2f}x-{upb * 1.02:.2f}x)"
    assert row[3:] == ["<= 1x", verdict]


def test_tensor_messages_and_runs_without_the_upb_reading_keep_the_baseline_as_it_runs(
    tmp_path: Path,
) -> None:
    rows = _rows(
        tmp_path,
        [_record("image-fp32", "tensor", 1.2), _record("stream-256", "protobuf", 0.3)],
    )
    tensor = rows["`flatbuffers` encode <= `tensor` encode, per message (`image-fp32`)"]
    chunk = rows["`flatbuffers` encode <= `protobuf` encode, per chunk (`stream-256`)"]
    assert tensor[1] == "256.00 us per message; paired ratio flatbuffers / tensor"
    assert tensor[2].startswith("1.20x")
    assert tensor[4] == "**missed**"
    assert chunk[2].startswith("0.30x")
    assert chunk[4] == "met"


@pytest.mark.parametrize(
    ("ratios", "fb_bytes", "pb_bytes", "span"),
    [
        ((1.21, 1.39), (194, 434), (94, 197), "1.21-1.39x"),
        ((1.6, 1.05), (300, 500), (100, 250), "1.05-1.60x"),
        ((1.3, 1.3), (200, 400), (100, 200), "1.30x"),
    ],
)
def test_the_compiled_comparison_is_a_finding_with_the_runs_figures(
    tmp_path: Path,
    ratios: tuple[float, float],
    fb_bytes: tuple[int, int],
    pb_bytes: tuple[int, int],
    span: str,
) -> None:
    workloads = ("stream-256", "stream-256-top5")
    results = _results(
        tmp_path,
        [
            _record(
                workload,
                "protobuf",
                ratio,
                upb=0.2,
                bytes_per_chunk={"flatbuffers": fb, "protobuf": pb, "protobuf (upb)": pb},
            )
            for workload, ratio, fb, pb in zip(workloads, ratios, fb_bytes, pb_bytes, strict=True)
        ]
        + [_record("image-fp32", "protobuf", 3.0)],  # not a token chunk: not in the finding
    )
    text = flatbuffers_encode.finding(results)
    assert f"FlatBuffers' format costs {span} protobuf's to encode per token chunk" in text
    for workload, ratio, fb, pb in zip(workloads, ratios, fb_bytes, pb_bytes, strict=True):
        assert f"`{workload}` {ratio:.2f}x (" in text
        assert f"{fb} vs {pb} bytes per chunk" in text
    assert "image-fp32" not in text
    assert "3.00x" not in text
    # the chunks' targets read upb's path (0.2x): met, however slow the compiled comparison
    chunk_rows = [r for r in flatbuffers_encode.target_rows(results) if "per chunk" in r[0]]
    assert [r[4] for r in chunk_rows] == ["met", "met"]


def test_the_findings_bytes_fall_back_to_the_codec_tables(tmp_path: Path) -> None:
    """A run from before the record kept each codec's bytes: the codec tables' encode."""
    encode = {
        "name": "bench_codecs_interleaved[stream-256-encode]",
        "extra_info": {
            "workload": "stream-256",
            "op": "encode",
            "messages": 256,
            "rounds": 9,
            "codecs": {
                codec: {"median_s": 1e-4, "iqr_s": 1e-5, "wire_bytes": b, "correct": True}
                for codec, b in (("protobuf", 94 * 256), ("flatbuffers", 194 * 256))
            },
            "vs_json": {},
        },
    }
    results = _results(tmp_path, [encode, _record("stream-256", "protobuf", 1.2, upb=0.2)])
    assert "194 vs 94 bytes per chunk" in flatbuffers_encode.finding(results)


def test_no_finding_without_the_compiled_comparison(tmp_path: Path) -> None:
    results = _results(tmp_path, [_record("stream-256", "protobuf", 1.2)])
    assert flatbuffers_encode.finding(results) == ""
    assert flatbuffers_encode.finding([]) == ""


def test_the_causes_the_finding_names_are_in_the_schema() -> None:
    """Two vtables and the union envelope: a chunk is a union member of the root Envelope
    table; padding: 8-byte scalars beside 4-byte offsets."""
    schema = SCHEMA.read_text()  # the file the finding cites
    assert re.search(r"union Payload \{[^}]*\bTokenChunk\b", schema)
    assert re.search(r"table Envelope \{\s*payload: Payload;\s*\}", schema)
    assert "root_type Envelope;" in schema
    chunk = re.search(r"table TokenChunk \{([^}]*)\}", schema)
    assert chunk is not None
    assert "created: int64;" in chunk.group(1)
    assert "seq: uint64;" in chunk.group(1)
