"""The versions of the libraries a run used, recorded beside its results."""

from __future__ import annotations

from collections.abc import Iterable
from importlib import metadata
from typing import Final

CORE_LIBRARIES: Final = (
    "inferwire",
    "numpy",
    "orjson",
    "msgpack",
    "msgspec",
    "protobuf",
    "flatbuffers",
    "grpcio",
)
"""What every codec and transport figure depends on."""


def library_versions(names: Iterable[str]) -> dict[str, str]:
    """Each distribution's installed version, or ``"not installed"``."""
    found = {}
    for name in names:
        try:
            found[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            found[name] = "not installed"
    return found
