"""The HTTP/1.1 server against hostile clients, on raw loopback sockets.

* Request smuggling: every framing a front end and this server could read two ways is refused
  (400, or 501 for a transfer coding it does not implement) and the connection closed; a
  request pipelined behind it in the same bytes never runs.
* Limits: a head over the limit (however it arrives) is 431, a body over the cap 413 (declared
  or chunked), each refused before the rest is read; other connections are served meanwhile.
* Slow clients: a head must be whole within ``Limits.header_timeout_s`` of its first byte,
  so a byte a second (slowloris) is cut off while other clients are served.

Each test starts its own server in its own event loop, once on asyncio's and once on uvloop
(``event_loop_kind``, tests/conftest.py); every wait is bounded.
The unparsable requests of ``test_transport_faults`` (not HTTP, a bad Content-Length, an
unknown coding alone, one huge header) are not repeated here.
"""

from __future__ import annotations

import asyncio
import contextlib
import time

import orjson
import pytest

import inferwire.codecs as ic
import inferwire.transports as it
from inferwire._runtime import loops
from inferwire.transports.http1 import MAX_HEADER_BYTES
from tests.helpers.faults import (
    assert_serves,
    exchange,
    expected_chunks,
    http1_request,
    infer_request,
    parse_http1_response,
    serving,
)

BOUND_S = 20.0
"""Outer bound on an exchange that should take milliseconds: one that fires is a hang."""

_GENERATE = b'{"workload": "stream-16", "messages": [{"role": "user"}], "stream": true}'
assert len(_GENERATE) == 73 == 0x49, "the requests below declare this length"
_HEAD = (
    b"POST /v1/chat/completions HTTP/1.1\r\nhost: 127.0.0.1\r\ncontent-type: application/json\r\n"
)
_CHUNKED_GENERATE = b"%x\r\n%s\r\n0\r\n\r\n" % (len(_GENERATE), _GENERATE)
_SMUGGLED = http1_request("POST", "/v1/chat/completions", "application/json", _GENERATE)
"""Pipelined behind each hostile request: a stream that must never start."""

SMUGGLING = [
    pytest.param(
        _HEAD + b"content-length: 73\r\ntransfer-encoding: chunked\r\n\r\n" + _CHUNKED_GENERATE,
        {400},
        id="length-then-chunked",
    ),
    pytest.param(
        _HEAD + b"transfer-encoding: chunked\r\ncontent-length: 73\r\n\r\n" + _CHUNKED_GENERATE,
        {400},
        id="chunked-then-length",
    ),
    pytest.param(
        _HEAD + b"content-length: 73\r\ncontent-length: 73\r\n\r\n" + _GENERATE,
        {400},
        id="duplicate-length-same",
    ),
    pytest.param(
        _HEAD + b"content-length: 73\r\ncontent-length: 0\r\n\r\n" + _GENERATE,
        {400},
        id="duplicate-length-different",
    ),
    pytest.param(
        _HEAD + b"content-length: 73, 73\r\n\r\n" + _GENERATE, {400}, id="length-as-a-list"
    ),
    pytest.param(_HEAD + b"content-length: +73\r\n\r\n" + _GENERATE, {400}, id="length-plus-sign"),
    pytest.param(
        _HEAD + b"transfer-encoding: gzip, chunked\r\n\r\n" + _CHUNKED_GENERATE,
        {501},
        id="gzip-then-chunked",
    ),
    pytest.param(
        _HEAD + b"transfer-encoding: xchunked\r\n\r\n" + _CHUNKED_GENERATE, {501}, id="xchunked"
    ),
    pytest.param(
        _HEAD
        + b"transfer-encoding: chunked\r\ntransfer-encoding: chunked\r\n\r\n"
        + _CHUNKED_GENERATE,
        {400, 501},
        id="chunked-twice",
    ),
    pytest.param(
        _HEAD + b"content-length : 73\r\n\r\n" + _GENERATE, {400}, id="space-before-colon-length"
    ),
    pytest.param(
        _HEAD + b"transfer-encoding : chunked\r\n\r\n" + _CHUNKED_GENERATE,
        {400},
        id="space-before-colon-chunked",
    ),
    pytest.param(
        _HEAD + b"transfer-encoding: chunked\r\n\r\n49\r\n" + _GENERATE + b"XX0\r\n\r\n",
        {400},
        id="chunk-without-crlf",
    ),
    pytest.param(
        _HEAD + b"transfer-encoding: chunked\r\n\r\n20\r\n" + _GENERATE + b"\r\n0\r\n\r\n",
        {400},
        id="chunk-longer-than-its-size",
    ),
    pytest.param(
        _HEAD + b"content-length: 73\r\nx-folded: a\r\n b\r\n\r\n" + _GENERATE,
        {400},
        id="obsolete-line-folding",
    ),
    pytest.param(
        _HEAD.replace(b"HTTP/1.1", b"HTTP/1.0")
        + b"connection: keep-alive\r\ntransfer-encoding: chunked\r\n\r\n"
        + _CHUNKED_GENERATE,
        {400},
        id="http10-chunked",
    ),
]


def _responses(data: bytes) -> list[tuple[int, dict[str, str], bytes]]:
    """Every content-length response in ``data``, in order."""
    responses = []
    while data:
        status, headers, body = parse_http1_response(data)
        responses.append((status, headers, body))
        data = data.partition(b"\r\n\r\n")[2][len(body) :]
    return responses


def _assert_refusal(response: tuple[int, dict[str, str], bytes], statuses: set[int]) -> None:
    status, headers, body = response
    assert status in statuses, body
    assert headers["content-type"] == "application/json"
    assert headers.get("connection") == "close"
    error = orjson.loads(body)["error"]
    assert error["code"] == status
    assert error["message"]


@pytest.mark.parametrize(("raw", "statuses"), SMUGGLING)
def test_http1_smuggling_is_refused_and_what_follows_never_runs(
    event_loop_kind: str, raw: bytes, statuses: set[int]
) -> None:
    async def run() -> None:
        async with serving("http1") as srv:
            # exchange reads until the server closes: a server that kept the connection
            # open would fail here on the bound
            data = await exchange(srv.host, srv.port, raw + _SMUGGLED, timeout_s=BOUND_S)
            responses = _responses(data)
            assert len(responses) == 1, [status for status, _, _ in responses]
            _assert_refusal(responses[0], statuses)
            assert srv.service.streams_started == 0
            await assert_serves("http1", srv.address)

    loops.run(run(), event_loop_kind)


def test_http1_requests_before_a_refused_one_are_answered_in_order(event_loop_kind: str) -> None:
    """A good request pipelined ahead of a smuggling attempt gets its own answer, then the
    attempt its refusal: the refusal is not sent in place of the good request's answer."""

    async def run() -> None:
        async with serving("http1") as srv:
            good = http1_request(
                "POST",
                "/v2/models/x/infer",
                "application/json",
                ic.get("orjson", extensions=True).encode(infer_request()),
                close=False,
            )
            bad = _HEAD + b"content-length: 73\r\ncontent-length: 0\r\n\r\n" + _GENERATE
            data = await exchange(srv.host, srv.port, good + bad + _SMUGGLED, timeout_s=BOUND_S)
            responses = _responses(data)
            assert [status for status, _, _ in responses] == [200, 400]
            response = ic.get("orjson", extensions=True).decode(responses[0][2], ic.InferResponse)
            assert response.outputs[0].data.tolist() == infer_request().inputs[0].data.tolist()
            _assert_refusal(responses[1], {400})
            assert srv.service.streams_started == 0

    loops.run(run(), event_loop_kind)


# -- limits ---------------------------------------------------------------------------------


class RawConnection:
    """One client connection, written to in pieces, whose answer is read as it comes (until
    the server closes; a reset counts as closed)."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader = reader
        self.writer = writer
        self.received = b""
        self._reading = asyncio.create_task(self._read())

    @classmethod
    async def open(cls, host: str, port: int) -> RawConnection:
        reader, writer = await asyncio.open_connection(host, port)
        return cls(reader, writer)

    async def _read(self) -> None:
        with contextlib.suppress(ConnectionError):
            while piece := await self.reader.read(65536):
                self.received += piece

    async def send(self, data: bytes) -> bool:
        """Write ``data``; False once the server has answered or closed."""
        if self.received or self._reading.done():
            return False
        try:
            self.writer.write(data)
            await self.writer.drain()
        except ConnectionError:
            return False
        return True

    async def answer(self, *, timeout_s: float = BOUND_S) -> bytes:
        """Everything the server sent, once it has closed the connection."""
        await asyncio.wait_for(asyncio.shield(self._reading), timeout_s)
        return self.received

    async def close(self) -> None:
        self._reading.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self._reading
        self.writer.close()
        with contextlib.suppress(OSError):
            await self.writer.wait_closed()


_PAD = b"x-padding: "


@pytest.mark.parametrize("split", ["inside-one-header", "two-whole-headers"])
def test_http1_head_over_the_limit_in_two_halves_is_431(event_loop_kind: str, split: str) -> None:
    """Each half is under the limit, the head is over it: counted across reads."""
    half = MAX_HEADER_BYTES * 3 // 5
    head = b"GET /v2/health/ready HTTP/1.1\r\nhost: 127.0.0.1\r\n"
    if split == "inside-one-header":
        first = head + _PAD + b"a" * half
        second = b"a" * half + b"\r\n\r\n"
    else:
        first = head + b"x-one: " + b"a" * half + b"\r\n"
        second = b"x-two: " + b"a" * half + b"\r\n\r\n"
    assert len(first) < MAX_HEADER_BYTES
    assert len(second) < MAX_HEADER_BYTES

    async def run() -> None:
        async with serving("http1") as srv:
            conn = await RawConnection.open(srv.host, srv.port)
            try:
                assert await conn.send(first)
                await asyncio.sleep(0.1)  # two reads on the server, not one
                await conn.send(second)
                responses = _responses(await conn.answer())
            finally:
                await conn.close()
            assert len(responses) == 1
            _assert_refusal(responses[0], {431})
            await assert_serves("http1", srv.address)

    loops.run(run(), event_loop_kind)


def test_http1_head_that_never_ends_is_431_before_much_is_read(event_loop_kind: str) -> None:
    """httptools buffers a header line until its end; one that never ends is refused by the
    bytes read into it, not held until the client stops sending."""

    async def run() -> None:
        async with serving("http1") as srv:
            conn = await RawConnection.open(srv.host, srv.port)
            sent = 0
            try:
                await conn.send(b"GET /v2/health/ready HTTP/1.1\r\nhost: 127.0.0.1\r\n" + _PAD)
                async with asyncio.timeout(BOUND_S):
                    while sent < 128 * MAX_HEADER_BYTES and await conn.send(b"a" * 4096):
                        sent += 4096
                        await asyncio.sleep(0.01)  # paced: the server's lag is not counted
                responses = _responses(await conn.answer())
            finally:
                await conn.close()
            assert len(responses) == 1
            _assert_refusal(responses[0], {431})
            # the server's bound is the limit plus one read (256 KiB); more is in flight
            assert sent < 64 * MAX_HEADER_BYTES, f"{sent} bytes of one header were taken"
            await assert_serves("http1", srv.address)

    loops.run(run(), event_loop_kind)


SMALL_LIMITS = it.Limits(max_message_bytes=64 * 1024)


def test_http1_declared_body_over_the_cap_is_413_from_the_head(event_loop_kind: str) -> None:
    """A Content-Length over the cap is refused as soon as the head is read: the server does
    not wait for a body it would not keep."""

    async def run() -> None:
        async with serving("http1", limits=SMALL_LIMITS) as srv:
            conn = await RawConnection.open(srv.host, srv.port)
            try:
                assert await conn.send(
                    _HEAD + b"content-length: %d\r\n\r\n" % (SMALL_LIMITS.max_message_bytes + 1)
                )
                responses = _responses(await conn.answer())
            finally:
                await conn.close()
            assert len(responses) == 1
            _assert_refusal(responses[0], {413})
            assert srv.service.streams_started == 0
            await assert_serves("http1", srv.address)

    loops.run(run(), event_loop_kind)


def test_http1_chunked_body_over_the_cap_is_413_while_others_are_served(
    event_loop_kind: str,
) -> None:
    """A chunked body has no length to refuse from: it is counted as it arrives, refused
    once over the cap, and a client on another connection is served while it uploads."""
    cap = SMALL_LIMITS.max_message_bytes
    chunk = b"a" * 4096
    framed = b"%x\r\n%s\r\n" % (len(chunk), chunk)

    async def run() -> None:
        async with serving("http1", limits=SMALL_LIMITS) as srv:
            conn = await RawConnection.open(srv.host, srv.port)
            sent = 0
            try:
                assert await conn.send(_HEAD + b"transfer-encoding: chunked\r\n\r\n")
                while sent < cap // 2:
                    assert await conn.send(framed)
                    sent += len(chunk)
                await assert_serves("http1", srv.address)  # mid-upload
                async with asyncio.timeout(BOUND_S):
                    while sent < 32 * cap and await conn.send(framed):
                        sent += len(chunk)
                        await asyncio.sleep(0.005)  # paced: the server's lag is not counted
                responses = _responses(await conn.answer())
            finally:
                await conn.close()
            assert len(responses) == 1
            _assert_refusal(responses[0], {413})
            assert sent < 16 * cap, f"{sent} bytes of body were taken past a cap of {cap}"
            assert srv.service.streams_started == 1  # the other client's
            await assert_serves("http1", srv.address)

    loops.run(run(), event_loop_kind)


# -- slow clients ---------------------------------------------------------------------------

HEAD_TIMEOUT_S = 3.0
SLOW_LIMITS = it.Limits(header_timeout_s=HEAD_TIMEOUT_S)


def test_http1_slowloris_is_cut_off_and_others_are_served_meanwhile(event_loop_kind: str) -> None:
    """A client that sends a head byte every 0.25 s never trips a per-read timeout; the head
    timeout counts from the first byte. Another client is served while it drips."""

    async def drip(conn: RawConnection) -> float:
        """Send a head byte by byte until the server closes; how long that took."""
        start = time.monotonic()
        head = b"GET /v2/health/ready HTTP/1.1\r\nhost: 127.0.0.1\r\nx-slow: " + b"a" * 10_000
        for byte in head:
            if not await conn.send(bytes([byte])):
                break
            await asyncio.sleep(0.25)
        return time.monotonic() - start

    async def run() -> None:
        async with serving("http1", limits=SLOW_LIMITS) as srv:
            conn = await RawConnection.open(srv.host, srv.port)
            try:
                slow = asyncio.create_task(drip(conn))
                await asyncio.sleep(0.3)
                started = time.monotonic()
                await assert_serves("http1", srv.address)
                served_s = time.monotonic() - started
                assert not slow.done(), "the slow client was cut off before the other was served"
                async with asyncio.timeout(BOUND_S):
                    dripped_s = await slow
                answer = await conn.answer()
            finally:
                await conn.close()
            assert served_s < HEAD_TIMEOUT_S
            # closed at the head timeout: not before, and within a bound (a busy machine)
            assert HEAD_TIMEOUT_S - 0.3 <= dripped_s < HEAD_TIMEOUT_S + 5.0, dripped_s
            if answer:  # the server may also just close
                responses = _responses(answer)
                assert len(responses) == 1
                _assert_refusal(responses[0], {408})

    loops.run(run(), event_loop_kind)


def test_http1_head_timeout_counts_from_each_heads_first_byte(event_loop_kind: str) -> None:
    """An idle keep-alive connection is not a slow head: a request sent after idling longer
    than the head timeout is served, on the same connection."""

    async def run() -> None:
        limits = it.Limits(header_timeout_s=0.5)
        async with serving("http1", limits=limits) as srv:
            reader, writer = await asyncio.open_connection(srv.host, srv.port)
            request = http1_request(
                "POST", "/v1/chat/completions", "application/json", _GENERATE, close=False
            )
            try:
                for _ in range(2):
                    writer.write(request)
                    await writer.drain()
                    async with asyncio.timeout(BOUND_S):
                        head = await reader.readuntil(b"\r\n\r\n")
                        assert head.startswith(b"HTTP/1.1 200 ")
                        body = await reader.readuntil(b"\r\n0\r\n\r\n")
                    assert body.count(b"data: ") == len(expected_chunks("stream-16")) + 1
                    await asyncio.sleep(1.0)
            finally:
                writer.close()
                with contextlib.suppress(OSError):
                    await writer.wait_closed()
            assert srv.service.streams_started == 2

    loops.run(run(), event_loop_kind)
