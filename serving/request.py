"""The OpenAI chat completion request (``POST /v1/chat/completions``) as a validated value.

Fields and ranges are OpenAI's API reference's (the ``Create chat completion`` body), and the
nullable ones keep ``None`` (a client may send ``null`` for any of them). Fields the reference
defines that a text-generating server rarely reads (``tools``, ``response_format``,
``logit_bias``, ...) are kept as plain values; unknown fields are ignored, as OpenAI-compatible
servers (vLLM) and the SDK's ``extra_body`` expect.

    request = ChatCompletionRequest.parse(body)       # bytes or str of JSON
    request = ChatCompletionRequest.from_obj(obj)     # an already parsed object

Bad input is a :class:`~inferwire.serving.RequestError` (a ``ValueError``) whose ``param`` is
the field at fault, as a dotted path (``stream_options.include_usage``, ``messages[0].role``).
"""

from __future__ import annotations

import re
from typing import Any, Final, Literal

import msgspec

from .errors import RequestError

Role = Literal["system", "developer", "user", "assistant", "tool", "function"]
MAX_TOP_LOGPROBS: Final = 20
"""OpenAI's limit for ``top_logprobs`` (vLLM's default too)."""
MAX_STOP_SEQUENCES: Final = 4
_PATH: Final = re.compile(r" - at `\$\.?([^`]*)`$")
_MISSING: Final = re.compile(r"missing required field `([^`]*)`")


class ChatMessage(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """One message of ``messages``: its ``content`` is text, a list of content parts (kept as
    objects: text, images, audio) or ``null`` (an assistant message with tool calls)."""

    role: Role
    content: str | list[dict[str, Any]] | None = None
    name: str | None = None
    tool_call_id: str | None = None
    tool_calls: list[dict[str, Any]] | None = None

    def text(self) -> str:
        """The message's text: ``content`` itself, or its text parts joined."""
        if isinstance(self.content, str):
            return self.content
        parts = self.content or []
        return "".join(str(p.get("text", "")) for p in parts if p.get("type") == "text")


class StreamOptions(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    include_usage: bool | None = None
    """Send the request's usage in a last chunk of its own (``"choices": []``)."""


def _check(condition: bool, message: str, param: str) -> None:
    if not condition:
        raise RequestError(message, param=param)


class ChatCompletionRequest(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """A chat completion request, checked on construction (see the module docstring)."""

    messages: list[ChatMessage]
    model: str | None = None
    max_tokens: int | None = None
    """Deprecated by OpenAI for ``max_completion_tokens``; either limits the output."""
    max_completion_tokens: int | None = None
    stream: bool | None = None
    stream_options: StreamOptions | None = None
    temperature: float | None = None
    top_p: float | None = None
    n: int | None = None
    seed: int | None = None
    stop: str | list[str] | None = None
    logprobs: bool | None = None
    top_logprobs: int | None = None
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    logit_bias: dict[str, float] | None = None
    user: str | None = None
    tools: list[dict[str, Any]] | None = None
    tool_choice: str | dict[str, Any] | None = None
    response_format: dict[str, Any] | None = None

    def __post_init__(self) -> None:
        _check(bool(self.messages), "messages must hold at least one message", "messages")
        for name in ("max_tokens", "max_completion_tokens"):
            value = getattr(self, name)
            _check(value is None or value >= 1, f"{name} must be at least 1", name)
        _check(self.n is None or self.n >= 1, "n must be at least 1", "n")
        temperature, top_p = self.temperature, self.top_p
        _check(
            temperature is None or 0 <= temperature <= 2,
            "temperature must be between 0 and 2",
            "temperature",
        )
        _check(top_p is None or 0 <= top_p <= 1, "top_p must be between 0 and 1", "top_p")
        for name in ("presence_penalty", "frequency_penalty"):
            value = getattr(self, name)
            _check(value is None or -2 <= value <= 2, f"{name} must be between -2 and 2", name)
        _check(
            self.seed is None or -(1 << 63) <= self.seed < 1 << 63,
            "seed must be a 64-bit integer",
            "seed",
        )
        stops = [self.stop] if isinstance(self.stop, str) else self.stop or []
        _check(
            len(stops) <= MAX_STOP_SEQUENCES,
            f"stop holds at most {MAX_STOP_SEQUENCES} sequences",
            "stop",
        )
        top = self.top_logprobs
        if top is not None:
            _check(
                0 <= top <= MAX_TOP_LOGPROBS,
                f"top_logprobs must be between 0 and {MAX_TOP_LOGPROBS}",
                "top_logprobs",
            )
            _check(bool(self.logprobs), "top_logprobs needs logprobs: true", "top_logprobs")
        _check(
            self.stream_options is None or bool(self.stream),
            "stream_options is only allowed with stream: true",
            "stream_options",
        )

    # -- what a server reads --

    @property
    def streaming(self) -> bool:
        """Whether the answer is a stream of ``chat.completion.chunk`` events."""
        return bool(self.stream)

    @property
    def include_usage(self) -> bool:
        """``stream_options.include_usage``: usage in a last chunk of its own."""
        return self.stream_options is not None and bool(self.stream_options.include_usage)

    @property
    def max_output_tokens(self) -> int | None:
        """The output limit: ``max_completion_tokens``, else ``max_tokens``, else none."""
        if self.max_completion_tokens is not None:
            return self.max_completion_tokens
        return self.max_tokens

    @property
    def choices(self) -> int:
        """``n``: how many choices to generate (1 when not given)."""
        return 1 if self.n is None else self.n

    @property
    def stop_sequences(self) -> tuple[str, ...]:
        if isinstance(self.stop, str):
            return (self.stop,)
        return tuple(self.stop or ())

    # -- parsing --

    @classmethod
    def parse(cls, body: bytes | bytearray | memoryview | str) -> ChatCompletionRequest:
        """The request in a JSON body. Raises :class:`RequestError`."""
        try:
            return msgspec.json.decode(body, type=cls)
        except msgspec.ValidationError as exc:
            raise _request_error(exc) from exc
        except msgspec.DecodeError as exc:
            raise RequestError(f"the request body is not JSON: {exc}") from exc

    @classmethod
    def from_obj(cls, obj: object) -> ChatCompletionRequest:
        """The request in an already parsed JSON object. Raises :class:`RequestError`."""
        try:
            return msgspec.convert(obj, type=cls)
        except msgspec.ValidationError as exc:
            raise _request_error(exc) from exc

    def to_json(self) -> bytes:
        """The request as its JSON body, without the fields left unset."""
        return _ENCODER.encode(self)

    def to_obj(self) -> dict[str, Any]:
        """The request as a JSON object, without the fields left unset."""
        obj: dict[str, Any] = msgspec.to_builtins(self)
        return obj


_ENCODER: Final = msgspec.json.Encoder()


def _request_error(exc: msgspec.ValidationError) -> RequestError:
    """The :class:`RequestError` of a failed validation: the check's own (raised in
    ``__post_init__``), or msgspec's message with the path it names as ``param``."""
    if isinstance(exc.__cause__, RequestError):
        return exc.__cause__
    message = str(exc)
    match = _PATH.search(message)
    path = match.group(1) if match else ""
    text = message[: match.start()] if match else message
    missing = _MISSING.search(text)
    if missing is not None:
        field = missing.group(1)
        param = f"{path}.{field}" if path else field
        return RequestError(f"{param} is required", param=param)
    if not path:
        if text.startswith("Expected `object`"):
            return RequestError("the request body must be a JSON object")
        return RequestError(text)
    return RequestError(f"{path}: {text}", param=path)
