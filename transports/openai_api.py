"""The OpenAI API as vLLM serves it, over the simulated service.

=======  ==========================  ================================================
method   path                        answer
=======  ==========================  ================================================
POST     /v1/chat/completions        ``chat.completion`` JSON; with ``"stream": true``
                                     ``chat.completion.chunk`` server-sent events,
                                     ending with ``data: [DONE]``
POST     /v1/completions             the legacy ``text_completion``, the same two ways
GET      /v1/models                  the models served (``object: "list"``)
GET      /v1/models/{id}             one of them; 404 for another name
=======  ==========================  ================================================

A request is read as OpenAI documents it: a chat request's OpenAI fields are checked by
:class:`inferwire.serving.ChatCompletionRequest` (the one chat request type of the project:
types, ranges, ``messages`` required), a legacy one's ``prompt`` here; ``model`` must be a
model served (absent: the first), ``n`` can only be 1,
``max_tokens`` (or ``max_completion_tokens``) cuts the stream with ``finish_reason:
"length"``, ``stream_options`` needs ``stream``. Which tokens come back is inferwire's to say:
``workload`` and ``seed`` (our fields, sent by the OpenAI SDK through ``extra_body``) pick the
seeded stream; the prompt's text does not change it. Errors are OpenAI's error object with the
status vLLM gives: 400 ``invalid_request_error``, 404 for a model not served, 405, 406, 415.

Usage, by default, is where OpenAI puts it: nowhere, or with ``stream_options:
{"include_usage": true}`` in a last chunk of its own whose ``choices`` is empty. The bytes are
then what vLLM sends: no field of inferwire's own.

inferwire's extensions: a request with ``"inferwire": {"extensions": true}`` gets inferwire's
stream instead, the one its clients verify
(:class:`~inferwire.codecs.integrity.StreamVerifier`): each chunk carries ``seq`` and
``choices[0].token_ids``, and the chunk with ``finish_reason`` carries ``usage``, the end
marker whose token count proves the stream whole. ``stream_options.include_usage`` changes
nothing there: the proof needs the usage on the end marker, and an OpenAI client reads it
from there as well. These are the bytes the codec benchmarks measure (the codec built with
``extensions=True``), whatever the server codec's own option.

A chat client that names the server codec's own stream type in ``Accept`` (inferwire's clients
of a binary codec do) gets the codec's frames, which always carry everything. Any other answer
is JSON: chat chunks written by the server's codec if it is a JSON one (else by orjson), the
other objects (:mod:`.openai_bodies`) by orjson.
"""

from __future__ import annotations

import contextlib
import time
import urllib.parse
from collections.abc import AsyncGenerator, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Final

import orjson

import inferwire.codecs as ic
from inferwire.codecs.framing import StreamEncoder, framed_encoder
from inferwire.serving import ChatCompletionRequest, RequestError

from . import openai_bodies as ob
from .errors import BadRequestError
from .http_response import JSON, Response, accepts, error, media
from .service import GenerateRequest, SimulatedService, TokenStream
from .streams import stream_frames
from .timing import TRACEPARENT, ServerStamps

if TYPE_CHECKING:
    from .metrics import ServerMetrics
    from .tracing import Tracer

EXTENSIONS_FIELD: Final = "inferwire"
"""The request field that asks for inferwire's extensions: ``{"extensions": true}``."""
MODEL_OWNER: Final = "inferwire"
_CLIENT_MESSAGES: Final = ({"role": "user", "content": "Generate."},)
"""What inferwire's clients send as ``messages``: the workload, not the prompt, makes the
tokens."""


class ApiError(BadRequestError):
    """A request the OpenAI API refuses: ``status`` and OpenAI's error ``type``, and the
    request field at fault (``param``) if one is."""

    def __init__(
        self,
        message: str,
        *,
        status: int = 400,
        param: str | None = None,
        kind: str = "invalid_request_error",
    ) -> None:
        super().__init__(message)
        self.status = status
        self.param = param
        self.kind = kind


@dataclass(frozen=True, slots=True, kw_only=True)
class OpenAIRequest:
    """A chat or legacy completion request, checked."""

    generate: GenerateRequest
    stream: bool = False
    include_usage: bool = False
    extensions: bool = False


def _flag(obj: Mapping[str, Any], name: str, param: str) -> bool:
    value = obj.get(name)
    if value is None:
        return False
    if not isinstance(value, bool):
        raise ApiError(f"{param} must be true or false", param=param)
    return value


def _one_prompt(value: object) -> bool:
    """A string, or a non-empty list of token ids."""
    if isinstance(value, str):
        return True
    return isinstance(value, list) and bool(value) and all(type(t) is int and t >= 0 for t in value)


def _check_prompt(prompt: object) -> None:
    if _one_prompt(prompt):
        return
    if isinstance(prompt, list) and prompt and all(_one_prompt(p) for p in prompt):
        if len(prompt) == 1:
            return
        raise ApiError("one prompt per request is served", param="prompt")
    raise ApiError(
        "prompt must be a string, a list of token ids, or a list of one of these", param="prompt"
    )


def _model(obj: Mapping[str, Any], models: Sequence[str]) -> str:
    model = obj.get("model")
    if model is None:
        return models[0]
    if not isinstance(model, str):
        raise ApiError("model must be a string", param="model")
    if model not in models:
        raise ApiError(f"The model `{model}` does not exist.", status=404, param="model")
    return model


def parse_request(obj: object, *, chat: bool, models: Sequence[str]) -> OpenAIRequest:
    """A chat (``chat``) or legacy completion request body, checked as the module docstring
    says. Raises :class:`ApiError`, or :class:`BadRequestError` for our own fields."""
    if not isinstance(obj, dict):
        raise ApiError("the request body must be a JSON object")
    if chat:
        # OpenAI's own fields, checked by the one chat request type (inferwire.serving); ours
        # (workload, timing, the extensions) below
        try:
            ChatCompletionRequest.from_obj(obj)
        except RequestError as exc:
            raise ApiError(str(exc), param=exc.param) from exc
    else:
        _check_prompt(obj.get("prompt"))
    stream = _flag(obj, "stream", "stream")
    options = obj.get("stream_options")
    if options is not None and not isinstance(options, dict):
        raise ApiError("stream_options must be an object", param="stream_options")
    if options is not None and not stream:
        raise ApiError("stream_options is only allowed with stream", param="stream_options")
    extensions = obj.get(EXTENSIONS_FIELD)
    if extensions is not None and (
        not isinstance(extensions, dict) or not set(extensions) <= {"extensions"}
    ):
        raise ApiError(
            f'{EXTENSIONS_FIELD} must be an object like {{"extensions": true}}',
            param=EXTENSIONS_FIELD,
        )
    n = obj.get("n")
    if n is not None and (type(n) is not int or n != 1):
        raise ApiError("only n=1 is served", param="n")
    generate = GenerateRequest.from_json_obj({**obj, "model": _model(obj, models)})
    if generate.timing and not stream:
        raise ApiError("timing is recorded for streams only", param="timing")
    return OpenAIRequest(
        generate=generate,
        stream=stream,
        include_usage=_flag(options or {}, "include_usage", "stream_options.include_usage"),
        extensions=_flag(extensions or {}, "extensions", f"{EXTENSIONS_FIELD}.extensions"),
    )


def chat_request_body(request: GenerateRequest, *, timing: bool = False) -> bytes:
    """The ``POST /v1/chat/completions`` body with which inferwire's clients ask for
    ``request``'s stream, with inferwire's extensions (and the server's stamps if ``timing``)."""
    obj = request.to_json_obj()
    obj["messages"] = _CLIENT_MESSAGES
    obj["stream"] = True
    obj[EXTENSIONS_FIELD] = {"extensions": True}
    if timing:
        obj["timing"] = True
    return orjson.dumps(obj)


async def _after(
    service: SimulatedService, stream: TokenStream, body: bytes
) -> AsyncGenerator[bytes, None]:
    """``body`` once the paced stream has been generated: a non-streamed answer takes as
    long as the streamed one."""
    async with contextlib.aclosing(service.batches(stream)) as batches:
        async for _ in batches:
            pass
    yield body


class OpenAIApi:
    """The routes of the module docstring for ``service``; ``codec`` is the server's. With
    ``metrics``, a stream's answer carries its meter."""

    def __init__(
        self,
        service: SimulatedService,
        codec: ic.Codec,
        *,
        metrics: ServerMetrics | None = None,
        tracer: Tracer | None = None,
    ) -> None:
        self.service = service
        self.codec = codec
        self.metrics = metrics
        self.tracer = tracer
        self.created = int(time.time())
        """When the server started: the ``created`` of the models it lists."""
        json_codec = codec.media_type == JSON and ic.TokenChunk in codec.types
        self._chunks = codec if json_codec else ic.get("orjson")
        self._framing = self._chunks.framing
        self._openai_chunks = ic.get(self._chunks.name, framing=self._framing, extensions=False)
        self._inferwire_chunks = ic.get(self._chunks.name, framing=self._framing, extensions=True)
        self._content_type = self._chunks.stream_media_type
        self._frames = codec if not json_codec and ic.TokenChunk in codec.types else None
        """A binary codec's own stream, for a client that asks for it by name."""

    # -- routes --

    def chat(self, headers: Mapping[str, str], body: bytes, received_ns: int = 0) -> Response:
        return self._complete(headers, body, received_ns, chat=True)

    def completions(
        self, headers: Mapping[str, str], body: bytes, received_ns: int = 0
    ) -> Response:
        return self._complete(headers, body, received_ns, chat=False)

    def models(self) -> Response:
        data = [self._model_obj(name) for name in self.service.models]
        return Response(200, JSON, orjson.dumps({"object": "list", "data": data}))

    def model(self, quoted_name: str) -> Response:
        name = urllib.parse.unquote(quoted_name)
        if name not in self.service.models:
            return error(404, f"The model `{name}` does not exist.", param="model")
        return Response(200, JSON, orjson.dumps(self._model_obj(name)))

    # -- the parts --

    def _model_obj(self, name: str) -> dict[str, Any]:
        return {"id": name, "object": "model", "created": self.created, "owned_by": MODEL_OWNER}

    def _complete(
        self, headers: Mapping[str, str], body: bytes, received_ns: int, *, chat: bool
    ) -> Response:
        content_type = media(headers.get("content-type", JSON))
        if content_type != JSON:
            return error(415, f"the request body is {JSON}, not {content_type!r}")
        try:
            request = parse_request(orjson.loads(body), chat=chat, models=self.service.models)
            stream = self.service.open(request.generate)  # refused before a stream starts
        except orjson.JSONDecodeError as exc:
            return error(400, f"the request body is not JSON: {exc}")
        except ApiError as exc:
            return error(exc.status, str(exc), exc.kind, exc.param)
        except BadRequestError as exc:
            return error(400, str(exc))
        accept = headers.get("accept", "*/*")
        if not request.stream:
            if not accepts(accept, JSON):
                return error(406, f"this answer is {JSON}, not {accept}")
            return self._whole(stream, request, chat=chat)
        frames = self._frames
        if (
            chat
            and frames is not None
            and accepts(accept, frames.stream_media_type, wildcards=False)
        ):
            encoder = frames.stream_encoder()
            return self._stream(
                stream,
                request,
                encoder,
                frames.stream_media_type,
                received_ns,
                frames.name,
                headers,
            )
        if not accepts(accept, self._content_type) and not accepts(accept, JSON):
            return error(406, f"this stream is {self._content_type}, not {accept}")
        encoder = self._encoder(request, chat=chat)
        encoded_by = self._chunks.name if chat else "orjson"  # see _encoder
        return self._stream(
            stream, request, encoder, self._content_type, received_ns, encoded_by, headers
        )

    def _encoder(self, request: OpenAIRequest, *, chat: bool) -> StreamEncoder:
        if chat and request.extensions:
            return self._inferwire_chunks.stream_encoder()
        objects = framed_encoder(self._framing, orjson.dumps)
        if not chat:
            return ob.CompletionChunks(
                objects, include_usage=request.include_usage, extensions=request.extensions
            )
        return ob.UsageAsOpenAI(
            self._openai_chunks.stream_encoder(), objects, include_usage=request.include_usage
        )

    def _stream(
        self,
        stream: TokenStream,
        request: OpenAIRequest,
        encoder: StreamEncoder,
        content_type: str,
        received_ns: int,
        encoded_by: str,
        headers: Mapping[str, str],
    ) -> Response:
        stamps = None
        if request.generate.timing:
            stamps = ServerStamps(received_ns)
            stamps.parsed()
        meter = None
        if self.metrics is not None:
            meter = self.metrics.start("stream", received_ns, encoded_by)
        if self.tracer is None:
            frames = stream_frames(self.service, stream, encoder, stamps, meter=meter)
        else:
            trace = self.tracer.server_request(
                headers.get(TRACEPARENT), received_ns, stamps, request.generate.workload
            )
            frames = trace.frames(
                stream_frames(self.service, stream, encoder, trace.stamps, meter=meter)
            )
        return Response(200, content_type, stream=frames, stamps=stamps, meter=meter)

    def _whole(self, stream: TokenStream, request: OpenAIRequest, *, chat: bool) -> Response:
        build: Callable[..., dict[str, Any]] = ob.chat_completion if chat else ob.text_completion
        body = orjson.dumps(build(stream.chunks, extensions=request.extensions))
        if self.service.prefill_s or self.service.decode_s:
            return Response(200, JSON, stream=_after(self.service, stream, body))
        return Response(200, JSON, body)
