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
(``token_count``). Each chunk's own tokens (for ITL per token and the tokens-per-chunk
distribution) are counted from its token ids, else the rise of the server's running usage
(vLLM's ``continuous_usage_stats``), else the tokenizer, else one a choice (``chunk_token_count``).

Reasoning deltas (``reasoning_content``, ``reasoning``) are kept out of ``text``, which is the
reply's output alone; reasoning and tool calls are counted and checked as
:mod:`.stream_content` says, and a delta for a choice after its ``finish_reason`` is out of
order (:class:`EventOrderError`).
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
from .stream_content import EventOrderError as EventOrderError  # raised here, and re-exported
from .stream_content import (
    StreamContent,
    ToolCallDelta,
    ToolCalls,
    chunk_source,
    function_call_delta,
    tool_call_deltas,
)
from .stream_content import ToolCallArgumentsError as ToolCallArgumentsError

perf_ns: Final = time.perf_counter_ns
arrival_ns: Final = time.monotonic_ns  # the open loop's clock, for the first output's arrival


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
    reasoning_tokens: int | None = None
    """``completion_tokens_details.reasoning_tokens``: of the completion tokens, those spent
    reasoning (``None``: not given)."""


@dataclass(frozen=True, slots=True)
class ApiChunk:
    """One response event of a stream, over all its choices."""

    text: str = ""
    """The output text it adds (``content``, a completion's ``text``): never reasoning, so
    that a stream's texts joined are the reply."""
    token_ids: tuple[int, ...] | None = None
    tokens: int = 0
    """How many of its choices carry a token: output (text, token ids, a tool call) or
    reasoning."""
    finished: tuple[int, ...] = ()
    """The choices it finishes (their ``finish_reason`` is set)."""
    started: tuple[int, ...] = ()
    """The choices it carries."""
    reasoning: str = ""
    """The reasoning text it adds (``reasoning_content``, or ``reasoning``), apart from
    ``text``."""
    reasoning_choices: int = 0
    """Of ``tokens``, the choices that carry reasoning and no output."""
    tool_calls: tuple[ToolCallDelta, ...] = ()
    """The tool-call fragments it carries, in order."""
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
    details = obj.get("completion_tokens_details")
    reasoning = details.get("reasoning_tokens") if isinstance(details, dict) else None
    return Usage(
        prompt if type(prompt) is int and prompt >= 0 else None,
        completion,
        reasoning if type(reasoning) is int and reasoning >= 0 else None,
    )


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
    thoughts: list[str] | None = None
    calls: list[ToolCallDelta] | None = None
    ids: list[int] = []
    has_ids = False
    tokens = reasoning_choices = 0
    finished: list[int] = []
    started: list[int] = []
    for position, choice in enumerate(choices):
        if not isinstance(choice, dict):
            raise ProtocolError("a choice that is not an object")
        index = choice.get("index", position)
        index = index if type(index) is int else position
        started.append(index)
        output = False
        thought = None
        if chat:
            delta = choice.get("delta") or {}
            if not isinstance(delta, dict):
                raise ProtocolError("a delta that is not an object")
            text = delta.get("content")
            if isinstance(text, str) and text:
                texts.append(text)
                output = True
            thought = delta.get("reasoning_content") or delta.get("reasoning")
            if isinstance(thought, str) and thought:
                thoughts = [thought] if thoughts is None else [*thoughts, thought]
            else:
                thought = None
            called = delta.get("tool_calls")
            if called:
                calls = tool_call_deltas(called, index, calls)
                output = True
            called = delta.get("function_call")
            if called:
                calls = function_call_delta(called, index, calls)
                output = True
        else:
            text = choice.get("text")
            if isinstance(text, str) and text:
                texts.append(text)
                output = True
        before = len(ids)
        if _token_ids(choice.get("token_ids"), ids):
            has_ids = True
            output = output or (thought is None and len(ids) > before)
        if output:
            tokens += 1
        elif thought is not None:
            tokens += 1
            reasoning_choices += 1
        if choice.get("finish_reason") is not None:
            finished.append(index)
    return ApiChunk(
        text="".join(texts),
        token_ids=tuple(ids) if has_ids else None,
        tokens=tokens,
        finished=tuple(finished),
        started=tuple(started),
        reasoning="" if thoughts is None else "".join(thoughts),
        reasoning_choices=reasoning_choices,
        tool_calls=() if calls is None else tuple(calls),
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
    incomplete stream. ``parse``: the histogram of client parse times, one value per event.

    A chunk of plain output takes the short path of :meth:`check`; one with reasoning or a
    tool call, or the first after reasoning, the longer one (:meth:`_by_kind`)."""

    __slots__ = (
        "_awaiting_output",
        "_by_ids",
        "_by_tokenizer",
        "_by_usage",
        "_counter",
        "_finished",
        "_needs_finish",
        "_parse",
        "_reasoning_choices",
        "_reasoning_counted",
        "_running",
        "_started",
        "_tool_calls",
        "chunk_count",
        "chunk_source",
        "content",
        "ended",
        "first_output_ns",
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
        """The token-carrying choices of the stream's chunks."""
        self.output_tokens = 0
        self.input_tokens: int | None = None
        self.source = "chunks"
        self.chunk_source = "chunks"
        """How each chunk's tokens were counted (:data:`.stream_content.CHUNK_SOURCES`)."""
        self.parse_total_ns = 0
        """The client's parse time over the stream's events."""
        self.server_metrics: object = None
        """The server's per-request ``metrics`` object, if it sent one."""
        self.content: StreamContent | None = None
        """Its reasoning and tool calls, once :meth:`finish` passed (``None``: neither)."""
        self.first_output_ns: int | None = None
        """Set when reasoning came first: 0, then the first output's arrival."""
        self._awaiting_output = False
        self._by_ids = self._by_usage = self._by_tokenizer = 0
        self._running: dict[int, int] = {}
        self._reasoning_choices = 0
        self._reasoning_counted = 0
        self._tool_calls: ToolCalls | None = None

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
        if self._finished and chunk.tokens:
            self._check_not_finished(chunk)
        if chunk.started:
            self._started.update(chunk.started)
        if chunk.finished:
            self._finished.update(chunk.finished)
        if not chunk.tokens:
            return 0
        if chunk.reasoning or chunk.tool_calls or self._awaiting_output:
            return self._by_kind(chunk)
        self.chunk_count += chunk.tokens
        if chunk.token_ids is None and chunk.usage is None and self._counter is None:
            return chunk.tokens  # one token a choice
        return self._count(chunk)

    def _check_not_finished(self, chunk: ApiChunk) -> None:
        """A token for a choice already finished. Known where every choice of the chunk
        carries a token, as in every chunk of one choice (vLLM's, OpenAI's); a chunk with some
        choices that carry none does not say which do."""
        if len(chunk.started) != chunk.tokens:
            return
        for index in chunk.started:
            if index in self._finished:
                raise EventOrderError(f"choice {index} carried a delta after its finish_reason")

    def _count(self, chunk: ApiChunk) -> int:
        """The tokens of a chunk: its token ids, else the rise of its choice's running usage,
        else the tokenizer's count of its text, else one a choice."""
        ids = chunk.token_ids
        if ids is not None:
            self.id_tokens += len(ids)
            self._by_ids += chunk.tokens
            return len(ids) or 1
        usage = chunk.usage
        if usage is not None and len(chunk.started) == 1:
            # vLLM's continuous usage is each choice's own running count (one choice a chunk)
            index = chunk.started[0]
            before = self._running.get(index, 0)
            if usage.completion_tokens > before:
                self._running[index] = usage.completion_tokens
                self._by_usage += chunk.tokens
                return usage.completion_tokens - before
        if self._counter is not None:
            self._by_tokenizer += chunk.tokens
            count = self._counter.count(chunk.text)
            if chunk.reasoning:
                count += self._counter.count(chunk.reasoning)
            return count or chunk.tokens
        return chunk.tokens

    def _by_kind(self, chunk: ApiChunk) -> int:
        """A chunk with reasoning or tool calls, or the first after reasoning: its tool-call
        fragments assembled, its reasoning counted apart, the first output's arrival."""
        before = self.chunk_count
        self.chunk_count += chunk.tokens
        if chunk.token_ids is None and chunk.usage is None and self._counter is None:
            count = chunk.tokens
        else:
            count = self._count(chunk)
        if chunk.tool_calls:
            calls = self._tool_calls
            if calls is None:
                calls = self._tool_calls = ToolCalls()
            for delta in chunk.tool_calls:
                calls.add(delta)
        output = chunk.tokens - chunk.reasoning_choices
        if chunk.reasoning:
            self._reasoning_counted += self._reasoning_part(chunk, count, output)
        if output:
            if self._awaiting_output:
                self.first_output_ns = arrival_ns()
                self._awaiting_output = False
        elif before == self._reasoning_choices and self.first_output_ns is None:
            self.first_output_ns = 0  # the stream reasons first: TTFOT waits for output
            self._awaiting_output = True
        self._reasoning_choices += chunk.reasoning_choices
        return count

    def _reasoning_part(self, chunk: ApiChunk, count: int, output: int) -> int:
        """Of a chunk's ``count`` tokens, the reasoning ones: all when no choice carries
        output; else the tokenizer's count of its reasoning text, or, without one, a share by
        choices (a choice that carries both counts as output)."""
        if not output:
            return count
        if self._counter is not None:
            return min(self._counter.count(chunk.reasoning), count)
        return count * chunk.reasoning_choices // chunk.tokens

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
        if self._by_ids or self._by_usage or self._by_tokenizer:  # else: "chunks" already
            by_source = {
                "token_ids": self._by_ids,
                "usage_deltas": self._by_usage,
                "tokenizer": self._by_tokenizer,
            }
            self.chunk_source = chunk_source(by_source, self.chunk_count)
        if (  # a plain stream has nothing more to say
            self._reasoning_choices
            or self._reasoning_counted
            or self._tool_calls is not None
            or self.first_output_ns is not None
            or (usage is not None and usage.reasoning_tokens is not None)
        ):
            self.content = self._content(usage)

    def _content(self, usage: Usage | None) -> StreamContent | None:
        """The stream's reasoning and tool calls, each call's arguments checked whole."""
        tool_calls = 0 if self._tool_calls is None else self._tool_calls.finish(self.chunk_count)
        reasoning = None if usage is None else usage.reasoning_tokens
        if usage is not None and reasoning is not None:
            if reasoning > usage.completion_tokens or reasoning < self._reasoning_choices:
                raise UsageMismatchError(
                    f"the server's usage says {reasoning} reasoning tokens of"
                    f" {usage.completion_tokens}, and {self._reasoning_choices} choices' deltas"
                    " carried reasoning alone",
                    seq=self.chunk_count,
                )
            source = "usage"
        else:
            reasoning, source = self._reasoning_counted, self.chunk_source
        if not (reasoning or tool_calls or self.first_output_ns is not None):
            return None
        return StreamContent(
            reasoning_tokens=reasoning,
            reasoning_source=source if reasoning else "",
            tool_calls=tool_calls,
            first_output_ns=self.first_output_ns,
        )


CheckFactory = Callable[[], ApiStreamCheck]
