"""The codecs report's target row for the float32 delta stream (``bench/report/codecs.py``):
its bytes against OpenAI's SSE, with the wire format the target was set against and without."""

from __future__ import annotations

import inferwire.codecs as ic
from inferwire import workloads
from inferwire.bench.report import codecs as report_codecs
from inferwire.bench.report.results import Result
from tests.codecs.test_delta_f32 import encode, encode_both


def _encode_result(codec: str, wire_bytes: int) -> Result:
    return Result(
        codec=codec,
        workload=report_codecs.DELTA_F32_WORKLOAD,
        op="encode",
        median_s=1e-3,
        iqr_s=1e-4,
        rounds=9,
        wire_bytes=wire_bytes,
        messages=256,
        correct=True,
    )


def test_the_report_holds_the_float32_stream_to_8_percent_of_openai_sse() -> None:
    chunks = [
        c
        for c in workloads.get(report_codecs.DELTA_F32_WORKLOAD).messages()
        if isinstance(c, ic.TokenChunk)
    ]
    json_bytes = len(encode(ic.get("json", extensions=True), chunks))
    delta_bytes = len(encode_both(chunks))
    rows = report_codecs.target_rows(
        [_encode_result("delta", delta_bytes), _encode_result("json", json_bytes)]
    )
    (row,) = [r for r in rows if report_codecs.DELTA_F32_WORKLOAD in r[0]]
    assert row[1] == f"{delta_bytes:,} B vs {json_bytes:,} B"
    assert row[3:] == ["<= 8%", "met"]
    # format 0 (doubles and long decimals) is what the target was set against
    v2_bytes = len(encode_both(chunks, v2=True))
    rows = report_codecs.target_rows(
        [_encode_result("delta", v2_bytes), _encode_result("json", json_bytes)]
    )
    (row,) = [r for r in rows if report_codecs.DELTA_F32_WORKLOAD in r[0]]
    assert row[3:] == ["<= 8%", "**missed**"]
    assert not [r for r in report_codecs.target_rows([]) if "f32" in r[0]]
