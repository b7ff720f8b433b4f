"""The HTTP/2 server against hostile peers: what h2 leaves to the application.

Each test runs an :class:`~inferwire.transports.Http2Server` in this process on 127.0.0.1 and
attacks it from a raw socket, building frames by hand (``hyperframe``) or with h2's client
state machine where a well-behaved side is wanted. The properties, for every attack: the server
ends the attacking connection (a GOAWAY with the expected code where it can still leave), its
memory and write buffer stay bounded, and it goes on serving a new, well-behaved client.

The server-level attacks run once on asyncio's loop and once on uvloop (``event_loop_kind``,
tests/conftest.py), whose transports buffer and pause writes their own way; the frame floods
and malformed headers, judged by the sans-IO frame guard, run on asyncio's alone.

Bounds are generous (a busy 2-core machine): a bound that fires is a hang.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import struct
import time
import tracemalloc
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field

import h2.config
import h2.connection
import h2.errors
import h2.events
import h2.exceptions
import orjson
import pytest
from hyperframe.frame import (
    ContinuationFrame,
    DataFrame,
    Frame,
    HeadersFrame,
    PingFrame,
    RstStreamFrame,
    SettingsFrame,
    WindowUpdateFrame,
)

import inferwire.transports as it
from inferwire._runtime import loops
from inferwire.transports import errors as it_errors
from inferwire.transports import h2guard, http2
from inferwire.transports.http2.server import ServerProtocol
from tests.helpers.faults import MESSAGES, Running, assert_serves, serving, wait_until

PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
CLOSED_S = 20.0
"""Bound on a connection the server should end at once."""
Codes = h2.errors.ErrorCodes


# -- a raw peer ----------------------------------------------------------------------------


def serialize(*frames: Frame) -> bytes:
    return b"".join(frame.serialize() for frame in frames)


def hpack_int(value: int, prefix_bits: int, first: int) -> bytes:
    """An HPACK integer (RFC 7541, 5.1) whose first byte carries the flag bits ``first``."""
    limit = (1 << prefix_bits) - 1
    if value < limit:
        return bytes([first | value])
    out = [first | limit]
    value -= limit
    while value >= 128:
        out.append(value & 0x7F | 0x80)
        value >>= 7
    return bytes([*out, value])


def hpack_literal(name: bytes, value: bytes, *, index: bool) -> bytes:
    """A literal field with a new name (no Huffman): added to the dynamic table if ``index``."""
    first = 0x40 if index else 0x00
    return bytes([first]) + hpack_int(len(name), 7, 0) + name + hpack_int(len(value), 7, 0) + value


def request_block(method: str, path: str, *extra: bytes) -> bytes:
    """A request's header block, nothing added to the dynamic table."""
    block = bytes([0x82 if method == "GET" else 0x83, 0x86])  # :method, :scheme http
    block += hpack_int(4, 4, 0x00) + hpack_int(len(path), 7, 0) + path.encode()  # :path
    block += hpack_int(1, 4, 0x00) + b"\x01x"  # :authority x
    return block + b"".join(extra)


def headers_frame(stream_id: int, block: bytes, flags: Sequence[str]) -> HeadersFrame:
    return HeadersFrame(stream_id, block, flags=flags)


def frames_in(data: bytes) -> list[tuple[int, int, bytes]]:
    """(type, stream id, payload) of each whole frame in ``data``, a server's bytes from its
    start."""
    frames = []
    offset = 0
    while offset + 9 <= len(data):
        length = int.from_bytes(data[offset : offset + 3], "big")
        stream_id = int.from_bytes(data[offset + 5 : offset + 9], "big") & 0x7FFFFFFF
        frames.append((data[offset + 3], stream_id, data[offset + 9 : offset + 9 + length]))
        offset += 9 + length
    return frames


def goaway_codes(data: bytes) -> list[int]:
    """The error codes of the GOAWAY frames in ``data``."""
    return [
        struct.unpack(">L", payload[4:8])[0]
        for frame_type, _, payload in frames_in(data)
        if frame_type == 0x7 and len(payload) >= 8
    ]


def reset_codes(data: bytes) -> dict[int, int]:
    """Stream id to the error code of its RST_STREAM, for the RST_STREAM frames in ``data``."""
    return {
        stream_id: struct.unpack(">L", payload[:4])[0]
        for frame_type, stream_id, payload in frames_in(data)
        if frame_type == 0x3 and len(payload) == 4
    }


@dataclass
class Peer:
    """One raw connection to the server, and the server's protocol object for it."""

    reader: asyncio.StreamReader
    writer: asyncio.StreamWriter
    protocol: ServerProtocol
    received: bytearray = field(default_factory=bytearray)

    async def send(self, data: bytes) -> bool:
        """False once the server has closed the connection."""
        try:
            self.writer.write(data)
            await self.writer.drain()
        except (ConnectionError, OSError):
            return False
        return True

    async def read_until(self, wanted: bytes, bound_s: float = CLOSED_S) -> bytes:
        async with asyncio.timeout(bound_s):
            while wanted not in self.received:
                chunk = await self.reader.read(1 << 16)
                assert chunk, f"closed before {wanted!r} came"
                self.received += chunk
        return bytes(self.received)

    async def read_until_closed(self, bound_s: float = CLOSED_S) -> bytes:
        try:
            async with asyncio.timeout(bound_s):
                while chunk := await self.reader.read(1 << 16):
                    self.received += chunk
        except TimeoutError as exc:  # first: TimeoutError is an OSError
            raise AssertionError(f"the server left the connection open for {bound_s} s") from exc
        except (ConnectionError, OSError):
            pass  # dropped (RST) rather than closed: also closed
        return bytes(self.received)


@contextlib.asynccontextmanager
async def raw_peer(srv: Running, *, reads: bool = True) -> AsyncIterator[Peer]:
    """A connection that has sent the preface, an empty SETTINGS and the ACK of the server's.
    Without ``reads``, the peer hardly reads: a small receive buffer, and asyncio's reader
    stops reading after 2 KiB."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    if not reads:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.setblocking(False)
    protocols = _server(srv).protocols
    before = set(protocols)
    await asyncio.get_running_loop().sock_connect(sock, (srv.host, srv.port))
    reader, writer = await asyncio.open_connection(sock=sock, limit=1024 if not reads else 1 << 16)
    try:
        ack = SettingsFrame(0)
        ack.flags.add("ACK")
        writer.write(PREFACE + serialize(SettingsFrame(0), ack))
        await writer.drain()
        assert await wait_until(lambda: bool(protocols - before), timeout_s=CLOSED_S)
        (protocol,) = protocols - before
        yield Peer(reader, writer, protocol)
    finally:
        writer.close()
        with contextlib.suppress(OSError):
            await writer.wait_closed()


def _server(srv: Running) -> http2.Http2Server:
    assert isinstance(srv.server, http2.Http2Server)
    return srv.server


async def assert_freed(srv: Running) -> None:
    """No connection and no stream handler of the server is left."""
    server = _server(srv)
    assert await wait_until(lambda: not server.protocols, timeout_s=CLOSED_S), "connection left"
    assert await wait_until(lambda: srv.service.active_streams == 0, timeout_s=CLOSED_S)


def _flood(kind: str, count: int) -> bytes:
    if kind == "ping":
        return serialize(*(PingFrame(0, opaque_data=struct.pack(">Q", n)) for n in range(count)))
    if kind == "settings":
        return SettingsFrame(0).serialize() * count
    if kind == "empty-data":
        return DataFrame(1, b"").serialize() * count
    assert kind == "window-update-0"
    return WindowUpdateFrame(0, window_increment=0).serialize() * count


# -- 0. the frame guard, sans-IO ----------------------------------------------------------------


def _guard() -> h2guard.FrameGuard:
    return h2guard.FrameGuard(
        max_frame_bytes=16_384, max_header_block_bytes=32_768, max_idle_frames=100
    )


_BLOCK_PIECE = b"x" * 16_000
GUARD_CASES = {
    "requests": (
        headers_frame(1, request_block("GET", "/"), ["END_HEADERS", "END_STREAM"]).serialize()
        * 300,
        None,
    ),
    "16 MiB header": (
        ((1 << 24) - 1).to_bytes(3, "big") + b"\0\0\0\0\0\1",
        it_errors.PeerFrameTooLargeError,
    ),
    "max frame": (DataFrame(1, b"x" * 16_384).serialize(), None),
    "max frame + 1": (DataFrame(1, b"x" * 16_385).serialize(), it_errors.PeerFrameTooLargeError),
    "header block over the limit": (
        serialize(
            HeadersFrame(1, _BLOCK_PIECE),
            ContinuationFrame(1, _BLOCK_PIECE),
            ContinuationFrame(1, _BLOCK_PIECE),
        ),
        it_errors.HeaderBlockTooLargeError,
    ),
    "pings": (_flood("ping", 100), None),
    "pings + 1": (_flood("ping", 101), it_errors.IdleFloodError),
    "empty DATA": (_flood("empty-data", 101), it_errors.IdleFloodError),
    "pings with progress": (
        (_flood("ping", 99) + DataFrame(1, b"x").serialize()) * 5,
        None,
    ),
    "window updates": (WindowUpdateFrame(0, window_increment=1).serialize() * 500, None),
}


@pytest.mark.parametrize("split", [None, 1, 7])
@pytest.mark.parametrize(("data", "error"), GUARD_CASES.values(), ids=GUARD_CASES.keys())
def test_frame_guard_verdict_does_not_depend_on_how_bytes_arrive(
    data: bytes, error: type[it_errors.PeerLimitError] | None, split: int | None
) -> None:
    guard = _guard()
    pieces = [PREFACE + data] if split is None else [PREFACE[:5], PREFACE[5:]]
    if split is not None:
        pieces += [data[i : i + split] for i in range(0, len(data), split)]
    raised = None
    for piece in pieces:
        try:
            guard.feed(piece)
        except it_errors.PeerLimitError as exc:
            raised = exc
            break
    if error is None:
        assert raised is None, repr(raised)
    else:
        assert type(raised) is error, repr(raised)


# -- 1. Rapid Reset (CVE-2023-44487) ------------------------------------------------------


def test_http2_rapid_reset_is_bounded_and_calmed(event_loop_kind: str) -> None:
    """10,000 requests each reset at once: handlers of reset streams are cancelled, never more
    than MAX_HANDLERS run at once, and the server sends GOAWAY(ENHANCE_YOUR_CALM)."""
    pairs = 10_000
    body = orjson.dumps({"workload": "stream-16", "messages": MESSAGES, "stream": True})
    content_type = hpack_literal(b"content-type", b"application/json", index=False)

    async def run() -> None:
        # a long prefill: a handler that is not cancelled stays running
        async with serving("http2", prefill_s=60.0) as srv, raw_peer(srv) as peer:
            started = time.monotonic()
            batch = bytearray()
            for number in range(pairs):
                stream_id = 2 * number + 1
                batch += serialize(
                    headers_frame(
                        stream_id,
                        request_block("POST", "/v1/chat/completions", content_type),
                        ["END_HEADERS"],
                    ),
                    DataFrame(stream_id, body, flags=["END_STREAM"]),
                    RstStreamFrame(stream_id, error_code=Codes.CANCEL),
                )
                if number % 200 == 199:
                    if not await peer.send(bytes(batch)):
                        break
                    batch.clear()
            else:
                await peer.send(bytes(batch))
            data = await peer.read_until_closed()
            elapsed_s = time.monotonic() - started
            assert peer.protocol.shut_code == Codes.ENHANCE_YOUR_CALM
            assert goaway_codes(data) == [Codes.ENHANCE_YOUR_CALM]
            assert 1 <= _server(srv).handlers_peak <= http2.MAX_HANDLERS
            # the budget (a burst, then a rate), and GOAWAY at once after it
            assert (
                peer.protocol.resets <= http2.RESET_BURST + elapsed_s * http2.RESET_RATE_PER_S + 1
            )
            await assert_freed(srv)
            await assert_serves("http2", srv.address, stream=False)  # prefill: unary only

    loops.run(run(), event_loop_kind)


_STREAM_BODY = orjson.dumps({"workload": "stream-16", "messages": MESSAGES, "stream": True})
_CONTENT_TYPE = hpack_literal(b"content-type", b"application/json", index=False)


def _stream_request(stream_id: int) -> bytes:
    """A whole streaming request: HEADERS, then its JSON body with END_STREAM."""
    block = request_block("POST", "/v1/chat/completions", _CONTENT_TYPE)
    return serialize(
        headers_frame(stream_id, block, ["END_HEADERS"]),
        DataFrame(stream_id, _STREAM_BODY, flags=["END_STREAM"]),
    )


def _resets(stream_ids: Sequence[int]) -> bytes:
    return serialize(*(RstStreamFrame(sid, error_code=Codes.CANCEL) for sid in stream_ids))


def _client_ids(first: int, count: int) -> list[int]:
    """The ids of the client's streams number ``first`` to ``first + count - 1``."""
    return [2 * n + 1 for n in range(first, first + count)]


@contextlib.asynccontextmanager
async def _limit_open(srv: Running) -> AsyncIterator[Peer]:
    """A raw peer with MAX_CONCURRENT_STREAMS streams open whose handlers all run (a long
    prefill): the stream limit is reached."""
    limit = http2.MAX_CONCURRENT_STREAMS
    async with raw_peer(srv) as peer:
        await peer.send(b"".join(_stream_request(sid) for sid in _client_ids(0, limit)))
        assert await wait_until(lambda: srv.service.active_streams == limit)
        yield peer


def test_http2_reset_streams_leave_the_stream_count_at_once(event_loop_kind: str) -> None:
    """RFC 9113, 5.1.2: open and half-closed streams count, closed ones do not. With the limit
    reached, streams the peer resets free their places at once, although their handlers take a
    moment to end: new streams in that moment are served, not refused."""
    limit = http2.MAX_CONCURRENT_STREAMS

    async def run() -> None:
        async with serving("http2", prefill_s=60.0) as srv, _limit_open(srv) as peer:
            reset, new = _client_ids(0, 5), _client_ids(limit, 5)
            # One call, as one read of the socket would make it (a write may reach the server
            # in pieces): no reset stream's handler can have ended before the new streams come.
            peer.protocol.data_received(_resets(reset) + b"".join(map(_stream_request, new)))
            assert _server(srv).handlers_peak == limit + 5
            assert await wait_until(lambda: srv.service.active_streams == limit)
            assert not set(reset_codes(bytes(peer.received))) & set(new)
            assert (peer.protocol.refusals, peer.protocol.resets) == (0, 5)
            assert not peer.protocol.transport.is_closing()

    loops.run(run(), event_loop_kind)


def test_http2_handlers_past_the_bound_are_refused_outside_the_reset_budget(
    event_loop_kind: str,
) -> None:
    """The Rapid Reset bound: at most MAX_HANDLERS handlers run, those of reset streams still
    ending included. A stream past it is refused (RST_STREAM(REFUSED_STREAM): not processed,
    safe to retry); the refusal is not the peer's reset and does not spend its budget; once
    the handlers have ended, new streams are served again."""
    limit = http2.MAX_CONCURRENT_STREAMS

    async def run() -> None:
        async with serving("http2", prefill_s=60.0) as srv, _limit_open(srv) as peer:
            replacing, past = _client_ids(limit, limit), _client_ids(2 * limit, 5)
            # In one call (see above): every open stream reset and replaced, so MAX_HANDLERS
            # handlers run (half of them ending); then 5 of the new ones reset and 5 more opened,
            # within the stream limit but past the handlers' bound.
            peer.protocol.data_received(
                _resets(_client_ids(0, limit))
                + b"".join(map(_stream_request, replacing))
                + _resets(replacing[:5])
                + b"".join(map(_stream_request, past))
            )
            await peer.read_until(serialize(RstStreamFrame(past[-1], error_code=7)))
            refused = reset_codes(bytes(peer.received))
            assert {sid: refused.get(sid) for sid in past} == dict.fromkeys(
                past, Codes.REFUSED_STREAM
            )
            assert _server(srv).handlers_peak == http2.MAX_HANDLERS
            assert (peer.protocol.refusals, peer.protocol.resets) == (5, limit + 5)
            assert await wait_until(lambda: srv.service.active_streams == limit - 5)
            # the reset streams' handlers have ended: a new stream is served
            await peer.send(_stream_request(_client_ids(2 * limit + 5, 1)[0]))
            assert await wait_until(lambda: srv.service.active_streams == limit - 4)
            assert not peer.protocol.transport.is_closing()

    loops.run(run(), event_loop_kind)


def test_http2_a_stream_past_the_advertised_limit_ends_the_connection(event_loop_kind: str) -> None:
    """A peer that opens MAX_CONCURRENT_STREAMS + 1 streams breaks RFC 9113, 5.1.2: h2 takes
    it as a connection error (GOAWAY(PROTOCOL_ERROR)), as section 5.4.1 allows; others are
    served."""
    limit = http2.MAX_CONCURRENT_STREAMS

    async def run() -> None:
        async with serving("http2", prefill_s=60.0) as srv, _limit_open(srv) as peer:
            await peer.send(_stream_request(_client_ids(limit, 1)[0]))
            data = await peer.read_until_closed()
            assert goaway_codes(data) == [Codes.PROTOCOL_ERROR]
            await assert_freed(srv)
            await assert_serves("http2", srv.address, stream=False)

    loops.run(run(), event_loop_kind)


# -- 2. floods from a peer that does not read -----------------------------------------------


@pytest.mark.parametrize(
    ("kind", "code"),
    [
        ("ping", Codes.ENHANCE_YOUR_CALM),
        ("settings", Codes.ENHANCE_YOUR_CALM),
        ("empty-data", Codes.ENHANCE_YOUR_CALM),
        # h2 takes WINDOW_UPDATE(0) as a protocol error at once (RFC 9113, 6.9)
        ("window-update-0", Codes.PROTOCOL_ERROR),
    ],
)
def test_http2_flood_from_a_peer_that_does_not_read(kind: str, code: Codes) -> None:
    count = 3 * http2.MAX_IDLE_FRAMES

    async def run() -> None:
        async with serving("http2") as srv, raw_peer(srv, reads=False) as peer:
            # an open request for the empty DATA frames to arrive on
            opening = request_block("POST", "/v2/models/x/infer")
            await peer.send(headers_frame(1, opening, ["END_HEADERS"]).serialize())
            flood = _flood(kind, count)
            for start in range(0, len(flood), 1 << 16):
                if not await peer.send(flood[start : start + (1 << 16)]):
                    break
            assert await wait_until(lambda: peer.protocol.shut_code is not None, timeout_s=CLOSED_S)
            assert peer.protocol.shut_code == code
            # others are served while this peer still has not read
            await assert_serves("http2", srv.address, stream=False)
            data = await peer.read_until_closed()
            assert set(goaway_codes(data)) <= {code}  # the GOAWAY, unless it had to be dropped
            assert _server(srv).outbound_peak <= http2.CONTROL_BYTES_CAP + (1 << 19)
            await assert_freed(srv)

    asyncio.run(run())


def test_http2_control_frames_to_a_peer_that_does_not_read_are_capped(event_loop_kind: str) -> None:
    """PINGs with a request now and then (so never idle for long): their ACKs pile up behind
    a peer that does not read until CONTROL_BYTES_CAP, and the connection is dropped."""
    pings_per_request = http2.MAX_IDLE_FRAMES // 2
    pings = _flood("ping", pings_per_request)

    async def run() -> None:
        async with serving("http2") as srv, raw_peer(srv, reads=False) as peer:
            # a small send buffer on the server's side, so its write buffer fills quickly
            sock = peer.protocol.transport.get_extra_info("socket")
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4096)
            stream_id = 1
            for _ in range(200):
                block = request_block("GET", "/v2/health/ready")
                request = headers_frame(stream_id, block, ["END_HEADERS", "END_STREAM"])
                stream_id += 2
                if not await peer.send(request.serialize() + pings):
                    break
                if peer.protocol.shut_code is not None:
                    break
            assert await wait_until(lambda: peer.protocol.shut_code is not None, timeout_s=CLOSED_S)
            assert peer.protocol.shut_code == Codes.ENHANCE_YOUR_CALM
            assert peer.protocol.control_bytes_unread > http2.CONTROL_BYTES_CAP
            assert _server(srv).outbound_peak <= http2.CONTROL_BYTES_CAP + (1 << 19)
            await assert_serves("http2", srv.address, stream=False)
            await peer.read_until_closed()
            await assert_freed(srv)

    loops.run(run(), event_loop_kind)


# -- 3. a lying frame length -----------------------------------------------------------------


@pytest.mark.parametrize("frame_type", [0x0, 0x1])  # DATA, HEADERS
def test_http2_frame_header_declaring_16_mib_closes_at_once(frame_type: int) -> None:
    """h2 would buffer the whole frame before checking its length; the server refuses it
    from the 9 bytes of its header, with GOAWAY(FRAME_SIZE_ERROR)."""
    length = (1 << 24) - 1
    header = length.to_bytes(3, "big") + bytes([frame_type, 0x0]) + (1).to_bytes(4, "big")

    async def run() -> None:
        async with serving("http2") as srv, raw_peer(srv) as peer:
            await peer.send(header)
            data = await peer.read_until_closed(bound_s=10.0)
            assert goaway_codes(data) == [Codes.FRAME_SIZE_ERROR]
            await assert_freed(srv)
            await assert_serves("http2", srv.address, stream=False)

    asyncio.run(run())


# -- 4. CONTINUATION floods and HPACK bombs ---------------------------------------------------


@pytest.mark.parametrize(
    ("piece", "code"),
    [
        # full CONTINUATION frames: refused once the block passes MAX_HEADER_BLOCK_BYTES
        (16_000, Codes.ENHANCE_YOUR_CALM),
        # empty ones: h2 allows 64 CONTINUATION frames to a block
        (0, Codes.PROTOCOL_ERROR),
    ],
)
def test_http2_continuation_flood(piece: int, code: Codes) -> None:
    frames = 1000
    # literal header bytes that never end: the block is never complete
    filler = hpack_literal(b"x-filler", b"a" * piece, index=False)[:piece]

    async def run() -> None:
        async with serving("http2") as srv, raw_peer(srv) as peer:
            tracemalloc.start()
            try:
                start = headers_frame(1, request_block("GET", "/v2/health/ready"), [])
                await peer.send(start.serialize())
                for _ in range(frames):
                    if not await peer.send(ContinuationFrame(1, filler).serialize()):
                        break
                data = await peer.read_until_closed(bound_s=10.0)
                _, peak = tracemalloc.get_traced_memory()
            finally:
                tracemalloc.stop()
            assert goaway_codes(data) == [code]
            assert peak < 8 << 20, f"{peak} bytes at the peak"  # 16 MB sent when unbounded
            await assert_freed(srv)
            await assert_serves("http2", srv.address, stream=False)

    asyncio.run(run())


def test_http2_hpack_bomb_is_refused_with_bounded_memory(event_loop_kind: str) -> None:
    """One 4,000-byte header put in the dynamic table, then a block that names it 10,000
    times: 10 KB on the wire, 40 MB decoded. Refused (GOAWAY(ENHANCE_YOUR_CALM)) as the header
    list passes MAX_HEADER_LIST_SIZE, with memory to match."""
    refs = 10_000

    async def run() -> None:
        async with serving("http2") as srv, raw_peer(srv) as peer:
            bomb = hpack_literal(b"x-bomb", b"a" * 4000, index=True)  # dynamic index 62
            first = request_block("GET", "/v2", bomb)  # server metadata: a body to look for
            await peer.send(headers_frame(1, first, ["END_HEADERS", "END_STREAM"]).serialize())
            await peer.read_until(b"inferwire")  # answered; the header is in the dynamic table
            tracemalloc.start()
            try:
                block = request_block("GET", "/v2/health/ready", bytes([0x80 | 62]) * refs)
                await peer.send(headers_frame(3, block, ["END_HEADERS", "END_STREAM"]).serialize())
                data = await peer.read_until_closed(bound_s=10.0)
                _, peak = tracemalloc.get_traced_memory()
            finally:
                tracemalloc.stop()
            assert goaway_codes(data) == [Codes.ENHANCE_YOUR_CALM]
            assert b"inferwire" in data  # the first request, with its header once, was answered
            assert peak < 8 << 20, f"{peak} bytes at the peak"
            await assert_freed(srv)
            await assert_serves("http2", srv.address, stream=False)

    loops.run(run(), event_loop_kind)


# -- 5. a reader that stops ------------------------------------------------------------------


@dataclass
class _H2Client:
    """A well-behaved client (h2's state machine) that can decline to open a stream's window."""

    reader: asyncio.StreamReader
    writer: asyncio.StreamWriter
    conn: h2.connection.H2Connection
    withheld: set[int] = field(default_factory=set)
    """Streams whose data is never acknowledged (their window is never opened again)."""
    received: dict[int, int] = field(default_factory=dict)
    ended: set[int] = field(default_factory=set)
    reset: dict[int, int] = field(default_factory=dict)
    terminated: bool = False

    def flush(self) -> None:
        self.writer.write(self.conn.data_to_send())

    def request(self, workload: str) -> int:
        stream_id = self.conn.get_next_available_stream_id()
        body = orjson.dumps({"workload": workload, "messages": MESSAGES, "stream": True})
        self.conn.send_headers(
            stream_id,
            [
                (":method", "POST"),
                (":scheme", "http"),
                (":authority", "x"),
                (":path", "/v1/chat/completions"),
                ("content-type", "application/json"),
            ],
        )
        self.conn.send_data(stream_id, body, end_stream=True)
        self.flush()
        return stream_id

    async def pump(self) -> None:
        while data := await self.reader.read(1 << 16):
            for event in self.conn.receive_data(data):
                if isinstance(event, h2.events.DataReceived):
                    sid = event.stream_id
                    self.received[sid] = self.received.get(sid, 0) + len(event.data or b"")
                    if sid not in self.withheld:
                        self.conn.acknowledge_received_data(event.flow_controlled_length, sid)
                elif isinstance(event, h2.events.StreamEnded):
                    self.ended.add(event.stream_id)
                elif isinstance(event, h2.events.StreamReset):
                    self.reset[event.stream_id] = event.error_code
                elif isinstance(event, h2.events.ConnectionTerminated):
                    self.terminated = True
            self.flush()


def test_http2_stalled_reader_holds_only_its_window_and_times_out(event_loop_kind: str) -> None:
    """A stream whose reader never opens its window again stalls alone: another stream on the
    connection and another connection complete meanwhile; after the server's ``timeout_s``
    the stalled stream is reset (its handler freed) and the connection goes on."""
    timeout_s = 1.0

    async def run() -> None:
        limits = it.Limits(timeout_s=timeout_s)
        async with serving("http2", limits=limits) as srv:
            reader, writer = await asyncio.open_connection(srv.host, srv.port)
            conn = h2.connection.H2Connection(
                h2.config.H2Configuration(client_side=True, header_encoding=None)
            )
            conn.initiate_connection()  # default stream window: 65,535 bytes
            conn.increment_flow_control_window(1 << 24)  # the connection's is not the limit
            client = _H2Client(reader, writer, conn)
            client.flush()
            pump = asyncio.create_task(client.pump())
            try:
                stalled = client.request("stream-2048")  # about 1 MB of SSE: over its window
                client.withheld.add(stalled)
                assert await wait_until(lambda: client.received.get(stalled, 0) > 0)
                other = client.request("stream-256")
                assert await wait_until(lambda: other in client.ended, timeout_s=CLOSED_S)
                assert stalled not in client.ended
                await assert_serves("http2", srv.address, stream=True)
                assert await wait_until(lambda: stalled in client.reset, timeout_s=CLOSED_S)
                assert client.reset[stalled] == Codes.CANCEL
                assert client.received[stalled] <= 65_535  # its own window, no more
                assert await wait_until(lambda: srv.service.active_streams == 0)
                again = client.request("stream-16")
                assert await wait_until(lambda: again in client.ended, timeout_s=CLOSED_S)
                assert not client.terminated
            finally:
                pump.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await pump
                writer.close()
                with contextlib.suppress(OSError):
                    await writer.wait_closed()

    loops.run(run(), event_loop_kind)
