"""Which event loop runs a server, a client or the load generator: asyncio's own or uvloop.

uvloop (libuv under asyncio's API) is what people deploy: ``uvicorn[standard]`` and vLLM's
API server run on it whenever it is installed. Every command that runs a loop takes
``--loop {auto,asyncio,uvloop}``; ``auto`` is uvloop when the ``uvloop`` extra is installed
and asyncio otherwise, and every result records the loop that actually ran
(:func:`running`), never the option.
"""

from __future__ import annotations

import asyncio
import importlib.util
import os
from collections.abc import Callable, Coroutine
from typing import Any, Final, TypeVar

from inferwire._runtime.extras import needs_extras

T = TypeVar("T")

LOOPS: Final = ("auto", "asyncio", "uvloop")
"""The choices of ``--loop``."""
CONCRETE: Final = ("asyncio", "uvloop")
"""What :func:`resolve` returns and what results record."""


def uvloop_installed() -> bool:
    return importlib.util.find_spec("uvloop") is not None


def resolve(name: str = "auto") -> str:
    """``"asyncio"`` or ``"uvloop"``: ``auto`` picks uvloop when it is installed; naming
    ``uvloop`` without it installed is a :class:`~inferwire._runtime.extras.MissingExtraError`
    that names the extra."""
    if name not in LOOPS:
        raise ValueError(f"unknown event loop {name!r}: one of {', '.join(LOOPS)}")
    if name == "auto":
        return "uvloop" if uvloop_installed() else "asyncio"
    if name == "uvloop":
        with needs_extras("--loop uvloop"):
            import uvloop  # noqa: F401
    return name


def factory(name: str = "auto") -> Callable[[], asyncio.AbstractEventLoop]:
    """A function that makes a new loop of the kind ``name`` resolves to."""
    if resolve(name) == "uvloop":
        import uvloop

        return uvloop.new_event_loop
    return asyncio.new_event_loop


def new_event_loop(name: str = "auto") -> asyncio.AbstractEventLoop:
    return factory(name)()


def run(coro: Coroutine[Any, Any, T], loop: str = "auto") -> T:
    """``asyncio.run(coro)`` on a new loop of the kind ``loop`` names."""
    with asyncio.Runner(loop_factory=factory(loop)) as runner:
        return runner.run(coro)


def running() -> str:
    """The kind of the loop running now (``"uvloop"`` or ``"asyncio"``), for results."""
    return kind(asyncio.get_running_loop())


def kind(loop: asyncio.AbstractEventLoop) -> str:
    return "uvloop" if type(loop).__module__.startswith("uvloop") else "asyncio"


LOOP_ENV: Final = "INFERWIRE_LOOP"
"""The environment variable that chooses the event loop of a benchmark run's servers and clients
(``auto``, ``asyncio`` or ``uvloop``); ``inferwire bench --loop`` sets it."""


def requested_loop() -> str:
    """``"asyncio"`` or ``"uvloop"``: the loop ``$INFERWIRE_LOOP`` names (``auto`` when unset)
    resolved. An unknown name is a ValueError, uvloop asked for but not installed a
    :class:`~inferwire._runtime.extras.MissingExtraError`."""
    return resolve(os.environ.get(LOOP_ENV) or "auto")


def with_loop(options: tuple[str, ...]) -> tuple[str, ...]:
    """``options`` with ``--loop`` of :func:`requested_loop`, unless they name one."""
    return options if "--loop" in options else (*options, "--loop", requested_loop())
