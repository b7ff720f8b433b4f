"""The report's serving section, its target rows and its "what should I use?" row, from the
raw file of a small made-up run (the layout bench_serving.py writes), one repeat and merged
repeats."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from inferwire.bench.report import advice, serving
from inferwire.bench.runner import merge

RATIOS = {"pydantic": 1.0, "dicts": 1.7, "orjson-per-chunk": 2.1, "orjson": 3.4}


def _server(ratios: dict[str, float]) -> dict[str, Any]:
    paths = {
        name: {
            "label": f"way {name}",
            "codec": "delta" if name == "delta" else "orjson",
            "tokens": 1000,
            "tokens_per_server_cpu_s": 40_000.0 * ratio,
            "server_us_per_token": 25.0 / ratio,
            "tokens_per_s": 9_000.0,
            "server_cpu_utilization": 0.5,
            "wire_bytes_per_chunk": 12.0 if name == "delta" else 244.0,
            "vs_pydantic": ratio,
            "vs_pydantic_low": ratio * 0.9,
            "vs_pydantic_high": ratio * 1.1,
            "correct": True,
        }
        for name, ratio in ratios.items()
    }
    return {
        "name": "bench_serving_server",
        "fullname": "bench/bench_serving.py::bench_serving_server",
        "group": serving.SERVER_GROUP,
        "stats": {"median": 1.0, "iqr": 0.0},
        "extra_info": {
            "workload": "stream-256",
            "streams_per_round": 24,
            "concurrency": 8,
            "pairs": 7,
            "baseline": "pydantic",
            "target_ratio": 3.0,
            "paths": paths,
            "server_loop": "uvloop",
        },
    }


def _client() -> dict[str, Any]:
    parsers = {
        "openai-sdk": {"us_per_chunk": 40.0, "vs_sdk": 1.0, "correct": True},
        "helper-orjson": {"us_per_chunk": 5.0, "vs_sdk": 8.0, "correct": True},
    }
    return {
        "name": "bench_serving_client",
        "fullname": "bench/bench_serving.py::bench_serving_client",
        "group": serving.CLIENT_GROUP,
        "stats": {"median": 1.0, "iqr": 0.0},
        "extra_info": {"workload": "stream-256", "chunks": 256, "rounds": 40, "parsers": parsers},
    }


def _encode() -> dict[str, Any]:
    ways = {
        "pydantic": {"us_per_chunk": 10.0, "vs_pydantic": 1.0, "wire_bytes_per_chunk": 244.0},
        "orjson": {"us_per_chunk": 2.0, "vs_pydantic": 5.0, "wire_bytes_per_chunk": 244.0},
    }
    return {
        "name": "bench_serving_encode",
        "fullname": "bench/bench_serving.py::bench_serving_encode",
        "group": serving.ENCODE_GROUP,
        "stats": {"median": 1.0, "iqr": 0.0},
        "extra_info": {"workload": "stream-256", "chunks": 256, "rounds": 40, "ways": ways},
    }


def _write(raw_dir: Path, document: dict[str, Any]) -> None:
    raw_dir.mkdir(parents=True, exist_ok=True)
    (raw_dir / "serving.json").write_text(json.dumps(document))


def test_the_section_shows_every_way_against_pydantic(tmp_path: Path) -> None:
    benchmarks = [_server({**RATIOS, "delta": 4.0}), _encode(), _client()]
    _write(tmp_path, {"benchmarks": benchmarks})
    text = serving.section(tmp_path)
    assert "| `pydantic` | way pydantic | 40,000 | 25.0 | 1.00x (baseline) | 10.00 (1.0x) |" in text
    assert "| `orjson` | way orjson | 136,000 | 7.4 | 3.40x [3.06-3.74] | 2.00 (5.0x) |" in text
    assert "| `delta` | way delta | 160,000 | 6.2 | 4.00x [3.60-4.40] |  |" in text
    assert "| `helper-orjson` | 5.00 | 8.00x | yes |" in text
    rows = serving.target_rows(tmp_path)
    assert [r[-1] for r in rows] == ["met", "met"]  # orjson and delta; msgspec-json absent
    assert all(r[3] == ">= 3x" for r in rows)


def test_a_helper_below_the_target_is_missed(tmp_path: Path) -> None:
    _write(tmp_path, {"benchmarks": [_server({**RATIOS, "msgspec-json": 2.5})]})
    verdicts = {r[0].split("`")[3]: r[-1] for r in serving.target_rows(tmp_path)}
    assert verdicts == {"orjson": "met", "msgspec-json": "**missed**"}
    assert serving.section(tmp_path).count("| `helper-") == 0  # no client benchmark


def test_the_advice_names_the_fastest_json_helper(tmp_path: Path) -> None:
    _write(tmp_path, {"benchmarks": [_server({**RATIOS, "msgspec-json": 3.2, "delta": 5.0})]})
    (row,) = advice._server_rows(tmp_path)
    # within 10% of each other: the first in the registry's order
    assert row[2] == "`orjson` through the `inferwire.serving` helpers"
    assert "3.4x" in row[3]
    assert "5.0x" in row[3]
    assert advice._names(row[2]) == "`orjson`"


def test_no_run_no_section(tmp_path: Path) -> None:
    assert serving.section(tmp_path) == ""
    assert serving.target_rows(tmp_path) == []
    assert advice._server_rows(tmp_path) == []


def test_repeats_show_their_range(tmp_path: Path) -> None:
    runs = [{"benchmarks": [_server({**RATIOS, "orjson": ratio})]} for ratio in (3.1, 3.4, 3.9)]
    _write(tmp_path, merge.merge(runs))
    (orjson,) = [r for r in serving.target_rows(tmp_path) if "`orjson`" in r[0]]
    assert orjson[2] == "3.40x (3.10x-3.90x)"
