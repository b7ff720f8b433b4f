"""The one markdown table writer of the report modules, and the cell format they share."""

from __future__ import annotations

from collections.abc import Collection, Iterable


def table(header: list[str], rows: Iterable[list[str]], *, left: Collection[int] = (0,)) -> str:
    """A markdown table: ``left`` names the columns aligned left, the others align right."""
    lines = [
        "| " + " | ".join(header) + " |",
        "| " + " | ".join("---" if i in left else "---:" for i in range(len(header))) + " |",
    ]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return "\n".join(lines)


def ms(seconds: float) -> str:
    """Seconds as milliseconds, one decimal."""
    return f"{seconds * 1e3:,.1f} ms"
