"""The report's machine section: the machine, Python and libraries of the run."""

from __future__ import annotations

from typing import Any


def machine_section(raw: dict[str, Any]) -> str:
    info = raw.get("machine_info", {})
    cpu = info.get("cpu", {})
    libraries = info.get("libraries", {})
    lines = [
        f"- run: {raw.get('datetime', '?')}, commit `{raw.get('commit_info', {}).get('id', '?')}`"
        f"{' (dirty)' if raw.get('commit_info', {}).get('dirty') else ''}",
        f"- CPU: {cpu.get('brand_raw', '?')}, {cpu.get('count', '?')} logical cores, "
        f"{info.get('machine', '?')}",
        f"- Python {info.get('python_version', '?')} ({info.get('python_implementation', '?')}),"
        f" protobuf backend `{info.get('protobuf_backend', '?')}`",
        "- libraries: " + ", ".join(f"{k} {v}" for k, v in libraries.items()),
    ]
    return "\n".join(lines)
