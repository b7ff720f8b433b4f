"""The engine suite's raw file as the report reads it (``raw/engine.json``, written by
``bench/bench_engine.py``), the cell formats of the engine tables, and the note on the step model
under each of them."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any, Final

from .results import REPEATS_DIR, infos

ENGINE_RAW: Final = "engine.json"
NOT_IN_RUN: Final = ["not in this run", "-", "-"]


def fmt_ms(value: float) -> str:
    return f"{value:,.1f}"


def fmt_pct(value: float) -> str:
    return f"{value:.0%}"


def fmt_x(value: float) -> str:
    return f"{value:.2f}x"


def engine_path(raw_dir: Path) -> Path:
    """The engine suite's file for ``raw_dir``. The suite runs once per ``inferwire bench``
    (its virtual clock gives the same figures in every process), so a later repeat's
    directory (``raw/repeats/<n>/``) has none and reads the run's (``raw/``)."""
    path = raw_dir / ENGINE_RAW
    if not path.exists() and raw_dir.parent.name == REPEATS_DIR:
        return raw_dir.parent.parent / ENGINE_RAW
    return path


def records(raw_dir: Path, op: str) -> list[dict[str, Any]]:
    return [i for i in infos(engine_path(raw_dir)) if i.get("op") == op]


def one(raw_dir: Path, op: str) -> dict[str, Any] | None:
    found = records(raw_dir, op)
    return found[0] if found else None


def step_note(info: Mapping[str, Any]) -> str:
    """What the step model is: its parameters and the measurement the defaults come from."""
    step = info.get("step", {})
    params = ", ".join(f"`{k}` = {v:g}" for k, v in step.get("parameters", {}).items())
    source = step.get("source", "")
    return (
        f"Step model (`inferwire.engine.StepModel`, defaults): {params or '?'}. {source} "
        "Limits: one simulated accelerator, no tensor parallelism, no speculative decoding or "
        "prefix caching; a step's time is the model's formula, not a measured kernel, so "
        "absolute milliseconds follow the step model and only the comparisons between policies "
        "on one trace carry over."
    )
