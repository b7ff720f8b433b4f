"""The items an async iterator has ready now, taken together without waiting for more.

A model that runs ahead of the wire (a busy server, a client that reads slowly, an engine step
that finishes many requests' tokens at once) hands a response its chunks faster than one write
per chunk can send them; a framework's streaming response then pays its per-write cost (an ASGI
``send`` through every middleware, a transport write) once per chunk. :class:`Ready` takes
the next item as ``async for`` would, then every item the source can give *without
suspending*, up to a limit: the bytes on the wire are the same, in fewer writes, and no item is
ever held back waiting for another (inferwire's own servers batch the same way,
``SimulatedService.batches``).

Whether the source can give an item without suspending is found by stepping its
``__anext__()`` awaitable once (``send(None)``), as an event loop's task does: an item that is
ready completes in that step. One that is not has already started, so it is finished later by
awaiting :class:`_Resumed`, which hands the event loop whatever the source is waiting on
(a future, a bare ``yield``) and forwards what the loop sends or throws back (a result, a
cancellation) exactly as if the source were awaited directly.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Awaitable, Coroutine, Generator
from typing import Any, Generic, TypeVar, cast

T = TypeVar("T")


class _Resumed(Generic[T]):
    """An ``__anext__()`` awaitable already stepped once (it yielded ``pending``), awaitable to
    its end."""

    __slots__ = ("_pending", "_step")

    def __init__(self, step: Coroutine[Any, Any, T], pending: Any) -> None:
        self._step = step
        self._pending = pending

    def __await__(self) -> Generator[Any, Any, T]:
        step, yielded = self._step, self._pending
        while True:
            try:
                sent = yield yielded
            except GeneratorExit:
                _abandon(step)
                raise
            except BaseException as exc:  # a cancellation, thrown in by the task
                try:
                    yielded = step.throw(exc)
                except StopIteration as done:
                    return cast("T", done.value)
                continue
            try:
                yielded = step.send(sent)
            except StopIteration as done:
                return cast("T", done.value)

    def close(self) -> None:
        """Abandon the step (the consumer stopped): the source sees ``GeneratorExit``."""
        _abandon(self._step)


def _abandon(step: Coroutine[Any, Any, Any]) -> None:
    """Stop a started step, the source finalized: ``GeneratorExit`` thrown in where it waits.
    An async generator's ``__anext__()`` object only marks itself closed on ``close()``,
    leaving the generator "already running" for its later ``aclose()``; a throw runs its
    ``finally`` and ends it."""
    with contextlib.suppress(GeneratorExit, StopIteration, StopAsyncIteration):
        step.throw(GeneratorExit)


class Ready(Generic[T]):
    """Batches of what ``source`` has ready (see the module docstring): :meth:`next_batch`
    returns one or more items, at most ``limit``, or ``[]`` once the source is exhausted."""

    __slots__ = ("_error", "_resumed", "_source", "limit")

    def __init__(self, source: AsyncIterator[T], limit: int = 32) -> None:
        if type(limit) is not int or limit < 1:
            raise ValueError("limit must be a positive integer")
        self._source = source
        self._resumed: _Resumed[T] | None = None
        self._error: BaseException | None = None
        self.limit = limit

    async def next_batch(self) -> list[T]:
        if self._error is not None:
            error, self._error = self._error, None
            raise error
        try:
            if self._resumed is not None:
                resumed, self._resumed = self._resumed, None
                first = await resumed
            else:
                first = await self._source.__anext__()
        except StopAsyncIteration:
            return []
        batch = [first]
        while len(batch) < self.limit:
            awaitable = self._source.__anext__()
            # an async generator's __anext__() steps like a coroutine; any other awaitable is
            # stepped through one
            step = cast(
                "Coroutine[Any, Any, T]",
                awaitable if hasattr(awaitable, "send") else _awaited(awaitable),
            )
            try:
                pending = step.send(None)
            except StopIteration as done:
                batch.append(cast("T", done.value))
                continue
            except StopAsyncIteration:
                break
            except Exception as exc:  # the items before it still go out; then the error
                self._error = exc
                break
            self._resumed = _Resumed(step, pending)
            break
        return batch

    def close(self) -> None:
        """Abandon a step in progress (call when the consumer stops early)."""
        if self._resumed is not None:
            resumed, self._resumed = self._resumed, None
            resumed.close()


async def _awaited(awaitable: Awaitable[T]) -> T:
    return await awaitable
