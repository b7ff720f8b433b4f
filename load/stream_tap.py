"""A timestamping TCP relay between a load generator and an HTTP/1.1 server of token streams:
one clock, outside both tools, for what the wire saw.

For every request on every connection it records, in Unix seconds (``time.time()``, the clock
guidellm stamps with): when the request's first bytes reached the relay, when its last byte
did (a client may write the headers and the body apart), when the first
server-sent event (``data:``) of the answer passed back, and when ``data: [DONE]`` did. So
``first_event - request_in`` is the time to first token as the wire sees it, whatever each
tool does before it writes and after it reads, and the requests' arrival times give the rate
the server was actually offered. HTTP/1.1 keeps one request at a time on a connection (no
pipelining from either tool), which is what lets bytes be matched to requests: a request
starts with the first client bytes after the previous answer's ``[DONE]``.

The relay copies bytes and looks at them, nothing more; its own cost is one more loopback
hop, the same for both tools. It runs on the run's event loop (``$INFERWIRE_LOOP``, uvloop
when installed: :func:`~inferwire._runtime.loops.requested_loop`), like the server
behind it; ``loop`` says which.
"""

from __future__ import annotations

import asyncio
import threading
import time
from dataclasses import dataclass, field
from typing import Final

from inferwire._runtime import loops
from inferwire._runtime.loops import requested_loop

READ_BYTES: Final = 65536
_DATA: Final = b"data:"
_DONE: Final = b"data: [DONE]"


@dataclass(slots=True)
class Exchange:
    """One request and its streamed answer, as the relay saw them (Unix seconds; 0: not seen)."""

    request_in: float
    request_whole: float = 0.0
    """When the last byte of the request (its headers' ``content-length``) passed: the
    server can start on it only then."""
    first_event_out: float = 0.0
    done_out: float = 0.0


@dataclass(slots=True)
class _Connection:
    exchanges: list[Exchange] = field(default_factory=list)
    open: Exchange | None = None
    answered: bool = False
    """The server has sent bytes since the open request's: the client's next bytes are the
    next request (a GET that ends without ``[DONE]`` included)."""
    tail: bytes = b""
    """The last bytes of the previous read, for a marker split across two reads."""
    request_bytes: bytearray = field(default_factory=bytearray)
    """The open request's bytes so far, until its length is known and reached."""


def _request_whole(data: bytes | bytearray) -> bool:
    """Whether ``data`` holds a whole HTTP/1.1 request: its headers and ``content-length``
    bytes of body (neither tool sends a chunked request)."""
    end = data.find(b"\r\n\r\n")
    if end < 0:
        return False
    length = 0
    for line in bytes(data[:end]).split(b"\r\n")[1:]:
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length":
            length = int(value.strip() or 0)
    return len(data) >= end + 4 + length


class StreamTap:
    """The relay, on its own event loop in a thread: ``with StreamTap(upstream) as tap``,
    point the tools at ``tap.address``, read :meth:`take` after each run."""

    def __init__(self, upstream_host: str, upstream_port: int) -> None:
        self.upstream = (upstream_host, upstream_port)
        self.address = ""
        self._connections: list[_Connection] = []
        self._lock = threading.Lock()
        self._loop = loops.new_event_loop(requested_loop())
        self.loop = loops.kind(self._loop)
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._server: asyncio.Server | None = None

    def _run(self) -> None:
        asyncio.set_event_loop(self._loop)
        self._server = self._loop.run_until_complete(
            asyncio.start_server(self._accept, "127.0.0.1", 0)
        )
        host, port = self._server.sockets[0].getsockname()[:2]
        self.address = f"{host}:{port}"
        self._ready.set()
        self._loop.run_forever()

    def __enter__(self) -> StreamTap:
        self._thread.start()
        if not self._ready.wait(30):
            raise RuntimeError("the stream tap did not start")
        return self

    def __exit__(self, *exc: object) -> None:
        async def close() -> None:
            if self._server is not None:
                self._server.close()
            tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
            for task in tasks:
                task.cancel()
            # let each connection's handler close its sockets before the loop stops
            await asyncio.gather(*tasks, return_exceptions=True)

        asyncio.run_coroutine_threadsafe(close(), self._loop).result(30)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(30)
        self._loop.close()

    def take(self) -> list[Exchange]:
        """Every exchange seen since the last call, in order of arrival; forgets them."""
        with self._lock:
            connections, self._connections = self._connections, []
        exchanges = [e for c in connections for e in c.exchanges]
        return sorted(exchanges, key=lambda e: e.request_in)

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        connection = _Connection()
        with self._lock:
            self._connections.append(connection)
        try:
            up_reader, up_writer = await asyncio.open_connection(*self.upstream)
        except OSError:
            writer.close()
            return
        pumps = [
            asyncio.ensure_future(self._requests(reader, up_writer, connection)),
            asyncio.ensure_future(self._answers(up_reader, writer, connection)),
        ]
        try:
            await asyncio.wait(pumps, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for pump in pumps:
                pump.cancel()
            await asyncio.gather(*pumps, return_exceptions=True)
            for w in (writer, up_writer):
                w.close()

    async def _requests(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, c: _Connection
    ) -> None:
        while data := await reader.read(READ_BYTES):
            if c.open is None or c.answered:
                c.open = Exchange(request_in=time.time())
                c.exchanges.append(c.open)
                c.answered = False
                c.tail = b""
                c.request_bytes.clear()
            if not c.open.request_whole:
                c.request_bytes += data
                if _request_whole(c.request_bytes):
                    c.open.request_whole = time.time()
            writer.write(data)
            await writer.drain()

    async def _answers(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, c: _Connection
    ) -> None:
        while data := await reader.read(READ_BYTES):
            seen = time.time()
            writer.write(data)
            exchange = c.open
            if exchange is not None and not exchange.done_out:
                c.answered = True
                window = c.tail + data
                if not exchange.first_event_out and _DATA in window:
                    exchange.first_event_out = seen
                if _DONE in window:
                    exchange.done_out = seen
                c.tail = data[-len(_DONE) :]
            await writer.drain()
