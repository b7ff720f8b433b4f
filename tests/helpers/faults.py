"""Fixtures for the transport fault tests: servers in this process or a child process, fake
peers that misbehave on purpose, raw HTTP/1.1 exchanges, and polling instead of sleeping.

Every helper closes what it opens (``filterwarnings = error`` turns a leaked socket into a
failure), and every wait has a generous bound: the machine is a busy 2-core one.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

import inferwire.codecs as ic
import inferwire.transports as it
from inferwire._runtime.child import ChildStartError
from inferwire.transports.server_process import ServerProcess
from inferwire.workloads import token_stream_source

MESSAGES = [{"role": "user", "content": "Generate."}]
"""The ``messages`` of a hand-written chat completion request (the workload makes the tokens)."""

STARTUP_TIMEOUT_S = 60.0
"""A child server imports numpy, grpc and the codecs before it prints its address."""


async def wait_until(
    predicate: Callable[[], bool], *, timeout_s: float = 10.0, interval_s: float = 0.02
) -> bool:
    """Poll ``predicate`` until it holds or ``timeout_s`` passes; the caller asserts on it."""
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() > deadline:
            return False
        await asyncio.sleep(interval_s)
    return True


def task_census() -> Counter[str]:
    """How many tasks of the running loop (the caller's aside) run each coroutine. Counted by
    name, not identity: a server may replace a standing task with a new one of the same kind
    (grpc.aio's ``_request_call`` waits for the next call and is renewed after each)."""
    current = asyncio.current_task()
    return Counter(
        getattr(task.get_coro(), "__qualname__", repr(task.get_coro()))
        for task in asyncio.all_tasks()
        if task is not current
    )


def expected_chunks(workload: str, seed: int = 0) -> list[ic.TokenChunk]:
    return list(token_stream_source(workload, seed))


def infer_request(tensor_bytes: int = 64, model: str = "x") -> ic.InferRequest:
    """An echo request with one FP32 tensor of about ``tensor_bytes`` bytes."""
    count = max(1, tensor_bytes // 4)
    data = np.arange(count, dtype="<f4")
    tensor = ic.Tensor(name="input_0", datatype="FP32", shape=(count,), data=data)
    return ic.InferRequest(model=model, id="req-1", inputs=(tensor,))


async def assert_serves(
    transport: str, address: str, codec: str = "orjson", *, stream: bool = True
) -> None:
    """A fresh client gets a correct echo and (with ``stream``) a complete, correct short
    stream."""
    request = infer_request()
    async with asyncio.timeout(60.0), it.connect(transport, address, codec=codec) as client:
        response = await client.infer(request)
        assert response.outputs[0].data.tolist() == request.inputs[0].data.tolist()
        if stream:
            chunks = [c async for c in client.generate(it.GenerateRequest(workload="stream-16"))]
            assert chunks == expected_chunks("stream-16")


# -- servers ----------------------------------------------------------------------------


@dataclass
class Running:
    server: it.Server
    service: it.SimulatedService
    host: str
    port: int

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}"


@contextlib.asynccontextmanager
async def serving(
    transport: str,
    codec: str = "orjson",
    *,
    prefill_s: float = 0.0,
    decode_s: float = 0.0,
    limits: it.Limits | None = None,
) -> AsyncIterator[Running]:
    """A real server on a loopback socket in this event loop."""
    service = it.SimulatedService(token_stream_source, prefill_s=prefill_s, decode_s=decode_s)
    server = it.server_class(transport)(
        service, ic.get(codec, extensions=True), limits=limits or it.Limits()
    )
    host, port = await server.start()
    try:
        yield Running(server, service, host, port)
    finally:
        await server.stop()


@contextlib.contextmanager
def server_process(
    transport: str, codec: str, extra_args: Sequence[str], log_path: Path
) -> Iterator[ServerProcess]:
    """``inferwire serve`` in a child process, its stderr in ``log_path``; killed (if still
    running) and reaped on exit."""
    with log_path.open("wb") as log:
        child = ServerProcess(
            "serve", "--transport", transport, "--codec", codec, *extra_args, stderr=log
        )
        try:
            child.start()
        except ChildStartError as exc:
            raise AssertionError(f"{exc}; stderr: {log_path.read_text()}") from None
    try:
        yield child
    finally:
        child.kill()


# -- fake peers and raw exchanges ---------------------------------------------------------

Handler = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]


@dataclass
class FakeServer:
    host: str
    port: int
    connections: int = 0
    tasks: set[asyncio.Task[object]] = field(default_factory=set)

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}"


@contextlib.asynccontextmanager
async def fake_server(handler: Handler) -> AsyncIterator[FakeServer]:
    """A loopback listener whose every connection runs ``handler``, then is closed."""
    fake = FakeServer("127.0.0.1", 0)

    async def run(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        fake.connections += 1
        task = asyncio.current_task()
        if task is not None:
            fake.tasks.add(task)
        try:
            await handler(reader, writer)
        except (OSError, asyncio.IncompleteReadError, asyncio.CancelledError):
            pass  # the client went away, or the fake stops (a cancelled handler ends quietly)
        finally:
            writer.close()
            with contextlib.suppress(OSError):
                await writer.wait_closed()

    server = await asyncio.start_server(run, fake.host, 0)
    fake.port = server.sockets[0].getsockname()[1]
    try:
        yield fake
    finally:
        server.close()
        # Python 3.11's Server.close leaves the connections' handlers running
        for task in fake.tasks:
            task.cancel()
        if fake.tasks:
            await asyncio.wait(fake.tasks, timeout=10.0)
        await server.wait_closed()


async def exchange(host: str, port: int, data: bytes, *, timeout_s: float = 20.0) -> bytes:
    """Send ``data`` on a new connection and read until the peer closes it."""
    reader, writer = await asyncio.open_connection(host, port)
    try:
        writer.write(data)
        await writer.drain()
        async with asyncio.timeout(timeout_s):
            return await reader.read()
    finally:
        writer.close()
        with contextlib.suppress(OSError):
            await writer.wait_closed()


def http1_request(
    method: str, path: str, content_type: str | None, body: bytes, *, close: bool = True
) -> bytes:
    headers = [f"{method} {path} HTTP/1.1", "host: 127.0.0.1"]
    if content_type is not None:
        headers.append(f"content-type: {content_type}")
    headers.append(f"content-length: {len(body)}")
    if close:
        headers.append("connection: close")
    return ("\r\n".join(headers) + "\r\n\r\n").encode("latin-1") + body


def parse_http1_response(data: bytes) -> tuple[int, dict[str, str], bytes]:
    """Status, headers (lower-case names) and body of one content-length response."""
    head, sep, rest = data.partition(b"\r\n\r\n")
    assert sep, f"no complete response head in {data[:200]!r}"
    status_line, *lines = head.decode("latin-1").split("\r\n")
    headers = {}
    for line in lines:
        name, _, value = line.partition(":")
        headers[name.strip().lower()] = value.strip()
    assert "content-length" in headers, headers
    length = int(headers["content-length"])
    assert len(rest) >= length, f"body cut short: {len(rest)} of {length} bytes"
    return int(status_line.split()[1]), headers, rest[:length]


async def read_http1_request(reader: asyncio.StreamReader) -> bytes:
    """Read one request with a content-length body; the body is returned."""
    head = await reader.readuntil(b"\r\n\r\n")
    length = 0
    for line in head.decode("latin-1").split("\r\n"):
        name, _, value = line.partition(":")
        if name.strip().lower() == "content-length":
            length = int(value)
    return await reader.readexactly(length)


@contextlib.contextmanager
def thread_server(transport: str, service: it.SimulatedService) -> Iterator[str]:
    """A real server on 127.0.0.1 with its own event loop in a thread: a stall there leaves
    the caller's loop running, as a server in another process would."""
    loop = asyncio.new_event_loop()
    server = it.server_class(transport)(service, ic.get("orjson", extensions=True))
    started = threading.Event()

    def main() -> None:
        asyncio.set_event_loop(loop)
        loop.run_until_complete(server.start())
        started.set()
        loop.run_forever()

    thread = threading.Thread(target=main, daemon=True)
    thread.start()
    assert started.wait(30)
    assert server.address is not None
    try:
        yield f"{server.address[0]}:{server.address[1]}"
    finally:
        asyncio.run_coroutine_threadsafe(server.stop(), loop).result(30)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(30)
        loop.close()
