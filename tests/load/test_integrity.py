"""Streams prove themselves whole: the verifier's verdict on every way a stream can be wrong,
the service's cut streams keeping their end marker, and the load generator counting a stream
that fails verification as an error, by kind."""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import AsyncIterator, Callable, Sequence
from typing import Any

import pytest

import inferwire.codecs as ic
import inferwire.transports as it
from inferwire import workloads
from inferwire.codecs.errors import DuplicateFrameError, ReorderedFrameError, SequenceGapError
from inferwire.codecs.integrity import AlteredStreamError, StreamVerifier
from inferwire.load import load_command, metrics, openloop
from inferwire.workloads import token_stream_source

SERVICE = it.SimulatedService(token_stream_source)
CHUNKS = list(SERVICE.chunks(it.GenerateRequest(workload="stream-16")))
STREAMS = [w for w in workloads.names() if workloads.get(w).kind == "stream"]


def verdict(
    chunks: Sequence[ic.TokenChunk], expected: Sequence[ic.TokenChunk] | None = CHUNKS
) -> type[Exception] | None:
    """The class of what the verifier raised, or None for a whole stream."""
    verifier = StreamVerifier(expected)
    try:
        for chunk in chunks:
            verifier.check(chunk)
        verifier.finish()
    except ic.DecodeError as exc:
        return type(exc)
    return None


def _swap(chunks: list[ic.TokenChunk], i: int) -> list[ic.TokenChunk]:
    return [*chunks[:i], chunks[i + 1], chunks[i], *chunks[i + 2 :]]


def _recount(chunks: list[ic.TokenChunk], tokens: int) -> list[ic.TokenChunk]:
    usage = ic.Usage(prompt_tokens=1, completion_tokens=tokens)
    return [*chunks[:-1], dataclasses.replace(chunks[-1], usage=usage)]


BROKEN: dict[str, tuple[Callable[[list[ic.TokenChunk]], list[ic.TokenChunk]], type[Exception]]] = {
    "first lost": (lambda c: c[1:], SequenceGapError),
    "middle lost": (lambda c: c[:5] + c[6:], SequenceGapError),
    "many lost": (lambda c: c[:2] + c[9:], SequenceGapError),
    "last before the end lost": (lambda c: c[:-2] + c[-1:], SequenceGapError),
    "duplicated": (lambda c: c[:5] + c[4:], DuplicateFrameError),
    "first duplicated": (lambda c: c[:1] + c, DuplicateFrameError),
    "end marker duplicated": (lambda c: c + c[-1:], DuplicateFrameError),
    "reordered": (lambda c: _swap(c, 4), ReorderedFrameError),
    "end marker ahead": (lambda c: _swap(c, len(c) - 2), ReorderedFrameError),
    "no end marker": (lambda c: c[:-1], ic.IncompleteStreamError),
    "empty": (lambda c: [], ic.IncompleteStreamError),
    "chunk after the end marker": (
        lambda c: [*c, dataclasses.replace(c[0], seq=len(c))],
        ic.IncompleteStreamError,
    ),
    "end marker counts more": (lambda c: _recount(c, 17), ic.IncompleteStreamError),
    "end marker counts fewer": (lambda c: _recount(c, 15), ic.IncompleteStreamError),
    "end marker without a count": (
        lambda c: [*c[:-1], dataclasses.replace(c[-1], usage=None)],
        ic.IncompleteStreamError,
    ),
    "text altered": (
        lambda c: [*c[:3], dataclasses.replace(c[3], text=c[3].text + "!"), *c[4:]],
        AlteredStreamError,
    ),
    "token altered": (
        lambda c: [*c[:3], dataclasses.replace(c[3], token_ids=(7,)), *c[4:]],
        AlteredStreamError,
    ),
}


def test_whole_streams_pass() -> None:
    for name in STREAMS:
        for max_tokens in (None, 1, 7, 100, 10**6):
            chunks = list(SERVICE.chunks(it.GenerateRequest(workload=name, max_tokens=max_tokens)))
            assert verdict(chunks, chunks) is None, (name, max_tokens)
            assert verdict(chunks, None) is None, (name, max_tokens)


@pytest.mark.parametrize("case", list(BROKEN))
def test_broken_streams_are_named(case: str) -> None:
    breaking, expected_error = BROKEN[case]
    broken = breaking(list(CHUNKS))
    assert verdict(broken) is expected_error
    if expected_error is not AlteredStreamError:  # the sequence and count alone tell
        assert verdict(broken, None) is expected_error


def test_a_different_but_well_formed_stream_is_altered() -> None:
    other = list(SERVICE.chunks(it.GenerateRequest(workload="stream-16", seed=1)))
    assert verdict(other, None) is None
    assert verdict(other) is AlteredStreamError
    shorter = list(SERVICE.chunks(it.GenerateRequest(workload="stream-16", max_tokens=8)))
    assert verdict(shorter) is AlteredStreamError  # whole, as cut, but not what was asked


def test_sequence_errors_say_where() -> None:
    verifier = StreamVerifier()
    verifier.check(CHUNKS[0])
    assert verifier.check(CHUNKS[3]) == 0  # held: a gap or a reordering, the next one tells
    with pytest.raises(SequenceGapError) as caught:
        verifier.check(CHUNKS[4])
    assert (caught.value.expected, caught.value.received) == (1, 3)
    verifier = StreamVerifier()
    for chunk in CHUNKS[:4]:
        verifier.check(chunk)
    with pytest.raises(DuplicateFrameError) as dup:
        verifier.check(CHUNKS[2])
    assert (dup.value.expected, dup.value.received) == (4, 2)


def test_flatbuffers_views_verify() -> None:
    codec = ic.get("flatbuffers")
    encoder, decoder = codec.stream_encoder(), codec.stream_decoder()
    views = decoder.feed(b"".join(encoder.encode(c) for c in CHUNKS) + encoder.end())
    decoder.close()
    assert not isinstance(views[0], ic.TokenChunk)
    assert verdict(views) is None
    assert verdict(views[:-1]) is ic.IncompleteStreamError


@pytest.mark.parametrize("max_tokens", [1, 5, 15])
def test_a_cut_stream_ends_with_its_own_end_marker(max_tokens: int) -> None:
    workload = "stream-256-multi"
    whole = list(SERVICE.chunks(it.GenerateRequest(workload=workload)))
    cut = list(SERVICE.chunks(it.GenerateRequest(workload=workload, max_tokens=max_tokens)))
    last = len(cut) - 1
    kept = sum(len(c.token_ids) for c in cut)
    assert kept >= max_tokens > kept - len(cut[last].token_ids)
    assert [c.finish_reason for c in cut] == [None] * last + ["length"]
    assert whole[-1].usage is not None
    assert cut[last].usage == ic.Usage(
        prompt_tokens=whole[-1].usage.prompt_tokens, completion_tokens=kept
    )
    assert cut[:last] == whole[:last]
    assert cut[last] == dataclasses.replace(
        whole[last], finish_reason="length", usage=cut[last].usage
    )


# -- the load generator -------------------------------------------------------------------


class ScriptedTarget:
    """A target whose n-th stream is ``streams[n % len(streams)]``, sent without I/O."""

    def __init__(self, streams: Sequence[Sequence[ic.TokenChunk]]) -> None:
        self.streams = streams
        self.sent = 0

    async def generate(self, request: it.GenerateRequest, /) -> AsyncIterator[ic.TokenChunk]:
        stream = self.streams[self.sent % len(self.streams)]
        self.sent += 1
        for chunk in stream:
            await asyncio.sleep(0)
            yield chunk

    async def close(self) -> None:
        pass


def _point(target: ScriptedTarget, **kwargs: Any) -> dict[str, Any]:
    spec = openloop.LoadSpec(workload="stream-16", requests=len(target.streams) * 3, seed=2)
    return asyncio.run(openloop.run_point(target, spec, rate_rps=1000.0, **kwargs))


def test_the_generator_counts_each_kind_of_broken_stream() -> None:
    kinds = {
        "lost": BROKEN["middle lost"][0](list(CHUNKS)),
        "duplicated": BROKEN["duplicated"][0](list(CHUNKS)),
        "reordered": BROKEN["reordered"][0](list(CHUNKS)),
        "truncated": BROKEN["no end marker"][0](list(CHUNKS)),
        "altered": BROKEN["text altered"][0](list(CHUNKS)),
    }
    target = ScriptedTarget([CHUNKS, *kinds.values()])
    point = _point(target, expected=CHUNKS)
    assert point["requests_completed"] == 3
    assert point["requests_failed"] == 3 * len(kinds)
    assert point["integrity"] == {
        "verified": 3,
        **{kind: 3 for kind in kinds},
        "content_checked": True,
    }
    assert metrics.integrity_violations(point["integrity"]) == 3 * len(kinds)
    assert "integrity: 3 verified, 3 lost, 3 duplicated, 3 reordered, 3 truncated, 3 altered" in (
        load_command.summary_line(point)
    )
    # without the expected chunks, an altered stream that is whole passes: sequence only
    point = _point(ScriptedTarget([CHUNKS, kinds["altered"]]))
    assert point["requests_completed"] == 6
    assert point["integrity"]["content_checked"] is False
    assert "(sequence only)" in load_command.summary_line(point)


def test_a_healthy_run_reports_zero_violations() -> None:
    point = _point(ScriptedTarget([CHUNKS]), expected=CHUNKS)
    assert point["requests_completed"] == point["requests_scheduled"] == 3
    assert point["errors"] == {}
    assert point["integrity"]["verified"] == 3
    assert metrics.integrity_violations(point["integrity"]) == 0
    assert point["output_tokens"] == 3 * 16
