"""``inferwire load --metrics-port 0`` as a child process against real servers, scraped over
HTTP while the run goes and during ``--metrics-hold``: the metrics move during the run, and
once the run's JSON report is written they say what it says (requests, errors by kind, tokens,
histogram counts and sums), with nothing left in flight. Against ``inferwire serve`` on our
transports, against one killed mid-run, and against an OpenAI-compatible server written
inside the tests (``--api``). Ctrl-C ends the hold, and the port closes with the command.

No wall-clock assertion: every wait is a poll with a generous bound, and the assertions are
on counts that a slow machine changes the timing of, not the values of.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

import inferwire.transports as it
from inferwire.transports import server_process
from tests.load.load_metrics_helpers import SPEC, assert_agree, parse, value

LOAD = (sys.executable, "-m", "inferwire.cli.main", "load")
TINY = Path(__file__).with_name("tiny_openai_server.py")
TIMEOUT_S = 180.0
"""Bound on any one wait (start-up, the run, the exit): one that fires is a hang."""
HOLD_S = "600"
"""Longer than any test: each ends the hold itself (SIGINT), after reading the final values."""
SCRAPE_EVERY_S = 0.05


class LoadProcess:
    """``inferwire load ARGS --metrics-port 0 --metrics-hold 600 --out FILE`` in a child
    process, its stdout and stderr read by threads as it writes them."""

    def __init__(self, out: Path, *args: str) -> None:
        self.out = out
        self.lines: list[str] = []
        self._changed = threading.Condition()
        metrics = ("--metrics-port", "0", "--metrics-hold", HOLD_S)
        self.process = subprocess.Popen(
            [*LOAD, *args, "--quiet", "--out", str(out), *metrics],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            stdin=subprocess.DEVNULL,
            text=True,
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
        )
        self._readers = [
            threading.Thread(target=self._read, args=(stream,), daemon=True)
            for stream in (self.process.stdout, self.process.stderr)
        ]
        for reader in self._readers:
            reader.start()

    def _read(self, stream: Any) -> None:
        for line in stream:
            with self._changed:
                self.lines.append(line.rstrip("\n"))
                self._changed.notify_all()

    def line(self, pattern: str, timeout_s: float = TIMEOUT_S) -> re.Match[str]:
        """The first line matching ``pattern``, waiting for it."""
        deadline = time.monotonic() + timeout_s
        with self._changed:
            while True:
                for line in self.lines:
                    if found := re.search(pattern, line):
                        return found
                remaining = deadline - time.monotonic()
                if remaining <= 0 or (self.process.poll() is not None and not self._alive()):
                    raise AssertionError(f"no line {pattern!r}: {self.output()}")
                self._changed.wait(min(remaining, 0.5))

    def _alive(self) -> bool:
        return any(reader.is_alive() for reader in self._readers)

    def has(self, pattern: str) -> bool:
        with self._changed:
            return any(re.search(pattern, line) for line in self.lines)

    def output(self) -> str:
        with self._changed:
            return "\n".join(self.lines)

    def url(self) -> str:
        address = self.line(r"^metrics=(\S+)$").group(1)
        return f"http://{address}/metrics"

    def report(self) -> dict[str, Any]:
        self.line(r"^wrote " + re.escape(str(self.out)))
        report: dict[str, Any] = json.loads(self.out.read_text())
        return report

    def end_hold(self) -> int:
        """Ctrl-C, as a user ends the hold; the exit status."""
        self.process.send_signal(signal.SIGINT)
        return self.process.wait(TIMEOUT_S)

    def close(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
        self.process.wait(TIMEOUT_S)
        for reader in self._readers:
            reader.join(TIMEOUT_S)
        for stream in (self.process.stdout, self.process.stderr):
            if stream is not None:
                stream.close()


@contextlib.contextmanager
def load(out: Path, *args: str) -> Iterator[LoadProcess]:
    process = LoadProcess(out, *args)
    try:
        yield process
    finally:
        process.close()


def scrape(url: str) -> dict[str, Any]:
    with urllib.request.urlopen(url, timeout=TIMEOUT_S) as response:
        assert response.headers["Content-Type"].startswith("text/plain")
        return parse(response.read().decode())


def ok(families: dict[str, Any]) -> float:
    return value(families, "inferwire_load_requests_total", outcome="ok")


def in_flight(families: dict[str, Any]) -> float:
    return value(families, "inferwire_load_requests_in_flight")


def watch(
    run: LoadProcess, url: str, *, until: Callable[[dict[str, Any]], bool] | None = None
) -> list[dict[str, Any]]:
    """Scrape until the report is written (or ``until`` holds of a scrape): every scrape."""
    seen: list[dict[str, Any]] = []
    deadline = time.monotonic() + TIMEOUT_S
    while not run.has(r"^wrote "):
        assert time.monotonic() < deadline, run.output()
        assert run.process.poll() is None, run.output()
        seen.append(scrape(url))
        if until is not None and until(seen[-1]):
            break
        time.sleep(SCRAPE_EVERY_S)
    return seen


def assert_final(run: LoadProcess, url: str) -> tuple[dict[str, Any], dict[str, Any]]:
    """The values served during the hold, which the report's, and Ctrl-C's clean end."""
    report = run.report()
    assert run.process.poll() is None, "the metrics are held after the report"
    final = scrape(url)
    assert set(final) == set(SPEC)
    assert_agree(final, report["points"])
    assert run.end_hold() == 0, run.output()
    with pytest.raises(urllib.error.URLError):
        scrape(url)  # the port closed with the command
    return final, report


@pytest.mark.parametrize("transport", ["http2", "tcp"])
def test_a_run_is_watched_live_and_ends_with_its_reports_values(
    transport: str, tmp_path: Path
) -> None:
    with server_process.serve(transport, "orjson", "--decode-ms", "5") as server:
        args = ["--transport", transport, "--address", server.address]
        args += ["--workload", "stream-16", "--rate", "40", "--duration", "5", "--seed", "16"]
        with load(tmp_path / "load.json", *args) as run:
            url = run.url()
            seen = watch(run, url)
            final, report = assert_final(run, url)
    assert report["parameters"]["live_metrics"] is True
    (point,) = report["points"]
    assert point["requests_failed"] == 0, point["errors"]
    assert ok(final) == point["requests_completed"] == point["requests_scheduled"]
    assert value(final, "inferwire_load_output_tokens_total") == 16 * ok(final)
    # watched while it went: counters only grow, and some scrape caught it half-way
    counts = [ok(families) for families in seen]
    assert counts == sorted(counts)
    assert any(0 < count < ok(final) for count in counts), counts
    assert max(in_flight(families) for families in seen) > 0
    assert max(in_flight(families) for families in seen) <= point["max_in_flight"]


def test_a_server_killed_mid_run_shows_as_errors_by_kind(tmp_path: Path) -> None:
    """Streams cut and connections refused are counted by the generator's error names, the
    same as in its report, and the in-flight count comes back to zero."""
    with server_process.serve("tcp", "orjson", "--decode-ms", "5") as server:
        args = ["--transport", "tcp", "--address", server.address, "--workload", "stream-16"]
        args += ["--rate", "40", "--duration", "5", "--seed", "16"]
        with load(tmp_path / "load.json", *args) as run:
            url = run.url()
            watch(run, url, until=lambda families: ok(families) >= 1)
            server.kill()
            seen_after = watch(run, url)
            final, report = assert_final(run, url)
    (point,) = report["points"]
    assert point["requests_completed"] >= 1
    assert point["requests_failed"] > 0
    errors = final["inferwire_load_errors"]["samples"]
    kinds = {dict(labels)["kind"] for (_, labels), count in errors.items() if count}
    assert kinds == set(point["errors"])
    for kind in kinds:  # what a dead server does to a client: the transport's own errors
        assert issubclass(getattr(it, kind), it.TransportError), kind
    assert "ConnectError" in kinds  # sent while nothing listened
    errors_seen = [value(f, "inferwire_load_requests_total", outcome="error") for f in seen_after]
    assert errors_seen == sorted(errors_seen)


def test_a_foreign_openai_server_through_the_api_mode(tmp_path: Path) -> None:
    """Against a server inferwire did not write: tokens as its usage counts them, and the
    requests of the warm-up window (--warmup-s) in no count, as in the report."""
    tiny = subprocess.Popen(
        [sys.executable, str(TINY), "--ttft-ms", "20", "--itl-ms", "5"],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert tiny.stdout is not None
        address = re.search(r"listening on (\S+)", tiny.stdout.readline())
        assert address, "the tiny server did not start"
        args = ["--url", f"http://{address.group(1)}", "--api", "openai-chat"]
        args += ["--model", "paced", "--max-tokens", "6", "--prompts", "synthetic"]
        args += ["--input-tokens", "16", "--rate", "20", "--requests", "40", "--seed", "16"]
        args += ["--warmup-s", "0.5"]
        with load(tmp_path / "api.json", *args) as run:
            url = run.url()
            watch(run, url)
            final, report = assert_final(run, url)
    finally:
        tiny.terminate()
        tiny.wait(TIMEOUT_S)
        if tiny.stdout is not None:
            tiny.stdout.close()
    (point,) = report["points"]
    assert point["requests_failed"] == 0, point["errors"]
    assert point["requests_excluded"] > 0
    assert ok(final) == point["requests_measured"] < point["requests_scheduled"]
    assert value(final, "inferwire_load_output_tokens_total") == 6 * ok(final)
    assert point["token_count"] == {"usage": point["requests_completed"]}
