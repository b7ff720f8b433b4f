"""A real Prometheus (Debian's package, started here on loopback with a generated config)
scrapes a real server and a real load generator while the server is stopped for a few seconds
(SIGSTOP): the client's P99 end-to-end alert goes pending, fires, and resolves once the stall
is a window behind; every query of the shipped Grafana dashboard returns data through
Prometheus' HTTP API while the run goes on.

The rules are the generator's with a short window (10 s), ``for: 2s`` and a 1 s evaluation
interval, so the test takes about a minute; the shipped defaults are checked by promtool's
unit test (test_watch_rules.py)."""

from __future__ import annotations

import contextlib
import json
import math
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, Final, TypeVar

import pytest

from inferwire.observe.watch import dashboard, prometheus_config, rules

PROMETHEUS: Final = shutil.which("prometheus")
pytestmark = pytest.mark.skipif(
    PROMETHEUS is None,
    reason="the prometheus server is not installed (Debian's prometheus; make sysdeps)",
)

ALERT: Final = "InferwireClientE2ELatencyHigh"
WINDOW: Final = "10s"
STALL_S: Final = 4.0
RATE_RPS: Final = 20
RUN_S: Final = 150
"""Long enough for every phase below even on a slow machine; the run is stopped once done."""
WAIT_S: Final = 90.0
"""Generous bound on each wait (the phases take seconds on a quiet machine)."""
LISTENING: Final = re.compile(r"listening on ([0-9.]+):(\d+)")
METRICS: Final = re.compile(r"metrics=([0-9.]+):(\d+)")

T = TypeVar("T")


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


def _inferwire(*args: str) -> list[str]:
    return [sys.executable, "-m", "inferwire.cli.main", *args]


def _until(what: str, check: Callable[[], T | None], timeout_s: float = WAIT_S) -> T:
    """Polls ``check`` until it returns something other than None."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = check()
        if value is not None:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.25)


class Prometheus:
    def __init__(self, port: int) -> None:
        self.base = f"http://127.0.0.1:{port}"

    def _get(self, path: str, **params: str) -> Any:
        url = f"{self.base}{path}?{urllib.parse.urlencode(params)}"
        with urllib.request.urlopen(url, timeout=10) as response:
            body = json.load(response)
        assert body["status"] == "success", body
        return body["data"]

    def ready(self) -> bool:
        try:
            with urllib.request.urlopen(f"{self.base}/-/ready", timeout=2) as response:
                return bool(response.status == 200)
        except (urllib.error.URLError, OSError):
            return False

    def query(self, expr: str) -> list[dict[str, Any]]:
        result: list[dict[str, Any]] = self._get("/api/v1/query", query=expr)["result"]
        return result

    def targets_up(self) -> bool:
        active = self._get("/api/v1/targets")["activeTargets"]
        return len(active) == 2 and all(t["health"] == "up" for t in active)

    def alert_state(self, name: str) -> str:
        """``inactive``, ``pending`` or ``firing`` (the worst of the alert's series)."""
        alerts = self._get("/api/v1/alerts")["alerts"]
        states = {a["state"] for a in alerts if a["labels"]["alertname"] == name}
        for state in ("firing", "pending"):
            if state in states:
                return state
        return "inactive"


@contextlib.contextmanager
def _process(args: list[str], **kwargs: Any) -> Iterator[subprocess.Popen[str]]:
    process = subprocess.Popen(args, text=True, **kwargs)
    try:
        yield process
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(process.pid, signal.SIGCONT)
        if process.poll() is None:
            process.terminate()
            try:
                process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait(timeout=30)
        for pipe in (process.stdout, process.stderr):
            if pipe is not None:
                pipe.close()


def queries_of(settings: rules.AlertSettings) -> list[str]:
    """Each alert's quantile expression, without its comparison."""
    return [rules.quantile_expression(alert, settings) for alert in rules.ALERTS]


def _finite(result: list[dict[str, Any]]) -> bool:
    return any(math.isfinite(float(series["value"][1])) for series in result)


def test_a_stall_fires_the_alert_and_every_dashboard_query_has_data(tmp_path: Path) -> None:
    assert PROMETHEUS is not None
    with _process(
        _inferwire(
            "serve", "--transport", "http1", "--codec", "orjson", "--decode-ms", "2",
            "--loop", "asyncio",
        ),
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
    ) as server:  # fmt: skip
        assert server.stdout is not None
        announced = LISTENING.search(server.stdout.readline())
        assert announced, "the server did not announce its address"
        server_address = f"{announced[1]}:{announced[2]}"
        load_metrics = f"127.0.0.1:{_free_port()}"
        prometheus_port = _free_port()

        settings = rules.AlertSettings(window=WINDOW, hold="2s", evaluation_interval="1s")
        (tmp_path / "alerts.yml").write_text(rules.rules(settings))
        (tmp_path / "prometheus.yml").write_text(
            prometheus_config.config(
                prometheus_config.ScrapeSettings(
                    servers=(server_address,), loads=(load_metrics,), scrape_interval="1s"
                )
            )
        )
        with (
            _process(
                [
                    PROMETHEUS,
                    f"--config.file={tmp_path / 'prometheus.yml'}",
                    f"--storage.tsdb.path={tmp_path / 'data'}",
                    f"--web.listen-address=127.0.0.1:{prometheus_port}",
                    "--log.level=warn",
                ],
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            ),
            _process(
                _inferwire(
                    "load", "--transport", "http1", "--codec", "orjson",
                    "--address", server_address, "--workload", "stream-16",
                    "--rate", str(RATE_RPS), "--duration", str(RUN_S), "--quiet",
                    "--metrics-port", load_metrics.rsplit(":", 1)[1],
                    "--loop", "asyncio",
                ),
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            ),
        ):  # fmt: skip
            prometheus = Prometheus(prometheus_port)
            _until("prometheus to start", lambda: True if prometheus.ready() else None)
            _until("both targets up", lambda: True if prometheus.targets_up() else None)
            # some requests finished in the window, and no alert yet
            client_p99 = queries_of(settings)[0]
            _until(
                "a client P99 from the scrapes",
                lambda: True if _finite(prometheus.query(client_p99)) else None,
            )
            # every dashboard query returns data while the run goes on (a rate needs two
            # scrapes of a target inside the window: polled until they are there)
            missing: list[str] = []

            def all_have_data() -> bool | None:
                missing[:] = [
                    expr
                    for expr in dashboard.every_query()
                    if not prometheus.query(expr.replace(dashboard.RATE_WINDOW, WINDOW))
                ]
                return True if not missing else None

            try:
                _until("every dashboard query to return data", all_have_data)
            except AssertionError:
                raise AssertionError(f"dashboard queries without data: {missing}") from None
            assert prometheus.alert_state(ALERT) == "inactive"

            os.kill(server.pid, signal.SIGSTOP)
            time.sleep(STALL_S)
            os.kill(server.pid, signal.SIGCONT)

            seen = {prometheus.alert_state(ALERT)}

            def fired() -> bool | None:
                seen.add(prometheus.alert_state(ALERT))
                return True if "firing" in seen else None

            _until("the alert to fire", fired)
            assert "pending" in seen or "firing" in seen
            _until(
                "the alert to resolve",
                lambda: True if prometheus.alert_state(ALERT) == "inactive" else None,
            )
            # the server itself saw the stalled requests' end-to-end time too
            server_p99 = prometheus.query(f"max_over_time(({queries_of(settings)[2]})[2m:1s])")
            assert server_p99
            assert _finite(server_p99)
