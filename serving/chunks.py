"""The token chunks of one response, numbered and finished as OpenAI's stream is.

    builder = ChunkBuilder(model, include_usage=request.include_usage, prompt_tokens=12)
    for text, ids in generated:
        yield builder.chunk(text, ids)
    yield builder.finish(finish_reason="stop")

Every chunk of a response shares its ``id`` (``chatcmpl-`` and a random hex, as vLLM makes
it), ``created`` (seconds since the epoch) and ``model``; ``seq`` counts the chunks from 0.
Only the last chunk carries ``finish_reason``, and ``usage`` too when the request asked for it
(``stream_options.include_usage``): the response helpers then write it as OpenAI does, in a
chunk of its own with ``"choices": []`` (:func:`inferwire.serving.response_encoder`).
"""

from __future__ import annotations

import secrets
import time
import uuid
from collections.abc import Sequence
from typing import Final

import inferwire.codecs as ic
from inferwire.codecs.model import new_token_chunk

from .errors import ChunkBuilderError

FINISH_REASONS: Final = frozenset(
    {"stop", "length", "tool_calls", "content_filter", "function_call"}
)
"""The ``finish_reason`` values OpenAI's chat completion chunk defines."""
_MAX_TOKEN_ID: Final = (1 << 32) - 1
"""Token ids are uint32 in the binary codecs' schemas."""


COMPLETION_ID_PREFIX: Final = "chatcmpl-"


def completion_id(hex_digits: int = 32) -> str:
    """A fresh chat completion id: ``chatcmpl-`` and ``hex_digits`` random hex digits (32 by
    default: vLLM's form, a UUID4's hex)."""
    if hex_digits == 32:
        return f"{COMPLETION_ID_PREFIX}{uuid.uuid4().hex}"
    if type(hex_digits) is not int or hex_digits < 1:
        raise ValueError("hex_digits must be a positive integer")
    return COMPLETION_ID_PREFIX + secrets.token_hex((hex_digits + 1) // 2)[:hex_digits]


class ChunkBuilder:
    """The chunks of one choice of one response; see the module docstring.

    ``prompt_tokens`` goes into the usage; ``completion_tokens`` counts the token ids of every
    chunk (pass ``completion_tokens`` to :meth:`finish` when the chunks carry none)."""

    __slots__ = (
        "completion_tokens",
        "created",
        "finished",
        "id",
        "include_usage",
        "index",
        "model",
        "prompt_tokens",
        "seq",
    )

    def __init__(
        self,
        model: str,
        *,
        id: str | None = None,
        created: int | None = None,
        index: int = 0,
        prompt_tokens: int = 0,
        include_usage: bool = False,
    ) -> None:
        if not isinstance(model, str) or not model:
            raise ChunkBuilderError("model must be a non-empty string")
        if type(prompt_tokens) is not int or prompt_tokens < 0:
            raise ChunkBuilderError("prompt_tokens must be a non-negative integer")
        self.model = model
        self.id = completion_id() if id is None else id
        self.created = int(time.time()) if created is None else created
        self.index = index
        self.prompt_tokens = prompt_tokens
        self.include_usage = include_usage
        self.seq = 0
        """The ``seq`` of the next chunk: how many have been made."""
        self.completion_tokens = 0
        self.finished = False

    def chunk(
        self,
        text: str,
        token_ids: Sequence[int] = (),
        *,
        logprobs: Sequence[ic.TokenLogprob] | None = None,
    ) -> ic.TokenChunk:
        """The next chunk: ``text`` and the ``token_ids`` it decodes from (optional), with
        one logprob entry per token when the request asked for logprobs."""
        return self._make(text, token_ids, logprobs, None, None)

    def finish(
        self,
        text: str = "",
        token_ids: Sequence[int] = (),
        *,
        finish_reason: str = "stop",
        logprobs: Sequence[ic.TokenLogprob] | None = None,
        completion_tokens: int | None = None,
    ) -> ic.TokenChunk:
        """The last chunk: ``finish_reason`` (``"stop"``, or ``"length"`` when the output
        limit cut it, ...), and the usage when the builder was asked to include it
        (``completion_tokens``: the token ids counted so far unless given)."""
        if finish_reason not in FINISH_REASONS:
            raise ChunkBuilderError(
                f"finish_reason must be one of {', '.join(sorted(FINISH_REASONS))}, "
                f"not {finish_reason!r}"
            )
        usage = None
        if self.include_usage:
            counted = self.completion_tokens + len(token_ids)
            usage = ic.Usage(
                prompt_tokens=self.prompt_tokens,
                completion_tokens=counted if completion_tokens is None else completion_tokens,
            )
        chunk = self._make(text, token_ids, logprobs, finish_reason, usage)
        self.finished = True
        return chunk

    def usage(self) -> ic.Usage:
        """The usage so far (what a non-streamed answer reports)."""
        return ic.Usage(prompt_tokens=self.prompt_tokens, completion_tokens=self.completion_tokens)

    def _make(
        self,
        text: str,
        token_ids: Sequence[int],
        logprobs: Sequence[ic.TokenLogprob] | None,
        finish_reason: str | None,
        usage: ic.Usage | None,
    ) -> ic.TokenChunk:
        if self.finished:
            raise ChunkBuilderError("the response is finished: no chunk follows finish()")
        if type(text) is not str:
            raise ChunkBuilderError(f"text must be a string, not {type(text).__name__}")
        ids = token_ids if type(token_ids) is tuple else tuple(token_ids)
        for token_id in ids:  # a loop, not all(...): one token a chunk is the common case
            if type(token_id) is not int or not 0 <= token_id <= _MAX_TOKEN_ID:
                raise ChunkBuilderError("token ids must be integers in 0..2**32-1")
        # the model's positional constructor: a chunk per token is this builder's hot path
        chunk = new_token_chunk(
            self.id,
            self.model,
            self.created,
            self.index,
            self.seq,
            ids,
            text,
            None if logprobs is None else tuple(logprobs),
            finish_reason,
            usage,
        )
        self.seq += 1
        self.completion_tokens += len(ids)
        return chunk
