"""A small YAML writer for the Prometheus files: mappings, lists and scalars, block style.

Why by hand: the files are a few nested mappings of strings and numbers, and every string is
written as a JSON string, which is also a valid YAML double-quoted scalar (YAML 1.2 is a
superset of JSON), so no quoting rule of YAML's can bite; a YAML library would be a dependency
for twenty lines. promtool checks what this writes (tests/observe/test_watch_rules.py)."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence


def dump(value: Mapping[str, object], header: str = "") -> str:
    """``value`` as a YAML document, after ``header`` (comment lines, ``#`` added)."""
    lines = [f"# {line}".rstrip() for line in header.splitlines()]
    lines += _mapping(value, 0)
    return "\n".join(lines) + "\n"


def _scalar(value: object) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return repr(value)
    if isinstance(value, str):
        return json.dumps(value)
    raise TypeError(f"not a scalar: {value!r}")


def _is_scalar(value: object) -> bool:
    return isinstance(value, str | int | float | bool)


def _mapping(value: Mapping[str, object], indent: int) -> list[str]:
    pad = " " * indent
    lines: list[str] = []
    for key, item in value.items():
        if _is_scalar(item):
            lines.append(f"{pad}{key}: {_scalar(item)}")
        elif isinstance(item, Mapping):
            lines.append(f"{pad}{key}:" + (" {}" if not item else ""))
            lines += _mapping(item, indent + 2)
        elif isinstance(item, Sequence):
            lines.append(f"{pad}{key}:" + (" []" if not item else ""))
            lines += _sequence(item, indent + 2)
        else:
            raise TypeError(f"cannot write {item!r}")
    return lines


def _sequence(value: Sequence[object], indent: int) -> list[str]:
    pad = " " * indent
    lines: list[str] = []
    for item in value:
        if _is_scalar(item):
            lines.append(f"{pad}- {_scalar(item)}")
        elif isinstance(item, Mapping):
            inner = _mapping(item, indent + 2)
            lines.append(f"{pad}- {inner[0].lstrip()}" if inner else f"{pad}- {{}}")
            lines += inner[1:]
        else:
            raise TypeError("nested lists are not used in these files")
    return lines
