"""One result file from the repeats of a suite (``inferwire bench --repeat N``).

Each repeat is a whole run of the suite in a fresh process (pyperf's reason: memory layout and
hash randomization differ per process, and so do the figures). The merged file keeps
pytest-benchmark's layout, so every reader of a one-repeat file reads it unchanged:

- per benchmark (matched by its full name), every float in ``extra_info`` (nested dicts too)
  is the **median over the repeats**, and ``extra_info["repeats"]`` keeps each one's values,
  keyed by its dotted path (read by :mod:`inferwire.bench.report.spread`);
- ``stats.median`` is the median of the repeats' medians (its values under ``"stats.median"``);
- everything else (counts, flags, names, lists, the other statistics) comes from one
  *representative* repeat, the one whose median is the median, so counts that must add up
  (requests scheduled = completed + failed) still do;
- ``calibration`` becomes ``{"repeats": [each repeat's], "stable": all of them}``.

A benchmark missing from a repeat (a ``-k`` that selected differently, a skip) is merged over
the repeats that have it.
"""

from __future__ import annotations

import copy
import statistics
from collections.abc import Mapping, Sequence
from typing import Any, Final

REPEATS_KEY: Final = "repeats"


def _float_paths(value: Any, prefix: str = "") -> dict[str, float]:
    """Every float leaf of nested dicts, by dotted path (bools and ints are not floats)."""
    if isinstance(value, float):
        return {prefix: value}
    if isinstance(value, Mapping):
        found: dict[str, float] = {}
        for key, item in value.items():
            if key == REPEATS_KEY and not prefix:
                continue
            found.update(_float_paths(item, f"{prefix}.{key}" if prefix else str(key)))
        return found
    return {}


def _set_path(target: dict[str, Any], path: str, value: float) -> None:
    *parents, leaf = path.split(".")
    for key in parents:
        target = target[key]
    target[leaf] = value


def _merge_benchmark(runs: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    medians = [run["stats"]["median"] for run in runs]
    representative = runs[medians.index(statistics.median_low(medians))]
    merged = copy.deepcopy(dict(representative))
    merged["stats"]["median"] = statistics.median(medians)
    values: dict[str, list[float]] = {"stats.median": medians}
    per_run = [_float_paths(run.get("extra_info", {})) for run in runs]
    for path in per_run[runs.index(representative)]:
        samples = [paths[path] for paths in per_run if path in paths]
        values[path] = samples
        _set_path(merged["extra_info"], path, statistics.median(samples))
    merged["extra_info"][REPEATS_KEY] = values
    return merged


def merge(repeats: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """The merged result of a suite's repeats (each a pytest-benchmark JSON document)."""
    if not repeats:
        raise ValueError("no repeats to merge")
    if len(repeats) == 1:
        return copy.deepcopy(dict(repeats[0]))
    merged = copy.deepcopy(dict(repeats[0]))
    by_name: dict[str, list[Mapping[str, Any]]] = {}
    for repeat in repeats:
        for bench in repeat["benchmarks"]:
            by_name.setdefault(bench["fullname"], []).append(bench)
    merged["benchmarks"] = [_merge_benchmark(runs) for runs in by_name.values()]
    calibrations = [r.get("calibration") for r in repeats]
    merged["calibration"] = {
        "repeats": calibrations,
        "stable": all(c is not None and c.get("stable", False) for c in calibrations),
    }
    merged[REPEATS_KEY] = len(repeats)
    return merged


def stable(result: Mapping[str, Any]) -> bool | None:
    """A result file's stability verdict: None when it has no calibration (an older run)."""
    calibration = result.get("calibration")
    if not isinstance(calibration, Mapping) or "stable" not in calibration:
        return None
    return bool(calibration["stable"])


def unstable_reasons(result: Mapping[str, Any]) -> list[str]:
    """Why a result file is unstable, each reason once (empty when it is stable)."""
    calibration = result.get("calibration") or {}
    runs = calibration.get("repeats", [calibration])
    reasons: list[str] = []
    for number, run in enumerate(runs, 1):
        for reason in (run or {}).get("reasons", []):
            tagged = f"repeat {number}: {reason}" if len(runs) > 1 else reason
            reasons.append(tagged)
    return reasons
