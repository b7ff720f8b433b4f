"""A raw echo over loopback: the least a request-response round trip of given byte counts costs
on an event loop, the floor of the ``tcp unary <= 3x raw echo`` target (bench_transports.py).

The server reads ``--request-bytes`` bytes, then writes ``--response-bytes`` bytes (one
prebuilt buffer), for as many round trips as the connection makes; :class:`EchoClient` writes
the request bytes and waits until the response's count has arrived. Both are bare
``asyncio.Protocol`` callbacks: no streams, no framing to parse, no codec, no copy beyond the
loop's own, so the difference to a ``tcp`` round trip of the same bytes is what inferwire's
framing, codec and stream machinery add. Hand-written because that is the point: any library
on top would be part of what the floor excludes.

    python -m inferwire.bench.procs.echo_server --request-bytes 105 --response-bytes 109

prints ``listening on HOST:PORT loop=KIND`` first, like ``inferwire serve``, and stops on
SIGTERM or SIGINT. :func:`echo` is the
:class:`~inferwire.transports.server_process.ServerProcess` for one.
"""

from __future__ import annotations

import argparse
import asyncio
import signal
import sys
from collections.abc import Sequence
from typing import cast

from inferwire._runtime import loops
from inferwire.transports import server_process


def _stream_transport(transport: asyncio.BaseTransport) -> asyncio.Transport:
    """A TCP connection's transport: uvloop's implement asyncio.Transport without subclassing
    it, so this is a cast, not a check."""
    return cast(asyncio.Transport, transport)


class _EchoServer(asyncio.Protocol):
    def __init__(self, request_bytes: int, response: bytes, open_: set[asyncio.Transport]) -> None:
        self.request_bytes = request_bytes
        self.response = response
        self.pending = 0
        self.open = open_
        self.transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = _stream_transport(transport)
        self.open.add(self.transport)

    def connection_lost(self, exc: Exception | None) -> None:
        if self.transport is not None:
            self.open.discard(self.transport)

    def data_received(self, data: bytes) -> None:
        assert self.transport is not None
        self.pending += len(data)
        while self.pending >= self.request_bytes:
            self.pending -= self.request_bytes
            self.transport.write(self.response)


async def _serve(host: str, port: int, request_bytes: int, response_bytes: int) -> None:
    loop = asyncio.get_running_loop()
    response = bytes(response_bytes)
    connections: set[asyncio.Transport] = set()
    server = await loop.create_server(
        lambda: _EchoServer(request_bytes, response, connections), host, port, backlog=1024
    )
    stop = asyncio.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    bound = server.sockets[0].getsockname()
    print(f"listening on {bound[0]}:{bound[1]} loop={loops.running()}", flush=True)
    try:
        await stop.wait()
    finally:
        server.close()
        for transport in list(connections):
            transport.close()
        await server.wait_closed()


class EchoClient(asyncio.Protocol):
    """One connection to an echo server; :meth:`round_trip` sends the request's bytes and
    returns once the response's count has arrived."""

    def __init__(self, request_bytes: int, response_bytes: int) -> None:
        self.request = bytes(request_bytes)
        self.response_bytes = response_bytes
        self.received = 0
        self.transport: asyncio.Transport | None = None
        self.waiter: asyncio.Future[int] | None = None

    @classmethod
    async def connect(
        cls, host: str, port: int, request_bytes: int, response_bytes: int
    ) -> EchoClient:
        loop = asyncio.get_running_loop()
        _, protocol = await loop.create_connection(
            lambda: cls(request_bytes, response_bytes), host, port
        )
        return protocol

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = _stream_transport(transport)

    def data_received(self, data: bytes) -> None:
        self.received += len(data)
        if self.received >= self.response_bytes and self.waiter is not None:
            waiter, self.waiter = self.waiter, None
            waiter.set_result(self.received)

    def connection_lost(self, exc: Exception | None) -> None:
        if self.waiter is not None and not self.waiter.done():
            self.waiter.set_exception(exc or ConnectionResetError("the echo server closed"))

    async def round_trip(self) -> int:
        """One request and its whole response; the bytes that arrived for it (the response's
        count, unless the server sent more)."""
        assert self.transport is not None
        self.received = 0
        self.waiter = asyncio.get_running_loop().create_future()
        self.transport.write(self.request)
        return await self.waiter

    def close(self) -> None:
        if self.transport is not None:
            self.transport.close()


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m inferwire.bench.procs.echo_server", description=__doc__.splitlines()[0]
    )
    parser.add_argument("--request-bytes", type=int, required=True)
    parser.add_argument("--response-bytes", type=int, required=True)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=0, help="0: any free port (printed)")
    parser.add_argument("--loop", choices=loops.LOOPS, default="auto")
    args = parser.parse_args(argv)
    if args.request_bytes < 1 or args.response_bytes < 1:
        parser.error("--request-bytes and --response-bytes must be at least 1")
    coro = _serve(args.host, args.port, args.request_bytes, args.response_bytes)
    loops.run(coro, args.loop)
    return 0


def echo(request_bytes: int, response_bytes: int, *options: str) -> server_process.ServerProcess:
    """An echo server (not started; use ``with``) on the run's loop unless ``options`` name
    one, as :func:`~inferwire.transports.server_process.serve` is one of ours."""
    process = server_process.ServerProcess()
    process.args = [
        sys.executable,
        "-m",
        "inferwire.bench.procs.echo_server",
        "--request-bytes",
        str(request_bytes),
        "--response-bytes",
        str(response_bytes),
        *loops.with_loop(options),
    ]
    return process


if __name__ == "__main__":
    sys.exit(main())
