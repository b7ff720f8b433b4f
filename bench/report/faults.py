"""The report's "Bad input and faults" section, from ``raw/faults.json``: the fault scenarios
under load, what they counted, and the bad-input table."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from inferwire.load.fault_plan import (
    DECODE_MS,
    DOWN_S,
    DROP_EVERY_S,
    DROPS,
    FAULT_AT_S,
    GRACE_S,
    STALL_S,
)

from . import bad_inputs
from .results import FAULTS_RAW, infos
from .tables import table

_FAILURE_KINDS = ("lost", "duplicated", "reordered", "truncated", "altered")
"""The integrity counts of a point that are failures, as the table's column names them."""


def _errors(errors: dict[str, int]) -> str:
    if not errors:
        return "none"
    return ", ".join(f"{n} {name.rsplit('.', 1)[-1]}" for name, n in sorted(errors.items()))


def render(rows: Sequence[dict[str, Any]]) -> str:
    """The rows as a markdown table."""
    header = [
        "fault",
        "transport",
        "scheduled",
        "completed",
        "errors",
        "verified",
        "lost / dup / reord / trunc / altered",
        "ok after recovery",
        "all accounted for",
    ]
    body = []
    for r in rows:
        integrity = r["integrity"]
        counts = " / ".join(str(integrity[kind]) for kind in _FAILURE_KINDS)
        cells = [
            r["scenario"],
            f"`{r['transport']}`",
            str(r["scheduled"]),
            str(r["completed"]),
            _errors(r["errors"]),
            str(integrity["verified"]),
            counts,
            f"{r['after_recovery_ok']}/{r['after_recovery']}",
            "yes" if r["accounted"] else "**no**",
        ]
        body.append(cells)
    return table(header, body, left=(0, 1, 4))


def _summary(rows: Sequence[dict[str, Any]]) -> str:
    """What the rows show, in a sentence or two computed from them."""
    total = {
        key: sum(int(r[key]) for r in rows)
        for key in ("scheduled", "completed", "failed", "after_recovery", "after_recovery_ok")
    }
    verified = sum(int(r["integrity"]["verified"]) for r in rows)
    cut = sum(int(r["integrity"]["truncated"]) for r in rows)
    unnoticed = sum(
        r["integrity"][kind] for r in rows for kind in ("lost", "duplicated", "reordered")
    )
    altered = sum(int(r["integrity"]["altered"]) for r in rows)
    accounted = all(r["accounted"] for r in rows) and verified == total["completed"]
    passed_short = sum(int(r["ended_not_whole"]) for r in rows)
    recovered = total["after_recovery_ok"] == total["after_recovery"]
    return (
        f"Over {len(rows)} runs, {total['scheduled']:,} requests were scheduled: "
        f"{total['completed']:,} succeeded and {total['failed']:,} failed, "
        + ("each counted once. " if accounted else "**not each counted once**. ")
        + f"Every success was verified chunk by chunk against the chunks sent ({verified:,} "
        f"streams): {unnoticed} lost, duplicated or reordered, {altered} altered. The "
        f"{cut} streams cut short by a fault were errors, never successes, and "
        + (
            "no transport ended a short stream as a whole one. "
            if passed_short == 0
            else f"**{passed_short} short streams ended as whole ones** (caught by the "
            "generator's verification). "
        )
        + f"Once the server was back, {total['after_recovery_ok']:,} of the "
        f"{total['after_recovery']:,} requests sent after a grace of {GRACE_S:g} s succeeded"
        + ("." if recovered else ": **the clients did not all reconnect**.")
    )


def _machine(info: dict[str, Any]) -> str:
    machine = info.get("machine")
    if not machine:
        return ""
    return (
        f" Machine: {machine['cpus']} logical cores, load average "
        f"{machine['load_average'][0]:.1f} when the first run began."
    )


def section(raw_dir: Path) -> str:
    """The report's "Bad input and faults" section from ``raw/faults.json`` ("" if absent)."""
    recorded = infos(raw_dir / FAULTS_RAW)
    rows = [i for i in recorded if i.get("op") == "fault"]
    hostile_rows = [r for i in recorded if i.get("op") == "hostile-inputs" for r in i["rows"]]
    if not rows and not hostile_rows:
        return ""
    out = ["## Bad input and faults", ""]
    if rows:
        first = rows[0]
        out += [
            "### Faults under load",
            "",
            f"The open-loop generator sends `{first['workload']}` streams (paced at "
            f"{DECODE_MS:g} ms a token) at {first['rate_rps']:g} requests/s for "
            f"{_durations(rows)} to a server in its own process; after "
            f"{FAULT_AT_S:g} s, a fault: *kill-restart* kills the server (SIGKILL) and starts a "
            f"new one on the same port {DOWN_S:g} s later; *drop* aborts every connection "
            f"({DROPS} times, {DROP_EVERY_S:g} s apart) in a proxy between them; *stall* "
            f"stops the server (SIGSTOP) for {STALL_S:g} s, past the clients' "
            f"{first['timeout_s']:g} s timeout (gRPC: a deadline per call). Every stream is "
            "verified as it arrives (sequence numbers, an end marker whose token count "
            "matches, each chunk against the one sent); *verified* are the successes, and "
            "the integrity counts are failed requests by kind (*trunc*: cut before its end "
            "marker, reported by the transport). *ok after recovery*: requests sent from "
            f"{GRACE_S:g} s after the fault ended that succeeded.{_machine(first)}",
            "",
            render(rows),
            "",
            _summary(rows),
            "",
        ]
    if hostile_rows:
        out += bad_inputs.subsection(hostile_rows)
    return "\n".join(out)


def _durations(rows: list[dict[str, Any]]) -> str:
    """How long the runs lasted: a kill-restart run is lengthened by a slow restart."""
    low, high = min(r["duration_s"] for r in rows), max(r["duration_s"] for r in rows)
    return f"{low:g} s" if low == high else f"{low:g}-{high:g} s (a slow restart lengthens its run)"
