"""The OTLP/HTTP trace receiver, shared by ``inferwire load --otlp-listen`` (:mod:`.otlp`) and
``inferwire trace collect``: ``POST /v1/traces`` with an ``ExportTraceServiceRequest`` as
``application/x-protobuf`` or, unless told otherwise, ``application/json`` (OTLP JSON: hex ids),
gzip (or deflate) allowed, read by ``Content-Length`` or chunked. What it cannot take gets the
status the OTLP specification names (opentelemetry-proto ``docs/specification.md``, "OTLP/HTTP
Response"), with a ``google.rpc.Status`` body carrying the message, and the receiver goes on: 400
bad data, 404 another path, 405 another method, 411 no length, 413 over the body limit (before or
after decompression), 415 another content type or encoding, 503 closing. It runs in
``http.server`` threads, so parsing spans never touches the generator's event loop; loopback
unless told.
"""

from __future__ import annotations

import base64
import collections
import http.server
import socket
import socketserver
import threading
import zlib
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Final

import orjson

from inferwire._runtime.extras import needs_extras

if TYPE_CHECKING:
    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
        ExportTraceServiceRequest,
    )

PATH: Final = "/v1/traces"
PROTOBUF: Final = "application/x-protobuf"
JSON: Final = "application/json"
MAX_BODY_BYTES: Final = 20 << 20
"""The OTLP specification's recommended limit, applied before and after decompression."""
_DRAIN_BYTES: Final = 64 << 20
"""How much of an oversized body is read and dropped so that its sender reads the 413 (closing
a socket with unread data resets it, and the answer is lost); past it, the connection closes."""

_POLL_S: Final = 0.1
"""How often the accept loop looks for :meth:`TraceReceiver.close` (socketserver's 0.5 s would
make every close take that long)."""


class ExportRefused(Exception):
    """An export answered with an error: ``status`` is its HTTP status, ``kind`` names the fault
    without figures (so faults of one kind count together), ``close`` when the connection
    cannot go on (its body was not read to the end)."""

    def __init__(self, status: int, kind: str, message: str, *, close: bool = False) -> None:
        super().__init__(message)
        self.status = status
        self.kind = kind
        self.close = close


def status_body(message: str, media_type: str) -> bytes:
    """A ``google.rpc.Status`` with ``message``: the body OTLP/HTTP gives every 4xx and 5xx, in
    the request's encoding. ``code`` is left out, as the specification allows."""
    if media_type == JSON:
        return orjson.dumps({"message": message})
    text = message.encode()
    return b"\x12" + _varint(len(text)) + text  # field 2 (message), length-delimited


def _varint(value: int) -> bytes:
    out = bytearray()
    while value > 0x7F:
        out.append(value & 0x7F | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def decode_export(
    body: bytes,
    *,
    media_type: str,
    content_encoding: str = "",
    accept_json: bool = True,
    max_body_bytes: int = MAX_BODY_BYTES,
) -> ExportTraceServiceRequest:
    """The ``ExportTraceServiceRequest`` of one OTLP/HTTP body; :class:`ExportRefused` for what
    is not one (``media_type`` without parameters, lower case)."""
    with needs_extras("the OTLP receiver"):
        from opentelemetry.proto.collector.trace.v1 import trace_service_pb2
    accepted = (PROTOBUF, JSON) if accept_json else (PROTOBUF,)
    if media_type not in accepted:
        takes = " or ".join(accepted)
        raise ExportRefused(
            415, "content type", f"this receiver takes {takes}, not {media_type or 'nothing'}"
        )
    encoding = content_encoding.strip().lower()
    if encoding in _WBITS:
        body = _inflate(body, max_body_bytes, encoding)
    elif encoding not in ("", "identity"):
        raise ExportRefused(
            415, "content encoding", f"no content encoding {encoding!r}: gzip or deflate"
        )
    request = trace_service_pb2.ExportTraceServiceRequest()
    if media_type == JSON:
        _parse_json(body, request)
        return request
    from google.protobuf.message import Error as ProtobufError

    try:
        request.ParseFromString(body)
    except ProtobufError as exc:
        raise ExportRefused(
            400, "not protobuf", f"not an ExportTraceServiceRequest: {exc}"
        ) from None
    return request


_WBITS: Final = {"gzip": 16 + zlib.MAX_WBITS, "deflate": zlib.MAX_WBITS}
"""Content codings (RFC 9110 section 8.4.1): the specification's gzip, and the zlib format the
Python SDK sends as ``deflate`` (``Compression.Deflate``)."""


def _inflate(data: bytes, limit: int, encoding: str) -> bytes:
    """``data`` decompressed (every gzip member), refused past ``limit`` bytes without
    inflating more."""
    parts: list[bytes] = []
    size = 0
    try:
        while data:
            inflater = zlib.decompressobj(wbits=_WBITS[encoding])
            part = inflater.decompress(data, limit - size + 1)
            size += len(part)
            if size > limit:
                raise ExportRefused(413, "too large", f"body over {limit} bytes decompressed")
            if not inflater.eof:
                raise ExportRefused(400, f"bad {encoding}", f"{encoding} body ends early")
            parts.append(part)
            data = inflater.unused_data
    except zlib.error as exc:
        raise ExportRefused(400, f"bad {encoding}", f"not {encoding}: {exc}") from None
    return b"".join(parts)


def _parse_json(body: bytes, request: ExportTraceServiceRequest) -> None:
    """OTLP JSON into ``request``: protobuf's JSON mapping but with hex ids (which it would read
    as base64) and unknown fields ignored (the specification, "JSON Protobuf Encoding")."""
    from google.protobuf import json_format

    try:
        obj = orjson.loads(body)
        for resource in obj.get("resourceSpans") or ():
            for scope in resource.get("scopeSpans") or ():
                for span in scope.get("spans") or ():
                    _base64_ids(span)
                    for link in span.get("links") or ():
                        _base64_ids(link)
        json_format.ParseDict(obj, request, ignore_unknown_fields=True)
    except (ValueError, TypeError, AttributeError, json_format.Error) as exc:
        raise ExportRefused(
            400, "not OTLP JSON", f"not an OTLP JSON ExportTraceServiceRequest: {exc}"
        ) from None


def _base64_ids(obj: dict[str, Any]) -> None:
    for name in ("traceId", "spanId", "parentSpanId"):
        value = obj.get(name)
        if isinstance(value, str) and value:
            obj[name] = base64.b64encode(bytes.fromhex(value)).decode()


ExportHandler = Callable[["ExportTraceServiceRequest"], None]


class TraceReceiver:
    """OTLP/HTTP traces on ``host:port`` (0: any free port; :attr:`address` says which), each
    accepted export handed to ``handle`` in the connection's thread (it may raise
    :class:`ExportRefused`). Use as a context manager, or :meth:`serve_forever` in the
    foreground; ``log`` hears of each refusal."""

    def __init__(
        self,
        handle: ExportHandler,
        host: str = "127.0.0.1",
        port: int = 0,
        *,
        accept_json: bool = True,
        max_body_bytes: int = MAX_BODY_BYTES,
        log: Callable[[str], None] | None = None,
    ) -> None:
        with needs_extras("the OTLP receiver"):
            import opentelemetry.proto.collector.trace.v1.trace_service_pb2  # noqa: F401
        self.handle = handle
        self.accept_json = accept_json
        self.max_body_bytes = max_body_bytes
        self.log = log
        self._lock = threading.Lock()
        self.exports = 0
        """Exports accepted."""
        self.spans = 0
        """Spans in the exports accepted."""
        self._refusals: collections.Counter[str] = collections.Counter()
        self._closing = False
        receiver = self

        class Handler(_Handler):
            owner = receiver

        host = host.strip("[]")
        server_class = _Server6 if ":" in host else _Server
        self._server = server_class((host, port), Handler)
        self.address: tuple[str, int] = self._server.server_address[:2]  # type: ignore[assignment]
        self._thread: threading.Thread | None = None

    @property
    def endpoint(self) -> str:
        """The URL to give the sender (``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT``)."""
        host, port = self.address
        return f"http://{f'[{host}]' if ':' in host else host}:{port}{PATH}"

    @property
    def refusals(self) -> dict[str, int]:
        """Requests answered with an error, by ``"<status> <kind>"``."""
        with self._lock:
            return dict(self._refusals)

    @property
    def refused(self) -> int:
        """Requests answered with an error."""
        with self._lock:
            return sum(self._refusals.values())

    def receive(self, body: bytes, media_type: str, content_encoding: str = "") -> bytes:
        """Take one export; the success response's body. Raises :class:`ExportRefused`."""
        if self._closing:
            raise ExportRefused(503, "closing", "the receiver is closing")
        request = decode_export(
            body,
            media_type=media_type,
            content_encoding=content_encoding,
            accept_json=self.accept_json,
            max_body_bytes=self.max_body_bytes,
        )
        self.handle(request)
        spans = sum(len(s.spans) for r in request.resource_spans for s in r.scope_spans)
        with self._lock:
            self.exports += 1
            self.spans += spans
        # an empty ExportTraceServiceResponse: full success leaves partial_success unset
        return b"{}" if media_type == JSON else b""

    def refuse(self, exc: ExportRefused) -> None:
        with self._lock:
            self._refusals[f"{exc.status} {exc.kind}"] += 1
        if self.log is not None:
            self.log(f"{exc.status}: {exc}")

    def start(self) -> TraceReceiver:
        self._thread = threading.Thread(target=self.serve_forever, name="otlp", daemon=True)
        self._thread.start()
        return self

    def serve_forever(self) -> None:
        self._server.serve_forever(_POLL_S)

    def close(self) -> None:
        """Stop listening; exports still arriving on open connections get 503."""
        self._closing = True
        if self._thread is not None:
            self._server.shutdown()
            self._thread.join()
        self._server.server_close()

    def __enter__(self) -> TraceReceiver:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()


class _Server(http.server.ThreadingHTTPServer):
    daemon_threads = True

    def server_bind(self) -> None:
        # HTTPServer's own looks up the host's name (socket.getfqdn): a reverse DNS query
        socketserver.TCPServer.server_bind(self)
        self.server_name, self.server_port = self.server_address[:2]  # type: ignore[assignment]


class _Server6(_Server):
    address_family = socket.AF_INET6


class _Handler(http.server.BaseHTTPRequestHandler):
    owner: TraceReceiver
    protocol_version = "HTTP/1.1"  # keep-alive: exporters reuse their connection

    def do_POST(self) -> None:
        media = self.headers.get("content-type", "").split(";", 1)[0].strip().lower()
        try:
            body = self._body()
            if self.path.split("?", 1)[0] != PATH:
                raise ExportRefused(404, "no route", f"no route {self.path}; traces go to {PATH}")
            answer = self.owner.receive(body, media, self.headers.get("content-encoding", ""))
        except ExportRefused as exc:
            self.owner.refuse(exc)
            self._send(exc.status, status_body(str(exc), media), media, close=exc.close)
            return
        self._send(200, answer, media)

    def do_GET(self) -> None:
        exc = ExportRefused(405, "method", f"{PATH} takes POST, not {self.command}", close=True)
        self.owner.refuse(exc)
        self._send(405, status_body(str(exc), PROTOBUF), PROTOBUF, close=True, allow="POST")

    do_PUT = do_DELETE = do_PATCH = do_GET  # noqa: N815

    def _body(self) -> bytes:
        limit = self.owner.max_body_bytes
        coding = self.headers.get("transfer-encoding")
        if coding is not None:
            if coding.strip().lower() != "chunked":
                # RFC 9112 section 6.1: no other framing can be read, so 400 and close
                raise ExportRefused(400, "framing", f"transfer coding {coding!r}", close=True)
            return self._chunked(limit)
        length = self.headers.get("content-length")
        if length is None:
            raise ExportRefused(411, "no length", "a body needs Content-Length", close=True)
        if not (length.isascii() and length.isdigit()):
            raise ExportRefused(400, "framing", f"Content-Length {length!r}", close=True)
        size = int(length)
        if size > limit:
            if size > limit + _DRAIN_BYTES:
                raise ExportRefused(413, "too large", f"body over {limit} bytes", close=True)
            while size > 0:
                dropped = len(self.rfile.read(min(size, 1 << 16)))
                if not dropped:
                    break
                size -= dropped
            raise ExportRefused(413, "too large", f"body over {limit} bytes", close=size > 0)
        body = self.rfile.read(size)
        if len(body) < size:
            raise ExportRefused(400, "framing", "body shorter than its length", close=True)
        return body

    def _chunked(self, limit: int) -> bytes:
        """A chunked body (RFC 9112 section 7.1), trailers dropped."""
        parts: list[bytes] = []
        size = 0
        while True:
            line = self.rfile.readline(1 << 10)
            try:
                chunk = int(line.split(b";", 1)[0].strip(), 16)
            except ValueError:
                chunk = -1
            if chunk < 0:
                raise ExportRefused(400, "framing", "bad chunk size", close=True)
            if chunk == 0:
                break
            size += chunk
            if size > limit + _DRAIN_BYTES:
                raise ExportRefused(413, "too large", f"body over {limit} bytes", close=True)
            data = self.rfile.read(chunk)
            if len(data) < chunk or self.rfile.readline(3).rstrip(b"\r\n"):
                raise ExportRefused(400, "framing", "chunk shorter than its size", close=True)
            if size <= limit:
                parts.append(data)
        while self.rfile.readline(1 << 16) not in (b"\r\n", b"\n", b""):
            pass
        if size > limit:
            raise ExportRefused(413, "too large", f"body over {limit} bytes")
        return b"".join(parts)

    def _send(
        self, status: int, body: bytes, media: str, *, close: bool = False, allow: str = ""
    ) -> None:
        self.send_response(status)
        self.send_header("content-type", JSON if media == JSON else PROTOBUF)
        self.send_header("content-length", str(len(body)))
        if allow:
            self.send_header("allow", allow)
        if close:
            self.send_header("connection", "close")
            self.close_connection = True
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:
        """Quiet: refusals go to the owner's ``log``, successes are not news."""
