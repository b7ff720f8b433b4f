"""Targets of any server for ``inferwire load --url URL --api API``: one request per prompt, its
stream read as the API defines it (:mod:`.api_streams`) and yielded as :class:`ApiChunk`s.

=====================  =====================================================================
API                    request
=====================  =====================================================================
openai-chat            ``POST {url}/v1/chat/completions``: ``model``, one user message (or a
                       conversation's ``messages``), ``max_tokens``, ``stream``,
                       ``stream_options: {"include_usage": true}``
openai-completions     ``POST {url}/v1/completions``: the same with ``prompt``
openai-responses       ``POST {url}/v1/responses``: ``model``, ``input`` (the prompt's text, or
                       its ``messages`` as input items), ``max_output_tokens``, ``stream``,
                       ``store: false``; events read by :mod:`.api_events`
openai-embeddings      ``POST {url}/v1/embeddings``: ``model``, ``input`` (a string, or the
                       list of ``--embeddings-batch`` strings), ``encoding_format``; unary, no
                       output token: its latency is E2E
kserve-v2-http         ``POST {url}/v2/models/{model}/generate_stream``: Triton's generate
                       extension, ``text_input`` and ``parameters: {"max_tokens", "stream"}``
kserve-v2-grpc         ``inference.GRPCInferenceService/ModelStreamInfer``: inputs
                       ``text_input`` (BYTES), ``stream`` (BOOL) and ``max_tokens`` (INT32),
                       as TensorRT-LLM's and the vLLM backend's Triton models take them, and
                       ``triton_enable_empty_final_response`` so the end is marked
=====================  =====================================================================

With ``--accept-encoding`` (``Endpoint.accept_encoding``) every HTTP request asks for compressed
answers, which the pool decodes as they arrive, bounded (:mod:`inferwire.transports.http1.pool`);
a compressed answer nobody asked for is decoded too.

The extra body fields the user gives (``--extra-body``, e.g. ``{"ignore_eos": true}``) are
merged into the JSON body, or into ``parameters`` (KServe). The URL is the server's root
(``http://host:8000``), its path a prefix of every route. ``describe()`` asks the server what
it serves (``/v1/models``, ``/v2`` and the model's metadata), for the report: the target's own
parameters, never ones assumed.
"""

from __future__ import annotations

import ssl
from collections.abc import AsyncIterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final, Protocol
from urllib.parse import urlsplit

import orjson

from inferwire.codecs.framing import SseDecoder
from inferwire.transports import ProtocolError, StreamTruncatedError
from inferwire.transports.common import map_exceptions
from inferwire.transports.compression import check_accept_encoding
from inferwire.transports.http1.pool import HttpPool, Origin, PooledResponse
from inferwire.transports.timing import TRACEPARENT, StreamTiming

from . import api_events, api_streams
from .api_streams import DONE, ApiChunk

APIS: Final = (
    "openai-chat",
    "openai-completions",
    "openai-responses",
    "openai-embeddings",
    "kserve-v2-http",
    "kserve-v2-grpc",
)
URL_ONLY_APIS: Final = ("openai-responses", "openai-embeddings")
"""The APIs inferwire's own server does not serve (no ``--spawn``)."""
EMBEDDINGS_FORMATS: Final = ("float", "base64")
MAX_BODY_BYTES: Final = 64 << 20
MAX_EVENT_BYTES: Final = 16 << 20
"""An event-stream line or event over this is refused: a server that never ends a line cannot
take unbounded memory."""


def _payload(data: bytes) -> bytes:
    return data


def _error_event(name: bytes, data: bytes) -> None:
    if name == b"error":
        raise api_streams.ServerStreamError(f"the server sent an error event: {data[:300]!r}")


class PromptLike(Protocol):
    @property
    def text(self) -> str: ...

    @property
    def max_tokens(self) -> int | None: ...


@dataclass(frozen=True, slots=True, kw_only=True)
class Endpoint:
    url: str
    api: str
    model: str | None = None
    headers: tuple[tuple[str, str], ...] = ()
    ca_cert: str | None = None
    insecure: bool = False
    """Skip the server certificate's verification (a self-signed test server)."""
    max_tokens: int | None = None
    """For every request whose prompt names none."""
    extra_body: Mapping[str, Any] = field(default_factory=dict)
    max_connections: int = 1024
    timeout_s: float = 60.0
    embeddings_batch: int = 1
    """Inputs in each ``openai-embeddings`` request."""
    embeddings_format: str = "float"
    """The ``encoding_format`` asked of ``openai-embeddings``."""
    accept_encoding: str | None = None
    """The ``Accept-Encoding`` of every HTTP request (``--accept-encoding``; None: none)."""

    def __post_init__(self) -> None:
        if self.accept_encoding is not None:
            check_accept_encoding(self.accept_encoding)
        if self.api not in APIS:
            raise ValueError(f"--api must be one of {', '.join(APIS)}")
        if self.embeddings_batch < 1:
            raise ValueError("--embeddings-batch must be at least 1")
        if self.embeddings_batch != 1 and self.api != "openai-embeddings":
            raise ValueError("--embeddings-batch is for --api openai-embeddings")
        if self.embeddings_format not in EMBEDDINGS_FORMATS:
            raise ValueError(f"--embeddings-format must be one of {', '.join(EMBEDDINGS_FORMATS)}")
        if self.api.startswith("kserve") and not self.model:
            raise ValueError(f"--api {self.api} needs --model: KServe names the model in the call")
        if self.api == "kserve-v2-grpc":
            parts = urlsplit(self.url)
            if parts.scheme not in ("grpc", "grpcs", "http", "https") or not parts.hostname:
                raise ValueError(f"{self.url!r}: give grpc://host:port or grpcs://host:port")
        else:
            Origin.parse(self.url)

    def ssl_context(self) -> ssl.SSLContext:
        context = ssl.create_default_context(cafile=self.ca_cert)
        if self.insecure:
            context.check_hostname = False
            context.verify_mode = ssl.CERT_NONE
        return context


class ApiTarget(Protocol):
    endpoint: Endpoint
    needs_finish: bool

    def generate(
        self, prompt: PromptLike, /, *, timing: StreamTiming | None = None
    ) -> AsyncIterator[ApiChunk]:
        """The request's stream; ``timing``, when given, is stamped as the request goes (the
        client's stages) and its ``traceparent`` is sent."""
        ...

    async def describe(self) -> dict[str, Any]: ...

    async def close(self) -> None: ...


class _HttpTarget:
    def __init__(self, endpoint: Endpoint) -> None:
        self.endpoint = endpoint
        origin = Origin.parse(endpoint.url)
        headers = endpoint.headers
        if endpoint.accept_encoding is not None:
            headers = (*headers, ("accept-encoding", endpoint.accept_encoding))
        self.pool = HttpPool(
            origin,
            headers=headers,
            ssl_context=endpoint.ssl_context() if origin.scheme == "https" else None,
            max_connections=endpoint.max_connections,
            timeout_s=endpoint.timeout_s,
        )
        self.model = endpoint.model

    async def _get_json(self, path: str) -> Any:
        response = await self.pool.request("GET", path)
        if response.status != 200:
            raise await response.fail()
        try:
            return orjson.loads(await response.read(MAX_BODY_BYTES))
        except orjson.JSONDecodeError as exc:
            raise ProtocolError(f"GET {path}: not JSON: {exc}") from None

    async def _events(
        self,
        path: str,
        body: dict[str, Any],
        parse: Any,
        *,
        marked_end: bool,
        timing: StreamTiming | None,
    ) -> AsyncIterator[ApiChunk]:
        response = await self._post(path, body, timing)
        events = SseDecoder(parse, MAX_EVENT_BYTES, on_named_event=_error_event)
        said_done = False
        async for data in response.body():
            with map_exceptions("event stream"):  # a broken or oversized event: ProtocolError
                chunks = events.feed(data)
            for chunk in chunks:
                yield chunk
            if events.finished and not said_done:  # data: [DONE]
                said_done = True
                yield DONE
        if not marked_end and not said_done and response.complete and not events.pending:
            yield DONE  # the generate extension's end: the body's own

    async def _post(
        self, path: str, body: dict[str, Any], timing: StreamTiming | None
    ) -> PooledResponse:
        """The answer's head, a success: any other status raises its :class:`RemoteError`."""
        if timing is None:
            response = await self.pool.request("POST", path, orjson.dumps(body))
        else:
            traced = f"{TRACEPARENT}: {timing.traceparent}\r\n" if timing.traceparent else ""
            response = await self.pool.request(
                "POST", path, orjson.dumps(body), headers=traced, timing=timing
            )
        if response.status != 200:
            raise await response.fail()
        return response

    async def close(self) -> None:
        await self.pool.close()


class _OpenAIModels(_HttpTarget):
    async def describe(self) -> dict[str, Any]:
        """``/v1/models``; with no ``--model``, the first model listed becomes the one used."""
        listing = await self._get_json("/v1/models")
        data = listing.get("data") if isinstance(listing, dict) else None
        models = [m for m in data if isinstance(m, dict)] if isinstance(data, list) else []
        if self.model is None:
            if not models or not isinstance(models[0].get("id"), str):
                raise ProtocolError("/v1/models lists no model: name one with --model")
            self.model = models[0]["id"]
        return {"api": self.endpoint.api, "model": self.model, "models": models[:20]}


class OpenAITarget(_OpenAIModels):
    needs_finish = True

    def __init__(self, endpoint: Endpoint) -> None:
        super().__init__(endpoint)
        self.chat = endpoint.api == "openai-chat"
        self.path = "/v1/chat/completions" if self.chat else "/v1/completions"

    def generate(
        self, prompt: PromptLike, /, *, timing: StreamTiming | None = None
    ) -> AsyncIterator[ApiChunk]:
        body: dict[str, Any] = {"model": self.model}
        if self.chat:
            # a conversation's turn carries its whole history (inferwire.load.conversations)
            messages = getattr(prompt, "messages", None)
            body["messages"] = messages or [{"role": "user", "content": prompt.text}]
        else:
            body["prompt"] = prompt.text
        max_tokens = prompt.max_tokens or self.endpoint.max_tokens
        if max_tokens is not None:
            body["max_tokens"] = max_tokens
        body["stream"] = True
        body["stream_options"] = {"include_usage": True}
        body.update(self.endpoint.extra_body)
        chat = self.chat
        return self._events(
            self.path,
            body,
            lambda data: api_streams.openai_chunk(data, chat=chat),
            marked_end=True,
            timing=timing,
        )


class GenerateTarget(_HttpTarget):
    needs_finish = False

    async def describe(self) -> dict[str, Any]:
        server = await self._get_json("/v2")
        model = await self._get_json(f"/v2/models/{self.model}")
        return {"api": self.endpoint.api, "model": self.model, "server": server, "metadata": model}

    def generate(
        self, prompt: PromptLike, /, *, timing: StreamTiming | None = None
    ) -> AsyncIterator[ApiChunk]:
        parameters: dict[str, Any] = {"stream": True}
        max_tokens = prompt.max_tokens or self.endpoint.max_tokens
        if max_tokens is not None:
            parameters["max_tokens"] = max_tokens
        parameters.update(self.endpoint.extra_body)
        body = {"text_input": prompt.text, "parameters": parameters}
        return self._events(
            f"/v2/models/{self.model}/generate_stream",
            body,
            api_streams.generate_chunk,
            marked_end=False,
            timing=timing,
        )


class ResponsesTarget(_OpenAIModels):
    """``--api openai-responses``: the Responses API, streamed (:mod:`.api_events`)."""

    needs_finish = False

    def generate(
        self, prompt: PromptLike, /, *, timing: StreamTiming | None = None
    ) -> AsyncIterator[ApiChunk]:
        messages = getattr(prompt, "messages", None)  # a conversation's history, when it has one
        body: dict[str, Any] = {
            "model": self.model,
            "input": list(messages) if messages else prompt.text,
        }
        max_tokens = prompt.max_tokens or self.endpoint.max_tokens
        if max_tokens is not None:
            body["max_output_tokens"] = max_tokens
        body["stream"] = True
        body["store"] = False  # OpenAI keeps a response for 30 days unless told not to
        body.update(self.endpoint.extra_body)
        return self._responses(body, timing)

    async def _responses(
        self, body: dict[str, Any], timing: StreamTiming | None
    ) -> AsyncIterator[ApiChunk]:
        response = await self._post("/v1/responses", body, timing)
        events = SseDecoder(_payload, MAX_EVENT_BYTES, on_named_event=_error_event)
        reader = api_events.ResponsesReader()
        async for data in response.body():
            with map_exceptions("event stream"):  # a broken or oversized event: ProtocolError
                payloads = events.feed(data)
            for payload in payloads:
                # read outside the mapping: an event out of order keeps its own error class
                yield reader(payload)
                if reader.ended:  # response.completed: the API's end of stream
                    yield DONE
            if events.finished and not reader.ended:  # a `data: [DONE]` some servers add
                raise StreamTruncatedError("data: [DONE] before the response's end")


class EmbeddingsTarget(_OpenAIModels):
    """``--api openai-embeddings``: one answer per request, yielded as one event with no token
    and the end, so the open loop records its E2E latency."""

    needs_finish = False

    def generate(
        self, prompt: PromptLike, /, *, timing: StreamTiming | None = None
    ) -> AsyncIterator[ApiChunk]:
        texts = prompt.texts if isinstance(prompt, api_events.PromptBatch) else [prompt.text]
        body: dict[str, Any] = {
            "model": self.model,
            "input": texts[0] if len(texts) == 1 else texts,
            "encoding_format": self.endpoint.embeddings_format,
        }
        body.update(self.endpoint.extra_body)
        return self._embed(body, len(texts), timing)

    async def _embed(
        self, body: dict[str, Any], inputs: int, timing: StreamTiming | None
    ) -> AsyncIterator[ApiChunk]:
        response = await self._post("/v1/embeddings", body, timing)
        yield api_events.embeddings_chunk(await response.read(MAX_BODY_BYTES), inputs=inputs)
        yield DONE


def parse_headers(values: Sequence[str]) -> tuple[tuple[str, str], ...]:
    """``Name: value`` strings as header pairs; raises ValueError for one that is not."""
    out = []
    for value in values:
        name, colon, rest = value.partition(":")
        name = name.strip().lower()
        if not colon or not name or any(c in name for c in " \t\r\n") or "\n" in rest:
            raise ValueError(f"--header {value!r}: give 'Name: value'")
        out.append((name, rest.strip()))
    return tuple(out)


def redacted(headers: Sequence[tuple[str, str]]) -> list[list[str]]:
    """Headers for the report, credentials hidden."""
    secret = {"authorization", "api-key", "x-api-key", "proxy-authorization", "cookie"}
    return [[name, "(redacted)" if name in secret else value] for name, value in headers]
