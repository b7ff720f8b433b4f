"""A userspace WAN-delay proxy: this kernel has no netem, so delay is added here.

Every chunk read from one side is forwarded to the other ``delay_s`` after it arrived, in the
order read (so byte order holds), with an optional bandwidth cap per direction (a chunk also
waits until the link has finished "sending" the chunks before it). A 20 ms one-way delay makes
a request-response round trip about 40 ms longer, like two hosts 20 ms apart.

Reads continue while earlier chunks wait, so the delay does not turn into back-pressure; the
per-direction queue is bounded by ``max_buffered_bytes`` (reading pauses above it), which
plays the role of the bottleneck router's buffer.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import deque
from typing import Final

from .common import BACKLOG, aclose_quietly

_READ_BYTES: Final = 64 * 1024


class DelayProxy:
    def __init__(
        self,
        upstream: tuple[str, int],
        *,
        delay_s: float,
        bandwidth_bytes_per_s: float | None = None,
        host: str = "127.0.0.1",
        port: int = 0,
        max_buffered_bytes: int = 16 * 1024 * 1024,
    ) -> None:
        if delay_s < 0:
            raise ValueError("delay cannot be negative")
        if bandwidth_bytes_per_s is not None and bandwidth_bytes_per_s <= 0:
            raise ValueError("bandwidth must be positive")
        self.upstream = upstream
        self.delay_s = delay_s
        self.bandwidth = bandwidth_bytes_per_s
        self.host = host
        self.port = port
        self.max_buffered_bytes = max_buffered_bytes
        self.address: tuple[str, int] | None = None
        self._server: asyncio.Server | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        self._links: set[tuple[asyncio.StreamWriter, asyncio.StreamWriter]] = set()

    async def start(self) -> tuple[str, int]:
        self._server = await asyncio.start_server(
            self._handle, self.host, self.port, backlog=BACKLOG
        )
        sockname = self._server.sockets[0].getsockname()
        self.address = (sockname[0], sockname[1])
        return self.address

    async def serve_forever(self) -> None:
        if self._server is None:
            await self.start()
        assert self._server is not None
        await self._server.serve_forever()

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
        for task in list(self._tasks):
            task.cancel()
        if self._tasks:
            await asyncio.wait(list(self._tasks), timeout=5.0)

    def drop_connections(self) -> int:
        """Abort every connection open now, both sides at once, as a failed link would (no
        FIN handshake, buffered bytes discarded); returns how many. New ones are accepted."""
        links = list(self._links)
        for client_w, server_w in links:
            client_w.transport.abort()
            server_w.transport.abort()
        return len(links)

    async def _handle(self, client_r: asyncio.StreamReader, client_w: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._tasks.add(task)
        try:
            try:
                server_r, server_w = await asyncio.open_connection(*self.upstream)
            except OSError:
                return
            link = (client_w, server_w)
            self._links.add(link)
            try:
                await asyncio.gather(self._pipe(client_r, server_w), self._pipe(server_r, client_w))
            finally:
                self._links.discard(link)
                await aclose_quietly(server_w)
        except (asyncio.CancelledError, OSError):
            pass
        finally:
            await aclose_quietly(client_w)
            self._tasks.discard(task)

    async def _pipe(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        queue: deque[tuple[float, bytes]] = deque()
        queued = asyncio.Event()
        room = asyncio.Event()
        room.set()
        buffered = 0

        async def read() -> None:
            nonlocal buffered
            link_free = time.monotonic()
            while True:
                await room.wait()
                data = await reader.read(_READ_BYTES)
                now = time.monotonic()
                if not data:
                    queue.append((now + self.delay_s, b""))
                    queued.set()
                    return
                due = now + self.delay_s
                if self.bandwidth is not None:
                    link_free = max(link_free, now) + len(data) / self.bandwidth
                    due = link_free + self.delay_s
                queue.append((due, data))
                buffered += len(data)
                if buffered >= self.max_buffered_bytes:
                    room.clear()
                queued.set()

        async def write() -> None:
            nonlocal buffered
            while True:
                while not queue:
                    queued.clear()
                    await queued.wait()
                due, data = queue.popleft()
                wait = due - time.monotonic()
                if wait > 0:
                    await asyncio.sleep(wait)
                if not data:
                    # uvloop raises RuntimeError on a transport already closed (a dropped
                    # link), where asyncio's does nothing: either way there is no EOF to send
                    with contextlib.suppress(OSError, RuntimeError):
                        if not writer.transport.is_closing() and writer.can_write_eof():
                            writer.write_eof()
                    return
                writer.write(data)
                await writer.drain()
                buffered -= len(data)
                if buffered < self.max_buffered_bytes:
                    room.set()

        reading = asyncio.ensure_future(read())
        try:
            await write()
        finally:
            reading.cancel()
            with contextlib.suppress(asyncio.CancelledError, OSError):
                await reading
