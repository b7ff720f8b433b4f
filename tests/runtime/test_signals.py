"""Every long-running command ends cleanly on SIGINT and on SIGTERM, even when it was started
with SIGINT ignored, as a shell starts ``cmd &`` (:mod:`inferwire._runtime.signals`).

Each command runs as a real child process under ``sh -c 'trap "" INT; exec ...'`` (the
disposition a background job inherits), started and read as every child is
(:class:`~inferwire._runtime.child.ChildProcess`); the test signals it, and checks its exit
status, that its sockets are closed and that what it owes was written. No wall-clock
assertion: every wait has a generous bound, one that fires is a hang.
"""

from __future__ import annotations

import asyncio
import importlib.util
import json
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Final

import pytest

from inferwire._runtime import signals
from inferwire._runtime.child import ChildProcess

TIMEOUT_S: Final = 120.0
IGNORING_SIGINT: Final = ("sh", "-c", 'trap "" INT; exec "$@"', "sh")
"""Runs its arguments with SIGINT ignored, as a shell runs a background job."""
CLI: Final = (*IGNORING_SIGINT, sys.executable, "-m", "inferwire.cli")
LISTENING: Final = re.compile(r"listening on \[?([0-9a-fA-F.:]+?)\]?:(\d+)")
ENDED: Final = {signal.SIGINT: "SIGINT", signal.SIGTERM: "SIGTERM"}


def _needs(module: str) -> None:
    if importlib.util.find_spec(module) is None:
        pytest.skip(f"{module} is not installed")


def _end(child: ChildProcess, sig: signal.Signals) -> tuple[int, str, str]:
    """Sends ``sig``; the exit status, and what the child wrote to stderr and to stdout
    after its announcement."""
    process = child.process
    assert process is not None
    process.send_signal(sig)
    try:
        stdout, stderr = process.communicate(timeout=TIMEOUT_S)
    finally:
        child.stop()  # SIGKILL if it hung, and the pipes closed
    return process.returncode, stderr or "", stdout or ""


def _refused(host: str, port: int) -> bool:
    try:
        with socket.create_connection((host, port), timeout=TIMEOUT_S):
            return False
    except ConnectionRefusedError:
        return True


@pytest.fixture
def server() -> Iterator[str]:
    """``inferwire serve --transport tcp``, for the load generator: its address."""
    child = ChildProcess(
        [*CLI, "serve", "--transport", "tcp", "--no-metrics", "--decode-ms", "1"], LISTENING
    )
    with child:
        host, port = child.announcement.groups()
        yield f"{host}:{port}"


def test_the_wrapper_starts_a_command_with_sigint_ignored() -> None:
    """What the tests below rely on: without a handler of its own, the child's SIGINT is
    ignored (so KeyboardInterrupt would never come)."""
    code = "import signal; print(signal.getsignal(signal.SIGINT) is signal.SIG_IGN)"
    done = subprocess.run(
        [*IGNORING_SIGINT, sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=TIMEOUT_S,
        check=True,
    )
    assert done.stdout.strip() == "True"


@pytest.mark.parametrize("sig", list(ENDED), ids=list(ENDED.values()))
@pytest.mark.parametrize("command", ["serve", "proxy"])
def test_serve_and_proxy_end_on_the_signal(command: str, sig: signal.Signals) -> None:
    if command == "serve":
        args = ["serve", "--transport", "tcp", "--no-metrics", "--loop", "asyncio"]
    else:  # an upstream that refuses: a warning, and the proxy listens all the same
        args = ["proxy", "--upstream", "127.0.0.1:9", "--delay-ms", "0", "--loop", "asyncio"]
    child = ChildProcess([*CLI, *args], LISTENING, stderr=subprocess.PIPE).start()
    host, port = child.announcement.group(1), int(child.announcement.group(2))
    status, stderr, _ = _end(child, sig)
    assert status == 0, stderr
    assert "Traceback" not in stderr
    assert _refused(host, port)


@pytest.mark.parametrize("sig", list(ENDED), ids=list(ENDED.values()))
def test_the_engine_ends_on_the_signal(sig: signal.Signals) -> None:
    _needs("zmq")
    announcement = re.compile(r"listening on tcp://([0-9.]+):(\d+) ")
    args = ["engine", "--endpoint", "tcp://127.0.0.1:0", "--heartbeat-interval", "0.2"]
    child = ChildProcess([*CLI, *args], announcement, stderr=subprocess.PIPE).start()
    host, port = child.announcement.group(1), int(child.announcement.group(2))
    status, stderr, _ = _end(child, sig)
    assert status == 0, stderr
    assert "Traceback" not in stderr
    assert _refused(host, port)


@pytest.mark.parametrize("sig", list(ENDED), ids=list(ENDED.values()))
def test_trace_collect_ends_on_the_signal(sig: signal.Signals, tmp_path: Path) -> None:
    _needs("opentelemetry")
    spans = tmp_path / "spans.jsonl"
    args = ["trace", "collect", "--listen", "127.0.0.1:0", "--out", str(spans)]
    child = ChildProcess([*CLI, *args], LISTENING, stderr=subprocess.PIPE).start()
    host, port = child.announcement.group(1), int(child.announcement.group(2))
    status, stderr, _ = _end(child, sig)
    assert status == 0, stderr
    assert "0 exports, 0 spans" in stderr  # its summary, written on the way out
    assert "Traceback" not in stderr
    assert _refused(host, port)


@pytest.mark.parametrize("sig", list(ENDED), ids=list(ENDED.values()))
def test_the_load_generator_s_hold_ends_on_the_signal(
    sig: signal.Signals, server: str, tmp_path: Path
) -> None:
    """The run ends, its report is written, the metrics are held: the signal ends the hold,
    and the command, with the run's status."""
    _needs("hdrh")
    out = tmp_path / "load.json"
    args = ["load", "--transport", "tcp", "--address", server, "--requests", "20"]
    args += ["--rate", "100", "--warmup", "1", "--quiet", "--out", str(out)]
    args += ["--metrics-port", "0", "--metrics-hold", "600"]
    # the summary of the one point is its first line on stdout: the run is over
    child = ChildProcess([*CLI, *args], re.compile(r"^rate "), stderr=subprocess.PIPE).start()
    status, stderr, _ = _end(child, sig)
    assert status == 0, stderr
    metrics = re.search(r"^metrics=([0-9.]+):(\d+)$", stderr, re.MULTILINE)
    assert metrics, stderr
    assert _refused(metrics.group(1), int(metrics.group(2)))
    report = json.loads(out.read_text())
    (point,) = report["points"]
    assert point["requests_completed"] == 20
    assert "stopped_by" not in report


@pytest.mark.parametrize("sig", list(ENDED), ids=list(ENDED.values()))
def test_a_load_run_stopped_half_way_writes_what_it_owes(
    sig: signal.Signals, server: str, tmp_path: Path
) -> None:
    """Stopped during its point: the records of the requests so far and the report (no point
    ended) are written, and the status is 128 + the signal's number."""
    _needs("hdrh")
    out = tmp_path / "load.json"
    args = ["load", "--transport", "tcp", "--address", server, "--duration", "600"]
    args += ["--rate", "5", "--warmup", "1", "--quiet", "--out", str(out)]
    args += ["--records", "-"]  # one JSON line per request on stdout: the first says it runs
    child = ChildProcess([*CLI, *args], re.compile(r"^\{"), stderr=subprocess.PIPE).start()
    first = json.loads(child.announcement.string)
    status, stderr, stdout = _end(child, sig)
    assert status == 128 + sig, stderr
    assert f"stopped by {ENDED[sig]}" in stderr
    assert "Traceback" not in stderr
    report = json.loads(out.read_text())
    assert report["stopped_by"] == ENDED[sig]
    assert report["points"] == []  # the point under way is dropped, not reported half-done
    # the records so far, every line whole: the output was closed, not cut
    records = [first, *(json.loads(line) for line in stdout.splitlines())]
    assert {"index", "ok"} <= set(records[-1])


# -- the helper itself, in this process --------------------------------------------------------


@pytest.fixture
def sigint_ignored() -> Iterator[None]:
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)


@pytest.mark.parametrize("sig", list(ENDED), ids=list(ENDED.values()))
def test_handled_raises_stopped_and_restores_what_it_found(
    sig: signal.Signals, sigint_ignored: None
) -> None:
    before = {s: signal.getsignal(s) for s in ENDED}

    def signalled() -> None:
        os.kill(os.getpid(), sig)
        time.sleep(TIMEOUT_S)  # the handler raises in it, at the latest

    with pytest.raises(signals.Stopped) as stopped, signals.handled():
        signalled()
    assert stopped.value.signum == sig
    assert {s: signal.getsignal(s) for s in ENDED} == before


def test_a_stop_signal_ends_a_wait(sigint_ignored: None) -> None:
    stop = signals.StopSignal()
    timer = threading.Timer(0.2, os.kill, (os.getpid(), signal.SIGINT))
    with signals.handled(stop):
        timer.start()
        try:
            assert stop.wait(TIMEOUT_S) is True
        finally:
            timer.cancel()
    assert stop.name == "SIGINT"


def test_a_stop_signal_waits_out_its_time_when_none_comes() -> None:
    stop = signals.StopSignal()
    with signals.handled(stop):
        assert stop.wait(0.01) is False
    assert not stop.received
    assert stop.name == ""


def test_the_loop_s_event_is_set_by_an_ignored_sigint(sigint_ignored: None) -> None:
    seen: list[int] = []

    async def main() -> None:
        with signals.stop_event(seen.append) as stop:
            asyncio.get_running_loop().call_later(0.05, os.kill, os.getpid(), signal.SIGINT)
            await asyncio.wait_for(stop.wait(), TIMEOUT_S)
        # the disposition it found is back, while the loop still runs
        assert signal.getsignal(signal.SIGINT) is signal.SIG_IGN

    asyncio.run(main())
    assert seen == [signal.SIGINT]
