"""Faults under load: the open-loop generator runs against a real server process while the
server is killed and restarted, its connections are dropped, or it is stalled (the scenarios
of :mod:`inferwire.load.fault_plan`); every request must end up either a verified,
whole stream or an error, never a short stream taken for a whole one, and never counted twice.

Each run's requests are also watched from outside the generator (:class:`WatchedTarget`):
every stream the transport delivered to its end is compared whole with the chunks sent, so a
success the generator reports is checked twice, and a request seen twice would show.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import time
from collections.abc import AsyncIterator, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import inferwire.codecs as ic
import inferwire.transports as it
from inferwire._runtime import loops
from inferwire.transports import server_process
from inferwire.transports.proxy import DelayProxy

from . import metrics, openloop
from .fault_plan import (
    AFTER_RECOVERY_S,
    DECODE_MS,
    DOWN_S,
    DRAIN_TIMEOUT_S,
    DROP_EVERY_S,
    DROPS,
    DURATION_S,
    FAULT_AT_S,
    GRACE_S,
    RATE_RPS,
    SCENARIOS,
    STALL_S,
    TIMEOUT_S,
    WORKLOAD,
    plan,
)


@dataclass
class Outcome:
    """One request as the target saw it: when it started, whether its stream reached its end,
    and whether what arrived was exactly the chunks sent."""

    started_s: float
    ended: bool = False
    whole: bool = False
    error: str = ""


class WatchedTarget:
    """A target that passes every stream through and notes each request's :class:`Outcome`."""

    def __init__(self, target: openloop.Target, expected: Sequence[ic.TokenChunk]) -> None:
        self.target = target
        self.expected = list(expected)
        self.outcomes: list[Outcome] = []
        self.clock_start = time.monotonic()

    async def generate(self, request: it.GenerateRequest, /) -> AsyncIterator[ic.TokenChunk]:
        outcome = Outcome(time.monotonic() - self.clock_start)
        self.outcomes.append(outcome)
        received: list[ic.TokenChunk] = []
        try:
            async for chunk in self.target.generate(request):
                received.append(chunk)
                yield chunk
        except Exception as exc:
            outcome.error = type(exc).__name__
            raise
        outcome.ended = True
        outcome.whole = received == self.expected

    async def close(self) -> None:
        await self.target.close()


@dataclass
class Fault:
    """When a scenario's fault began and ended, in seconds of the watched target's clock."""

    started_s: float = float("nan")
    ended_s: float = float("nan")
    notes: list[str] = field(default_factory=list)


def _server_options() -> tuple[str, ...]:
    return ("--decode-ms", str(DECODE_MS))


@contextlib.contextmanager
def _server(transport: str, codec: str) -> Iterator[server_process.ServerProcess]:
    server = server_process.serve(transport, codec, *_server_options())
    try:
        yield server.start()
    finally:
        server.stop()


def _target(transport: str, address: str, codec: str) -> openloop.Target:
    limits = it.Limits(timeout_s=TIMEOUT_S)
    if transport == "grpc":  # grpc's bound is a deadline per call, not a timeout per read
        return it.connect(transport, address, codec=codec, limits=limits, deadline_s=TIMEOUT_S)
    return openloop.open_target(transport, address, codec, limits=limits)


async def _kill_restart(
    server: server_process.ServerProcess,
    transport: str,
    codec: str,
    watched: WatchedTarget,
    fault: Fault,
) -> server_process.ServerProcess:
    """Kill ``server`` at the fault time, start another on its port; returns the new one."""
    await asyncio.sleep(FAULT_AT_S)
    fault.started_s = time.monotonic() - watched.clock_start
    await asyncio.to_thread(server.kill)
    await asyncio.sleep(DOWN_S)
    again = server_process.serve(transport, codec, "--port", str(server.port), *_server_options())
    await asyncio.to_thread(again.start)
    fault.ended_s = time.monotonic() - watched.clock_start
    return again


async def _drop(proxy: DelayProxy, watched: WatchedTarget, fault: Fault) -> None:
    await asyncio.sleep(FAULT_AT_S)
    fault.started_s = time.monotonic() - watched.clock_start
    for turn in range(DROPS):
        if turn:
            await asyncio.sleep(DROP_EVERY_S)
        fault.notes.append(f"{proxy.drop_connections()} connections dropped")
        fault.ended_s = time.monotonic() - watched.clock_start


async def _stall(
    server: server_process.ServerProcess, watched: WatchedTarget, fault: Fault
) -> None:
    assert server.process is not None
    pid = server.process.pid
    await asyncio.sleep(FAULT_AT_S)
    fault.started_s = time.monotonic() - watched.clock_start
    os.kill(pid, signal.SIGSTOP)
    try:
        await asyncio.sleep(STALL_S)
    finally:
        os.kill(pid, signal.SIGCONT)
    fault.ended_s = time.monotonic() - watched.clock_start


async def _drive(
    scenario: str,
    transport: str,
    codec: str,
    server: server_process.ServerProcess,
    duration_s: float,
) -> tuple[dict[str, Any], WatchedTarget, Fault]:
    spec = openloop.LoadSpec(
        workload=WORKLOAD, duration_s=duration_s, seed=11, drain_timeout_s=DRAIN_TIMEOUT_S
    )
    expected = spec.expected_chunks()
    assert expected is not None
    fault = Fault()
    proxy = None
    address = server.address
    if scenario == "drop":
        proxy = DelayProxy((server.host, server.port), delay_s=0.0)
        host, port = await proxy.start()
        address = f"{host}:{port}"
    watched = WatchedTarget(_target(transport, address, codec), expected)
    replacement: server_process.ServerProcess | None = None
    try:
        await openloop.warm_up(watched.target, spec.request(), 4)
        watched.clock_start = time.monotonic()
        if scenario == "kill-restart":
            injecting: asyncio.Task[Any] = asyncio.ensure_future(
                _kill_restart(server, transport, codec, watched, fault)
            )
        elif scenario == "drop":
            assert proxy is not None
            injecting = asyncio.ensure_future(_drop(proxy, watched, fault))
        elif scenario == "stall":
            injecting = asyncio.ensure_future(_stall(server, watched, fault))
        else:
            raise ValueError(f"unknown scenario {scenario!r}; choose from {SCENARIOS}")
        try:
            point = await openloop.run_point(watched, spec, rate_rps=RATE_RPS, expected=expected)
        finally:
            result = await asyncio.gather(injecting, return_exceptions=True)
        if isinstance(result[0], server_process.ServerProcess):
            replacement = result[0]
        elif isinstance(result[0], BaseException):
            raise result[0]
    finally:
        await watched.close()
        if proxy is not None:
            await proxy.stop()
        if replacement is not None:
            await asyncio.to_thread(replacement.stop)
    return point, watched, fault


def run_scenario(
    scenario: str, transport: str, codec: str = "orjson", *, duration_s: float = DURATION_S
) -> dict[str, Any]:
    """One scenario against one transport's server (started here): a row of the table. The
    run lasts ``duration_s`` (its fault starts after :data:`FAULT_AT_S`); a kill-restart run
    lasts longer where a server is slow to start (a busy machine: 3.7 s once under a load
    average of 60), so that requests are still due once the replacement is up and the grace
    is over (the row's ``duration_s`` says how long it ran)."""
    if scenario not in SCENARIOS:
        raise ValueError(f"unknown scenario {scenario!r}; choose from {SCENARIOS}")
    starting = time.monotonic()
    with _server(transport, codec) as server:
        start_s = time.monotonic() - starting
        if scenario == "kill-restart":  # its replacement may start twice as slowly
            recovered_s = FAULT_AT_S + DOWN_S + 2 * start_s + GRACE_S
            duration_s = max(duration_s, recovered_s + AFTER_RECOVERY_S)
        drive = _drive(scenario, transport, codec, server, duration_s)
        point, watched, fault = loops.run(drive, loops.requested_loop())
    return row(scenario, transport, codec, point, watched, fault, duration_s)


def row(
    scenario: str,
    transport: str,
    codec: str,
    point: dict[str, Any],
    watched: WatchedTarget,
    fault: Fault,
    duration_s: float,
) -> dict[str, Any]:
    """What one run shows: counts from the generator's point and from the watched target."""
    outcomes = watched.outcomes
    scheduled = int(point["requests_scheduled"])
    completed = int(point["requests_completed"])
    failed = int(point["requests_failed"])
    whole = sum(o.whole for o in outcomes)
    recovered_from_s = fault.ended_s + GRACE_S
    after = [o for o in outcomes if o.started_s >= recovered_from_s]
    during = [o for o in outcomes if fault.started_s <= o.started_s < recovered_from_s]
    return {
        "scenario": scenario,
        "transport": transport,
        "codec": codec,
        "workload": WORKLOAD,
        "rate_rps": RATE_RPS,
        "duration_s": duration_s,
        "timeout_s": TIMEOUT_S,
        "loop": point["loop"],
        "fault_started_s": round(fault.started_s, 3),
        "fault_ended_s": round(fault.ended_s, 3),
        "notes": fault.notes,
        "scheduled": scheduled,
        "completed": completed,
        "failed": failed,
        "errors": point["errors"],
        "error_examples": point["error_examples"],
        "integrity": point["integrity"],
        "violations": metrics.integrity_violations(point["integrity"]),
        "requests_seen": len(outcomes),
        "streams_whole": whole,
        "ended_not_whole": sum(o.ended and not o.whole for o in outcomes),
        "during_fault": len(during),
        "during_fault_ok": sum(o.whole for o in during),
        "after_recovery": len(after),
        "after_recovery_ok": sum(o.whole for o in after),
        # every request is counted once, as a success or an error, and the successes are
        # exactly the streams that arrived whole
        "accounted": completed + failed == scheduled == len(outcomes) and completed == whole,
    }


def fault_report(
    transports: Sequence[str] = it.TRANSPORTS, *, duration_s: float = DURATION_S
) -> list[dict[str, Any]]:
    """Run every scenario on every transport: the rows of the report's faults table."""
    return [
        run_scenario(scenario, transport, duration_s=duration_s)
        for scenario, transport in plan(transports)
    ]
