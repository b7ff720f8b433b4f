"""The report's section on the hop as vLLM builds it, and its advice row: there only with the
suite's raw file, and every comparison computed from the figures, so data that turn a result
around turn the finding and the advice around too."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import orjson

from inferwire.bench.report import vllm_hop

CODECS = ("msgspec-oob", "msgspec-inband", "pickle5-oob", "pickle-inband")


def _figures(frontend_us: float, encode_us: float, batch: int) -> dict[str, Any]:
    return {
        "batch": batch,
        "steps": 10,
        "rounds": 3,
        "frontend_us": frontend_us,
        "frontend_us_min": frontend_us * 0.9,
        "frontend_us_max": frontend_us * 1.1,
        "frontend_thread_us": frontend_us / 2,
        "engine_encode_us": encode_us,
        "bytes": 1000.0 * batch,
        "tokens_per_s_per_core": batch / (frontend_us / 1e6),
        "correct": True,
        "problems": [],
    }


def _info(transport: str, case: str, frontend: dict[str, float]) -> dict[str, Any]:
    """One (transport, case) benchmark: ``frontend`` us per step at B = 1 for each codec, ten
    times that at B = 8; engine encode 100 us for pickle, 10 for msgspec."""
    return {
        "op": vllm_hop.OP,
        "transport": transport,
        "case": case,
        "batches": [1, 8],
        "codecs": list(frontend),
        "rounds": 3,
        "step_period_ms": {"1": 10.0, "8": 11.0},
        "method": "made up for the test",
        "cells": {
            codec: {
                str(batch): _figures(us * batch, 100.0 if "pickle" in codec else 10.0, batch)
                for batch in (1, 8)
            }
            for codec, us in frontend.items()
        },
        "correct": True,
    }


def _write(raw: Path, msgspec_us: float, pickle_us: float, tcp_factor: float) -> None:
    frontend = {
        "msgspec-oob": msgspec_us,
        "msgspec-inband": msgspec_us * 2,
        "pickle5-oob": pickle_us,
        "pickle-inband": pickle_us * 2,
    }
    infos = [
        _info(
            transport,
            case,
            {c: us * (tcp_factor if transport == "tcp" else 1.0) for c, us in frontend.items()},
        )
        for transport in ("ipc", "tcp")
        for case in ("tokens", "logprobs", "embedding")
    ]
    benchmarks = [{"extra_info": i, "stats": {"median": 1e-3, "iqr": 1e-4}} for i in infos]
    (raw / vllm_hop.VLLM_HOP_RAW).write_bytes(orjson.dumps({"benchmarks": benchmarks}))


def test_nothing_without_the_suites_file(tmp_path: Path) -> None:
    assert vllm_hop.section(tmp_path) == ""
    assert vllm_hop.advice_rows(tmp_path) == []


def test_the_findings_and_the_advice_follow_the_figures(tmp_path: Path) -> None:
    _write(tmp_path, msgspec_us=100.0, pickle_us=300.0, tcp_factor=1.5)
    section = vllm_hop.section(tmp_path)
    assert "`pickle5-oob` / `msgspec-oob`: frontend CPU per step 3.00x" in section
    assert "tcp / ipc 1.50x" in section
    (row,) = vllm_hop.advice_rows(tmp_path)
    assert row[2] == "`msgspec-oob` over `ipc`"
    assert row[3].startswith("6.0x less frontend CPU per step than `pickle-inband`")

    # turned around: pickle cheaper on the frontend, tcp cheaper than ipc
    _write(tmp_path, msgspec_us=300.0, pickle_us=100.0, tcp_factor=0.5)
    section = vllm_hop.section(tmp_path)
    assert "`pickle5-oob` / `msgspec-oob`: frontend CPU per step 0.33x" in section
    assert "tcp / ipc 0.50x" in section
    (row,) = vllm_hop.advice_rows(tmp_path)
    assert row[2] == "`pickle5-oob` over `tcp`"


def test_a_tie_names_both_with_their_engine_encode(tmp_path: Path) -> None:
    _write(tmp_path, msgspec_us=105.0, pickle_us=100.0, tcp_factor=1.5)
    (row,) = vllm_hop.advice_rows(tmp_path)
    assert row[2] == "`pickle5-oob` over `ipc` (within 10%: `msgspec-oob`, its engine encode 0.10x)"
