"""A small OTLP/HTTP trace receiver that appends what it receives to a file (``inferwire
trace collect``): enough of an OpenTelemetry Collector to test and to look at one run.

The receiving is :class:`inferwire.load.attribution.otlp_receiver.TraceReceiver`'s, the one
``inferwire load --otlp-listen`` uses: ``POST /v1/traces`` with a body of ``application/x-protobuf``
(the OTLP/HTTP protobuf encoding, gzip allowed as ``Content-Encoding``), parsed as an
``ExportTraceServiceRequest`` (``opentelemetry-proto``). This file appends each to the output file
as one line of OTLP JSON (:mod:`.otlp_json`: the Collector file exporter's format), flushed at once,
and answers 200 with an empty ``ExportTraceServiceResponse``. What it cannot take is answered with
the status OTLP/HTTP names, printed to stderr, and the receiver goes on: 400 for a body that is not
that message (or gzip that is not gzip), 404 for another path, 405 for another method, 413 over
:data:`MAX_BODY_BYTES`, 415 for another content type (OTLP JSON bodies included: senders use
protobuf by default). It listens on loopback unless told otherwise, in threads (``http.server``), as
a test's fixture or a command.
"""

from __future__ import annotations

import sys
import threading
from pathlib import Path
from typing import TYPE_CHECKING, BinaryIO, Final

import orjson

from inferwire.load.attribution.otlp_receiver import PATH, PROTOBUF, ExportRefused, TraceReceiver

from . import otlp_json

if TYPE_CHECKING:
    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
        ExportTraceServiceRequest,
    )

__all__ = ["MAX_BODY_BYTES", "PATH", "PROTOBUF", "Collector"]

MAX_BODY_BYTES: Final = 32 << 20


class Collector:
    """Receives on ``host:port`` (0: any free port; :attr:`address` says which) and appends
    to ``out``. Use as a context manager, or :meth:`serve_forever` in the foreground."""

    def __init__(self, out: Path, host: str = "127.0.0.1", port: int = 0) -> None:
        self.out = out
        self._lock = threading.Lock()
        self._receiver = TraceReceiver(
            self._append,
            host,
            port,
            accept_json=False,
            max_body_bytes=MAX_BODY_BYTES,
            log=_print_refusal,
        )
        try:
            self._file: BinaryIO = out.open("ab")
        except BaseException:
            self._receiver.close()
            raise
        self.address: tuple[str, int] = self._receiver.address

    @property
    def endpoint(self) -> str:
        return self._receiver.endpoint

    @property
    def exports(self) -> int:
        """Requests appended."""
        return self._receiver.exports

    @property
    def spans(self) -> int:
        return self._receiver.spans

    @property
    def refused(self) -> int:
        """Requests answered with an error."""
        return self._receiver.refused

    def _append(self, request: ExportTraceServiceRequest) -> None:
        line = orjson.dumps(otlp_json.to_json(request)) + b"\n"
        with self._lock:
            if self._file.closed:
                raise ExportRefused(503, "closing", f"{self.out} is closed")
            self._file.write(line)
            self._file.flush()

    def start(self) -> Collector:
        self._receiver.start()
        return self

    def serve_forever(self) -> None:
        self._receiver.serve_forever()

    def close(self) -> None:
        self._receiver.close()
        with self._lock:
            self._file.close()

    def __enter__(self) -> Collector:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()


def _print_refusal(message: str) -> None:
    print(f"inferwire trace collect: {message}", file=sys.stderr, flush=True)
