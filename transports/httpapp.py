"""The HTTP routes of the simulated service, shared by the HTTP/1.1 and HTTP/2 servers.

=======  ==============================  ===========================================
method   path                            answer
=======  ==============================  ===========================================
POST     /v1/chat/completions            a token stream (``"stream": true``): SSE for
                                         the JSON codecs (OpenAI-compatible, ending with
                                         ``data: [DONE]``), else the codec's frames
*        /v2, /v2/...                    KServe v2 / Open Inference Protocol
                                         (:mod:`.kserve_http`)
GET      /schemas/ids/{id}               a schema of the registry (Confluent's paths)
GET      /subjects/{subject}/versions    the versions of a subject
=======  ==============================  ===========================================

Errors are JSON bodies in OpenAI's shape (``{"error": {"message", "type", "code"}}``), under
``/v2`` in the protocol's (``{"error": "..."}``).
Routing is sans-IO: :meth:`HttpApp.handle` takes a complete request and gives back a
:class:`Response` whose body is bytes or an async iterator of frames.
"""

from __future__ import annotations

import base64
import re
from collections.abc import Mapping
from typing import Final

import orjson

import inferwire.codecs as ic

from .common import error_body
from .errors import BadRequestError
from .http_response import Response as Response  # the servers import it from here
from .kserve_http import KServeHttp
from .service import GenerateRequest, SimulatedService
from .streams import stream_frames
from .timing import ServerStamps

_SCHEMA_PATH: Final = re.compile(r"/schemas/ids/([0-9]{1,10})")
_VERSIONS_PATH: Final = re.compile(r"/subjects/([A-Za-z0-9_.\-]{1,256})/versions")
_JSON: Final = "application/json"


def error(status: int, message: str, kind: str = "invalid_request_error") -> Response:
    return Response(status, _JSON, error_body(status, message, kind))


def _media(value: str) -> str:
    return value.split(";", 1)[0].strip().lower()


class HttpApp:
    """Routes requests to ``service``; streams and bodies in ``codec``."""

    def __init__(
        self,
        service: SimulatedService,
        codec: ic.Codec,
        *,
        registry: ic.SchemaRegistry | None = None,
    ) -> None:
        self.service = service
        self.codec = codec
        self.registry = registry
        self.sse = codec.stream_media_type == "text/event-stream"
        self.kserve = KServeHttp(service, codec)

    def handle(
        self,
        method: str,
        path: str,
        headers: Mapping[str, str],
        body: bytes,
        received_ns: int = 0,
    ) -> Response:
        """The answer to one request; ``headers`` has lower-case names. ``received_ns``: when
        the whole request had arrived (for a timed stream's stamps)."""
        path = path.split("?", 1)[0]
        if path == "/v2" or path.startswith("/v2/"):
            return self.kserve.handle(method, path, headers, body)
        if path == "/v1/chat/completions":
            if method != "POST":
                return error(405, "use POST")
            return self._generate(headers, body, received_ns)
        if method != "GET":
            return error(404, f"no route {path}")
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

    def _generate(self, headers: Mapping[str, str], body: bytes, received_ns: int) -> Response:
        if ic.TokenChunk not in self.codec.types:
            return error(406, f"codec {self.codec.name!r} does not carry token streams")
        if _media(headers.get("content-type", _JSON)) != _JSON:
            return error(415, "the request body is JSON")
        accept = headers.get("accept", "*/*")
        wanted = {_media(part) for part in accept.split(",")}
        mine = self.codec.stream_media_type
        if not wanted & {mine, "*/*", _JSON, "text/event-stream" if self.sse else mine}:
            return error(406, f"this server streams {mine}, not {accept}")
        try:
            obj = orjson.loads(body)
            request = GenerateRequest.from_json_obj(obj)
            if isinstance(obj, dict) and obj.get("stream") is False:
                raise BadRequestError("only streaming completions are served: set stream")
            stream = self.service.open(request)  # a bad request is refused before a stream
        except (orjson.JSONDecodeError, BadRequestError) as exc:
            return error(400, str(exc))
        stamps = None
        if request.timing:
            stamps = ServerStamps(received_ns)
            stamps.parsed()
        frames = stream_frames(self.service, stream, self.codec.stream_encoder(), stamps)
        return Response(200, mine, stream=frames, stamps=stamps)

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
