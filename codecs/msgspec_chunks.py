"""The token chunk as msgspec Structs: OpenAI's ``chat.completion.chunk`` field for field, as
:mod:`inferwire.codecs.openai` writes it with inferwire's extensions (:class:`ChunkS`) and
without (:class:`OpenAIChunkS`, written; :class:`AnyChunkS`, read from any OpenAI-compatible
server), and the conversions from and to :class:`~inferwire.codecs.TokenChunk`.
"""

from __future__ import annotations

import math
from typing import Any

import msgspec

from . import openai as oa
from .errors import DecodeError, EncodeError
from .model import (
    TokenChunk,
    TokenLogprob,
    Usage,
    new_token_chunk,
    new_token_logprob,
    new_top_logprob,
)


class TopLogprobS(msgspec.Struct):
    token: str
    logprob: float
    bytes: list[int]


class TokenLogprobS(msgspec.Struct):
    token: str
    logprob: float
    bytes: list[int]
    top_logprobs: list[TopLogprobS]


class LogprobsS(msgspec.Struct):
    content: list[TokenLogprobS]


class DeltaS(msgspec.Struct, kw_only=True, omit_defaults=True):
    role: str | None = None
    content: str


class ChoiceS(msgspec.Struct):
    index: int
    delta: DeltaS
    logprobs: LogprobsS | None
    finish_reason: str | None
    token_ids: list[int]


class OpenAIChoiceS(msgspec.Struct):
    """:class:`ChoiceS` without inferwire's ``token_ids``: the choice vLLM writes."""

    index: int
    delta: DeltaS
    logprobs: LogprobsS | None
    finish_reason: str | None


class AnyDeltaS(msgspec.Struct):
    role: str | None = None
    content: str | None = None


class AnyChoiceS(msgspec.Struct, kw_only=True):
    """A choice as any OpenAI-compatible server may write it (see :mod:`.openai`)."""

    index: int
    delta: AnyDeltaS
    logprobs: LogprobsS | None = None
    finish_reason: str | None = None
    token_ids: list[int] = msgspec.field(default_factory=list)


class UsageS(msgspec.Struct):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int


class ChunkS(msgspec.Struct, kw_only=True, omit_defaults=True):
    id: str
    object: str
    created: int
    model: str
    seq: int
    choices: list[ChoiceS]
    usage: UsageS | None = None


class OpenAIChunkS(msgspec.Struct, kw_only=True, omit_defaults=True):
    """:class:`ChunkS` without inferwire's ``seq``: the chunk vLLM writes."""

    id: str
    object: str
    created: int
    model: str
    choices: list[OpenAIChoiceS]
    usage: UsageS | None = None


class AnyChunkS(msgspec.Struct, kw_only=True):
    id: str
    object: str
    created: int
    model: str
    seq: int | None = None
    choices: list[AnyChoiceS]
    usage: UsageS | None = None


def _finite(value: float) -> float:
    if not math.isfinite(value):  # msgspec would write null in JSON
        raise EncodeError(f"non-finite float {value!r} cannot be carried")
    return value


def usage_s(usage: Usage | None) -> UsageS | None:
    if usage is None:
        return None
    return UsageS(
        usage.prompt_tokens, usage.completion_tokens, usage.prompt_tokens + usage.completion_tokens
    )


def usage_from_s(usage: UsageS | None) -> Usage | None:
    if usage is None:
        return None
    return Usage(prompt_tokens=usage.prompt_tokens, completion_tokens=usage.completion_tokens)


def _any(value: float) -> float:
    return value


def _logprobs_s(chunk: TokenChunk, number: Any) -> LogprobsS | None:
    logprobs = chunk.logprobs
    if logprobs is None:
        return None
    return LogprobsS(
        [
            TokenLogprobS(
                lp.token,
                number(lp.logprob),
                list(lp.token.encode()),
                [TopLogprobS(t.token, number(t.logprob), list(t.token.encode())) for t in lp.top],
            )
            for lp in logprobs
        ]
    )


def chunk_to_struct(
    chunk: TokenChunk, *, binary: bool = False, extensions: bool = True
) -> ChunkS | OpenAIChunkS:
    # MessagePack carries any double bit for bit; JSON has no text for NaN or infinities.
    number = _any if binary else _finite
    delta = DeltaS(role="assistant" if chunk.seq == 0 else None, content=chunk.text)
    logprobs = _logprobs_s(chunk, number)
    if extensions:
        return ChunkS(
            id=chunk.id,
            object=oa.CHUNK_OBJECT,
            created=chunk.created,
            model=chunk.model,
            seq=chunk.seq,
            choices=[
                ChoiceS(chunk.index, delta, logprobs, chunk.finish_reason, list(chunk.token_ids))
            ],
            usage=usage_s(chunk.usage),
        )
    return OpenAIChunkS(
        id=chunk.id,
        object=oa.CHUNK_OBJECT,
        created=chunk.created,
        model=chunk.model,
        choices=[OpenAIChoiceS(chunk.index, delta, logprobs, chunk.finish_reason)],
        usage=usage_s(chunk.usage),
    )


def _logprobs(logprobs: LogprobsS | None) -> tuple[TokenLogprob, ...] | None:
    if logprobs is None:
        return None
    return tuple(
        [
            new_token_logprob(
                lp.token,
                lp.logprob,
                tuple([new_top_logprob(t.token, t.logprob) for t in lp.top_logprobs]),
            )
            for lp in logprobs.content
        ]
    )


def chunk_from_struct(s: ChunkS) -> TokenChunk:
    if s.object != oa.CHUNK_OBJECT:
        raise DecodeError(f"not a {oa.CHUNK_OBJECT}: object={s.object!r}")
    if len(s.choices) != 1:
        raise DecodeError(f"expected one choice, got {len(s.choices)}")
    choice = s.choices[0]
    return new_token_chunk(
        s.id,
        s.model,
        s.created,
        choice.index,
        s.seq,
        tuple(choice.token_ids),
        choice.delta.content,
        _logprobs(choice.logprobs),
        choice.finish_reason,
        usage_from_s(s.usage),
    )


def chunk_from_any_struct(s: AnyChunkS, position: int) -> TokenChunk:
    """The chunk of an OpenAI-compatible server, at ``position`` in its stream (see the
    :mod:`.openai` module docstring): what it left out filled in, then read as ours."""
    if not s.choices and s.usage is not None:
        raise DecodeError(
            "a chunk without choices (the usage chunk of stream_options.include_usage) "
            "carries no tokens"
        )
    choices = [
        ChoiceS(
            c.index,
            DeltaS(role=c.delta.role, content=c.delta.content or ""),
            c.logprobs,
            c.finish_reason,
            c.token_ids,
        )
        for c in s.choices
    ]
    seq = position if s.seq is None else s.seq
    return chunk_from_struct(
        ChunkS(
            id=s.id,
            object=s.object,
            created=s.created,
            model=s.model,
            seq=seq,
            choices=choices,
            usage=s.usage,
        )
    )
