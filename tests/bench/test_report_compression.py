"""The report's compression section: printed only when the run has its raw file."""

from __future__ import annotations

from pathlib import Path

import orjson

from inferwire.bench.report import compression as section
from inferwire.bench.report.results import COMPRESSION_RAW


def test_the_report_section_is_there_only_with_its_raw_file(tmp_path: Path) -> None:
    assert section.section(tmp_path) == ""
    figures = {
        "bytes_per_token": 14.4,
        "vs_identity_bytes": 0.06,
        "encode_us_per_token": 4.0,
        "decode_us_per_token": 3.0,
        "correct": True,
    }
    info = {"op": "compression-codecs", "codec": "orjson", "codings": {"gzip": figures}}
    (tmp_path / COMPRESSION_RAW).write_text(
        orjson.dumps({"benchmarks": [{"extra_info": info}]}).decode()
    )
    text = section.section(tmp_path)
    assert (
        "| `orjson` stream, one chunk a write | `gzip` | 14.4 | 0.06x | 4.00 | 3.00 | yes |" in text
    )
