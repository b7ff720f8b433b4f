"""Connection setup: what a new connection per request costs against a reused one, at 1, 10
and 100 concurrent clients, with and without TLS, with and without 20 ms of one-way delay
(the WAN-delay proxy), per transport (claims C5 and C6).

One round: ``concurrency`` clients each make one small infer request at once. *new*: each
request opens its own connection (a new client: TCP handshake, TLS handshake, HTTP/2 preface
or gRPC channel setup) and closes it; *reused*: each client's connection was opened before
the timing and is kept. One benchmark per cell times both, in pairs of rounds that alternate
their order (new then reused, then reused then new, ...): ``saved`` is the median over the
``PAIRS`` pairs of 1 - reused / new, so a drift of the machine between two separately timed
benchmarks cannot show as a saving. The reused clients stay open, idle, through the new
rounds. ``extra_info`` records the connections the new rounds opened, and the loops the
client, the server and the proxy ran on (the run's,
:func:`~inferwire.bench.procs.loops.requested_loop`).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest

import inferwire.codecs as ic
import inferwire.transports as it
from inferwire._runtime import loops
from inferwire.transports import server_process
from inferwire.workloads import token_stream_source

CODEC = "protobuf"
SETUP_TRANSPORTS = ("http1", "http2", "grpc")
CONCURRENCY = (1, 10, 100)
DELAYS_MS = (0, 20)
SESSION_REQUESTS = 3
PAIRS = 7
"""New/reused pairs per cell after one untimed pair: 14 timed rounds, 7 of each."""
REQUEST = ic.InferRequest(
    model="sim",
    id="setup",
    inputs=(ic.Tensor(name="x", datatype="FP32", shape=(1, 4), data=np.ones((1, 4), np.float32)),),
)


class _Env:
    def __init__(self) -> None:
        self.loop = loops.new_event_loop(loops.requested_loop())
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

    def loop_info(self, transport: str, tls: bool, delay_ms: int) -> dict[str, str]:
        """The loops of a cell: this client's as it runs, its server's (and proxy's) as
        announced."""
        info = {"loop": loops.kind(self.loop), "server_loop": self.servers[transport, tls].loop}
        if delay_ms:
            info["proxy_loop"] = self.proxies[transport, tls].loop
        return info

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
) -> None:
    quick = benchmark.disabled
    if quick and (concurrency > 10 or delay_ms):
        concurrency = min(concurrency, 10)  # one quick pass in CI: every code path, less waiting
    pairs = 1 if quick else PAIRS
    warmup_pairs = 0 if quick else 1
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

    async def open_all() -> None:
        # at once, as a round does: one by one, 100 handshakes through the 20 ms proxy would
        # take longer than every timed round of the cell
        clients.extend(
            it.connect(transport, address, codec=CODEC, tls=client_tls) for _ in range(concurrency)
        )
        await asyncio.gather(*(client.infer(REQUEST) for client in clients))

    async def new_round() -> list[Any]:
        return list(await asyncio.gather(*(one_shot() for _ in range(concurrency))))

    async def reused_round() -> list[Any]:
        return list(await asyncio.gather(*(c.infer(REQUEST) for c in clients)))

    rounds = {"new": new_round, "reused": reused_round}
    times_s: dict[str, list[float]] = {"new": [], "reused": []}
    outputs: list[bool] = []

    def pair() -> None:
        # alternate which mode goes first, so a drift of the machine within a pair cancels
        order = ("new", "reused") if len(times_s["new"]) % 2 == 0 else ("reused", "new")
        for mode in order:
            start = time.perf_counter()
            responses = loop.run_until_complete(rounds[mode]())
            times_s[mode].append(time.perf_counter() - start)
            outputs.append(
                len(responses) == concurrency and all(r == conn_env.expected for r in responses)
            )

    async def close_all() -> None:
        for client in clients:
            await client.close()

    try:
        loop.run_until_complete(open_all())
        benchmark.pedantic(pair, rounds=pairs, warmup_rounds=warmup_pairs)
    finally:
        loop.run_until_complete(close_all())
    new, reused = (np.asarray(times_s[m][warmup_pairs:]) for m in ("new", "reused"))
    correct = all(outputs) and len(outputs) == 2 * (pairs + warmup_pairs)
    benchmark.extra_info.update(
        transport=transport,
        codec=CODEC,
        op="connection-setup",
        concurrency=concurrency,
        tls=tls,
        delay_ms=delay_ms,
        pairs=pairs,
        new_ms=float(np.median(new)) * 1e3,
        reused_ms=float(np.median(reused)) * 1e3,
        saved=float(np.median(1 - reused / new)),
        connections_per_round=concurrency,
        connections_opened=opened[0],
        correct=correct and opened[0] == concurrency * (pairs + warmup_pairs),
        **conn_env.loop_info(transport, tls, delay_ms),
    )
    assert benchmark.extra_info["correct"], f"{transport}: wrong responses or connections"


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
        **conn_env.loop_info(transport, False, 0),
    )
    assert correct
