"""What a stream carries besides its output text, and the figures made of it: reasoning, tool
calls, and how many tokens each chunk carries.

- **Reasoning** (``delta.reasoning_content``, or ``delta.reasoning`` as newer vLLM names it):
  counted apart from the output, from the server's
  ``usage.completion_tokens_details.reasoning_tokens`` when it gives one, else by the rules
  that count output tokens (token ids, running usage, the tokenizer, one a chunk). As in
  OpenAI's usage, a stream's output tokens include its reasoning tokens.
- **Time to first output token** (TTFOT): to the first chunk that carries output (``content``,
  a tool call, a completion's ``text``), where TTFT is to the first that carries any token,
  reasoning included. Equal unless reasoning came first.
- **Tool calls** (``delta.tool_calls[]``, and the legacy ``delta.function_call``): fragments
  assembled per (choice, index) as OpenAI streams them (the first fragment of a call names it
  with ``id`` and ``function.name``, later ones add ``function.arguments``); at the end each
  call's arguments must be whole JSON (:class:`ToolCallArgumentsError`). An arguments fragment
  for a call that never started is out of order (:class:`EventOrderError`).
- **Tokens per chunk**: the distribution of the token-carrying chunks by the tokens each
  carried (:data:`TOKENS_PER_CHUNK_BINS`), and how those counts were obtained
  (:data:`CHUNK_SOURCES`).

Nothing here runs for a plain stream: the check takes this path only for a chunk that carries
reasoning or a tool call.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

import numpy as np
import orjson

from inferwire.codecs.integrity import AlteredStreamError
from inferwire.transports import ProtocolError

MAX_TOOL_CALLS: Final = 1024
"""Tool calls a stream may start: past it, a stream is refused rather than held in memory."""
MAX_TOOL_ARGUMENT_CHARS: Final = 16 << 20
"""Characters of tool-call arguments a stream may carry, over all its calls (the event size
bound of :mod:`.endpoints`): they are kept until the end to be checked whole."""
FUNCTION_CALL: Final = -1
"""The index given to the legacy ``function_call`` of a choice (one call, no index)."""
CHUNK_SOURCES: Final = ("token_ids", "usage_deltas", "tokenizer", "chunks")
"""How a chunk's tokens are counted, best first: the token ids it carries; the rise of the
server's running ``usage.completion_tokens`` (vLLM's ``continuous_usage_stats``) for a chunk of
one choice; the tokenizer given (``--tokenizer``); else one token for each choice it carries."""
TOKENS_PER_CHUNK_BINS: Final = (
    ("1", 1, 1),
    ("2", 2, 2),
    ("3-4", 3, 4),
    ("5-8", 5, 8),
    ("9-16", 9, 16),
    ("17-32", 17, 32),
    ("33-64", 33, 64),
    ("65+", 65, 65),
)
"""(name, fewest, most) tokens of a chunk in each bin of the distribution; the last is open."""
CHUNK_TOKENS_TOP: Final = TOKENS_PER_CHUNK_BINS[-1][1]
"""Chunks of more tokens are counted as of this many (the open bin)."""


class EventOrderError(ProtocolError):
    """An event out of the order its API sets: a delta for a choice after the chunk that gave
    its ``finish_reason``, or arguments for a tool call that never started."""


class ToolCallArgumentsError(AlteredStreamError):
    """A streamed tool call whose arguments, assembled, are not whole JSON."""


@dataclass(frozen=True, slots=True)
class ToolCallDelta:
    """One fragment of a streamed tool call, as a chat delta's ``tool_calls[]`` item gives it."""

    choice: int
    index: int
    id: str | None
    name: str | None
    arguments: str | None


@dataclass(frozen=True, slots=True, kw_only=True)
class StreamContent:
    """A completed stream's reasoning and tool calls, for the records and the point's figures
    (``None`` in their place: a stream with neither, whose first token was output)."""

    reasoning_tokens: int = 0
    reasoning_source: str = ""
    """``usage`` (the server's ``reasoning_tokens``), else the :data:`CHUNK_SOURCES` used."""
    tool_calls: int = 0
    first_output_ns: int | None = None
    """When the first output-carrying chunk arrived (``time.monotonic_ns``) if reasoning came
    before it; ``None``: the first token was output (TTFOT is TTFT); 0: no output at all."""


class _Call:
    __slots__ = ("id", "name", "parts")

    def __init__(self, call_id: str | None, name: str | None) -> None:
        self.id = call_id
        self.name = name
        self.parts: list[str] = []


class ToolCalls:
    """The tool calls of one stream, assembled from their fragments as they arrive
    (:meth:`add`) and checked whole at its end (:meth:`finish`)."""

    __slots__ = ("_calls", "_chars")

    def __init__(self) -> None:
        self._calls: dict[tuple[int, int], _Call] = {}
        self._chars = 0

    def add(self, delta: ToolCallDelta) -> None:
        key = (delta.choice, delta.index)
        call = self._calls.get(key)
        if call is None:
            if delta.id is None and delta.name is None:
                raise EventOrderError(
                    f"choice {delta.choice}: a fragment of {_name(delta.index)} that never"
                    " started (no id or function name before its arguments)"
                )
            if len(self._calls) >= MAX_TOOL_CALLS:
                raise ProtocolError(f"more than {MAX_TOOL_CALLS} tool calls in one stream")
            call = self._calls[key] = _Call(delta.id, delta.name)
        elif delta.id is not None and call.id is not None and delta.id != call.id:
            raise EventOrderError(
                f"choice {delta.choice}: {_name(delta.index)} started again with another id"
                f" ({call.id!r}, then {delta.id!r})"
            )
        elif call.name is None:
            call.name = delta.name
        if delta.arguments:
            self._chars += len(delta.arguments)
            if self._chars > MAX_TOOL_ARGUMENT_CHARS:
                raise ProtocolError(
                    f"tool-call arguments over {MAX_TOOL_ARGUMENT_CHARS} characters in a stream"
                )
            call.parts.append(delta.arguments)

    def finish(self, seq: int) -> int:
        """The number of calls, once each one's arguments parse as JSON; ``seq``: where the
        stream got to, for the error."""
        for (choice, index), call in self._calls.items():
            arguments = "".join(call.parts)
            try:
                orjson.loads(arguments)
            except orjson.JSONDecodeError as exc:
                shown = arguments if len(arguments) <= 80 else arguments[:77] + "..."
                raise ToolCallArgumentsError(
                    f"choice {choice}: the arguments of {_name(index)}"
                    f" ({call.name or call.id}) are not whole JSON: {exc}: {shown!r}",
                    seq=seq,
                ) from None
        return len(self._calls)


def _optional_text(value: object, what: str) -> str | None:
    """A tool call's ``id``, name or arguments: a string (empty: absent) or nothing."""
    if value is None or value == "":
        return None
    if not isinstance(value, str):
        raise ProtocolError(f"a tool call's {what} that is not a string: {str(value)[:80]!r}")
    return value


def tool_call_deltas(
    items: object, choice: int, into: list[ToolCallDelta] | None
) -> list[ToolCallDelta]:
    """A delta's ``tool_calls``: each item's ``index`` (its place in the list if missing, as
    servers that send whole calls do), ``id`` and ``function.name``/``arguments``."""
    if not isinstance(items, list):
        raise ProtocolError("tool_calls is not a list")
    out = [] if into is None else into
    for position, item in enumerate(items):
        if not isinstance(item, dict):
            raise ProtocolError("a tool call that is not an object")
        index = item.get("index", position)
        if type(index) is not int or index < 0:
            raise ProtocolError(f"a tool call index that is not a count: {str(index)[:40]!r}")
        function = item.get("function") or {}
        if not isinstance(function, dict):
            raise ProtocolError("a tool call's function that is not an object")
        out.append(
            ToolCallDelta(
                choice,
                index,
                _optional_text(item.get("id"), "id"),
                _optional_text(function.get("name"), "name"),
                _optional_text(function.get("arguments"), "arguments"),
            )
        )
    return out


def function_call_delta(
    value: object, choice: int, into: list[ToolCallDelta] | None
) -> list[ToolCallDelta]:
    """The legacy ``function_call`` delta: one call a choice, named by its first fragment."""
    if not isinstance(value, dict):
        raise ProtocolError("function_call is not an object")
    out = [] if into is None else into
    name = _optional_text(value.get("name"), "name")
    arguments = _optional_text(value.get("arguments"), "arguments")
    out.append(ToolCallDelta(choice, FUNCTION_CALL, None, name, arguments))
    return out


def _name(index: int) -> str:
    return "the function_call" if index == FUNCTION_CALL else f"tool call {index}"


def tokens_per_chunk(counts: np.ndarray) -> dict[str, int]:
    """The chunks in each of :data:`TOKENS_PER_CHUNK_BINS`, from ``counts[n]``: the chunks
    that carried n tokens (the last entry: that many or more)."""
    cumulative = np.concatenate([[0], np.cumsum(counts, dtype=np.int64)])
    top = len(counts) - 1
    return {
        name: int(cumulative[min(most, top) + 1] - cumulative[min(fewest, top + 1)])
        if fewest <= top
        else 0
        for name, fewest, most in TOKENS_PER_CHUNK_BINS
    }


def chunk_source(by_source: dict[str, int], choices: int) -> str:
    """The :data:`CHUNK_SOURCES` that counted a stream's ``choices`` token-carrying choices,
    ``+``-joined best first, from the choices each of the others counted (the rest: chunks)."""
    used = [name for name in CHUNK_SOURCES if by_source.get(name)]
    if choices > sum(by_source.values()):
        used.append("chunks")
    return "+".join(used) or "chunks"
