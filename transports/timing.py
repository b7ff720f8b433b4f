"""Per-chunk timestamps of a stream, server side and client side, for the per-stage split.

A client that passes a :class:`StreamTiming` to ``generate`` asks the server to record, for
each chunk, when the service produced it, when the codec had encoded it and when the write
returned; the server sends the three arrays after the stream as a trailer (HTTP/1.1 chunked
trailer, HTTP/2 trailing HEADERS, gRPC trailing metadata, a block after the stream on tcp),
so the chunks' own bytes are those of an untimed stream. The client records when each chunk's
bytes arrived and when they were decoded.

All stamps are ``time.monotonic_ns()``: CLOCK_MONOTONIC, one clock for every process of a
host, so server and client stamps compare directly on one machine. Across two hosts they do
not: there only the per-side stages (serialize, parse) are meaningful, and the network share
must come from round-trip time (e.g. half the RTT measured by a ping on the same connection),
not from subtracting stamps of two clocks.

**Causal order.** A network stage runs from the sender's stamp taken *before* its write call
(the client's :attr:`StreamTiming.request_write_ns`, the server's "encoded") to the
receiver's stamp taken *after* its read returned (the server's "received", the client's
``received_ns``). The bytes cannot arrive before the write began, nor be read before they
arrived, so on one host a network stage is never below zero, and the stages between
consecutive stamps add up to the whole. The write call is part of the network stage: on
loopback the kernel hands the bytes to the reader inside the writer's call, and the woken reader
may run before the writer is back, so a stamp taken when the write *returned* is not in causal
order with the reader's (the ``write`` of :meth:`StreamTiming.stages_ns` is kept, as the
write call's own time, but is no stage of its own).
"""

from __future__ import annotations

import base64
import binascii
import time
from dataclasses import dataclass, field
from typing import Final

import numpy as np

from .errors import ProtocolError

TRAILER: Final = "x-inferwire-timing"
"""Trailer name; its value is base64 of little-endian uint64 triples (gRPC: the ``-bin`` form
carries the raw bytes)."""
MAX_CHUNKS: Final = 1 << 22
REQUEST_STAGES: Final = (
    "client serialize",
    "client dispatch",
    "network to server",
    "server parse",
    "service",
    "server serialize",
    "network back",
    "client parse",
)
"""The stages of :meth:`StreamTiming.request_stages_ns`, in the order a request meets them."""

TRACEPARENT: Final = "traceparent"
"""The W3C Trace Context header (and gRPC metadata key, and tcp request field)."""

now_ns = time.monotonic_ns


def asks_server(timing: StreamTiming | None) -> bool:
    """Whether a client's request asks the server for its stamps."""
    return timing is not None and timing.server_stamps


@dataclass(slots=True)
class StreamTiming:
    """Filled in by ``generate``: ``server`` rows are (produced, encoded, written) per chunk,
    client lists hold when each chunk's bytes were received and when it was decoded."""

    server: np.ndarray = field(default_factory=lambda: np.zeros((0, 3), dtype=np.uint64))
    received_ns: list[int] = field(default_factory=list)
    decoded_ns: list[int] = field(default_factory=list)
    request_start_ns: int = 0
    """Before the client encoded its request."""
    request_sent_ns: int = 0
    """After the client wrote its request."""
    server_request_ns: tuple[int, int] = (0, 0)
    """When the server had the whole request, and when it had parsed it."""
    request_encoded_ns: int = 0
    """After the client encoded its request, before writing it."""
    request_write_ns: int = 0
    """Just before the client's write call of its request, its connection in hand and the
    protocol's head built (gRPC: before the call is started, as grpc frames and writes in the
    background): network to server starts here (0: a client that does not stamp it;
    :attr:`request_encoded_ns` stands in)."""
    traceparent: str = ""
    """A W3C trace context to send with the request (``--trace``, :mod:`.tracing`)."""
    server_stamps: bool = True
    """Ask the server for its per-chunk stamps (the trailer); False: the client's only."""
    acquired_ns: int = 0
    """When the client had a connection for the request (a pool's wait, and a connect, before)."""
    connect_ns: int = 0
    """How long opening that connection took (TCP and TLS), when the request opened one."""
    head_ns: int = 0
    """When the response's head (status and headers) had arrived, where the protocol has one."""

    def decoded(self, count: int, received_ns: int) -> None:
        """``count`` chunks, from bytes received at ``received_ns``, are decoded now."""
        decoded_ns = now_ns()
        self.received_ns += [received_ns] * count
        self.decoded_ns += [decoded_ns] * count

    def set_server(self, rows: np.ndarray) -> None:
        """The trailer's rows: the request's (received, parsed, 0), then one per chunk."""
        if len(rows) == 0:
            raise ProtocolError("timing trailer without the request's stamps")
        self.server_request_ns = (int(rows[0][0]), int(rows[0][1]))
        self.server = rows[1:]

    def request_stages_ns(self) -> dict[str, int]:
        """One request, from the client's encode to its first chunk decoded, between stamps in
        causal order (see the module docstring): ``client serialize`` (start to encoded),
        ``client dispatch`` (to just before the write call: the stream's reader set up, a
        connection taken, with any wait for it, the protocol's request head built),
        ``network to server`` (the write call to the server having read the whole request),
        ``server parse``, ``service`` (parsed to the first chunk
        produced: prefill, on the simulated service), ``server serialize``, ``network back``
        (the server's write call to the client's read returned), ``client parse``. None is
        below zero on one host. Empty if a stamp is missing."""
        received, parsed = self.server_request_ns
        encoded = self.request_encoded_ns
        if not (self.request_start_ns and encoded and received and len(self.server)):
            return {}
        if not self.decoded_ns:  # no chunk came
            return {}
        produced, server_encoded, _ = (int(v) for v in self.server[0])
        stamps = (
            self.request_start_ns,
            encoded,
            self.request_write_ns or encoded,
            received,
            parsed,
            produced,
            server_encoded,
            self.received_ns[0],
            self.decoded_ns[0],
        )
        return {name: stamps[i + 1] - stamps[i] for i, name in enumerate(REQUEST_STAGES)}

    def stages_ns(self) -> dict[str, np.ndarray]:
        """Per chunk: ``serialize`` (server encode), ``network`` (encoded, before the server's
        write call, to the client's read returned: the write call, the wire, the reader's
        wake-up; same host only), ``parse`` (client decode), ``end_to_end`` (produced to
        decoded: the three add up to it), and ``write`` (the server's write call, until it
        returned: inside ``network``, no stage of its own)."""
        count = min(len(self.server), len(self.received_ns), len(self.decoded_ns))
        if count == 0:
            return {}
        server = self.server[:count].astype(np.int64)
        received = np.asarray(self.received_ns[:count], dtype=np.int64)
        decoded = np.asarray(self.decoded_ns[:count], dtype=np.int64)
        return {
            "serialize": server[:, 1] - server[:, 0],
            "network": received - server[:, 1],
            "parse": decoded - received,
            "end_to_end": decoded - server[:, 0],
            "write": server[:, 2] - server[:, 1],
        }


class ServerStamps:
    """What a server records while it sends one timed stream: the sender calls
    :meth:`encoded` when a chunk's bytes are ready and :meth:`written` once they are written."""

    __slots__ = ("_pending", "request_ns", "rows")

    def __init__(self, received_ns: int = 0) -> None:
        self.rows: list[tuple[int, int, int]] = []
        self._pending: list[tuple[int, int]] = []
        self.request_ns = (received_ns, 0)

    def parsed(self) -> None:
        """The request was parsed (now); ``received_ns`` was when it had arrived whole."""
        self.request_ns = (self.request_ns[0] or now_ns(), now_ns())

    def encoded(self, produced_ns: int, encoded_ns: int) -> None:
        self._pending.append((produced_ns, encoded_ns))

    def written(self) -> None:
        """The bytes of every chunk :meth:`encoded` since the last call were written (a no-op
        when none was, as for the end marker)."""
        if self._pending:
            written = now_ns()
            room = MAX_CHUNKS - len(self.rows)
            self.rows += [(p, e, written) for p, e in self._pending[:room]]
            self._pending = []

    def pack(self) -> bytes:
        request = (self.request_ns[0], self.request_ns[1], 0)
        return np.asarray([request, *self.rows], dtype="<u8").reshape(-1, 3).tobytes()

    def pack_text(self) -> str:
        return base64.b64encode(self.pack()).decode("ascii")


def unpack(data: bytes) -> np.ndarray:
    if len(data) % 24 or len(data) > MAX_CHUNKS * 24:
        raise ProtocolError(f"timing trailer of {len(data)} bytes is not whole triples")
    return np.frombuffer(data, dtype="<u8").reshape(-1, 3).astype(np.uint64)


def unpack_text(text: str) -> np.ndarray:
    try:
        return unpack(base64.b64decode(text, validate=True))
    except (binascii.Error, ValueError) as exc:
        raise ProtocolError(f"bad timing trailer: {exc}") from exc
