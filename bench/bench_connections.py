"""Connection setup: what a new connection per request costs against a reused one, at 1, 10
and 100 concurrent clients, with and without TLS, with and without 20 ms of one-way delay
(the WAN-delay proxy), per transport (claims C5 and C6).

One timed round: ``concurrency`` clients each make one small infer request at once. ``new``:
each request opens its own connection (a new client: TCP handshake, TLS handshake, HTTP/2
preface or gRPC channel setup) and closes it; ``reused``: each client's connection was opened
before the timing and is kept. ``extra_info`` records the connections each round opened.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest

import inferwire.codecs as ic
import inferwire.transports as it
from inferwire.bench.procs import server_process
from inferwire.workloads import token_stream_source

CODEC = "protobuf"
SETUP_TRANSPORTS = ("http1", "http2", "grpc")
CONCURRENCY = (1, 10, 100)
DELAYS_MS = (0, 20)
SESSION_REQUESTS = 3
REQUEST = ic.InferRequest(
    model="sim",
    id="setup",
    inputs=(ic.Tensor(name="x", datatype="FP32", shape=(1, 4), data=np.ones((1, 4), np.float32)),),
)


class _Env:
    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.servers: dict[tuple[str, bool], server_process.ServerProcess] = {}
        self.proxies: dict[tuple[str, bool], server_process.ServerProcess] = {}
        self.expected = it.SimulatedService(token_stream_source).infer(REQUEST)

    def address(self, transport: str, tls: bool, delay_ms: int) -> tuple[str, it.ClientTls | None]:
        key = (transport, tls)
        if key not in self.servers:
            options = ("--tls",) if tls else ()
            self.servers[key] = server_process.serve(transport, CODEC, *options).start()
        server = self.servers[key]
        client_tls = it.ClientTls(server.ca_pem) if server.ca_pem else None
        if not delay_ms:
            return server.address, client_tls
        if key not in self.proxies:
            self.proxies[key] = server_process.proxy(server.address, delay_ms).start()
        return self.proxies[key].address, client_tls

    def close(self) -> None:
        self.loop.run_until_complete(self.loop.shutdown_asyncgens())
        self.loop.close()
        for process in [*self.proxies.values(), *self.servers.values()]:
            process.stop()


@pytest.fixture(scope="module")
def conn_env() -> Iterator[_Env]:
    env = _Env()
    yield env
    env.close()


@pytest.mark.parametrize("mode", ["new", "reused"])
@pytest.mark.parametrize("delay_ms", DELAYS_MS)
@pytest.mark.parametrize("tls", [False, True], ids=["plain", "tls"])
@pytest.mark.parametrize("concurrency", CONCURRENCY)
@pytest.mark.parametrize("transport", SETUP_TRANSPORTS)
def bench_connection_setup(
    benchmark: Any,
    conn_env: _Env,
    transport: str,
    concurrency: int,
    tls: bool,
    delay_ms: int,
    mode: str,
) -> None:
    if benchmark.disabled and (concurrency > 10 or delay_ms):
        concurrency = min(concurrency, 10)  # one quick pass in CI: every code path, less waiting
    address, client_tls = conn_env.address(transport, tls, delay_ms)
    loop = conn_env.loop
    benchmark.group = f"connection setup {transport}"
    opened = [0]

    async def one_shot() -> Any:
        client = it.connect(transport, address, codec=CODEC, tls=client_tls)
        try:
            return await client.infer(REQUEST)
        finally:
            opened[0] += 1
            await client.close()

    clients: list[it.Client] = []
    if mode == "reused":

        async def open_all() -> None:
            for _ in range(concurrency):
                client = it.connect(transport, address, codec=CODEC, tls=client_tls)
                await client.infer(REQUEST)
                clients.append(client)

        loop.run_until_complete(open_all())

        async def round_() -> list[Any]:
            return list(await asyncio.gather(*(c.infer(REQUEST) for c in clients)))
    else:

        async def round_() -> list[Any]:
            return list(await asyncio.gather(*(one_shot() for _ in range(concurrency))))

    try:
        responses = benchmark.pedantic(
            lambda: loop.run_until_complete(round_()),
            rounds=1 if benchmark.disabled else 5,
            warmup_rounds=0 if benchmark.disabled else 1,
        )
    finally:

        async def close_all() -> None:
            for client in clients:
                await client.close()

        loop.run_until_complete(close_all())
    correct = len(responses) == concurrency and all(r == conn_env.expected for r in responses)
    benchmark.extra_info.update(
        transport=transport,
        codec=CODEC,
        op="connection-setup",
        mode=mode,
        concurrency=concurrency,
        tls=tls,
        delay_ms=delay_ms,
        connections_per_round=concurrency if mode == "new" else 0,
        connections_opened=opened[0],
        correct=correct,
    )
    assert correct, f"{transport} {mode}: wrong responses"


@pytest.mark.parametrize(
    ("transport", "options"),
    [
        ("http1", {"new_connection_per_request": True}),
        ("http1", {}),
        ("http2", {}),
    ],
    ids=["http1-no-keepalive", "http1-keepalive", "http2"],
)
def bench_session_connections(
    benchmark: Any, conn_env: _Env, transport: str, options: dict[str, Any]
) -> None:
    """Connections (TCP handshakes) one user session of ``SESSION_REQUESTS`` requests opens."""
    address, _ = conn_env.address(transport, False, 0)
    loop = conn_env.loop
    counts: list[int] = []

    async def session() -> list[Any]:
        client: Any = it.connect(transport, address, codec=CODEC, **options)
        try:
            responses = [await client.infer(REQUEST) for _ in range(SESSION_REQUESTS)]
        finally:
            await client.close()
        counts.append(client.connections_opened)
        return responses

    responses = benchmark.pedantic(
        lambda: loop.run_until_complete(session()), rounds=1 if benchmark.disabled else 3
    )
    benchmark.group = "session connections"
    correct = all(r == conn_env.expected for r in responses)
    benchmark.extra_info.update(
        transport=transport,
        codec=CODEC,
        op="session-connections",
        mode="no-keepalive" if options else "reused",
        requests=SESSION_REQUESTS,
        connections=max(counts),
        correct=correct,
    )
    assert correct
