"""The report's machine section: the machine, Python and libraries of the run, and how steady
the machine was while each suite ran (the calibration every timed suite records)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from .results import RUN_KEY
from .tables import table


def machine_section(raw: dict[str, Any], raw_dir: Path | None = None) -> str:
    info = raw.get("machine_info", {})
    cpu = info.get("cpu", {})
    libraries = info.get("libraries", {})
    run = raw.get(RUN_KEY, {})
    lines = [
        f"- run: {raw.get('datetime', '?')}, commit `{raw.get('commit_info', {}).get('id', '?')}`"
        f"{' (dirty)' if raw.get('commit_info', {}).get('dirty') else ''}"
        + (f", {run['repeats']} repeat(s) of each suite" if run.get("repeats") else ""),
        f"- CPU: {cpu.get('brand_raw', '?')}, {cpu.get('count', '?')} logical cores, "
        f"{info.get('machine', '?')}",
        f"- Python {info.get('python_version', '?')} ({info.get('python_implementation', '?')}),"
        f" protobuf backend `{info.get('protobuf_backend', '?')}`, event loop "
        f"`{info.get('event_loop', '?')}`"
        + (
            f" (`--loop {info['event_loop_requested']}`)"
            if info.get("event_loop_requested") not in (None, info.get("event_loop"))
            else ""
        ),
        "- libraries: " + ", ".join(f"{k} {v}" for k, v in libraries.items()),
    ]
    parts = ["\n".join(lines)]
    if raw_dir is not None:
        parts.append(calibration_section(raw_dir))
    return "\n\n".join(part for part in parts if part)


def _suite_calibrations(raw_dir: Path) -> list[tuple[str, int, dict[str, Any]]]:
    """(suite, repeat, calibration) of every suite file of the run that has one."""
    found = []
    for path in sorted(raw_dir.glob("*.json")):
        try:
            result = json.loads(path.read_text())
        except (OSError, json.JSONDecodeError):
            continue
        calibration = result.get("calibration") if isinstance(result, dict) else None
        if not isinstance(calibration, dict):
            continue
        runs = calibration.get("repeats", [calibration])
        for number, one in enumerate(runs, 1):
            if isinstance(one, dict):
                found.append((path.stem, number, one))
    return found


def _ms(points: list[dict[str, Any]], key: str) -> str:
    return " / ".join(f"{p[key] * 1e3:.1f}" for p in points)


def _mib(c: dict[str, Any]) -> str:
    return f"{c.get('memory_bytes', 64 * 2**20) / 2**20:.0f} MiB"


def calibration_section(raw_dir: Path) -> str:
    """The steadiness table, or "" for a run made before suites recorded it."""
    calibrations = _suite_calibrations(raw_dir)
    if not calibrations:
        return ""
    bounds = calibrations[0][2].get("bounds", {})
    moved_bound = bounds.get("moved", 0.1)
    rows = []
    for suite, number, c in calibrations:
        points = c.get("points", [])
        load = " / ".join(f"{p['load_average'][0]:.1f}" for p in points)
        rows.append(
            [
                f"`{suite}`",
                str(number),
                _ms(points, "cpu_s"),
                f"{_ms(points, 'memory_s')} ({_mib(c)})",
                f"{c.get('cpu_moved', 0.0):.0%} / {c.get('memory_moved', 0.0):.0%}",
                f"{c.get('others_cpu_share', 0.0):.0%}",
                f"{c.get('steal_share', 0.0):.1%}",
                load,
                "stable" if c.get("stable") else "**unstable**",
            ]
        )
    unstable = [(s, n, c) for s, n, c in calibrations if not c.get("stable")]
    verdict = (
        f"Stable by these bounds: all {len(calibrations)} suite runs."
        if not unstable
        else f"{len(unstable)} of {len(calibrations)} suite runs were **unstable**: "
        + "; ".join(f"`{s}` repeat {n}: {', '.join(c.get('reasons', []))}" for s, n, c in unstable)
        + ". Their figures are printed, but read them with that in mind."
    )
    drifted = [
        c
        for _, _, c in calibrations
        if max(c.get("cpu_moved", 0.0), c.get("memory_moved", 0.0)) > moved_bound
    ]
    cpu_ms = [p["cpu_s"] * 1e3 for _, _, c in calibrations for p in c.get("points", [])]
    drift = (
        f"The host's speed drifted past {moved_bound:.0%} in {len(drifted)} of "
        f"{len(calibrations)} suite runs; over the whole run the *cpu* workload took "
        f"{min(cpu_ms):.1f} to {max(cpu_ms):.1f} ms."
        if cpu_ms
        else ""
    )
    return "\n".join(
        [
            "How steady the machine was. *others*: the share of the CPUs' time that processes "
            "outside the suite used while it ran (from `/proc/stat`, minus the suite's own "
            "process tree); *steal*: the share the hypervisor gave to other guests. A run is "
            f"**unstable** when others used more than {bounds.get('others_cpu_share', 0.1):.0%}"
            f" or steal passed {bounds.get('steal_share', 0.05):.0%}: a neighbour on this "
            "machine; `inferwire bench` does not publish an unstable run over a stable one "
            "unless forced. Each suite also timed two fixed workloads at its start, middle and "
            "end, pinned to its core (ms, the fastest of several): *cpu*, pure-Python integer "
            "and dict work; *memory*, a copy of four times the last-level cache. *drift* is how "
            "far each moved between those points (cpu / memory). It reads the host below this "
            "machine, which shares its cores' siblings, its cache and its memory bus with other "
            "guests: with no other process and no steal it still moves, in phases of seconds "
            "(measured in `inferwire.bench.measure.calibration`). Drift is not a verdict: the "
            "absolute times of a run that drifted mix the host's speeds, the ratios this "
            "report judges are paired within one run and do not.",
            "",
            table(
                [
                    "suite",
                    "repeat",
                    "cpu (start / middle / end)",
                    "memory",
                    "drift",
                    "others",
                    "steal",
                    "load average",
                    "verdict",
                ],
                rows,
            ),
            "",
            " ".join(part for part in (verdict, drift) if part),
        ]
    )
