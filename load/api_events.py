"""The two OpenAI APIs that are not a stream of choices: the Responses API's streamed events
(``--api openai-responses``) and the embeddings API's one answer (``--api openai-embeddings``),
read as :class:`ApiChunk`s so the open loop and :class:`ApiStreamCheck` treat them as any stream.

**Responses** (``POST /v1/responses`` with ``stream: true``; OpenAI's API reference, "Streaming
events"): every SSE event names its ``type`` (also on its ``event:`` line) and carries a
``sequence_number``; there is no ``data: [DONE]``, the end is ``response.completed`` (its
``response.usage``: ``input_tokens``, ``output_tokens``, ``output_tokens_details.
reasoning_tokens``). Read as tokens: ``response.output_text.delta`` and
``response.refusal.delta`` (the reply's text), ``response.function_call_arguments.delta`` (a
tool call's fragments, assembled and checked whole as the chat API's are: the call's
``output_item.added`` names it), the inputs of custom-tool and code-interpreter calls (output),
and ``response.reasoning_text.delta`` / ``response.reasoning_summary_text.delta`` (reasoning). A
failure: ``response.failed``, an ``error`` event, ``response.incomplete`` for any reason but
``max_output_tokens`` (the cap the request asked for: the same end as the chat API's
``finish_reason: "length"``). Every other event type is tolerated and carries nothing.

Checked as the events arrive (:class:`ResponsesReader`, one per request): sequence numbers
strictly increase where sent (a repeat is :class:`DuplicateFrameError`, a step back
:class:`ReorderedFrameError`, counted as the point's ``duplicated`` and ``reordered``; gaps are
allowed), no delta comes while no output item is open (``response.output_item.added`` opens
one, ``.done`` closes one), nothing comes after the end: else :class:`EventOrderError`.
Open items are counted, not matched by ``output_index`` or ``item_id``: vLLM's
``serving_responses.py`` announces the message that follows a reasoning item at the reasoning
item's index and id, then streams its deltas under the next index and a fresh id, and its
gpt-oss path leaves the last item without its ``.done``; neither is an error here.

**Embeddings** (``POST /v1/embeddings``): ``data`` must hold one ``embedding`` object per input,
``index`` 0..N-1 each once, vectors of one length, every value finite; a vector is a list of
floats (``encoding_format: "float"``) or base64 of little-endian float32 (``"base64"``), read
whichever the server sent. ``usage.prompt_tokens`` is the request's input tokens.
"""

from __future__ import annotations

import base64
import binascii
import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Final, Protocol

import numpy as np
import orjson

from inferwire.codecs.errors import DuplicateFrameError, ReorderedFrameError
from inferwire.codecs.integrity import AlteredStreamError
from inferwire.transports import ProtocolError

from .api_streams import (
    ApiChunk,
    ApiStreamCheck,
    EventOrderError,
    ServerStreamError,
    Usage,
    perf_ns,
)
from .stream_content import MAX_TOOL_CALLS, ToolCallDelta

TEXT_DELTAS: Final = frozenset({"response.output_text.delta", "response.refusal.delta"})
"""Events whose ``delta`` is the reply's text."""
ARGUMENTS_DELTA: Final = "response.function_call_arguments.delta"
INPUT_DELTAS: Final = frozenset(
    {"response.custom_tool_call_input.delta", "response.code_interpreter_call_code.delta"}
)
"""Events whose ``delta`` is output that is neither text nor a function's JSON arguments."""
REASONING_DELTAS: Final = frozenset(
    {"response.reasoning_text.delta", "response.reasoning_summary_text.delta"}
)
DELTAS: Final = TEXT_DELTAS | INPUT_DELTAS | REASONING_DELTAS | {ARGUMENTS_DELTA}
CAPPED: Final = "max_output_tokens"
"""The ``incomplete_details.reason`` of a response that reached the ``max_output_tokens`` asked."""
FLOAT32: Final = np.dtype("<f4")


class EmbeddingsMismatchError(AlteredStreamError):
    """An embeddings answer that is whole JSON but not the answer to the request: a count or an
    index that does not match the inputs, vectors of different lengths, a value not finite."""


def _object(data: bytes, what: str) -> dict[str, Any]:
    try:
        obj = orjson.loads(data)
    except orjson.JSONDecodeError as exc:
        raise ProtocolError(f"{what} that is not JSON: {exc}: {data[:100]!r}") from None
    if not isinstance(obj, dict):
        raise ProtocolError(f"{what} that is not a JSON object: {data[:100]!r}")
    return obj


def _message(error: object) -> str:
    if isinstance(error, dict):
        return str(error.get("message", error))[:500]
    return str(error)[:500]


def _responses_usage(response: object) -> Usage | None:
    usage = response.get("usage") if isinstance(response, dict) else None
    if not isinstance(usage, dict):
        return None
    output = usage.get("output_tokens")
    prompt = usage.get("input_tokens")
    if type(output) is not int or output < 0:
        return None
    details = usage.get("output_tokens_details")
    reasoning = details.get("reasoning_tokens") if isinstance(details, dict) else None
    return Usage(
        prompt if type(prompt) is int and prompt >= 0 else None,
        output,
        reasoning if type(reasoning) is int and reasoning >= 0 else None,
    )


def _text_field(item: dict[str, Any], name: str) -> str | None:
    value = item.get(name)
    if value is None or value == "":
        return None
    if not isinstance(value, str):
        raise ProtocolError(f"a function call's {name} that is not a string: {str(value)[:80]!r}")
    return value


class ResponsesReader:
    """One Responses stream's events, each to an :class:`ApiChunk` (the callable the SSE reader
    decodes with), checked in order as the module docstring says; :attr:`ended` once the
    response has ended whole."""

    __slots__ = ("_calls", "_last_sequence", "_open_items", "ended")

    def __init__(self) -> None:
        self._last_sequence = -1
        self._open_items = 0
        self._calls: dict[int, tuple[str | None, str | None]] = {}
        """The function calls announced (``output_index``: ``call_id``, name) whose arguments
        have not begun: their first fragment names them, as a chat stream's first does."""
        self.ended = False

    def __call__(self, data: bytes) -> ApiChunk:
        started_ns = perf_ns()
        event = _object(data, "an event")
        kind = event.get("type")
        if not isinstance(kind, str):
            raise ProtocolError(f"an event without a type: {data[:100]!r}")
        self._sequence(event.get("sequence_number"), kind)
        if self.ended:
            raise EventOrderError(f"{kind} after the end of the response")
        if kind not in DELTAS:
            usage = self._lifecycle(event, kind)
            return ApiChunk(usage=usage, parse_ns=perf_ns() - started_ns)
        delta = self._delta(event, kind)
        tokens = int(bool(delta))
        if kind in TEXT_DELTAS:
            return ApiChunk(text=delta, tokens=tokens, parse_ns=perf_ns() - started_ns)
        if kind in REASONING_DELTAS:
            return ApiChunk(
                reasoning=delta,
                tokens=tokens,
                reasoning_choices=tokens,
                parse_ns=perf_ns() - started_ns,
            )
        if kind == ARGUMENTS_DELTA and delta:
            fragment = self._arguments(event, delta)
            return ApiChunk(tokens=1, tool_calls=(fragment,), parse_ns=perf_ns() - started_ns)
        return ApiChunk(tokens=tokens, parse_ns=perf_ns() - started_ns)

    def _sequence(self, number: object, kind: str) -> None:
        if number is None:
            return
        if type(number) is not int:
            raise ProtocolError(f"{kind}: sequence_number {number!r} is not an integer")
        last = self._last_sequence
        if number == last:
            raise DuplicateFrameError(
                f"{kind}: sequence_number {number} again", expected=last + 1, received=number
            )
        if number < last:
            raise ReorderedFrameError(
                f"{kind}: sequence_number {number} after {last}", expected=last + 1, received=number
            )
        self._last_sequence = number

    def _delta(self, event: dict[str, Any], kind: str) -> str:
        if not self._open_items:
            raise EventOrderError(
                f"{kind} while no output item is open (before its output_item.added)"
            )
        delta = event.get("delta")
        if not isinstance(delta, str):
            raise ProtocolError(f"{kind}: delta is not a string")
        return delta

    def _arguments(self, event: dict[str, Any], delta: str) -> ToolCallDelta:
        """A fragment of a function call's arguments, keyed by its ``output_index`` (vLLM
        changes the ``item_id`` after announcing the call); the first names the call. The
        check assembles them and refuses one for a call never announced."""
        index = event.get("output_index")
        if type(index) is not int or index < 0:
            raise ProtocolError(f"{ARGUMENTS_DELTA}: output_index {index!r} is not a count")
        call_id, name = self._calls.pop(index, (None, None))
        return ToolCallDelta(0, index, call_id, name, delta)

    def _announce(self, event: dict[str, Any]) -> None:
        item = event.get("item")
        index = event.get("output_index")
        if not isinstance(item, dict) or item.get("type") != "function_call":
            return
        if type(index) is not int or index < 0:
            raise ProtocolError(f"a function call's output_index {index!r} is not a count")
        if len(self._calls) >= MAX_TOOL_CALLS:
            raise ProtocolError(f"more than {MAX_TOOL_CALLS} function calls announced at once")
        call_id = _text_field(item, "call_id") or _text_field(item, "id")
        self._calls[index] = (call_id, _text_field(item, "name"))

    def _lifecycle(self, event: dict[str, Any], kind: str) -> Usage | None:
        """The events that carry no token: items opened and closed, the end, the failures."""
        if kind == "response.output_item.added":
            self._open_items += 1
            self._announce(event)
        elif kind == "response.output_item.done":
            if not self._open_items:
                raise EventOrderError("response.output_item.done while no output item is open")
            self._open_items -= 1
        elif kind == "response.completed":
            return self._end(event.get("response"), kind)
        elif kind == "response.incomplete":
            response = event.get("response")
            details = response.get("incomplete_details") if isinstance(response, dict) else None
            reason = details.get("reason") if isinstance(details, dict) else None
            if reason != CAPPED:
                raise ServerStreamError(f"response.incomplete: {reason or 'no reason given'}")
            return self._end(response, kind)
        elif kind == "response.failed":
            response = event.get("response")
            error = response.get("error") if isinstance(response, dict) else None
            raise ServerStreamError(f"response.failed: {_message(error or 'no error given')}")
        elif kind == "error":
            raise ServerStreamError(f"the server reported an error mid-stream: {_message(event)}")
        return None

    def _end(self, response: object, kind: str) -> Usage | None:
        status = response.get("status") if isinstance(response, dict) else None
        if status in ("failed", "cancelled"):
            raise ServerStreamError(f"{kind} with status {status}")
        self.ended = True
        return _responses_usage(response)


# -- embeddings ---------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class EmbeddingsChunk(ApiChunk):
    """The one event of an embeddings request: no output token, its usage and input count."""

    inputs: int = 1
    dimensions: int = 0
    """The vectors' length."""


class _Text(Protocol):
    @property
    def text(self) -> str: ...


@dataclass(frozen=True, slots=True, kw_only=True)
class PromptBatch:
    """The inputs of one embeddings request of ``--embeddings-batch N``: N prompts."""

    prompts: tuple[_Text, ...]

    @property
    def text(self) -> str:
        return self.prompts[0].text

    @property
    def texts(self) -> list[str]:
        return [prompt.text for prompt in self.prompts]

    @property
    def max_tokens(self) -> int | None:
        return None


def batches(prompts: Sequence[_Text], size: int) -> list[PromptBatch]:
    """``prompts`` in requests of ``size`` (the last one whole: ``len(prompts)`` is drawn as a
    multiple of ``size``)."""
    return [
        PromptBatch(prompts=tuple(prompts[at : at + size]))
        for at in range(0, len(prompts) - size + 1, size)
    ]


def _embeddings_body(data: bytes) -> dict[str, Any]:
    try:
        return _object(data, "an embeddings answer")
    except ProtocolError as exc:
        refused = exc
    # stdlib json reads NaN and Infinity, which are not JSON: a server that writes them (Python's
    # json.dumps does) sent values that are not finite, and is told that rather than "not JSON"
    try:
        obj = json.loads(data)
    except (ValueError, RecursionError):
        raise refused from None
    if not isinstance(obj, dict):
        raise refused
    return obj


def _vector(embedding: object, position: int) -> np.ndarray:
    if isinstance(embedding, str):
        try:
            raw = base64.b64decode(embedding, validate=True)
        except (binascii.Error, ValueError) as exc:
            raise ProtocolError(f"embedding {position}: not base64: {exc}") from None
        if len(raw) % FLOAT32.itemsize:
            raise ProtocolError(
                f"embedding {position}: {len(raw)} bytes of base64, not a whole number of float32"
            )
        return np.frombuffer(raw, dtype=FLOAT32)
    if not isinstance(embedding, list):
        raise ProtocolError(f"embedding {position}: neither a list of floats nor base64")
    try:
        return np.asarray(embedding, dtype=np.float64)
    except (TypeError, ValueError) as exc:
        raise ProtocolError(f"embedding {position}: not a list of numbers: {exc}") from None


def embeddings_chunk(data: bytes, *, inputs: int) -> EmbeddingsChunk:
    """The answer of ``POST /v1/embeddings`` for ``inputs`` inputs, checked (module docstring)."""
    started_ns = perf_ns()
    obj = _embeddings_body(data)
    if obj.get("error") is not None:
        raise ServerStreamError(f"the server answered an error: {_message(obj['error'])}")
    items = obj.get("data")
    if not isinstance(items, list):
        raise ProtocolError("an embeddings answer without a data list")
    if len(items) != inputs:
        raise EmbeddingsMismatchError(
            f"{len(items)} embeddings for {inputs} inputs", seq=min(len(items), inputs)
        )
    seen = [False] * inputs
    dimensions = -1
    for position, item in enumerate(items):
        if not isinstance(item, dict):
            raise ProtocolError(f"data[{position}] is not an object")
        index = item.get("index", position)
        if type(index) is not int or not 0 <= index < inputs or seen[index]:
            raise EmbeddingsMismatchError(
                f"data[{position}]: index {index!r} is not one of the inputs' 0..{inputs - 1} "
                "not yet answered",
                seq=position,
            )
        seen[index] = True
        vector = _vector(item.get("embedding"), position)
        if vector.ndim != 1 or not vector.size:
            raise EmbeddingsMismatchError(f"embedding {position} is empty or nested", seq=position)
        if dimensions < 0:
            dimensions = vector.size
        elif vector.size != dimensions:
            raise EmbeddingsMismatchError(
                f"embedding {position} has {vector.size} values, embedding 0 has {dimensions}",
                seq=position,
            )
        if not np.isfinite(vector).all():
            raise EmbeddingsMismatchError(
                f"embedding {position} has a value not finite", seq=position
            )
    usage = obj.get("usage")
    prompt = usage.get("prompt_tokens") if isinstance(usage, dict) else None
    return EmbeddingsChunk(
        usage=Usage(prompt, 0) if type(prompt) is int and prompt >= 0 else None,
        inputs=inputs,
        dimensions=max(dimensions, 0),
        parse_ns=perf_ns() - started_ns,
    )


class EmbeddingsCheck(ApiStreamCheck):
    """:class:`ApiStreamCheck` that also keeps the request's number of inputs (``inputs``, read
    by the recorder for the inputs-per-second figure; 0 until the answer came)."""

    __slots__ = ("inputs",)

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.inputs = 0

    def check(self, chunk: ApiChunk) -> int:
        if isinstance(chunk, EmbeddingsChunk):
            self.inputs = chunk.inputs
        return super().check(chunk)
