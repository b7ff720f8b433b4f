"""The JSON codecs' token chunks are OpenAI ``chat.completion.chunk`` objects.

Checked with the official client's own model (``openai.types.chat.ChatCompletionChunk``),
so a client written against OpenAI reads every chunk we send, field for field.
"""

from __future__ import annotations

import dataclasses
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
from inferwire.codecs.integrity import StreamVerifier

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
    expected = json.loads(ic.get("json", extensions=True).encode(chunk))
    for name in MSGPACK_CODECS:
        unpacked: Any = msgpack.unpackb(ic.get(name).encode(chunk), raw=False)
        assert unpacked == expected, name


# -- without inferwire's extensions: the chunk vLLM writes ---------------------------------

CHUNK = workloads.get("stream-16").messages()[0]

VLLM_CHUNK_KEYS = {"id", "object", "created", "model", "choices"}
VLLM_CHOICE_KEYS = {"index", "delta", "logprobs", "finish_reason"}


@pytest.mark.parametrize("name", JSON_CODECS)
@pytest.mark.parametrize("workload", STREAMS)
def test_without_extensions_a_chunk_has_the_fields_vllm_writes(name: str, workload: str) -> None:
    codec = ic.get(name, extensions=False)
    for chunk in workloads.get(workload).messages():
        assert isinstance(chunk, ic.TokenChunk)
        payload = codec.encode(chunk)
        check_openai_chunk(payload, chunk)
        obj = json.loads(payload)
        assert set(obj) == VLLM_CHUNK_KEYS | ({"usage"} if chunk.usage else set())
        assert set(obj["choices"][0]) == VLLM_CHOICE_KEYS
        assert obj["choices"][0]["logprobs"] is None or chunk.logprobs is not None


@given(chunk=openai_chunks)
def test_without_extensions_the_json_codecs_write_the_same_object(chunk: ic.TokenChunk) -> None:
    objects = [json.loads(ic.get(n, extensions=False).encode(chunk)) for n in JSON_CODECS]
    assert all(o == objects[0] for o in objects[1:])
    with_extensions = json.loads(ic.get("json", extensions=True).encode(chunk))
    del with_extensions["seq"], with_extensions["choices"][0]["token_ids"]
    assert objects[0] == with_extensions


@pytest.mark.parametrize("name", JSON_CODECS)
@pytest.mark.parametrize("workload", STREAMS)
def test_by_default_the_json_codecs_write_openais_chunk(name: str, workload: str) -> None:
    """No field of inferwire's own unless asked for: the bytes an OpenAI client receives."""
    codec = ic.get(name)
    assert codec.extensions is False
    encoder = codec.stream_encoder()
    for chunk in workloads.get(workload).messages():
        assert isinstance(chunk, ic.TokenChunk)
        payload = codec.encode(chunk)
        assert payload == ic.get(name, extensions=False).encode(chunk)
        assert encoder.encode(chunk) == b"data: " + payload + b"\n\n"
        check_openai_chunk(payload, chunk)
        obj = json.loads(payload)
        assert "seq" not in obj
        assert "token_ids" not in obj["choices"][0]
        assert set(obj) == VLLM_CHUNK_KEYS | ({"usage"} if chunk.usage else set())
    assert isinstance(CHUNK, ic.TokenChunk)
    with_extensions = json.loads(ic.get(name, extensions=True).encode(CHUNK))
    assert with_extensions["seq"] == CHUNK.seq
    assert with_extensions["choices"][0]["token_ids"] == list(CHUNK.token_ids)


@pytest.mark.parametrize("name", JSON_CODECS)
@pytest.mark.parametrize("workload", STREAMS)
def test_without_extensions_a_stream_reads_back_numbered_by_place(name: str, workload: str) -> None:
    """What is not sent cannot come back: token ids are empty, seq is the chunk's place."""
    codec = ic.get(name, extensions=False)
    chunks = workloads.get(workload).messages()
    encoder = codec.stream_encoder()
    wire = b"".join(encoder.encode(c) for c in chunks) + encoder.end()
    decoder = codec.stream_decoder()
    got = decoder.feed(wire)
    decoder.close()
    assert got == [
        dataclasses.replace(c, token_ids=()) for c in chunks if isinstance(c, ic.TokenChunk)
    ]
    # a stream without token ids cannot prove itself whole
    verifier = StreamVerifier()
    for chunk in got:
        verifier.check(chunk)
    with pytest.raises(ic.IncompleteStreamError):
        verifier.finish()


# What OpenAI-compatible servers send that inferwire does not write, read without extensions.
FOREIGN_CHUNKS = {
    "vllm role chunk": (
        b'{"id":"c","object":"chat.completion.chunk","created":1,"model":"m","choices":'
        b'[{"index":0,"delta":{"role":"assistant","content":""},"logprobs":null,'
        b'"finish_reason":null}]}',
        ic.TokenChunk(id="c", model="m", created=1, index=0, seq=7, token_ids=(), text=""),
    ),
    "vllm finish chunk, empty delta": (
        b'{"id":"c","object":"chat.completion.chunk","created":1,"model":"m","choices":'
        b'[{"index":0,"delta":{},"logprobs":null,"finish_reason":"stop","stop_reason":null}]}',
        ic.TokenChunk(
            id="c", model="m", created=1, index=0, seq=7, token_ids=(), text="",
            finish_reason="stop",
        ),
    ),
    "openai: no logprobs key, usage null, token ids": (
        b'{"id":"c","object":"chat.completion.chunk","created":1,"model":"m",'
        b'"system_fingerprint":"fp","usage":null,"choices":[{"index":0,"delta":'
        b'{"content":"hi","refusal":null},"finish_reason":null,"token_ids":[5]}]}',
        ic.TokenChunk(id="c", model="m", created=1, index=0, seq=7, token_ids=(5,), text="hi"),
    ),
}  # fmt: skip


@pytest.mark.parametrize("name", JSON_CODECS)
@pytest.mark.parametrize("case", FOREIGN_CHUNKS)
def test_without_extensions_any_openai_chunk_is_read(name: str, case: str) -> None:
    payload, want = FOREIGN_CHUNKS[case]
    decoder = ic.get(name, extensions=False).stream_decoder()
    got = decoder.feed(b"".join([b"data: " + payload + b"\n\n"] * 8) + b"data: [DONE]\n\n")
    decoder.close()
    assert got[7] == want
    assert [c.seq for c in got] == list(range(8))
    assert ic.get(name, extensions=False).decode(payload, ic.TokenChunk).seq == 0
    with pytest.raises(ic.DecodeError):  # with extensions, a chunk must carry them
        ic.get(name, extensions=True).decode(payload, ic.TokenChunk)


@pytest.mark.parametrize("name", JSON_CODECS)
def test_the_usage_chunk_is_not_a_token_chunk(name: str) -> None:
    payload = (
        b'{"id":"c","object":"chat.completion.chunk","created":1,"model":"m","choices":[],'
        b'"usage":{"prompt_tokens":1,"completion_tokens":2,"total_tokens":3}}'
    )
    with pytest.raises(ic.DecodeError, match="usage"):
        ic.get(name, extensions=False).decode(payload, ic.TokenChunk)


@pytest.mark.parametrize("name", MSGPACK_CODECS)
def test_only_the_json_codecs_leave_the_extensions_out(name: str) -> None:
    """OpenAI's wire is JSON: a MessagePack stream is inferwire's own and carries them all."""
    assert ic.get(name, extensions=True).encode(CHUNK) == ic.get(name).encode(CHUNK)
    with pytest.raises(ValueError, match="always carries"):
        ic.get(name, extensions=False)


@pytest.mark.parametrize("name", JSON_CODECS)
def test_extensions_must_be_a_bool(name: str) -> None:
    with pytest.raises(ValueError, match="True or False"):
        ic.get(name, extensions=1)
