"""Faults under load, on real server processes: the open-loop generator runs a few seconds at
40 requests/s while the server is killed and restarted on its port, its connections are
dropped, or it is stopped for longer than the clients' timeout
(:mod:`inferwire.load.faults`).

What must hold whatever the fault: every request is counted once, as a success or an error;
every success is a whole, verified stream (checked by the generator, and again from outside
it); the requests the fault hit are errors of the transport's own classes; the run finishes;
and once the server is back, the clients reconnect and every later request succeeds.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

import inferwire.transports as it
from inferwire.bench.report import faults as report_faults
from inferwire.load import fault_plan, faults, load_command, metrics, openloop
from inferwire.transports import server_process

TIMEOUT_S = 120.0
"""Outer bound on one scenario (each runs about 6 s): a bound that fires is a hang."""
ALLOWED: dict[str, set[str]] = {
    # in flight when it died (cut streams, a request sent but never answered), then refused
    "kill-restart": {"StreamTruncatedError", "ProtocolError", "ConnectError"},
    "drop": {"StreamTruncatedError", "ProtocolError"},
    "stall": {"TransportTimeoutError"},
}


def _run(scenario: str, transport: str) -> dict[str, Any]:
    row = faults.run_scenario(scenario, transport)
    print(report_faults.render([row]))
    print(row["error_examples"])
    return row


def _check(row: dict[str, Any]) -> None:
    integrity = row["integrity"]
    # every request once: a success or an error, and the successes are the whole streams
    assert row["accounted"], row
    assert row["requests_seen"] == row["scheduled"] == row["completed"] + row["failed"]
    assert row["streams_whole"] == row["completed"] == integrity["verified"]
    assert row["ended_not_whole"] == 0  # no transport ended a short stream as a whole one
    assert integrity["content_checked"] is True
    # the fault hit some requests, as errors of the transport's own classes
    assert row["failed"] > 0
    assert set(row["errors"]) <= ALLOWED[row["scenario"]], row["error_examples"]
    for name in row["errors"]:
        assert issubclass(getattr(it, name), it.TransportError), name
    # nothing was lost, repeated, reordered or altered; what was cut was caught and counted
    assert integrity["lost"] == integrity["duplicated"] == integrity["reordered"] == 0
    assert integrity["altered"] == 0
    assert integrity["truncated"] == row["errors"].get("StreamTruncatedError", 0)
    # the clients reconnected: every request after the fault (and a grace) succeeded
    assert row["after_recovery"] > 0, row
    assert row["after_recovery_ok"] == row["after_recovery"], row


@pytest.mark.parametrize("transport", it.TRANSPORTS)
def test_kill_and_restart_mid_run(transport: str) -> None:
    row = _run("kill-restart", transport)
    _check(row)
    assert row["errors"].get("ConnectError", 0) > 0  # sent while nothing listened


@pytest.mark.parametrize("transport", ["tcp", "http2"])
def test_dropped_connections_mid_run(transport: str) -> None:
    row = _run("drop", transport)
    _check(row)
    assert all(note.split()[0] != "0" for note in row["notes"]), row["notes"]


@pytest.mark.parametrize("transport", ["http1", "grpc"])
def test_a_stalled_server_times_requests_out(transport: str) -> None:
    row = _run("stall", transport)
    _check(row)
    # the requests due during the stop waited for it: all timed out, none passed as done
    assert row["errors"]["TransportTimeoutError"] >= fault_plan.RATE_RPS * fault_plan.TIMEOUT_S / 2


def test_a_healthy_run_has_nothing_to_report() -> None:
    """No fault: every stream verified against the chunks sent, every count zero."""
    spec = openloop.LoadSpec(workload="stream-16", max_tokens=10, duration_s=1.0, seed=3)

    async def run(address: str) -> dict[str, Any]:
        target = openloop.open_target("http2", address, "protobuf")
        try:
            return await openloop.run_point(
                target, spec, rate_rps=50.0, expected=spec.expected_chunks()
            )
        finally:
            await target.close()

    with server_process.serve("http2", "protobuf") as server:
        point = asyncio.run(asyncio.wait_for(run(server.address), TIMEOUT_S))
    assert point["requests_failed"] == 0, point["errors"]
    assert point["requests_completed"] == point["requests_scheduled"] > 0
    integrity = point["integrity"]
    assert integrity["verified"] == point["requests_completed"]
    assert integrity["content_checked"] is True
    assert metrics.integrity_violations(integrity) == 0
    assert point["output_tokens"] == 10 * point["requests_completed"]  # cut after 10 tokens
    assert "0 lost, 0 duplicated, 0 reordered, 0 truncated, 0 altered" in load_command.summary_line(
        point
    )
