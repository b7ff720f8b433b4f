"""The OpenAI objects a response is made of, built from the service's token chunks: the
``chat.completion`` and ``text_completion`` bodies of a non-streamed answer, the
``text_completion`` chunks of a streamed legacy completion, the usage-only chunk of
``stream_options.include_usage``, and the legacy stream's encoder that puts usage where OpenAI
does (a chat stream's is :class:`inferwire.serving.UsageAsOpenAI`, shared with the serving
helpers).

Shapes follow the OpenAI API reference (the chat completion and chunk objects, the legacy
completion object) and what vLLM writes for them: ``logprobs`` is ``null`` when absent, the
usage-only chunk has ``"choices": []``. inferwire's extensions, when a request asks for them,
add ``token_ids`` to a choice (and ``seq`` to a chunk, as the chat chunk codecs write it).
A chat chunk itself is the codec's (:mod:`inferwire.codecs.openai`); everything here is plain
objects written with orjson, whatever the server's codec.

Each OpenAI answer has its own ``id`` and ``created``, as vLLM's do (:class:`Identity`): the
service's chunks come from seeded workloads, whose ids repeat from one request to the next.
The fresh id is as long as the workload's (``chatcmpl-`` and as many random hex digits), so an
answer's bytes are as long as before; ``created`` is the time the answer started.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final

import inferwire.codecs as ic
from inferwire.codecs import openai as oa
from inferwire.codecs.framing import StreamEncoder
from inferwire.codecs.model import new_token_chunk
from inferwire.serving import UsageAsOpenAI, completion_id
from inferwire.serving.chunks import COMPLETION_ID_PREFIX
from inferwire.serving.stream import UsageExtra, usage_chunk

__all__ = [
    "CHAT_COMPLETION",
    "TEXT_COMPLETION",
    "CompletionChunks",
    "Identity",
    "Relabeled",
    "UsageAsOpenAI",
    "chat_completion",
    "text_completion",
    "text_completion_chunk",
    "text_completion_id",
]

Obj = dict[str, Any]

CHAT_COMPLETION: Final = "chat.completion"
TEXT_COMPLETION: Final = "text_completion"


@dataclass(frozen=True, slots=True)
class Identity:
    """An answer's own ``id`` and ``created``."""

    id: str
    created: int

    @classmethod
    def fresh(cls, like: str) -> Identity:
        """A new id as long as ``like`` (a ``chatcmpl-`` id; vLLM's 32 hex digits for any
        other), created now."""
        digits = len(like) - len(COMPLETION_ID_PREFIX)
        if not like.startswith(COMPLETION_ID_PREFIX) or digits < 1:
            digits = 32
        return cls(completion_id(digits), int(time.time()))


class Relabeled:
    """A stream encoder that writes every chunk under one answer's :class:`Identity`."""

    __slots__ = ("_created", "_encode", "_end", "_id", "identity")

    def __init__(self, encoder: StreamEncoder, identity: Identity) -> None:
        self._encode = encoder.encode
        self._end = encoder.end
        self.identity = identity
        self._id = identity.id
        self._created = identity.created

    def encode(self, chunk: ic.TokenChunk, /) -> bytes:
        # a copy of the chunk under this answer's id (the model's positional constructor, the
        # cheapest copy: about 0.5 us a chunk here)
        return self._encode(
            new_token_chunk(
                self._id,
                chunk.model,
                self._created,
                chunk.index,
                chunk.seq,
                chunk.token_ids,
                chunk.text,
                chunk.logprobs,
                chunk.finish_reason,
                chunk.usage,
            )
        )

    def end(self) -> bytes:
        return self._end()


def text_completion_id(chat_id: str) -> str:
    """The id of a legacy completion: ``cmpl-`` where a chat completion's is ``chatcmpl-``."""
    return "cmpl-" + chat_id.removeprefix("chatcmpl-")


def _usage(chunks: Sequence[ic.TokenChunk]) -> ic.Usage:
    """The end marker's usage; a stream whose source left it out counts its own tokens."""
    usage = chunks[-1].usage
    if usage is not None:
        return usage
    return ic.Usage(prompt_tokens=0, completion_tokens=sum(len(c.token_ids) for c in chunks))


def _logprobs(chunks: Sequence[ic.TokenChunk]) -> tuple[ic.TokenLogprob, ...] | None:
    if chunks[0].logprobs is None:
        return None
    return tuple(lp for c in chunks for lp in c.logprobs or ())


def chat_completion(
    chunks: Sequence[ic.TokenChunk],
    *,
    extensions: bool,
    identity: Identity | None = None,
    extra: Mapping[str, Any] | None = None,
) -> Obj:
    """The ``chat.completion`` object of a whole stream (one choice), under ``identity`` (the
    chunks' id and created without one); ``extra``'s fields after the usage."""
    first, last = chunks[0], chunks[-1]
    logprobs = _logprobs(chunks)
    choice: Obj = {
        "index": first.index,
        "message": {"role": "assistant", "content": "".join(c.text for c in chunks)},
        "logprobs": None if logprobs is None else {"content": oa.logprobs_content(logprobs)},
        "finish_reason": last.finish_reason,
    }
    if extensions:
        choice["token_ids"] = [t for c in chunks for t in c.token_ids]
    return {
        "id": first.id if identity is None else identity.id,
        "object": CHAT_COMPLETION,
        "created": first.created if identity is None else identity.created,
        "model": first.model,
        "choices": [choice],
        "usage": oa.usage_obj(_usage(chunks)),
        **(extra or {}),
    }


def _legacy_logprobs(logprobs: tuple[ic.TokenLogprob, ...], offset: int) -> Obj:
    """The legacy completion's ``logprobs``: parallel lists, each token's top alternatives as
    a map of text to logprob, and each token's character offset in the completion's text."""
    offsets = []
    for lp in logprobs:
        offsets.append(offset)
        offset += len(lp.token)
    return {
        "tokens": [lp.token for lp in logprobs],
        "token_logprobs": [lp.logprob for lp in logprobs],
        "top_logprobs": [{t.token: t.logprob for t in lp.top} for lp in logprobs],
        "text_offset": offsets,
    }


def _text_choice(
    chunks: Sequence[ic.TokenChunk], text: str, offset: int, *, extensions: bool
) -> Obj:
    logprobs = _logprobs(chunks)
    choice: Obj = {
        "index": chunks[0].index,
        "text": text,
        "logprobs": None if logprobs is None else _legacy_logprobs(logprobs, offset),
        "finish_reason": chunks[-1].finish_reason,
    }
    if extensions:
        choice["token_ids"] = [t for c in chunks for t in c.token_ids]
    return choice


def text_completion(
    chunks: Sequence[ic.TokenChunk],
    *,
    extensions: bool,
    identity: Identity | None = None,
    extra: Mapping[str, Any] | None = None,
) -> Obj:
    """The legacy ``text_completion`` object of a whole stream (one choice); ``identity``
    and ``extra`` as for :func:`chat_completion`."""
    first = chunks[0]
    text = "".join(c.text for c in chunks)
    return {
        "id": text_completion_id(first.id if identity is None else identity.id),
        "object": TEXT_COMPLETION,
        "created": first.created if identity is None else identity.created,
        "model": first.model,
        "choices": [_text_choice(chunks, text, 0, extensions=extensions)],
        "usage": oa.usage_obj(_usage(chunks)),
        **(extra or {}),
    }


def text_completion_chunk(chunk: ic.TokenChunk, offset: int, *, extensions: bool) -> Obj:
    """One streamed ``text_completion`` chunk; ``offset``: characters of text before it. With
    ``extensions``, ``seq`` and the usage of the end marker too, as on a chat chunk."""
    obj: Obj = {
        "id": text_completion_id(chunk.id),
        "object": TEXT_COMPLETION,
        "created": chunk.created,
        "model": chunk.model,
    }
    if extensions:
        obj["seq"] = chunk.seq
    obj["choices"] = [_text_choice((chunk,), chunk.text, offset, extensions=extensions)]
    if extensions and chunk.usage is not None:
        obj["usage"] = oa.usage_obj(chunk.usage)
    return obj


class CompletionChunks:
    """A legacy completion's stream: ``text_completion`` chunks in ``objects``' framing, usage
    placed as :class:`~inferwire.serving.UsageAsOpenAI` places a chat stream's (or, with
    ``extensions``, on the end marker), with ``usage_extra``'s fields."""

    __slots__ = ("_objects", "_offset", "extensions", "include_usage", "usage_extra")

    def __init__(
        self,
        objects: StreamEncoder,
        *,
        include_usage: bool,
        extensions: bool,
        usage_extra: UsageExtra | None = None,
    ) -> None:
        self._objects = objects
        self._offset = 0
        self.include_usage = include_usage
        self.extensions = extensions
        self.usage_extra = usage_extra

    def encode(self, chunk: ic.TokenChunk, /) -> bytes:
        frame = self._objects.encode(
            text_completion_chunk(chunk, self._offset, extensions=self.extensions)
        )
        self._offset += len(chunk.text)
        if chunk.usage is not None and self.include_usage and not self.extensions:
            frame += self._objects.encode(
                usage_chunk(
                    chunk,
                    chunk.usage,
                    object_=TEXT_COMPLETION,
                    id_=text_completion_id(chunk.id),
                    extra=self.usage_extra,
                )
            )
        return frame

    def end(self) -> bytes:
        return self._objects.end()
