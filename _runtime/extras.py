"""The optional dependencies, and the extra that installs each.

A base ``pip install inferwire`` has the codecs only; the transports' libraries come with
``inferwire[transports]`` (gRPC alone with ``inferwire[grpc]``), the serving helpers' frameworks
with ``inferwire[serving]`` and the benchmark suite's with ``inferwire[bench]``
(pyproject.toml). Code that imports one of them does so inside
:func:`needs_extras`, so a missing library is a :class:`MissingExtraError` that says what to
install (msgspec's way with its optional dependencies), never a bare ``ModuleNotFoundError``.
"""

from __future__ import annotations

import contextlib
import importlib.util
from collections.abc import Iterator
from typing import Final

EXTRAS: Final = {
    # import name: (distribution, the extra of pyproject.toml that lists it)
    "grpc": ("grpcio", "grpc"),
    "grpc_health": ("grpcio-health-checking", "grpc"),
    "grpc_reflection": ("grpcio-reflection", "grpc"),
    "grpclib": ("grpclib", "grpclib"),
    "h2": ("h2", "transports"),
    "httptools": ("httptools", "transports"),
    "prometheus_client": ("prometheus-client", "transports"),
    "trustme": ("trustme", "transports"),
    "websockets": ("websockets", "transports"),
    # Content-Encoding br and zstd (transports/compression.py)
    "brotli": ("brotli", "transports"),
    "zstandard": ("zstandard", "transports"),
    "uvloop": ("uvloop", "uvloop"),
    "zmq": ("pyzmq", "engine"),
    "pytest": ("pytest", "bench"),
    "pytest_benchmark": ("pytest-benchmark", "bench"),
    "hdrh": ("hdrhistogram", "bench"),
    "tqdm": ("tqdm", "bench"),
    "psutil": ("psutil", "bench"),
    "matplotlib": ("matplotlib", "bench"),
    "uvicorn": ("uvicorn", "bench"),
    "hypercorn": ("hypercorn", "bench"),
    "granian": ("granian", "bench"),
    "fastapi": ("fastapi", "bench"),
    "pydantic": ("pydantic", "bench"),
    "openai": ("openai", "bench"),
    # inferwire.serving's framework helpers (its core needs none of them)
    "starlette": ("starlette", "serving"),
    "aiohttp": ("aiohttp", "serving"),
    "httpx": ("httpx", "serving"),
    "tokenizers": ("tokenizers", "tokenizer"),
    "locust": ("locust", "locust"),
    # one import name for the four distributions of the trace extra: the SDK stands for them
    "opentelemetry": ("opentelemetry-sdk", "trace"),
}
INCLUDES: Final = {
    "bench": ("transports", "engine", "uvloop", "serving", "grpclib"),
    "engine": (),
    "serving": (),
    "uvloop": (),
    "transports": ("grpc",),
    "grpc": (),
    "grpclib": (),
    "tokenizer": (),
    "locust": ("bench",),
}
"""Each extra installs the ones it names too (``inferwire[bench]`` is a superset)."""


class MissingExtraError(ModuleNotFoundError):
    """An optional library is not installed; the message names the extra that installs it."""

    def __init__(self, what: str, module: str, extra: str | None = None) -> None:
        distribution, needed_by = EXTRAS[module]
        extra = extra or needed_by
        super().__init__(
            f"{what} needs {distribution}, which is not installed: "
            f"pip install 'inferwire[{extra}]'",
            name=module,
        )
        self.extra = extra


@contextlib.contextmanager
def needs_extras(what: str) -> Iterator[None]:
    """Imports inside become :class:`MissingExtraError` when an optional library is missing;
    ``what`` names what needed it (``"the http1 transport"``). Any other missing module is
    a broken install and propagates as it is."""
    try:
        yield
    except MissingExtraError:
        raise
    except ModuleNotFoundError as exc:
        module = (exc.name or "").partition(".")[0]
        if module not in EXTRAS:
            raise
        raise MissingExtraError(what, module) from exc


def require(extra: str, what: str) -> None:
    """Raises :class:`MissingExtraError` (naming ``extra``) unless every library of ``extra``
    and of the extras it includes is installed: for work that imports them in another process."""
    wanted = _closure(extra)
    for module, (_, needed_by) in EXTRAS.items():
        if needed_by in wanted and importlib.util.find_spec(module) is None:
            raise MissingExtraError(what, module, extra)


def _closure(extra: str) -> set[str]:
    found = {extra}
    for included in INCLUDES[extra]:
        found |= _closure(included)
    return found
