"""The token streams of the APIs ``inferwire load --api`` drives, read as each API defines them
and as real servers send them, and checked in the ways that hold for any server.

Each reader turns one response event (an SSE ``data`` object, or a gRPC message) into an
:class:`ApiChunk`: the text it adds over all its choices, its token ids when the server sends
them, whether it finishes a choice, and the usage when it carries one. Tolerated, because
OpenAI, vLLM, SGLang and TGI send them: a chunk with no choices (the usage-only last chunk of
``stream_options.include_usage``), several choices (``n`` > 1), a role-only first delta and
empty deltas (no token), keep-alive comments (the SSE reader drops them), usage on every chunk
(vLLM's ``continuous_usage_stats``: the last one counts), unknown fields. An error object in
the stream (OpenAI's ``{"error": ...}``, the generate extension's ``{"error": "..."}``, a
gRPC response's ``error_message``) fails the request with :class:`ServerStreamError`.

:class:`ApiStreamCheck` is the integrity that holds for any server:

- the stream ends as its API says a stream ends: ``data: [DONE]`` (OpenAI), the end of the
  body (the generate extension has no marker of its own), Triton's final response (gRPC,
  asked for with ``triton_enable_empty_final_response``); else :class:`StreamTruncatedError`;
- every choice that began carries a ``finish_reason`` (where the API has one);
- the tokens counted agree with the server's ``usage`` where it reports one: exactly, when
  counted from token ids or a tokenizer; at most, when counted by chunks (a chunk carries one
  token or more); else :class:`UsageMismatchError`.

How output tokens are counted, in order: the server's usage, the token ids it sent, the
tokenizer the user named, one per token-carrying chunk. The report says which
(``token_count``).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Final, Protocol

import orjson

from inferwire.codecs.integrity import AlteredStreamError
from inferwire.transports import ProtocolError, StreamTruncatedError, TransportError

from .metrics import Histogram

perf_ns: Final = time.perf_counter_ns


class ServerStreamError(TransportError):
    """The server reported an error inside a stream it had begun with a success status."""


class UsageMismatchError(AlteredStreamError):
    """The tokens delivered disagree with the server's own usage count."""


class TokenCounter(Protocol):
    def count(self, text: str, /) -> int: ...


@dataclass(frozen=True, slots=True)
class Usage:
    prompt_tokens: int | None
    completion_tokens: int


@dataclass(frozen=True, slots=True)
class ApiChunk:
    """One response event of a stream, over all its choices."""

    text: str = ""
    token_ids: tuple[int, ...] | None = None
    tokens: int = 0
    """How many of its choices carry output (text, token ids, a tool call or reasoning)."""
    finished: tuple[int, ...] = ()
    """The choices it finishes (their ``finish_reason`` is set)."""
    started: tuple[int, ...] = ()
    """The choices it carries."""
    usage: Usage | None = None
    end: bool = False
    """The API's end of stream (``[DONE]``, Triton's final response)."""
    parse_ns: int = 0
    """Time the client took to parse it: JSON (or protobuf) to this object."""
    server_metrics: object = None
    """The server's own account of the request, when the event carries one (vLLM's
    ``metrics`` object, on the last chunk of a stream with ``include_usage``); unchecked."""


DONE: Final = ApiChunk(end=True)


def _usage(obj: object) -> Usage | None:
    if not isinstance(obj, dict):
        return None
    completion = obj.get("completion_tokens")
    prompt = obj.get("prompt_tokens")
    if type(completion) is not int or completion < 0:
        return None
    return Usage(prompt if type(prompt) is int and prompt >= 0 else None, completion)


def _error_text(error: object) -> str:
    if isinstance(error, dict):
        return str(error.get("message", error))[:500]
    return str(error)[:500]


def _token_ids(value: object, into: list[int]) -> bool:
    if isinstance(value, list) and all(type(t) is int for t in value):
        into.extend(value)
        return True
    return False


def _loads(data: bytes) -> Any:
    try:
        return orjson.loads(data)
    except orjson.JSONDecodeError as exc:
        raise ProtocolError(f"an event that is not JSON: {exc}: {data[:100]!r}") from None


def openai_chunk(data: bytes, *, chat: bool) -> ApiChunk:
    """A ``chat.completion.chunk`` (``chat``) or legacy ``text_completion`` event's data."""
    started_ns = perf_ns()
    if data == b"[DONE]":
        return DONE
    obj = _loads(data)
    if not isinstance(obj, dict):
        raise ProtocolError(f"an event that is not a JSON object: {data[:100]!r}")
    if "error" in obj and obj["error"] is not None:
        raise ServerStreamError(
            f"the server reported an error mid-stream: {_error_text(obj['error'])}"
        )
    choices = obj.get("choices")
    if choices is None:
        choices = []
    if not isinstance(choices, list):
        raise ProtocolError("choices is not a list")
    texts: list[str] = []
    ids: list[int] = []
    has_ids = False
    tokens = 0
    finished: list[int] = []
    started: list[int] = []
    for position, choice in enumerate(choices):
        if not isinstance(choice, dict):
            raise ProtocolError("a choice that is not an object")
        index = choice.get("index", position)
        index = index if type(index) is int else position
        started.append(index)
        output = False
        if chat:
            delta = choice.get("delta") or {}
            if not isinstance(delta, dict):
                raise ProtocolError("a delta that is not an object")
            for field in ("content", "reasoning_content", "reasoning"):
                text = delta.get(field)
                if isinstance(text, str) and text:
                    texts.append(text)
                    output = True
            if delta.get("tool_calls") or delta.get("function_call"):
                output = True
        else:
            text = choice.get("text")
            if isinstance(text, str) and text:
                texts.append(text)
                output = True
        before = len(ids)
        if _token_ids(choice.get("token_ids"), ids):
            has_ids = True
            output = output or len(ids) > before
        tokens += output
        if choice.get("finish_reason") is not None:
            finished.append(index)
    return ApiChunk(
        text="".join(texts),
        token_ids=tuple(ids) if has_ids else None,
        tokens=tokens,
        finished=tuple(finished),
        started=tuple(started),
        usage=_usage(obj.get("usage")),
        server_metrics=obj.get("metrics"),
        parse_ns=perf_ns() - started_ns,
    )


def generate_chunk(data: bytes) -> ApiChunk:
    """A ``$generate_response`` of Triton's generate extension (one SSE event's data)."""
    started_ns = perf_ns()
    obj = _loads(data)
    if not isinstance(obj, dict):
        raise ProtocolError(f"an event that is not a JSON object: {data[:100]!r}")
    if "error" in obj:
        raise ServerStreamError(
            f"the server reported an error mid-stream: {_error_text(obj['error'])}"
        )
    text = obj.get("text_output", "")
    if isinstance(text, list):  # a BYTES tensor of more than one element, as Triton writes it
        text = "".join(t for t in text if isinstance(t, str))
    if not isinstance(text, str):
        raise ProtocolError("text_output is not a string")
    ids: list[int] = []
    has_ids = _token_ids(obj.get("token_ids", obj.get("output_ids")), ids)
    finish = obj.get("finish_reason")
    if isinstance(finish, list):
        finish = finish[0] if finish else None
    return ApiChunk(
        text=text,
        token_ids=tuple(ids) if has_ids else None,
        tokens=int(bool(text) or bool(ids)),
        finished=(0,) if isinstance(finish, str) and finish else (),
        started=(0,),
        usage=None,
        parse_ns=perf_ns() - started_ns,
    )


class ApiStreamCheck:
    """Counts and checks one stream's :class:`ApiChunk`s (see the module docstring).

    ``needs_finish``: the API marks each choice's end (OpenAI), so a choice without one is an
    incomplete stream. ``parse``: the histogram of client parse times, one value per event."""

    __slots__ = (
        "_counter",
        "_finished",
        "_needs_finish",
        "_parse",
        "_started",
        "chunk_count",
        "ended",
        "id_tokens",
        "input_tokens",
        "output_tokens",
        "parse_total_ns",
        "server_metrics",
        "source",
        "usage",
    )

    def __init__(
        self,
        *,
        parse: Histogram | None = None,
        counter: TokenCounter | None = None,
        needs_finish: bool = True,
    ) -> None:
        self._parse = parse
        self._counter = counter
        self._needs_finish = needs_finish
        self._started: set[int] = set()
        self._finished: set[int] = set()
        self.ended = False
        self.usage: Usage | None = None
        self.id_tokens = 0
        self.chunk_count = 0
        self.output_tokens = 0
        self.input_tokens: int | None = None
        self.source = "chunks"
        self.parse_total_ns = 0
        """The client's parse time over the stream's events."""
        self.server_metrics: object = None
        """The server's per-request ``metrics`` object, if it sent one."""

    def check(self, chunk: ApiChunk) -> int:
        """Tokens in ``chunk`` as the stream counts them (0: none)."""
        if chunk.parse_ns:
            self.parse_total_ns += chunk.parse_ns
            if self._parse is not None:
                self._parse.record_ns(chunk.parse_ns)
        if chunk.server_metrics is not None:
            self.server_metrics = chunk.server_metrics
        if self.ended:
            raise ProtocolError("an event after the end of the stream")
        if chunk.end:
            self.ended = True
            return 0
        if chunk.usage is not None:
            self.usage = chunk.usage
        if chunk.started:
            self._started.update(chunk.started)
        if chunk.finished:
            self._finished.update(chunk.finished)
        if not chunk.tokens:
            return 0
        self.chunk_count += chunk.tokens
        if chunk.token_ids is not None:
            self.id_tokens += len(chunk.token_ids)
            return len(chunk.token_ids) or 1
        if self._counter is not None:
            return self._counter.count(chunk.text) or chunk.tokens
        return chunk.tokens

    def finish(self, counted: int, *, body_ended: bool = False) -> None:
        """After the last event: ``counted`` is the sum of :meth:`check`'s counts;
        ``body_ended``: the API has no end marker and the body ended properly."""
        if not self.ended and not body_ended:
            raise StreamTruncatedError(
                "the stream ended without its end marker", chunks_received=self.chunk_count
            )
        if self._needs_finish:
            unfinished = self._started - self._finished
            if unfinished:
                raise StreamTruncatedError(
                    f"choice {min(unfinished)} has no finish_reason",
                    chunks_received=self.chunk_count,
                )
        exact = self.id_tokens if self.id_tokens else None
        if exact is None and self._counter is not None:
            exact = counted
        usage = self.usage
        if usage is not None:
            self.input_tokens = usage.prompt_tokens
            if exact is not None and exact != usage.completion_tokens:
                raise UsageMismatchError(
                    f"{exact} tokens delivered, the server's usage says {usage.completion_tokens}",
                    seq=self.chunk_count,
                )
            if exact is None and self.chunk_count > usage.completion_tokens:
                raise UsageMismatchError(
                    f"{self.chunk_count} choices' deltas carried tokens, the server's usage says "
                    f"{usage.completion_tokens} tokens",
                    seq=self.chunk_count,
                )
            self.output_tokens = usage.completion_tokens
            self.source = "usage"
        elif self.id_tokens:
            self.output_tokens = self.id_tokens
            self.source = "token_ids"
        elif self._counter is not None:
            self.output_tokens = counted
            self.source = "tokenizer"
        else:
            self.output_tokens = counted
            self.source = "chunks"


CheckFactory = Callable[[], ApiStreamCheck]
