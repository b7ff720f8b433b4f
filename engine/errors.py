"""The engine model's exceptions: one root, :class:`EngineError`, and a class for each thing a
caller can act on (retry later, shrink the request, pick another id)."""

from __future__ import annotations


class EngineError(Exception):
    """Root of every error raised by :mod:`inferwire.engine`."""


class EngineFullError(EngineError):
    """The waiting queue holds ``max_waiting`` requests: the engine refuses more until it
    drains (what a frontend turns into an "overloaded" answer, as vLLM's 503)."""

    def __init__(self, waiting: int, max_waiting: int) -> None:
        super().__init__(f"engine is full: {waiting} requests wait (max_waiting={max_waiting})")
        self.waiting = waiting
        self.max_waiting = max_waiting


class InvalidRequestError(EngineError, ValueError):
    """A request the engine cannot run: no chunks, a negative prompt, a bad id."""


class RequestTooLargeError(InvalidRequestError):
    """The request's prompt plus all its output tokens need more KV blocks than the whole cache
    holds: it could never finish, so it is refused at :meth:`EngineCore.add` instead of waiting
    (or being preempted) forever, as vLLM refuses a prompt over ``max_model_len``."""

    def __init__(self, rid: str, blocks_needed: int, kv_blocks: int) -> None:
        super().__init__(
            f"request {rid!r} needs {blocks_needed} KV blocks; the cache has {kv_blocks}"
        )
        self.rid = rid
        self.blocks_needed = blocks_needed
        self.kv_blocks = kv_blocks


class DuplicateRequestError(InvalidRequestError):
    """A request id that the engine already holds (waiting, running or paused)."""
