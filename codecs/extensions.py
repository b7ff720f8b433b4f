"""Loading the codecs' small C extensions, each the fast path of a pure-Python reference.

Every extension (the delta codec's steady state, the decode-limit scan, the FlatBuffers
encoder, protobuf's and the OpenAI mapping's token-chunk marshalling) is optional at run time:
absent (a pure-Python install), stale (built from an older source: its ``API_VERSION``
differs, or its ``configure`` refuses what it is given) or turned off
(``INFERWIRE_PURE_PYTHON=1`` in the environment, read at import), the reference does all the
work. A stale one warns, loudly in tests, where warnings are errors.
"""

from __future__ import annotations

import importlib
import os
import sys
import warnings
from collections.abc import Callable
from typing import Any


def pure_python() -> bool:
    """Whether ``INFERWIRE_PURE_PYTHON`` asks for the references only."""
    return os.environ.get("INFERWIRE_PURE_PYTHON", "") not in ("", "0")


def load(
    name: str, api_version: int, configure: Callable[[Any], object], instead: str
) -> Any | None:
    """The extension ``inferwire.codecs.<name>``, configured by ``configure(module)``; None
    when absent, stale or turned off. ``instead`` says, in the stale warning, what runs in its
    place."""
    if pure_python():
        return None
    package = sys.modules[__package__]
    try:  # as ``from . import name`` finds it: the package's attribute first
        module = getattr(package, name, None) or importlib.import_module(f"{__package__}.{name}")
    except ImportError:
        return None  # not built: the reference does all the work
    try:
        if getattr(module, "API_VERSION", None) != api_version:
            raise TypeError("its API version differs")
        configure(module)
    except (TypeError, ValueError) as exc:
        warnings.warn(
            f"{__package__}.{name} is stale ({exc}); {instead}. "
            "Rebuild it: pip install -e . (or make venv).",
            RuntimeWarning,
            stacklevel=3,
        )
        return None
    return module
