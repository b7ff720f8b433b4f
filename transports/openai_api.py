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
then what vLLM sends: no field of inferwire's own. Every such answer has its own ``id`` and
``created`` (:class:`~inferwire.transports.openai_bodies.Identity`: the workloads' ids repeat
from one request to the next; the fresh one has their length, so an answer's bytes keep theirs).

With :class:`OpenAIOptions` (``inferwire serve``'s flags, named as vLLM's):

- ``per_request_metrics`` (``--enable-per-request-metrics``): vLLM's per-request ``metrics``
  object (:func:`~inferwire.transports.request_stamps.metrics_object`) after ``usage``, on a
  non-streamed answer and on the usage-only chunk of a stream that asked for
  ``stream_options.include_usage`` (a stream that did not ask has no place for it, as in
  vLLM); computed from the request's stamps, the engine's with ``--engine``, else the
  simulated service's. Off, not a byte of an answer changes.
- ``stamps_file`` (``--stamps-file PATH``): a JSON line per answer with the request's raw
  stamps (:class:`~inferwire.transports.request_stamps.StampsFile`), keyed by the answer's
  ``id``, the ground truth that what a client makes of these figures is checked against.

A non-streamed answer is written once its tokens are generated: by the engine with
``--engine``, or as the service paces them; an unpaced local service has them at once (its
stamps are then all the moment the body was made), and answers at once unless a stamps file
asks for the moment its body was written.

inferwire's extensions: a request with ``"inferwire": {"extensions": true}`` gets inferwire's
stream instead (the service's chunks as they are, their ``id`` and ``created`` too, so that
inferwire's clients compare them with the service's), the one its clients verify
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
from typing import TYPE_CHECKING, Any, Final, Literal

import orjson

import inferwire.codecs as ic
from inferwire.codecs.framing import StreamEncoder, framed_encoder
from inferwire.serving import ChatCompletionRequest, RequestError

from . import openai_bodies as ob
from .errors import BadRequestError
from .http_response import JSON, Response, accepts, error, media
from .request_stamps import StampsFile, metrics_object
from .service import GenerateRequest, SimulatedService, TokenStream
from .streams import stream_frames
from .timing import TRACEPARENT, ServerStamps, now_ns

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
class OpenAIOptions:
    """What ``inferwire serve`` adds to the OpenAI API (the module docstring): vLLM's
    per-request ``metrics`` object, and a file of each request's stamps."""

    per_request_metrics: bool = False
    stamps_file: StampsFile | None = None


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


def chat_request_body(
    request: GenerateRequest, *, timing: bool = False, traceparent: str | None = None
) -> bytes:
    """The ``POST /v1/chat/completions`` body with which inferwire's clients ask for
    ``request``'s stream, with inferwire's extensions (and the server's stamps if ``timing``;
    a W3C ``traceparent`` where no header can carry it, as on a WebSocket session)."""
    obj = request.to_json_obj()
    obj["messages"] = _CLIENT_MESSAGES
    obj["stream"] = True
    obj[EXTENSIONS_FIELD] = {"extensions": True}
    if timing:
        obj["timing"] = True
    if traceparent:
        obj[TRACEPARENT] = traceparent
    return orjson.dumps(obj)


Outcome = Literal["ok", "cancelled", "error"]
Record = Callable[[Outcome], None]
"""What is done when an answer ended (its stamps-file line), given how it ended."""


async def _after(
    service: SimulatedService,
    stream: TokenStream,
    body: Callable[[], bytes],
    record: Record | None,
) -> AsyncGenerator[bytes, None]:
    """The answer's ``body()`` once the stream has been generated: a non-streamed answer
    takes as long as the streamed one. The stream's frontend stamps are taken as
    :func:`~inferwire.transports.streams.stream_frames` takes them."""
    stamps = stream.stamps
    outcome: Outcome = "cancelled"
    try:
        async with contextlib.aclosing(service.batches(stream)) as batches:
            async for _ in batches:
                if not stamps.first_chunk_ns:
                    stamps.first_chunk_ns = now_ns()
        stamps.last_chunk_ns = now_ns()
        yield body()
        stamps.last_chunk_written_ns = now_ns()
        outcome = "ok"
    except Exception:
        outcome = "error"
        raise
    finally:
        if record is not None:
            record(outcome)


async def _recorded(
    pieces: AsyncGenerator[bytes, None], record: Record
) -> AsyncGenerator[bytes, None]:
    """``pieces`` as they are, then ``record`` how the answer ended (the transport asks for
    the next piece once it wrote one: the stream ends ``ok`` after its last write)."""
    outcome: Outcome = "cancelled"
    try:
        async with contextlib.aclosing(pieces):
            async for piece in pieces:
                yield piece
        outcome = "ok"
    except Exception:
        outcome = "error"
        raise
    finally:
        record(outcome)


def _tokens(chunks: Sequence[ic.TokenChunk]) -> int:
    """An answer's completion tokens: its end marker's usage, else its chunks' token ids."""
    usage = chunks[-1].usage
    if usage is not None:
        return usage.completion_tokens
    return sum(len(c.token_ids) for c in chunks)


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
        options: OpenAIOptions | None = None,
    ) -> None:
        self.service = service
        self.codec = codec
        self.metrics = metrics
        self.tracer = tracer
        self.options = options if options is not None else OpenAIOptions()
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
            stream.stamps.received_ns = received_ns or now_ns()
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
                stream.chunks[0].id,  # the codec's own stream: the service's chunks whole
            )
        if not accepts(accept, self._content_type) and not accepts(accept, JSON):
            return error(406, f"this stream is {self._content_type}, not {accept}")
        identity = self._identity(stream, request)
        encoder = self._encoder(request, stream, identity, chat=chat)
        encoded_by = self._chunks.name if chat else "orjson"  # see _encoder
        return self._stream(
            stream,
            request,
            encoder,
            self._content_type,
            received_ns,
            encoded_by,
            headers,
            self._answer_id(stream, identity, chat=chat),
        )

    @staticmethod
    def _identity(stream: TokenStream, request: OpenAIRequest) -> ob.Identity | None:
        """A fresh id and created for an OpenAI answer; none with inferwire's extensions."""
        return None if request.extensions else ob.Identity.fresh(stream.chunks[0].id)

    @staticmethod
    def _answer_id(stream: TokenStream, identity: ob.Identity | None, *, chat: bool) -> str:
        """The ``id`` the client reads in the answer."""
        chat_id = stream.chunks[0].id if identity is None else identity.id
        return chat_id if chat else ob.text_completion_id(chat_id)

    def _record(self, stream: TokenStream, answer_id: str, *, streamed: bool) -> Record | None:
        """The stamps-file line of an answer, once it ended (None: no stamps file)."""
        stamps_file = self.options.stamps_file
        if stamps_file is None:
            return None

        def record(outcome: Outcome) -> None:
            line = stream.stamps.line(answer_id, outcome, _tokens(stream.chunks), stream=streamed)
            stamps_file.write(line)

        return record

    def _usage_metrics(self, stream: TokenStream) -> Callable[[ic.Usage], dict[str, Any]] | None:
        """The per-request ``metrics`` object beside a usage, if the server gives it."""
        if not self.options.per_request_metrics:
            return None
        stamps = stream.stamps
        return lambda usage: {"metrics": metrics_object(stamps, usage.completion_tokens)}

    def _encoder(
        self,
        request: OpenAIRequest,
        stream: TokenStream,
        identity: ob.Identity | None,
        *,
        chat: bool,
    ) -> StreamEncoder:
        if chat and request.extensions:
            return self._inferwire_chunks.stream_encoder()
        objects = framed_encoder(self._framing, orjson.dumps)
        encoder: StreamEncoder
        if not chat:
            encoder = ob.CompletionChunks(
                objects,
                include_usage=request.include_usage,
                extensions=request.extensions,
                usage_extra=self._usage_metrics(stream),
            )
        else:
            encoder = ob.UsageAsOpenAI(
                self._openai_chunks.stream_encoder(),
                objects,
                include_usage=request.include_usage,
                usage_extra=self._usage_metrics(stream),
            )
        return encoder if identity is None else ob.Relabeled(encoder, identity)

    def _stream(
        self,
        stream: TokenStream,
        request: OpenAIRequest,
        encoder: StreamEncoder,
        content_type: str,
        received_ns: int,
        encoded_by: str,
        headers: Mapping[str, str],
        answer_id: str,
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
                headers.get(TRACEPARENT),
                received_ns,
                stamps,
                request.generate.workload,
                stream.stamps,
                answer_id,
            )
            frames = trace.frames(
                stream_frames(self.service, stream, encoder, trace.stamps, meter=meter)
            )
        record = self._record(stream, answer_id, streamed=True)
        if record is not None:
            frames = _recorded(frames, record)
        return Response(200, content_type, stream=frames, stamps=stamps, meter=meter)

    def _whole(self, stream: TokenStream, request: OpenAIRequest, *, chat: bool) -> Response:
        build: Callable[..., dict[str, Any]] = ob.chat_completion if chat else ob.text_completion
        identity = self._identity(stream, request)
        stamps = stream.stamps

        def body() -> bytes:
            extra = None
            if self.options.per_request_metrics:
                extra = {"metrics": metrics_object(stamps, _tokens(stream.chunks))}
            answer = build(
                stream.chunks, extensions=request.extensions, identity=identity, extra=extra
            )
            return orjson.dumps(answer)

        record = self._record(stream, self._answer_id(stream, identity, chat=chat), streamed=False)
        if self.service.instant and record is None:
            at_once = now_ns()  # the unpaced local service has every token now
            stamps.engine(at_once, at_once, at_once, at_once)
            stamps.first_chunk_ns = stamps.last_chunk_ns = at_once
            return Response(200, JSON, body(), request_stamps=stamps)
        answer = _after(self.service, stream, body, record)
        return Response(200, JSON, stream=answer, request_stamps=stamps)
