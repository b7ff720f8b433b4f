"""The WAN-delay proxy in-process: delay, bandwidth cap and byte order, on real sockets.

Only lower bounds on time are asserted (a busy machine only makes things slower), with
generous upper bounds so a hang still fails.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import time

import pytest

from inferwire._runtime import loops
from inferwire.transports.proxy import DelayProxy


async def _echo_server() -> tuple[asyncio.Server, int, set[asyncio.StreamWriter]]:
    writers: set[asyncio.StreamWriter] = set()

    async def echo(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writers.add(writer)
        try:
            while data := await reader.read(65536):
                writer.write(data)
                await writer.drain()
        finally:
            writer.close()

    server = await asyncio.start_server(echo, "127.0.0.1", 0)
    return server, server.sockets[0].getsockname()[1], writers


async def _through_proxy(
    payload: bytes, *, delay_s: float, bandwidth: float | None
) -> tuple[bytes, float]:
    server, port, writers = await _echo_server()
    proxy = DelayProxy(("127.0.0.1", port), delay_s=delay_s, bandwidth_bytes_per_s=bandwidth)
    host, proxy_port = await proxy.start()
    try:
        reader, writer = await asyncio.open_connection(host, proxy_port)
        start = time.perf_counter()
        writer.write(payload)
        await writer.drain()
        received = bytearray()
        async with asyncio.timeout(30):
            while len(received) < len(payload):
                chunk = await reader.read(65536)
                assert chunk, "the proxy closed early"
                received += chunk
        elapsed = time.perf_counter() - start
        writer.close()
        await writer.wait_closed()
        return bytes(received), elapsed
    finally:
        await proxy.stop()
        server.close()
        await server.wait_closed()  # on 3.11 this does not wait for the handlers' connections:
        for writer in writers:  # close them here, not in a later test's garbage collection
            writer.close()
            with contextlib.suppress(OSError):
                await writer.wait_closed()


def test_delay_applies_in_each_direction() -> None:
    payload = b"ping"
    echoed, elapsed = asyncio.run(_through_proxy(payload, delay_s=0.05, bandwidth=None))
    assert echoed == payload
    assert 0.1 <= elapsed < 10.0  # 50 ms there and 50 ms back


@pytest.mark.parametrize("size", [1, 4096, 1 << 20])
def test_bytes_arrive_whole_and_in_order(size: int) -> None:
    payload = hashlib.shake_256(b"inferwire").digest(size)
    echoed, _ = asyncio.run(_through_proxy(payload, delay_s=0.001, bandwidth=None))
    assert echoed == payload


def test_bandwidth_cap_paces_a_large_transfer() -> None:
    # 1 MiB at 8 MiB/s: at least 0.125 s (the echo streams back while the rest goes out, so
    # the two directions overlap rather than add)
    payload = bytes(1 << 20)
    echoed, elapsed = asyncio.run(_through_proxy(payload, delay_s=0.0, bandwidth=8 * (1 << 20)))
    assert echoed == payload
    assert 0.12 <= elapsed < 20.0


def test_rejects_nonsense_settings() -> None:
    with pytest.raises(ValueError, match="delay"):
        DelayProxy(("127.0.0.1", 1), delay_s=-1.0)
    with pytest.raises(ValueError, match="bandwidth"):
        DelayProxy(("127.0.0.1", 1), delay_s=0.0, bandwidth_bytes_per_s=0)


def test_a_dropped_link_ends_both_directions_and_the_proxy_serves_on(
    event_loop_kind: str,
) -> None:
    """``drop_connections`` (the faults suite's drop) on either loop: the client reads EOF, the
    proxy's pipes end without an error (on uvloop, EOF towards a transport already closed raised
    RuntimeError out of the connection's task) and a new connection through it works."""

    errors: list[dict[str, object]] = []

    async def run() -> tuple[int, bytes, bytes]:
        asyncio.get_running_loop().set_exception_handler(lambda _, context: errors.append(context))
        server, port, writers = await _echo_server()
        proxy = DelayProxy(("127.0.0.1", port), delay_s=0.0)
        host, proxy_port = await proxy.start()
        try:
            reader, writer = await asyncio.open_connection(host, proxy_port)
            writer.write(b"ping")
            async with asyncio.timeout(30):
                first = await reader.readexactly(4)
                dropped = proxy.drop_connections()
                tail = await reader.read()  # EOF, not a hang
            writer.close()
            async with asyncio.timeout(30):
                while proxy._tasks:  # every pipe of the dropped link has ended
                    await asyncio.sleep(0.01)
            again, _ = await _through_proxy_at(host, proxy_port, b"again")
            return dropped, first + tail, again
        finally:
            await proxy.stop()
            server.close()
            for w in writers:
                w.close()

    dropped, before, after = loops.run(run(), event_loop_kind)
    assert dropped == 1
    assert errors == []  # no pipe ended on an exception
    assert before == b"ping"
    assert after == b"again"


async def _through_proxy_at(host: str, port: int, payload: bytes) -> tuple[bytes, None]:
    reader, writer = await asyncio.open_connection(host, port)
    writer.write(payload)
    async with asyncio.timeout(30):
        echoed = await reader.readexactly(len(payload))
    writer.close()
    with contextlib.suppress(OSError):
        await writer.wait_closed()
    return echoed, None
