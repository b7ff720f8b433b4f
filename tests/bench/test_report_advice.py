"""The "what should I use?" summary: fixed rules over the figures of a run, nothing else.

Each test writes the raw files of a small made-up run (the layout the suites write) and reads
the answer the report gives for it."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from inferwire.bench.report import advice

CODECS = {
    # codec: (encode s, decode s, wire bytes)
    "json": (10e-6, 20e-6, 1000),
    "orjson": (2e-6, 12e-6, 1000),
    "msgspec-json": (2.1e-6, 10e-6, 1000),
    "protobuf": (3e-6, 9e-6, 400),
    "delta": (0.5e-6, 1e-6, 60),
}


def _interleaved(workload: str, op: str, codecs: dict[str, tuple[float, float, int]]) -> Any:
    index = 0 if op == "encode" else 1
    json_s = codecs["json"][index]
    return {
        "name": f"bench_codec_interleaved[{workload}-{op}]",
        "fullname": f"bench_codec_interleaved[{workload}-{op}]",
        "stats": {"median": sum(c[index] for c in codecs.values()), "iqr": 0.0},
        "extra_info": {
            "workload": workload,
            "op": op,
            "codecs": {
                name: {"median_s": c[index], "iqr_s": 0.0, "wire_bytes": c[2], "correct": True}
                for name, c in codecs.items()
            },
            "vs_json": {name: json_s / c[index] for name, c in codecs.items()},
        },
    }


def _transport(transport: str, codec: str, op: str, vs_tcp: float) -> Any:
    return {
        "name": f"bench_{op}[{transport}-{codec}]",
        "fullname": f"bench_{op}[{transport}-{codec}]",
        "stats": {"median": 1e-3, "iqr": 0.0},
        "extra_info": {"transport": transport, "codec": codec, "op": op, "vs_tcp": vs_tcp},
    }


def _write(raw_dir: Path, name: str, benchmarks: list[Any]) -> None:
    raw_dir.mkdir(parents=True, exist_ok=True)
    (raw_dir / name).write_text(json.dumps({"benchmarks": benchmarks}))


def _run(raw_dir: Path, codecs: dict[str, tuple[float, float, int]] = CODECS) -> None:
    _write(
        raw_dir,
        "codecs.json",
        [
            _interleaved(workload, op, codecs)
            for workload in ("stream-256", "stream-256-top5")
            for op in ("encode", "decode")
        ],
    )
    _write(
        raw_dir,
        "transports.json",
        [
            _transport("http1", "delta", "stream", 1.05),
            _transport("http2", "delta", "stream", 2.4),
            _transport("grpc", "delta", "stream", 20.0),
        ],
    )


def _answers(raw_dir: Path) -> dict[tuple[str, str], list[str]]:
    return {(row[0], row[1]): row for row in advice.rows(raw_dir)}


def test_a_browser_gets_the_fastest_json_encoder_and_its_margin(tmp_path: Path) -> None:
    _run(tmp_path)
    row = _answers(tmp_path)[("token stream", "browser or OpenAI SDK")]
    # orjson encodes 5.0x faster than json, msgspec-json 4.8x: within 10%, named beside it
    assert row[2] == "`orjson` (`msgspec-json` within 10%) over `http1`"
    assert row[3].startswith("5.0x faster server encode than `json`")


def test_service_to_service_weighs_encode_and_decode_and_picks_a_transport(
    tmp_path: Path,
) -> None:
    _run(tmp_path)
    row = _answers(tmp_path)[("token stream", "service to service")]
    # delta: (10 + 20) / (0.5 + 1) = 20x the round trip of json; 6% of its bytes
    assert row[2].startswith("`delta`; `http1`: 1.05x `tcp` per token")
    assert row[3] == "encode + decode 20.0x faster than `json`, 6% of its bytes"


def test_a_long_round_trip_gets_the_fewest_bytes(tmp_path: Path) -> None:
    _run(tmp_path)
    row = _answers(tmp_path)[("token stream with top-5 logprobs", "long round trip")]
    assert row[2] == "`delta` (fewest bytes), one stream per response"
    assert row[3].startswith("6% of `json`'s bytes")


def test_the_answer_follows_the_figures(tmp_path: Path) -> None:
    slower = {**CODECS, "delta": (8e-6, 18e-6, 60), "msgspec-json": (2.1e-6, 14e-6, 1000)}
    _run(tmp_path, slower)
    row = _answers(tmp_path)[("token stream", "service to service")]
    assert row[2].startswith("`protobuf`;")  # (10 + 20) / (3 + 9) = 2.5x, delta only 1.15x


def test_a_draw_is_settled_by_the_registry_order_not_by_the_run(tmp_path: Path) -> None:
    """orjson and msgspec-json within 10% of each other: whichever is faster in a run, the
    answer is the same (the first of them in the registry), the other named beside it."""
    for msgspec_encode_s in (1.9e-6, 2.1e-6):
        _run(tmp_path, {**CODECS, "msgspec-json": (msgspec_encode_s, 10e-6, 1000)})
        row = _answers(tmp_path)[("token stream", "browser or OpenAI SDK")]
        assert row[2] == "`orjson` (`msgspec-json` within 10%) over `http1`"
    assert advice.verdict_rows(tmp_path)[0] == ["token stream, browser or OpenAI SDK", "`orjson`"]


def test_a_payload_the_run_did_not_measure_gets_no_answer(tmp_path: Path) -> None:
    _run(tmp_path)
    payloads = {payload for payload, _ in _answers(tmp_path)}
    assert payloads == {"token stream", "token stream with top-5 logprobs"}
    assert advice.rows(tmp_path / "empty") == []
    assert advice.section(tmp_path / "empty") == ""


def test_the_section_states_its_rules_and_every_row(tmp_path: Path) -> None:
    _run(tmp_path)
    text = advice.section(tmp_path)
    assert text.startswith("## What should I use?")
    assert "bench/report/advice.py" in text
    assert text.count("| token stream") == 6
