"""KServe v2 (the Open Inference Protocol) over HTTP: every route under ``/v2``, sans-IO.

The protocol: https://kserve.github.io/website/latest/modelserving/data_plane/v2_protocol/
("HTTP/REST"); its binary tensor data extension: Triton's
``docs/protocol/extension_binary_data.md``. The bodies are read and written by
:mod:`inferwire.codecs.kserve`.

=======  ==========================================  ==========================================
method   path                                        answer
=======  ==========================================  ==========================================
GET      /v2/health/live, /v2/health/ready           200, empty body (the spec: "should be
                                                     empty"); ready is 400 while a frontend's
                                                     engine is away
GET      /v2                                         server metadata: name, version, extensions
GET      /v2/models/{m}[/versions/{v}]               model metadata
GET      /v2/models/{m}[/versions/{v}]/ready         200, empty body
POST     /v2/models/{m}[/versions/{v}]/infer         inference
POST     /v2/models/{m}[/versions/{v}]/generate      Triton's generate extension: one JSON
         .../generate_stream                         answer, or server-sent events
                                                     (:mod:`.kserve_generate`)
GET      /v2/systemsharedmemory[/region/{r}]/status  Triton's system shared memory extension
POST     /v2/systemsharedmemory/region/{r}/register  (:mod:`.kserve_shm_wire`); the CUDA one's
POST     /v2/systemsharedmemory[/region/{r}]/        routes (``cudasharedmemory``) answer as a
         unregister                                  Triton without GPUs does
=======  ==========================================  ==========================================

**The model.** The simulated service has one model, an echo (input ``i`` comes back as
``output_<i>``, the same tensor), and serves it under any name of 1 to 128 characters from
``[A-Za-z0-9_.-]``, in version ``"1"``. Its metadata gives the name asked for, platform
``inferwire_echo`` and empty ``inputs`` and ``outputs``: the echo takes any number of tensors of
any datatype and shape, which no list of ``$metadata_tensor`` can state, and an empty list is
what KServe's own Python server reports for a model that declares no signature
(``kserve.Model.get_input_types``).

**Infer bodies, by content type.** No content type (tritonclient sends none),
``application/json`` or ``application/octet-stream`` (Triton's binary examples): the protocol's
JSON, followed by binary tensor data when ``Inference-Header-Content-Length`` gives the JSON's
length. The server codec's own media type, when it is not JSON (``protobuf``, ``msgpack``,
``flatbuffers``, ``tensor``, ...): an :class:`~inferwire.codecs.InferRequest` in that codec,
answered in it; this is what inferwire's own clients send, so a benchmark of them measures the
codec. Anything else is a 415.

**Errors** are ``{"error": "<message>"}``: 400 for a request the protocol or the model refuses,
404 for an unknown route or model version, 405 for a method a route does not take, 415 for a
content type or encoding that is not read. The shared memory extension's errors carry their
status, as Triton answers them (:mod:`.kserve_shm`: 404 for a region not registered, 501 when
client regions are not allowed). Nothing a client sends raises out of :meth:`KServeHttp.handle`.
"""

from __future__ import annotations

import dataclasses
import functools
import importlib.metadata
import re
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Final

import orjson

import inferwire.codecs as ic
from inferwire.codecs import kserve
from inferwire.codecs.base import DEFAULT_MAX_DEPTH, DEFAULT_MAX_ELEMENTS

from . import kserve_generate, kserve_shm, kserve_shm_wire
from .errors import BadRequestError, NotFoundError
from .http_response import Response
from .service import SimulatedService

if TYPE_CHECKING:
    from .metrics import ServerMetrics

SERVER_NAME: Final = "inferwire"
MODEL_VERSION: Final = "1"
PLATFORM: Final = "inferwire_echo"
EXTENSIONS: Final = ("binary_tensor_data", "generate", kserve_shm.EXTENSION)
HEADER_LENGTH: Final = "inference-header-content-length"

_JSON: Final = "application/json"
_BINARY: Final = "application/octet-stream"
_EMPTY: Final = "text/plain; charset=utf-8"
_PROTOCOL_MEDIA: Final = frozenset({"", _JSON, _BINARY})
_MODEL_PATH: Final = re.compile(
    r"/v2/models/([A-Za-z0-9_.\-]{1,128})(?:/versions/([A-Za-z0-9_.\-]{1,64}))?"
    r"(/ready|/infer|/generate|/generate_stream)?"
)
_HEADER_LENGTH_VALUE: Final = re.compile(r"[0-9]{1,19}")
_UNSERVED_OUTPUT_PARAMETERS: Final = {"classification": "the classification extension"}
_SHM_PARAMETER: Final = b"shared_memory_"
"""In a request's JSON only when a tensor uses a region (or escapes its name, which the decoder
then refuses): the common request pays one search."""


@functools.cache
def _server_version() -> str:
    try:
        return importlib.metadata.version("inferwire")
    except importlib.metadata.PackageNotFoundError:  # run from a source tree, not installed
        return "unknown"


def server_metadata() -> dict[str, Any]:
    """The ``$metadata_server_response``."""
    return {"name": SERVER_NAME, "version": _server_version(), "extensions": list(EXTENSIONS)}


def model_metadata(name: str) -> dict[str, Any]:
    """The ``$metadata_model_response`` of the echo model served as ``name``."""
    return {
        "name": name,
        "versions": [MODEL_VERSION],
        "platform": PLATFORM,
        "inputs": [],
        "outputs": [],
    }


def kserve_error(
    status: int, message: str, headers: list[tuple[str, str]] | None = None
) -> Response:
    """The protocol's error object, ``{"error": $string}``."""
    return Response(status, _JSON, orjson.dumps({"error": message}), headers=headers or [])


def _media(value: str) -> str:
    return value.split(";", 1)[0].strip().lower()


def _refused(exc: Exception) -> Response:
    status = getattr(exc, "http_status", 404 if isinstance(exc, NotFoundError) else 400)
    return kserve_error(status, str(exc))


def _method(method: str, allowed: str) -> Response | None:
    if method == allowed:
        return None
    return kserve_error(405, f"use {allowed}", [("allow", allowed)])


def _json_length(headers: Mapping[str, str]) -> int | None:
    value = headers.get(HEADER_LENGTH)
    if value is None:
        return None
    if not _HEADER_LENGTH_VALUE.fullmatch(value.strip()):
        raise BadRequestError(
            f"Inference-Header-Content-Length must be a byte count, not {value!r}"
        )
    return int(value)


def select_outputs(
    response: ic.InferResponse, request: kserve.KServeRequest
) -> list[tuple[ic.Tensor, bool]]:
    """The outputs to send, each with whether it goes as binary data: every output when the
    request names none (the spec's default), else those it names, in its order."""
    if request.outputs is None:
        return [(tensor, request.binary_output) for tensor in response.outputs]
    produced = {tensor.name: tensor for tensor in response.outputs}
    chosen = []
    for wanted in request.outputs:
        for parameter, extension in _UNSERVED_OUTPUT_PARAMETERS.items():
            if parameter in wanted.parameters:
                raise BadRequestError(
                    f"output {wanted.name!r} asks for {extension} ({parameter}), "
                    "which this server does not implement"
                )
        tensor = produced.get(wanted.name)
        if tensor is None:
            names = ", ".join(repr(name) for name in produced) or "none"
            raise BadRequestError(
                f"model {response.model!r} produces no output {wanted.name!r} for this request "
                f"(it produces {names})"
            )
        chosen.append((tensor, request.binary_output if wanted.binary is None else wanted.binary))
    return chosen


class KServeHttp:
    """The ``/v2`` routes of ``service``; ``codec`` reads and writes the bodies of inferwire's
    own clients (see the module docstring). ``max_depth`` and ``max_elements`` hold the JSON of
    a protocol request, as they hold a codec's input. With ``metrics``, a stream's answer carries
    its meter. ``allow_client_shm``: whether clients may register shared memory regions (off by
    default, ``serve --allow-client-shm``; :mod:`.kserve_shm`)."""

    def __init__(
        self,
        service: SimulatedService,
        codec: ic.Codec,
        *,
        max_depth: int = DEFAULT_MAX_DEPTH,
        max_elements: int = DEFAULT_MAX_ELEMENTS,
        metrics: ServerMetrics | None = None,
        allow_client_shm: bool = False,
    ) -> None:
        self.service = service
        self.codec = codec
        self.metrics = metrics
        self.max_depth = max_depth
        self.max_elements = max_elements
        self._codec_media = (
            codec.media_type
            if codec.media_type != _JSON and ic.InferRequest in codec.types
            else None
        )
        self.shm = kserve_shm.SystemSharedMemory(allow=allow_client_shm)
        """The shared memory regions clients registered with this server."""

    def close(self) -> None:
        """Unregister every shared memory region (the server stops)."""
        self.shm.close()

    def handle(
        self,
        method: str,
        path: str,
        headers: Mapping[str, str],
        body: bytes,
        received_ns: int = 0,
    ) -> Response:
        """The answer to one request under ``/v2``; ``path`` without its query, ``headers``
        with lower-case names, ``received_ns`` when it had arrived whole (for the metrics)."""
        if path == "/v2/health/live":
            return _method(method, "GET") or Response(200, _EMPTY)
        if path == "/v2/health/ready":
            # not ready while a frontend's engine is away: the status code is the answer
            # (4xx for false, as Triton's HandleServerHealth answers 400)
            ready = self.service.healthy()
            return _method(method, "GET") or Response(200 if ready else 400, _EMPTY)
        if path == "/v2":
            return _method(method, "GET") or Response(200, _JSON, orjson.dumps(server_metadata()))
        if path.startswith(kserve_shm_wire.HTTP_PREFIXES):
            return self._shared_memory(method, path, body)
        match = _MODEL_PATH.fullmatch(path)
        if match is None:
            return kserve_error(404, f"no route {path}"[:300])
        model, version, action = match.groups()
        if version is not None and version != MODEL_VERSION:
            return kserve_error(
                404, f"model {model!r} has no version {version!r}; it has {MODEL_VERSION!r}"
            )
        if action == "/infer":
            return _method(method, "POST") or self._infer(model, headers, body)
        if action in ("/generate", "/generate_stream"):
            return _method(method, "POST") or kserve_generate.generate(
                self.service,
                model,
                MODEL_VERSION,
                headers,
                body,
                stream=action == "/generate_stream",
                metrics=self.metrics,
                received_ns=received_ns,
            )
        refused = _method(method, "GET")
        if refused is not None:
            return refused
        if action == "/ready":
            return Response(200, _EMPTY)
        return Response(200, _JSON, orjson.dumps(model_metadata(model)))

    def _infer(self, model: str, headers: Mapping[str, str], body: bytes) -> Response:
        encoding = headers.get("content-encoding", "identity").strip().lower()
        if encoding != "identity":
            return kserve_error(
                415, f"content-encoding {encoding!r} is not read: send the body as is"
            )
        media = _media(headers.get("content-type", ""))
        if media == self._codec_media:
            return self._infer_codec(model, body)
        if media not in _PROTOCOL_MEDIA:
            mine = f", or {self._codec_media} (this server's codec)" if self._codec_media else ""
            return kserve_error(
                415,
                f"infer reads the protocol's JSON (application/json, or application/octet-stream "
                f"with binary tensor data){mine}, not {media!r}",
            )
        try:
            request = self._decode(model, _json_length(headers), body)
            response = self.service.infer(request.request)
            chosen = select_outputs(response, request)
            spans = kserve_shm_wire.json_output_spans(request.outputs)
            for tensor, _ in chosen:
                if tensor.name in spans:
                    self.shm.write_tensor(tensor, spans[tensor.name])
            parts, json_length = kserve.encode_response(
                response,
                [(tensor, binary) for tensor, binary in chosen if tensor.name not in spans],
                id=request.id,
                model_version=MODEL_VERSION,
            )
            if spans:  # their entries, without data
                order = [tensor for tensor, _ in chosen]
                parts[0] = kserve_shm_wire.with_region_outputs(bytes(parts[0]), order, spans)
                json_length = None if json_length is None else len(parts[0])
        except (ic.CodecError, BadRequestError) as exc:
            return _refused(exc)
        if json_length is None:
            return Response(200, _JSON, b"".join(parts))
        return Response(200, _BINARY, b"".join(parts), headers=[(HEADER_LENGTH, str(json_length))])

    def _decode(self, model: str, json_length: int | None, body: bytes) -> kserve.KServeRequest:
        """The protocol's request; inputs that name a shared memory region are read from it."""
        end = len(body) if json_length is None else json_length
        if not 0 <= end <= len(body) or body.find(_SHM_PARAMETER, 0, end) < 0:
            return kserve.decode_request(
                body,
                model=model,
                json_length=json_length,
                max_depth=self.max_depth,
                max_elements=self.max_elements,
            )
        obj = kserve.load_json(memoryview(body)[:end], self.max_depth, self.max_elements)
        taken = kserve_shm_wire.split_json_inputs(obj, self.shm) if type(obj) is dict else []
        head = orjson.dumps(obj)  # the JSON without them, for the decoder
        request = kserve.decode_request(
            head if json_length is None else head + memoryview(body)[end:],
            model=model,
            json_length=None if json_length is None else len(head),
            max_depth=self.max_depth,
            max_elements=self.max_elements,
        )
        if not taken:
            return request
        inputs = kserve_shm_wire.merge_inputs(request.request.inputs, taken)
        model_request = dataclasses.replace(request.request, inputs=inputs)
        return dataclasses.replace(request, request=model_request)

    def _shared_memory(self, method: str, path: str, body: bytes) -> Response:
        try:
            route = kserve_shm_wire.http_route(path)
        except BadRequestError as exc:
            return _refused(exc)
        if route is None:
            return kserve_error(404, f"no route {path}"[:300])
        kind, region, action = route
        refused = _method(method, "GET" if action == "status" else "POST")
        if refused is not None:
            return refused
        try:
            answer = kserve_shm_wire.http_call(
                self.shm,
                kind,
                region,
                action,
                body,
                max_depth=self.max_depth,
                max_elements=self.max_elements,
            )
        except BadRequestError as exc:
            return _refused(exc)
        if answer is None:
            return Response(200, _EMPTY)
        return Response(200, _JSON, orjson.dumps(answer))

    def _infer_codec(self, model: str, body: bytes) -> Response:
        try:
            request = self.codec.decode(body, ic.InferRequest)
            if request.model != model:
                raise BadRequestError(f"the path names model {model!r}, the body {request.model!r}")
            payload = self.codec.encode(self.service.infer(request))
        except (ic.CodecError, BadRequestError) as exc:
            return kserve_error(400, str(exc))
        return Response(200, self.codec.media_type, payload)
