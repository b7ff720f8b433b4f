"""A small OTLP/HTTP trace receiver that appends what it receives to a file (``inferwire
trace collect``): enough of an OpenTelemetry Collector to test and to look at one run.

It answers ``POST /v1/traces`` with a body of ``application/x-protobuf`` (the OTLP/HTTP
protobuf encoding, gzip allowed as ``Content-Encoding``), parses it as an
``ExportTraceServiceRequest`` (``opentelemetry-proto``) and appends it to the output file as one
line of OTLP JSON (:mod:`.otlp_json`: the Collector file exporter's format), flushed at once,
then answers 200 with an empty ``ExportTraceServiceResponse``. What it cannot take is answered
with the status OTLP/HTTP names, with a message in the body, and the receiver goes on: 400 for a
body that is not that message (or gzip that is not gzip), 404 for another path, 405 for another
method, 413 over :data:`MAX_BODY_BYTES`, 415 for another content type (OTLP JSON bodies
included: senders use protobuf by default). It listens on loopback unless told otherwise, in
threads (``http.server``), as a test's fixture or a command.
"""

from __future__ import annotations

import gzip
import http.server
import socket
import sys
import threading
import zlib
from pathlib import Path
from typing import Any, BinaryIO, Final

import orjson

from . import otlp_json

PATH: Final = "/v1/traces"
PROTOBUF: Final = "application/x-protobuf"
MAX_BODY_BYTES: Final = 32 << 20


class Collector:
    """Receives on ``host:port`` (0: any free port; :attr:`address` says which) and appends
    to ``out``. Use as a context manager, or :meth:`serve_forever` in the foreground."""

    def __init__(self, out: Path, host: str = "127.0.0.1", port: int = 0) -> None:
        from opentelemetry.proto.collector.trace.v1 import trace_service_pb2

        self._messages = trace_service_pb2
        self.out = out
        self._file: BinaryIO = out.open("ab")
        self._lock = threading.Lock()
        self.exports = 0
        """Requests appended."""
        self.spans = 0
        self.refused = 0
        """Requests answered with an error."""
        collector = self

        class Handler(_Handler):
            owner = collector

        server_class = _Server6 if ":" in host else http.server.ThreadingHTTPServer
        self._server = server_class((host, port), Handler)
        self._server.daemon_threads = True
        self.address: tuple[str, int] = self._server.server_address[:2]  # type: ignore[assignment]
        self._thread: threading.Thread | None = None

    @property
    def endpoint(self) -> str:
        host, port = self.address
        return f"http://{f'[{host}]' if ':' in host else host}:{port}{PATH}"

    def receive(self, body: bytes) -> bytes:
        """Append the export in ``body``; the response's body. Raises ``ValueError``."""
        request = self._messages.ExportTraceServiceRequest()
        try:
            request.ParseFromString(body)
        except Exception as exc:  # google.protobuf.message.DecodeError, or the upb's own
            raise ValueError(f"not an ExportTraceServiceRequest: {exc}") from None
        line = orjson.dumps(otlp_json.to_json(request)) + b"\n"
        spans = sum(len(s.spans) for r in request.resource_spans for s in r.scope_spans)
        with self._lock:
            self._file.write(line)
            self._file.flush()
            self.exports += 1
            self.spans += spans
        response: bytes = self._messages.ExportTraceServiceResponse().SerializeToString()
        return response

    def start(self) -> Collector:
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)
        self._thread.start()
        return self

    def serve_forever(self) -> None:
        self._server.serve_forever()

    def close(self) -> None:
        if self._thread is not None:
            self._server.shutdown()
            self._thread.join()
        self._server.server_close()
        with self._lock:
            self._file.close()

    def __enter__(self) -> Collector:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()


class _Server6(http.server.ThreadingHTTPServer):
    address_family = socket.AF_INET6


class _Handler(http.server.BaseHTTPRequestHandler):
    owner: Collector
    protocol_version = "HTTP/1.1"  # keep-alive: the OTLP exporter reuses its connection

    def do_POST(self) -> None:
        length = self.headers.get("content-length", "")
        if not length.isdigit():
            self._answer(411, "a body with Content-Length is needed", close=True)
            return
        size = int(length)
        if size > MAX_BODY_BYTES:
            self._answer(413, f"body over {MAX_BODY_BYTES} bytes", close=True)
            return
        body = self.rfile.read(size)
        if self.path.split("?", 1)[0] != PATH:
            self._answer(404, f"no route {self.path}; traces go to {PATH}")
            return
        media = self.headers.get("content-type", "").split(";", 1)[0].strip().lower()
        if media != PROTOBUF:
            self._answer(415, f"this receiver takes {PROTOBUF}, not {media or 'nothing'}")
            return
        try:
            if self.headers.get("content-encoding", "").strip().lower() == "gzip":
                body = gzip.decompress(body)
            answer = self.owner.receive(body)
        except (ValueError, OSError, EOFError, zlib.error) as exc:
            self._answer(400, str(exc))
            return
        self._answer(200, answer, content_type=PROTOBUF)

    def do_GET(self) -> None:
        self._answer(405, f"{PATH} takes POST")

    do_PUT = do_DELETE = do_PATCH = do_GET  # noqa: N815

    def _answer(
        self,
        status: int,
        body: bytes | str,
        *,
        content_type: str = "text/plain; charset=utf-8",
        close: bool = False,
    ) -> None:
        if status != 200:
            self.owner.refused += 1
            print(f"inferwire trace collect: {status}: {body!s}", file=sys.stderr, flush=True)
        data = body.encode() if isinstance(body, str) else body
        self.send_response(status)
        self.send_header("content-type", content_type)
        self.send_header("content-length", str(len(data)))
        if close:
            self.send_header("connection", "close")
            self.close_connection = True
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, format: str, *args: Any) -> None:
        """Quiet: errors are printed by :meth:`_answer`, successes are not news."""
