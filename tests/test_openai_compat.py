"""The JSON codecs' token chunks are OpenAI ``chat.completion.chunk`` objects.

Checked with the official client's own model (``openai.types.chat.ChatCompletionChunk``),
so a client written against OpenAI reads every chunk we send, field for field.
"""

from __future__ import annotations

import json
import struct
from typing import Any

import msgpack
import pytest
from hypothesis import given
from hypothesis import strategies as st
from openai.types.chat import ChatCompletionChunk

import inferwire.codecs as ic
from inferwire import workloads

JSON_CODECS = [n for n in ic.names() if ic.get(n).media_type == "application/json"]
MSGPACK_CODECS = ["msgpack", "msgspec-msgpack"]
STREAMS = ["stream-16", "stream-16-top5", "stream-256-top5", "stream-256-multi"]
# OpenAI's finish reasons (ChatCompletionChunk.choices[].finish_reason)
FINISH_REASONS = ["stop", "length", "tool_calls", "content_filter", "function_call"]


def _bits(value: float) -> bytes:
    return struct.pack("<d", value)


def check_openai_chunk(payload: bytes, chunk: ic.TokenChunk) -> None:
    """``payload`` validates as OpenAI's chunk and carries every value of ``chunk``."""
    parsed = ChatCompletionChunk.model_validate_json(payload, strict=True)
    assert parsed.object == "chat.completion.chunk"
    assert parsed.id == chunk.id
    assert parsed.model == chunk.model
    assert parsed.created == chunk.created
    (choice,) = parsed.choices
    assert choice.index == chunk.index
    assert choice.delta.content == chunk.text
    # the first chunk of a response names the role, as OpenAI's does
    assert choice.delta.role == ("assistant" if chunk.seq == 0 else None)
    assert choice.finish_reason == chunk.finish_reason
    if chunk.logprobs is None:
        assert choice.logprobs is None
    else:
        assert choice.logprobs is not None
        content = choice.logprobs.content
        assert content is not None
        assert len(content) == len(chunk.logprobs)
        for got, want in zip(content, chunk.logprobs, strict=True):
            assert got.token == want.token
            assert _bits(got.logprob) == _bits(want.logprob)
            assert got.bytes == list(want.token.encode())
            assert len(got.top_logprobs) == len(want.top)
            for got_top, want_top in zip(got.top_logprobs, want.top, strict=True):
                assert got_top.token == want_top.token
                assert _bits(got_top.logprob) == _bits(want_top.logprob)
                assert got_top.bytes == list(want_top.token.encode())
    if chunk.usage is None:
        assert parsed.usage is None
    else:
        assert parsed.usage is not None
        assert parsed.usage.prompt_tokens == chunk.usage.prompt_tokens
        assert parsed.usage.completion_tokens == chunk.usage.completion_tokens
        assert parsed.usage.total_tokens == (
            chunk.usage.prompt_tokens + chunk.usage.completion_tokens
        )


@pytest.mark.parametrize("name", JSON_CODECS)
@pytest.mark.parametrize("workload", STREAMS)
def test_every_sse_event_is_an_openai_chunk(name: str, workload: str) -> None:
    codec = ic.get(name)
    chunks = workloads.get(workload).messages()
    encoder = codec.stream_encoder()
    for chunk in chunks:
        assert isinstance(chunk, ic.TokenChunk)
        frame = encoder.encode(chunk)
        assert frame.startswith(b"data: ")
        assert frame.endswith(b"\n\n")
        payload = frame[len(b"data: ") : -2]
        assert b"\n" not in payload
        assert payload == codec.encode(chunk)
        check_openai_chunk(payload, chunk)
    assert encoder.end() == b"data: [DONE]\n\n"


def test_the_stream_workloads_cover_what_a_client_reads() -> None:
    """With and without logprobs, and a last chunk with usage and finish_reason."""
    for workload in STREAMS:
        chunks = workloads.get(workload).messages()
        assert isinstance(chunks[-1], ic.TokenChunk)
        assert chunks[-1].usage is not None
        assert chunks[-1].finish_reason in FINISH_REASONS
    with_logprobs = workloads.get("stream-16-top5").messages()[0]
    assert isinstance(with_logprobs, ic.TokenChunk)
    assert with_logprobs.logprobs
    assert with_logprobs.logprobs[0].top


@pytest.mark.parametrize("name", JSON_CODECS)
def test_every_ndjson_line_is_an_openai_chunk(name: str) -> None:
    codec = ic.get(name, framing="ndjson")
    chunks = workloads.get("stream-16-top5").messages()
    encoder = codec.stream_encoder()
    for chunk in chunks:
        assert isinstance(chunk, ic.TokenChunk)
        line = encoder.encode(chunk)
        assert line.endswith(b"\n")
        check_openai_chunk(line[:-1], chunk)


texts = st.text(max_size=10)
u32 = st.integers(0, 2**32 - 1)
finite = st.floats(allow_nan=False, allow_infinity=False)
top_logprobs = st.builds(ic.TopLogprob, token=texts, logprob=finite)
token_logprobs = st.builds(
    ic.TokenLogprob, token=texts, logprob=finite, top=st.lists(top_logprobs, max_size=3).map(tuple)
)
openai_chunks = st.builds(
    ic.TokenChunk,
    id=texts,
    model=texts,
    created=st.integers(0, 2**63 - 1),
    index=u32,
    seq=st.integers(0, 2**63 - 1),
    token_ids=st.lists(u32, max_size=4).map(tuple),
    text=st.text(),
    logprobs=st.none() | st.lists(token_logprobs, max_size=3).map(tuple),
    finish_reason=st.none() | st.sampled_from(FINISH_REASONS),
    usage=st.none() | st.builds(ic.Usage, prompt_tokens=u32, completion_tokens=u32),
)


@pytest.mark.parametrize("name", JSON_CODECS)
@given(chunk=openai_chunks)
def test_any_chunk_is_an_openai_chunk(name: str, chunk: ic.TokenChunk) -> None:
    check_openai_chunk(ic.get(name).encode(chunk), chunk)


@given(chunk=openai_chunks)
def test_the_json_codecs_write_the_same_object(chunk: ic.TokenChunk) -> None:
    """The byte-level text may differ (float formatting), the object may not."""
    objects = [json.loads(ic.get(name).encode(chunk)) for name in JSON_CODECS]
    assert all(o == objects[0] for o in objects[1:])


@given(chunk=openai_chunks)
def test_the_msgpack_codecs_write_the_json_object_too(chunk: ic.TokenChunk) -> None:
    expected = json.loads(ic.get("json").encode(chunk))
    for name in MSGPACK_CODECS:
        unpacked: Any = msgpack.unpackb(ic.get(name).encode(chunk), raw=False)
        assert unpacked == expected, name
