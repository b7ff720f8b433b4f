"""The report's grpclib rows (bench/bench_grpc.py's ``bench_grpclib_*``): a table beside
grpcio's in the gRPC section and one line of "What should I use?", from the figures of the
run, and nothing at all from a run without them (the committed results have none).

Each test writes the raw file of a small made-up run and reads what the report makes of it."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from inferwire.bench.report import advice, grpc

VERSIONS = {"grpcio": "1.85.1", "grpclib": "0.4.9"}


def _bench(name: str, **info: Any) -> dict[str, Any]:
    return {
        "name": name,
        "fullname": name,
        "stats": {"median": 1e-3, "iqr": 0.0},
        "extra_info": {"loop": "uvloop", "versions": VERSIONS, "correct": True, **info},
    }


def _grpclib_run(per_message: float, *, correct: bool = True) -> list[dict[str, Any]]:
    return [
        *(
            _bench(
                f"bench_grpclib_floor[{codec}]",
                op="grpclib-floor",
                codec=codec,
                floor_us_per_message=20.0,
                grpcio_us_per_message=40.0,
                grpclib_us_per_message=40.0 * per_message,
                vs_grpcio=per_message,
                vs_floor=2.0 * per_message,
                client_vs_grpcio=1.5,
                server_vs_grpcio=1.25,
                correct=correct,
            )
            for codec in ("orjson", "protobuf", "delta")
        ),
        _bench(
            "bench_grpclib_batched[protobuf]",
            op="grpclib-batched",
            codec="protobuf",
            tcp_us_per_token=1.0,
            grpcio_us_per_token=2.0,
            grpclib_us_per_token=3.0,
            vs_grpcio=1.5,
            vs_tcp=3.0,
        ),
        _bench(
            "bench_grpclib_unary[protobuf]",
            op="grpclib-unary",
            codec="protobuf",
            grpcio_us_per_call=100.0,
            grpclib_us_per_call=175.0,
            vs_grpcio=1.75,
            client_vs_grpcio=1.3,
            server_vs_grpcio=1.4,
        ),
    ]


def _grpcio_row() -> dict[str, Any]:
    return _bench(
        "bench_grpc_floor[protobuf]",
        op="grpc-floor",
        codec="protobuf",
        message_bytes=30.0,
        floor_us_per_message=20.0,
        ours_us_per_message=22.0,
        vs_floor=1.1,
    )


def _write(raw_dir: Path, benchmarks: list[dict[str, Any]]) -> Path:
    raw_dir.mkdir(parents=True, exist_ok=True)
    (raw_dir / "grpc.json").write_text(json.dumps({"benchmarks": benchmarks}))
    return raw_dir


def test_a_run_without_grpclib_rows_prints_nothing_of_them(tmp_path: Path) -> None:
    raw = _write(tmp_path, [_grpcio_row()])
    assert "grpclib" not in grpc.section(raw)
    assert grpc.advice_rows(raw, advice.TIE) == []
    assert advice.rows(raw) == []


def test_the_section_shows_grpclib_beside_grpcio(tmp_path: Path) -> None:
    raw = _write(tmp_path, [_grpcio_row(), *_grpclib_run(2.0)])
    text = grpc.section(raw)
    assert text.startswith("## gRPC against its floors")
    assert "### grpclib beside grpcio" in text
    assert "0.4.9" in text
    assert "1.85.1" in text
    rows = [line for line in text.splitlines() if line.startswith("| `")]
    per_message = [row for row in rows if "80.0 us" in row]
    assert len(per_message) == 3  # one per codec
    assert "| 2.00x | 4.00x | 1.50x | 1.25x | yes |" in per_message[0]
    assert any("| 3.0 us | 1.50x | 3.00x |" in row for row in rows)  # per token
    assert any("| 175.0 us | 1.75x | 1.30x | 1.40x | yes |" in row for row in rows)  # per call
    assert grpc.target_rows(raw) == grpc.target_rows(_write(tmp_path / "b", [_grpcio_row()]))


def test_grpclib_rows_alone_make_the_section(tmp_path: Path) -> None:
    assert "### grpclib beside grpcio" in grpc.section(_write(tmp_path, _grpclib_run(2.0)))


@pytest.mark.parametrize(
    ("per_message", "use"),
    [
        (2.0, "`grpcio`"),
        (0.5, "`grpclib`"),
        (1.05, "`grpcio` (`grpclib` within 10%)"),
    ],
)
def test_the_advice_names_the_cheaper_library(tmp_path: Path, per_message: float, use: str) -> None:
    raw = _write(tmp_path, _grpclib_run(per_message))
    (row,) = advice.rows(raw)
    payload, situation, chosen, margin, changes = row
    assert (payload, situation, chosen) == ("token stream", "gRPC in a Python service", use)
    assert margin == (
        f"`grpclib` takes {per_message:.2f}x `grpcio`'s time per message, "
        "1.50x per token batched, 1.75x per call"
    )
    if chosen == "`grpclib`":  # its unary calls cost more: when the answer changes
        assert changes == "mostly unary calls (`grpclib` 1.75x per call): `grpcio`"
    assert advice.verdict_rows(raw) == [
        ["token stream, gRPC in a Python service", use.split(" ")[0]]
    ]


def test_wrong_streams_give_no_advice(tmp_path: Path) -> None:
    raw = _write(tmp_path, _grpclib_run(0.5, correct=False))
    assert advice.rows(raw) == []
    assert "**no**" in grpc.section(raw)
