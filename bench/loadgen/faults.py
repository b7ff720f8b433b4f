"""Faults under load: the open-loop generator runs against a real server process while the
server is killed and restarted, its connections are dropped, or it is stalled; every request
must end up either a verified, whole stream or an error, never a short stream taken for a
whole one, and never counted twice.

Scenarios (each a few seconds at a modest rate, ``stream-16`` paced at 5 ms a token, so a few
streams are in flight at any time):

- ``kill-restart``: SIGKILL the server mid-run, start a new one on the same port a moment
  later. Requests in flight and those sent while it is down fail; the clients reconnect to
  the new server and later requests succeed.
- ``drop``: the generator reaches the server through a :class:`~inferwire.transports.proxy.
  DelayProxy` (no delay) that aborts every open connection, twice a second apart, as a
  middlebox or a network failure would. The streams cut are errors; the clients reconnect.
- ``stall``: SIGSTOP the server for longer than the client's timeout, then SIGCONT. Requests
  waiting on it time out (errors); the run finishes; later requests succeed.

Each run's requests are also watched from outside the generator (:class:`WatchedTarget`):
every stream the transport delivered to its end is compared whole with the chunks sent, so a
success the generator reports is checked twice, and a request seen twice would show.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib
import json
import os
import signal
import time
from collections.abc import AsyncIterator, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

import inferwire.codecs as ic
import inferwire.transports as it
from inferwire.bench.procs import server_process
from inferwire.bench.tables import table
from inferwire.transports.proxy import DelayProxy

from . import metrics, openloop

RAW_NAME: Final = "faults.json"
SCENARIOS: Final = ("kill-restart", "drop", "stall")
WORKLOAD: Final = "stream-16"
DECODE_MS: Final = 5.0
RATE_RPS: Final = 40.0
DURATION_S: Final = 5.0
FAULT_AT_S: Final = 1.0
"""When the fault starts, after the run's first request."""
DROPS: Final = 2
DROP_EVERY_S: Final = 1.0
DOWN_S: Final = 0.3
"""kill-restart: how long the port stays closed before the new server starts."""
TIMEOUT_S: Final = 1.0
"""The clients' timeout (connect, each wait for the server; gRPC: each call's deadline)."""
STALL_S: Final = 2.0
"""stall: how long the server stays stopped, well past the clients' timeout."""
GRACE_S: Final = 1.5
"""After the fault ends: time for the clients to reconnect before every request must succeed
(gRPC's channel retries a lost connection after a backoff of up to a second)."""
DRAIN_TIMEOUT_S: Final = 30.0


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
    run lasts ``duration_s`` (its fault starts after :data:`FAULT_AT_S`)."""
    if scenario not in SCENARIOS:
        raise ValueError(f"unknown scenario {scenario!r}; choose from {SCENARIOS}")
    with _server(transport, codec) as server:
        precise = openloop.select_is_safe(transport, [None])
        with asyncio.Runner(loop_factory=openloop.event_loop_factory(precise)) as runner:
            point, watched, fault = runner.run(
                _drive(scenario, transport, codec, server, duration_s)
            )
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


def plan(transports: Sequence[str] = it.TRANSPORTS) -> list[tuple[str, str]]:
    """Every scenario on every transport."""
    return [(scenario, transport) for scenario in SCENARIOS for transport in transports]


def fault_report(
    transports: Sequence[str] = it.TRANSPORTS, *, duration_s: float = DURATION_S
) -> list[dict[str, Any]]:
    """Run every scenario on every transport: the rows of :func:`render`."""
    return [
        run_scenario(scenario, transport, duration_s=duration_s)
        for scenario, transport in plan(transports)
    ]


def _errors(errors: dict[str, int]) -> str:
    if not errors:
        return "none"
    return ", ".join(f"{n} {name.rsplit('.', 1)[-1]}" for name, n in sorted(errors.items()))


def render(rows: Sequence[dict[str, Any]]) -> str:
    """The rows as a markdown table."""
    header = [
        "fault",
        "transport",
        "scheduled",
        "completed",
        "errors",
        "verified",
        "lost / dup / reord / trunc / altered",
        "ok after recovery",
        "all accounted for",
    ]
    body = []
    for r in rows:
        integrity = r["integrity"]
        counts = " / ".join(str(integrity[kind]) for kind, _ in metrics.INTEGRITY_KINDS)
        cells = [
            r["scenario"],
            f"`{r['transport']}`",
            str(r["scheduled"]),
            str(r["completed"]),
            _errors(r["errors"]),
            str(integrity["verified"]),
            counts,
            f"{r['after_recovery_ok']}/{r['after_recovery']}",
            "yes" if r["accounted"] else "**no**",
        ]
        body.append(cells)
    return table(header, body, left=(0, 1, 4))


def _summary(rows: Sequence[dict[str, Any]]) -> str:
    """What the rows show, in a sentence or two computed from them."""
    total = {
        key: sum(int(r[key]) for r in rows)
        for key in ("scheduled", "completed", "failed", "after_recovery", "after_recovery_ok")
    }
    verified = sum(int(r["integrity"]["verified"]) for r in rows)
    cut = sum(int(r["integrity"]["truncated"]) for r in rows)
    unnoticed = sum(
        r["integrity"][kind] for r in rows for kind in ("lost", "duplicated", "reordered")
    )
    altered = sum(int(r["integrity"]["altered"]) for r in rows)
    accounted = all(r["accounted"] for r in rows) and verified == total["completed"]
    passed_short = sum(int(r["ended_not_whole"]) for r in rows)
    recovered = total["after_recovery_ok"] == total["after_recovery"]
    return (
        f"Over {len(rows)} runs, {total['scheduled']:,} requests were scheduled: "
        f"{total['completed']:,} succeeded and {total['failed']:,} failed, "
        + ("each counted once. " if accounted else "**not each counted once**. ")
        + f"Every success was verified chunk by chunk against the chunks sent ({verified:,} "
        f"streams): {unnoticed} lost, duplicated or reordered, {altered} altered. The "
        f"{cut} streams cut short by a fault were errors, never successes, and "
        + (
            "no transport ended a short stream as a whole one. "
            if passed_short == 0
            else f"**{passed_short} short streams ended as whole ones** (caught by the "
            "generator's verification). "
        )
        + f"Once the server was back, {total['after_recovery_ok']:,} of the "
        f"{total['after_recovery']:,} requests sent after a grace of {GRACE_S:g} s succeeded"
        + ("." if recovered else ": **the clients did not all reconnect**.")
    )


def _machine(info: dict[str, Any]) -> str:
    machine = info.get("machine")
    if not machine:
        return ""
    return (
        f" Machine: {machine['cpus']} logical cores, load average "
        f"{machine['load_average'][0]:.1f} when the first run began."
    )


def _infos(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    return [bench["extra_info"] for bench in json.loads(path.read_text())["benchmarks"]]


def section(raw_dir: Path) -> str:
    """The report's "Bad input and faults" section from ``raw/faults.json`` ("" if absent)."""
    infos = _infos(raw_dir / RAW_NAME)
    rows = [i for i in infos if i.get("op") == "fault"]
    hostile_rows = [r for i in infos if i.get("op") == "hostile-inputs" for r in i["rows"]]
    if not rows and not hostile_rows:
        return ""
    out = ["## Bad input and faults", ""]
    if rows:
        first = rows[0]
        out += [
            "### Faults under load",
            "",
            f"The open-loop generator sends `{first['workload']}` streams (paced at "
            f"{DECODE_MS:g} ms a token) at {first['rate_rps']:g} requests/s for "
            f"{first['duration_s']:g} s to a server in its own process; after "
            f"{FAULT_AT_S:g} s, a fault: *kill-restart* kills the server (SIGKILL) and starts a "
            f"new one on the same port {DOWN_S:g} s later; *drop* aborts every connection "
            f"({DROPS} times, {DROP_EVERY_S:g} s apart) in a proxy between them; *stall* "
            f"stops the server (SIGSTOP) for {STALL_S:g} s, past the clients' "
            f"{first['timeout_s']:g} s timeout (gRPC: a deadline per call). Every stream is "
            "verified as it arrives (sequence numbers, an end marker whose token count "
            "matches, each chunk against the one sent); *verified* are the successes, and "
            "the integrity counts are failed requests by kind (*trunc*: cut before its end "
            "marker, reported by the transport). *ok after recovery*: requests sent from "
            f"{GRACE_S:g} s after the fault ended that succeeded.{_machine(first)}",
            "",
            render(rows),
            "",
            _summary(rows),
            "",
        ]
    if hostile_rows:
        try:
            hostile = importlib.import_module("inferwire.bench.loadgen.bad_inputs")
        except ImportError:
            hostile = None
        if hostile is not None:
            out += [
                "### Bad input",
                "",
                str(hostile.__doc__).split("\n\n")[0].replace("\n", " "),
                "Seeded prefixes, corruptions and lying length headers, fed to each codec; "
                "*other* counts exceptions that escaped the codec (expected 0), and the "
                "slowest decode bounds what one bad input costs.",
                "",
            ]
            out += [hostile.render(hostile_rows).rstrip("\n"), ""]
    return "\n".join(out)
