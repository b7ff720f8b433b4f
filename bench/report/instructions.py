"""The codecs' instructions per chunk, from ``raw/instructions.json`` (bench_instructions.py).

Counted by valgrind's callgrind around one call of each codec operation, so a busy neighbour
cannot move them: the deterministic column beside the codec tables' microseconds. A run
without valgrind skips the suite, and its file holds no benchmark: :func:`note` says so.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Final

INSTRUCTIONS_RAW: Final = "instructions.json"
NOT_INSTALLED: Final = "not measured: valgrind not installed"
NOT_RUN: Final = "not measured: the instructions suite (bench_instructions.py) was not run"
INSTRUCTIONS_KEY: Final = "instructions"


def label(codec: str, workload: str, op: str) -> str:
    """The key of a cell in ``extra_info["instructions"]`` (bench/measure/instructions.py's
    Cell.label); ``f"instructions.{label}"`` is its path in ``extra_info["repeats"]``."""
    return f"{codec}|{workload}|{op}"


def info(raw_dir: Path) -> dict[str, Any] | None:
    """The instructions benchmark's ``extra_info`` (for spread.cell), or None if not measured."""
    path = raw_dir / INSTRUCTIONS_RAW
    if not path.exists():
        return None
    for bench in json.loads(path.read_text())["benchmarks"]:
        extra: dict[str, Any] = bench["extra_info"]
        if INSTRUCTIONS_KEY in extra:
            return extra
    return None


def per_chunk(raw_dir: Path) -> dict[tuple[str, str, str], float]:
    """(codec, workload, op) -> instructions per chunk (per message for unary workloads); empty
    when the run counted none (see :func:`note`)."""
    extra = info(raw_dir)
    if extra is None:
        return {}
    out = {}
    for key, value in extra[INSTRUCTIONS_KEY].items():
        codec, workload, op = key.split("|")
        out[(codec, workload, op)] = float(value)
    return out


def note(raw_dir: Path) -> str:
    """One line for under the tables: why nothing was counted, or which cells the run left out
    (the benchmark's ``left_out``, e.g. the stream-2048 workloads)."""
    if not (raw_dir / INSTRUCTIONS_RAW).exists():
        return NOT_RUN
    extra = info(raw_dir)
    if extra is None:
        # the suite ran and wrote its file, but its only benchmark skipped: no valgrind
        return NOT_INSTALLED
    return str(extra.get("left_out", ""))


def per_chunk_cell(value: float) -> str:
    """An instruction count as a table prints it: ``12.3k``, ``4.56M``."""
    if value >= 1e6:
        return f"{value / 1e6:,.2f}M"
    if value >= 1e3:
        return f"{value / 1e3:,.1f}k"
    return f"{value:,.0f}"
