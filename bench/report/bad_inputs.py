"""The report's bad-input table: the rows of :mod:`inferwire.load.bad_inputs`, as
recorded in ``raw/faults.json``, summed per codec and kind of input."""

from __future__ import annotations

from typing import Any, Final

from inferwire.workloads.hostile import KINDS

WHAT: Final = (
    "Bad bytes against every codec: what each decoder makes of input a peer should never send."
)


def subsection(rows: list[dict[str, Any]]) -> list[str]:
    """The lines of the report's "Bad input" subsection."""
    return [
        "### Bad input",
        "",
        WHAT,
        "Seeded prefixes, corruptions and lying length headers, fed to each codec; "
        "*other* counts exceptions that escaped the codec (expected 0), and the "
        "slowest decode bounds what one bad input costs.",
        "",
        render(rows).rstrip("\n"),
        "",
    ]


def render(rows: list[dict[str, Any]]) -> str:
    """A markdown table: one line per codec and kind, summed over the workloads."""
    totals: dict[tuple[str, str], dict[str, Any]] = {}
    for row in rows:
        key = (row["codec"], row["kind"])
        total = totals.setdefault(
            key, {"tried": 0, "decoded": 0, "decode_error": 0, "other": 0, "max_ms": 0.0}
        )
        for field in ("tried", "decoded", "decode_error", "other"):
            total[field] += row[field]
        total["max_ms"] = max(total["max_ms"], row["max_ms"])
    order = {kind: i for i, kind in enumerate(KINDS)}
    codecs = {name: i for i, name in enumerate(dict.fromkeys(row["codec"] for row in rows))}
    lines = [
        "| codec | input | tried | decoded | DecodeError | other | slowest decode |",
        "| --- | --- | ---: | ---: | ---: | ---: | ---: |",
    ]
    for (codec, kind), total in sorted(
        totals.items(), key=lambda item: (codecs[item[0][0]], order.get(item[0][1], len(order)))
    ):
        lines.append(
            f"| {codec} | {kind} | {total['tried']:,} | {total['decoded']:,} "
            f"| {total['decode_error']:,} | {total['other']:,} | {total['max_ms']:.2f} ms |"
        )
    return "\n".join(lines) + "\n"
