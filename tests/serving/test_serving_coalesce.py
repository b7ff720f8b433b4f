"""inferwire.serving.coalesce: what a source has ready goes out together, nothing waits for
more, and cancellation, errors and an early stop reach the source as if it were awaited
directly, on both event loops."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import pytest

import inferwire.codecs as ic
import inferwire.serving as iws
from inferwire._runtime import loops
from inferwire.serving.coalesce import Ready


async def _source(pattern: list[int], log: list[str]) -> AsyncIterator[int]:
    """Yields 0, 1, 2, ...: ``pattern[i]`` items in a row, then one suspension."""
    item = 0
    try:
        for run in pattern:
            await asyncio.sleep(0)
            for _ in range(run):
                yield item
                item += 1
    finally:
        log.append("closed")


async def _batches(source: AsyncIterator[int], limit: int) -> list[list[int]]:
    ready = Ready(source, limit)
    out = []
    while batch := await ready.next_batch():
        out.append(batch)
    return out


@pytest.mark.parametrize(
    ("pattern", "limit", "expected"),
    [
        ([5], 32, [[0, 1, 2, 3, 4]]),  # the first item is awaited; the rest were ready
        ([1, 1, 1], 32, [[0], [1], [2]]),  # a suspension between items: one at a time
        ([3, 2], 32, [[0, 1, 2], [3, 4]]),
        ([7], 3, [[0, 1, 2], [3, 4, 5], [6]]),  # never more than the limit
        ([], 4, []),
    ],
)
def test_batches_hold_what_was_ready(
    event_loop_kind: str, pattern: list[int], limit: int, expected: list[list[int]]
) -> None:
    log: list[str] = []
    assert loops.run(_batches(_source(pattern, log), limit), event_loop_kind) == expected
    assert log == ["closed"]


def test_a_source_that_never_suspends_is_cut_at_the_limit(event_loop_kind: str) -> None:
    async def ready_now() -> AsyncIterator[int]:
        for i in range(70):
            yield i

    batches = loops.run(_batches(ready_now(), 32), event_loop_kind)
    assert [len(b) for b in batches] == [32, 32, 6]
    assert [i for b in batches for i in b] == list(range(70))


def test_a_source_error_comes_after_the_items_before_it(event_loop_kind: str) -> None:
    async def failing() -> AsyncIterator[int]:
        yield 1
        yield 2
        raise RuntimeError("model failed")

    async def run() -> list[int]:
        ready = Ready(failing(), 8)
        first = await ready.next_batch()
        with pytest.raises(RuntimeError, match="model failed"):
            await ready.next_batch()
        return first

    assert loops.run(run(), event_loop_kind) == [1, 2]


def test_a_cancellation_reaches_the_waiting_source(event_loop_kind: str) -> None:
    log: list[str] = []

    async def waits_after_one(event: asyncio.Event) -> AsyncIterator[int]:
        try:
            yield 1
            await event.wait()
            yield 2
        except asyncio.CancelledError:
            log.append("cancelled")
            raise

    async def run() -> None:
        event = asyncio.Event()
        ready = Ready(waits_after_one(event), 8)
        assert await ready.next_batch() == [1]
        task = asyncio.ensure_future(ready.next_batch())
        await asyncio.sleep(0.01)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    loops.run(run(), event_loop_kind)
    assert log == ["cancelled"]


def test_a_resumed_step_gets_its_result(event_loop_kind: str) -> None:
    async def slow() -> AsyncIterator[int]:
        yield 1
        await asyncio.sleep(0.005)  # a timer future, handed to the loop and back
        yield 2
        await asyncio.sleep(0)
        yield 3

    assert loops.run(_batches(slow(), 8), event_loop_kind) == [[1], [2], [3]]


def test_an_early_stop_closes_the_source(event_loop_kind: str) -> None:
    log: list[str] = []

    async def run() -> None:
        builder = iws.ChunkBuilder("m")

        async def chunks() -> AsyncIterator[ic.TokenChunk]:
            try:
                for i in range(100):
                    if i % 5 == 0:
                        await asyncio.sleep(0)
                    yield builder.chunk(str(i), [i])
            finally:
                log.append("closed")

        body = iws.stream_body(chunks(), ic.get("orjson"))
        await body.__anext__()
        await body.__anext__()
        await body.aclose()

    loops.run(run(), event_loop_kind)
    assert log == ["closed"]


@pytest.mark.parametrize("coalesce", [1, 3, 32])
@pytest.mark.parametrize("sync", [False, True])
def test_stream_body_writes_the_same_bytes_however_cut(coalesce: int, sync: bool) -> None:
    builder = iws.ChunkBuilder("m", id="chatcmpl-1", created=1)
    chunks = [builder.chunk(str(i), [i]) for i in range(10)] + [builder.finish()]

    async def source() -> AsyncIterator[ic.TokenChunk]:
        for i, chunk in enumerate(chunks):
            if i % 4 == 0:
                await asyncio.sleep(0)
            yield chunk

    async def collect() -> list[bytes]:
        body = iws.stream_body(chunks if sync else source(), ic.get("delta"), coalesce=coalesce)
        return [piece async for piece in body]

    pieces = asyncio.run(collect())
    reference = asyncio.run(_one_a_piece(chunks))
    assert b"".join(pieces) == b"".join(reference)
    assert len(pieces) <= len(reference)
    if coalesce == 1:
        assert len(pieces) == len(reference)


async def _one_a_piece(chunks: list[ic.TokenChunk]) -> list[bytes]:
    return [p async for p in iws.stream_body(chunks, ic.get("delta"), coalesce=1)]


@pytest.mark.parametrize("bad", [0, -1, 1.5, "2"])
def test_limits_are_positive_integers(bad: Any) -> None:
    with pytest.raises(ValueError, match="positive"):
        Ready(_source([], []), bad)

    async def first() -> bytes:
        return await iws.stream_body([], ic.get("orjson"), coalesce=bad).__anext__()

    with pytest.raises(ValueError, match="positive"):
        asyncio.run(first())
