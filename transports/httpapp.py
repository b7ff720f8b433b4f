"""The HTTP routes of the simulated service, shared by the HTTP/1.1 and HTTP/2 servers.

=======  ==============================  ===========================================
method   path                            answer
=======  ==============================  ===========================================
POST     /v1/chat/completions            the OpenAI API as vLLM serves it
POST     /v1/completions                 (:mod:`inferwire.transports.openai_api`):
GET      /v1/models                      completions streamed (SSE, or the codec's
GET      /v1/models/{id}                 frames by ``Accept``) and not, the models
GET      /health                         200, empty: vLLM's liveness route; 503 while
                                         the engine behind a frontend is away
*        /v2, /v2/...                    KServe v2 / Open Inference Protocol
                                         (:mod:`inferwire.transports.kserve_http`)
GET      /schemas/ids/{id}               a schema of the registry (Confluent's paths)
GET      /subjects/{subject}/versions    the versions of a subject
GET      /metrics                        the server's Prometheus metrics, if it records
                                         them (:mod:`inferwire.transports.metrics`)
=======  ==============================  ===========================================

Errors are JSON bodies in OpenAI's shape (``{"error": {"message", "type", "param",
"code"}}``), under ``/v2`` in the protocol's (``{"error": "..."}``). Routing is sans-IO:
:meth:`HttpApp.handle` takes a complete request and gives back a :class:`Response` whose body
is bytes or an async iterator of frames.
"""

from __future__ import annotations

import base64
import re
from collections.abc import Mapping
from typing import TYPE_CHECKING, Final

import orjson

import inferwire.codecs as ic
from inferwire.codecs.schema_registry import SchemaRegistry

from .compression import DECODABLE, Compression, ContentEncodingError, content_coding
from .errors import MessageTooLargeError
from .http_response import JSON as _JSON
from .http_response import Response, error
from .kserve_http import KServeHttp, kserve_error
from .metrics import SCRAPE_PATH, exposition
from .openai_api import OpenAIApi, OpenAIOptions
from .service import SimulatedService

if TYPE_CHECKING:
    from .metrics import ServerMetrics
    from .tracing import Tracer

__all__ = ["HttpApp", "Response", "error"]

_SCHEMA_PATH: Final = re.compile(r"/schemas/ids/([0-9]{1,10})")
_VERSIONS_PATH: Final = re.compile(r"/subjects/([A-Za-z0-9_.\-]{1,256})/versions")
_MODEL_PATH: Final = re.compile(r"/v1/models/(.+)")
_OPENAI_POST: Final = frozenset({"/v1/chat/completions", "/v1/completions"})


class HttpApp:
    """Routes requests to ``service``; streams and bodies in ``codec``. With ``metrics``, every
    answer but a scrape's carries its request's meter (``Response.meter``)."""

    def __init__(
        self,
        service: SimulatedService,
        codec: ic.Codec,
        *,
        registry: SchemaRegistry | None = None,
        metrics: ServerMetrics | None = None,
        tracer: Tracer | None = None,
        openai: OpenAIOptions | None = None,
        compression: Compression | None = None,
        allow_client_shm: bool = False,
    ) -> None:
        self.service = service
        self.codec = codec
        self.registry = registry
        self.metrics = metrics
        self.compression = compression
        """Content codings (``serve --compress``): of the answers, and of request bodies, which
        are decoded before any route reads them; None: none (a route refuses a coded body)."""
        self.openai = OpenAIApi(service, codec, metrics=metrics, tracer=tracer, options=openai)
        self.kserve = KServeHttp(service, codec, metrics=metrics, allow_client_shm=allow_client_shm)
        """``allow_client_shm``: whether KServe clients may register shared memory regions
        (``serve --allow-client-shm``, :mod:`.kserve_shm`)."""

    def close(self) -> None:
        """Unmap what the routes hold (the KServe clients' shared memory regions): the server
        stops, and a region must not outlive it until garbage collection."""
        self.kserve.close()

    def handle(
        self,
        method: str,
        path: str,
        headers: Mapping[str, str],
        body: bytes,
        received_ns: int = 0,
    ) -> Response:
        """The answer to one request; ``headers`` has lower-case names. ``received_ns``: when
        the whole request had arrived (for a timed stream's stamps, and the metrics). With
        :attr:`compression`, the request's body is decoded and the answer encoded as
        ``Content-Encoding`` and ``Accept-Encoding`` say (:mod:`.compression`)."""
        response = self._handle(method, path, headers, body, received_ns)
        compression = self.compression
        return response if compression is None else compression.encode(response, headers)

    def _handle(
        self,
        method: str,
        path: str,
        headers: Mapping[str, str],
        body: bytes,
        received_ns: int,
    ) -> Response:
        metrics = self.metrics
        if metrics is None:
            return self._route(method, path, headers, body, received_ns)
        if method == "GET" and path.split("?", 1)[0] == SCRAPE_PATH:
            text, content_type = exposition(metrics)
            return Response(200, content_type, text)
        try:
            response = self._route(method, path, headers, body, received_ns)
        except Exception:
            metrics.answered("unary", "error", received_ns)
            raise
        if response.meter is None:  # the routes meter their streams, the rest is unary
            response.meter = metrics.start("unary", received_ns)
            response.meter.stamps = response.request_stamps
        return response

    def _route(
        self, method: str, path: str, headers: Mapping[str, str], body: bytes, received_ns: int
    ) -> Response:
        if self.compression is not None and "content-encoding" in headers:
            decoded = self._decoded_body(path, headers, body)
            if isinstance(decoded, Response):
                return decoded
            body = decoded
            headers = {k: v for k, v in headers.items() if k != "content-encoding"}
        path = path.split("?", 1)[0]
        if path.startswith("/v1/"):
            return self._openai(method, path, headers, body, received_ns)
        if path == "/v2" or path.startswith("/v2/"):
            return self.kserve.handle(method, path, headers, body, received_ns)
        if method != "GET":
            return error(404, f"no route {path}")
        if path == "/health":  # vLLM's liveness route, which load tools (guidellm) check first
            # vLLM answers 503 when its engine is dead; a frontend's engine may be away
            return Response(200 if self.service.healthy() else 503, "text/plain; charset=utf-8")
        match = _SCHEMA_PATH.fullmatch(path)
        if match and self.registry is not None:
            return self._schema(int(match.group(1)))
        match = _VERSIONS_PATH.fullmatch(path)
        if match and self.registry is not None:
            subject = match.group(1)
            if subject not in self.registry.subjects():
                return error(404, f"subject {subject!r} not found", "not_found")
            return Response(200, _JSON, orjson.dumps(self.registry.versions(subject)))
        return error(404, f"no route {path}", "not_found")

    def _openai(
        self, method: str, path: str, headers: Mapping[str, str], body: bytes, received_ns: int
    ) -> Response:
        if path in _OPENAI_POST:
            if method != "POST":
                return error(405, f"{path} takes POST, not {method}")
            if path == "/v1/completions":
                return self.openai.completions(headers, body, received_ns)
            return self.openai.chat(headers, body, received_ns)
        match = _MODEL_PATH.fullmatch(path)
        if path == "/v1/models" or match:
            if method != "GET":
                return error(405, f"{path} takes GET, not {method}")
            return self.openai.model(match.group(1)) if match else self.openai.models()
        return error(404, f"no route {method} {path}")

    def _decoded_body(self, path: str, headers: Mapping[str, str], body: bytes) -> bytes | Response:
        """A request body in a content coding, decoded (bounded by the request limit), or the
        refusal, in the route's error shape: 415 for a coding not decoded, with the
        ``Accept-Encoding`` that says which are (RFC 9110, 12.5.3), 413 past a limit, 400 for
        bytes that do not decode."""
        assert self.compression is not None
        refuse = kserve_error if path == "/v2" or path.startswith("/v2/") else error
        try:
            coding = content_coding(headers["content-encoding"])
            if coding is None:
                return body
        except ContentEncodingError as exc:
            refusal = refuse(415, str(exc))
            refusal.headers.append(("accept-encoding", ", ".join(DECODABLE)))
            return refusal
        try:
            return self.compression.decode_request(coding, body)
        except MessageTooLargeError as exc:
            return refuse(413, str(exc))
        except ContentEncodingError as exc:
            return refuse(400, str(exc))

    def _schema(self, schema_id: int) -> Response:
        assert self.registry is not None
        try:
            schema = self.registry.resolve(schema_id)
        except ic.UnknownSchemaError:
            return error(404, f"schema {schema_id} not found", "not_found")
        document = {
            "schemaType": "PROTOBUF",
            "encoding": "FileDescriptorSet+base64",
            "schema": base64.b64encode(schema.descriptor_set).decode(),
        }
        return Response(200, _JSON, orjson.dumps(document))
