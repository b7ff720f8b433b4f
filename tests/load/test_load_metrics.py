"""The load generator's live metrics (:mod:`inferwire.load.live_metrics`), in this
process: the names, types and labels of the contract (OBSERVE-SPEC.md), buckets as Prometheus
reads them, the recorder feeding them exactly what it records (its window, its error names),
a point in process whose metrics equal its report, and the checks of ``--metrics-*``.

The runs against real server processes, scraped over HTTP, are in test_load_metrics_live.py.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import math
import os
import signal
import socket
import threading
import urllib.error
import urllib.request
from argparse import Namespace
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import inferwire.codecs as ic
import inferwire.transports as it
from inferwire._runtime import signals
from inferwire.bench.report import load as report_load
from inferwire.bench.report.results import LOAD_RAW
from inferwire.cli import main as cli
from inferwire.load import live_metrics, openloop
from inferwire.load.live_metrics import LiveMetrics
from inferwire.load.metrics import UNFINISHED, Recorder, Window
from inferwire.transports import metrics_core
from inferwire.transports.metrics_core import LATENCY_BUCKETS_S
from tests.load.load_metrics_helpers import (
    HISTOGRAMS,
    SPEC,
    assert_agree,
    buckets,
    parse,
    scrape,
    value,
)

# -- the contract --------------------------------------------------------------------------------


def test_the_families_are_the_contracts() -> None:
    live = LiveMetrics()
    live.started()
    live.completed(3)
    live.ttft.observe_all_ns(np.array([2_000_000]))
    live.itl.observe_all_ns(np.array([1_000_000, 3_000_000]))
    live.e2e.observe_all_ns(np.array([9_000_000]))
    live.failed("ConnectError")
    live.send_lag.observe_all_ns(np.array([40_000]))
    live.ended()
    families = scrape(live)
    assert {name: f["type"] for name, f in families.items()} == {
        name: kind for name, (kind, _) in SPEC.items()
    }
    for name, (_, labelnames) in SPEC.items():
        for sample_name, labels in families[name]["samples"]:
            assert {k for k, _ in labels} - {"le"} == labelnames, (sample_name, labels)
    assert value(families, "inferwire_load_requests_total", outcome="ok") == 1
    assert value(families, "inferwire_load_requests_total", outcome="error") == 1
    assert value(families, "inferwire_load_errors_total", kind="ConnectError") == 1
    assert value(families, "inferwire_load_output_tokens_total") == 3
    assert value(families, "inferwire_load_requests_in_flight") == 0
    assert value(families, "inferwire_load_inter_token_latency_seconds_count") == 2
    assert value(families, "inferwire_load_inter_token_latency_seconds_sum") == pytest.approx(0.004)
    assert value(families, "inferwire_load_time_to_first_token_seconds_sum") == pytest.approx(0.002)
    assert value(families, "inferwire_load_e2e_request_latency_seconds_sum") == pytest.approx(0.009)
    assert value(families, "inferwire_load_send_lag_seconds_sum") == pytest.approx(4e-5)


def test_both_outcomes_are_exposed_from_the_start() -> None:
    """``rate()`` over a counter needs it present at 0 before its first increment."""
    families = scrape(LiveMetrics())
    assert value(families, "inferwire_load_requests_total", outcome="ok") == 0
    assert ("inferwire_load_requests_total", (("outcome", "error"),)) in families[
        "inferwire_load_requests"
    ]["samples"]


def test_the_latency_buckets_are_the_servers_and_send_lag_starts_at_a_microsecond() -> None:
    families = scrape(LiveMetrics())
    for name in HISTOGRAMS.values():
        bounds = [le for le, _ in buckets(families, name)]
        assert bounds[-1] == math.inf
        if name == "inferwire_load_send_lag_seconds":
            assert bounds[0] == 1e-6
            assert 1e-3 in bounds
            assert 5e-3 in bounds
        else:
            assert tuple(bounds[:-1]) == LATENCY_BUCKETS_S  # 0.5 s is one: the alert's bound


@pytest.mark.parametrize("weighted", [False, True], ids=["once-each", "with-counts"])
def test_a_value_on_a_bound_counts_in_it(weighted: bool) -> None:
    """Prometheus' ``le``: each bound, and a nanosecond either side of it."""
    live = LiveMetrics()
    values_ns = [0]
    for bound in LATENCY_BUCKETS_S:
        bound_ns = round(bound * 1e9)
        values_ns += [bound_ns - 1, bound_ns, bound_ns + 1]
    values_ns.append(10**12)  # past the last bound: +Inf only
    counts = [1 + i % 3 for i in range(len(values_ns))] if weighted else [1] * len(values_ns)
    values = np.array(values_ns, np.int64)
    live.itl.observe_all_ns(values, np.array(counts, np.int64) if weighted else None)
    counted = dict(buckets(scrape(live), HISTOGRAMS["itl_per_chunk"]))
    for bound in LATENCY_BUCKETS_S:
        below_or_on = sum(
            c for v, c in zip(values_ns, counts, strict=True) if v <= round(bound * 1e9)
        )
        assert counted[bound] == below_or_on, bound
    assert counted[math.inf] == sum(counts)
    total_s = sum(v * c for v, c in zip(values_ns, counts, strict=True)) / 1e9
    assert value(scrape(live), "inferwire_load_inter_token_latency_seconds_sum") == pytest.approx(
        total_s, rel=1e-12
    )


def test_values_land_where_the_servers_histogram_puts_them() -> None:
    """Batches of any size, in the buckets where :class:`metrics_core.Histogram` (the
    servers') puts the same values in seconds; an empty batch changes nothing."""
    rng = np.random.default_rng(16)
    reference = metrics_core.Histogram(LATENCY_BUCKETS_S)
    live = LiveMetrics()
    for length in (0, 1, 5, 255, 1000):
        gaps_ns = rng.lognormal(math.log(2e6), 2.0, length).astype(np.int64)
        live.itl.observe_all_ns(gaps_ns)
        for gap_ns in gaps_ns.tolist():
            reference.observe(gap_ns / 1e9)
    family = scrape(live)
    cumulative = [count for _, count in buckets(family, HISTOGRAMS["itl_per_chunk"])]
    assert cumulative == np.cumsum(reference.counts).tolist()
    assert value(family, "inferwire_load_inter_token_latency_seconds_sum") == pytest.approx(
        reference.sum, rel=1e-12
    )


def test_in_a_point_the_histograms_follow_without_a_flush_by_hand() -> None:
    """The recorder buffers the latencies; while a point runs, :func:`kept_flushed` counts
    them into the live histograms without anyone asking, and stops with its block."""

    def e2e_count(live: LiveMetrics) -> float:
        return value(scrape(live), "inferwire_load_e2e_request_latency_seconds_count")

    async def run() -> None:
        live = LiveMetrics()
        recorder = Recorder(live=live)
        recorder.completed_stream(intended_ns=0, first_token_ns=5, done_ns=9, output_tokens=1)
        assert e2e_count(live) == 0  # buffered, the counters already counted
        assert value(scrape(live), "inferwire_load_requests_total", outcome="ok") == 1
        recorder.flush_live()
        assert e2e_count(live) == 1
        recorder.completed_stream(intended_ns=0, first_token_ns=5, done_ns=9, output_tokens=1)
        async with live_metrics.kept_flushed(recorder.flush_live, every_s=0.01):
            async with asyncio.timeout(60):
                while e2e_count(live) < 2:
                    await asyncio.sleep(0.01)
        recorder.completed_stream(intended_ns=0, first_token_ns=5, done_ns=9, output_tokens=1)
        await asyncio.sleep(0.05)
        assert e2e_count(live) == 2  # the block is over: nothing flushes on its own
        recorder.flush()
        assert e2e_count(live) == 3

    asyncio.run(run())


# -- fed by the recorder -------------------------------------------------------------------------

START_NS = 10**12


def test_the_recorder_feeds_what_it_records_in_its_window() -> None:
    """The requests outside the measured window (warm-up, cool-down) are in no live count, as
    in no statistic of the report; errors go by the report's names."""
    live = LiveMetrics()
    recorder = Recorder(window=Window(from_ns=1_000_000_000, until_ns=2_000_000_000), live=live)
    recorder.begin(START_NS)
    for offset_s in (0.5, 1.0, 1.5, 2.0, 2.5):  # 0.5 and 2.5 outside
        intended_ns = START_NS + int(offset_s * 1e9)
        recorder.lagged(intended_ns, intended_ns + 30_000)
        recorder.completed_stream(
            intended_ns=intended_ns,
            first_token_ns=intended_ns + 5_000_000,
            done_ns=intended_ns + 20_000_000,
            output_tokens=4,
            gaps_ns=[5_000_000, 5_000_000, 5_000_000],
            chunk_tokens=[1, 1, 1],
        )
    recorder.completed_stream(  # a whole stream of no token: an E2E, no TTFT
        intended_ns=START_NS + 1_200_000_000, first_token_ns=0, done_ns=START_NS + 1_300_000_000,
        output_tokens=0,
    )  # fmt: skip
    recorder.failed(it.ConnectError("refused"), START_NS, intended_ns=START_NS + 1_100_000_000)
    recorder.failed(it.ConnectError("refused"), START_NS, intended_ns=START_NS)  # outside
    recorder.failed(ValueError("odd"), START_NS, intended_ns=START_NS + 1_100_000_000)
    recorder.failed(None, START_NS)  # never finished: counted
    point = recorder.summary(start_ns=START_NS, scheduled=12)
    families = scrape(live)
    assert_agree(families, [point])
    assert value(families, "inferwire_load_requests_total", outcome="ok") == 4
    assert value(families, "inferwire_load_errors_total", kind="ConnectError") == 1
    assert value(families, "inferwire_load_errors_total", kind="builtins.ValueError") == 1
    assert value(families, "inferwire_load_errors_total", kind=UNFINISHED) == 1
    assert value(families, "inferwire_load_output_tokens_total") == 12
    assert value(families, "inferwire_load_time_to_first_token_seconds_count") == 3
    assert value(families, "inferwire_load_send_lag_seconds_count") == 3


def test_without_live_metrics_the_recorder_records_as_before() -> None:
    recorder = Recorder()
    assert recorder.live is None
    recorder.lagged(0, 1)
    recorder.completed_stream(intended_ns=0, first_token_ns=1, done_ns=2, output_tokens=1)
    recorder.failed(None, 3)
    assert recorder.completed == 1
    assert dict(recorder.errors) == {UNFINISHED: 1}


# -- a point in this process ---------------------------------------------------------------------

TOKENS = 6


def _chunk(seq: int, last: bool) -> ic.TokenChunk:
    return ic.TokenChunk(
        id="x", model="x", created=0, index=0, seq=seq, token_ids=(seq,), text="t",
        finish_reason="length" if last else None,
        usage=ic.Usage(prompt_tokens=0, completion_tokens=TOKENS) if last else None,
    )  # fmt: skip


CHUNKS = [_chunk(seq, seq == TOKENS - 1) for seq in range(TOKENS)]


class FaultyTarget:
    """Every third request refused, every fifth cut after two chunks, the rest whole; notes the
    live in-flight count each stream sees."""

    def __init__(self, live: LiveMetrics) -> None:
        self.live = live
        self.calls = 0
        self.in_flight_seen: list[int] = []

    async def generate(self, request: Any, /) -> AsyncIterator[ic.TokenChunk]:
        self.calls += 1
        call = self.calls
        self.in_flight_seen.append(self.live.in_flight)
        if call % 3 == 0:
            raise it.ConnectError("refused")
        for chunk in CHUNKS:
            await asyncio.sleep(0.001)
            if call % 5 == 0 and chunk.seq == 2:
                raise it.StreamTruncatedError("cut")
            yield chunk

    async def close(self) -> None:
        pass


def test_a_point_in_process_exposes_what_it_reports() -> None:
    live = LiveMetrics()
    target = FaultyTarget(live)
    spec = openloop.LoadSpec(requests=60, seed=2)
    point = asyncio.run(openloop.run_point(target, spec, rate_rps=500.0, live=live))
    assert point["requests_completed"] > 0
    assert set(point["errors"]) == {"ConnectError", "StreamTruncatedError"}
    assert_agree(scrape(live), [point])
    assert min(target.in_flight_seen) >= 1  # counted from the send, before the stream
    assert live.in_flight == 0


# -- the command's options and side server -------------------------------------------------------


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--metrics-hold", "5"], "--metrics-hold goes with --metrics-port"),
        (["--metrics-host", "0.0.0.0"], "--metrics-host goes with --metrics-port"),
        (["--metrics-port", "70000"], "a port"),
        (["--metrics-port", "-1"], "a port"),
        (["--metrics-port", "0", "--metrics-hold", "-1"], "negative"),
        (["--metrics-port", "0", "--metrics-host", "host.invalid"], "cannot resolve"),
    ],
)
def test_the_command_refuses_bad_metrics_flags(
    flags: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["load", "--transport", "tcp", "--address", "127.0.0.1:9", "--quiet", *flags]
    try:
        status = cli.main(argv)
    except SystemExit as exc:  # refused while parsing, as argparse does
        status = int(str(exc.code))
    assert status == 2
    assert message in capsys.readouterr().err


def test_a_metrics_port_in_use_is_refused_before_the_run(
    capsys: pytest.CaptureFixture[str],
) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        argv = ["load", "--transport", "tcp", "--address", "127.0.0.1:9", "--quiet"]
        assert cli.main([*argv, "--metrics-port", str(port)]) == 2
    err = capsys.readouterr().err
    assert f"port {port} is in use" in err
    assert "metrics=" not in err


def _args(**given: Any) -> Namespace:
    return Namespace(**{"metrics_port": 0, "metrics_host": None, "metrics_hold": None, **given})


def test_the_side_server_serves_from_its_announcement_until_the_block_ends(
    capsys: pytest.CaptureFixture[str],
) -> None:
    with live_metrics.serving(_args()) as live:
        assert live is not None
        live.started()
        announced = capsys.readouterr().err.strip()
        assert announced.startswith("metrics=127.0.0.1:")
        url = f"http://{announced.removeprefix('metrics=')}/metrics"
        with urllib.request.urlopen(url, timeout=30) as response:
            families = parse(response.read().decode())
        assert value(families, "inferwire_load_requests_in_flight") == 1
    with (
        pytest.raises(urllib.error.URLError),
        contextlib.closing(urllib.request.urlopen(url, timeout=30)),
    ):
        pass


def test_no_port_no_server() -> None:
    with live_metrics.serving(_args(metrics_port=None)) as live:
        assert live is None


def test_the_hold_waits_after_the_block_and_a_signal_ends_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    waited: list[float] = []

    def wait(self: signals.StopSignal, seconds: float) -> bool:
        waited.append(seconds)
        return True  # as when SIGINT or SIGTERM ends it

    monkeypatch.setattr(signals.StopSignal, "wait", wait)
    with live_metrics.serving(_args(metrics_hold=7.5)):
        assert waited == []
    assert waited == [7.5]
    with pytest.raises(RuntimeError), live_metrics.serving(_args(metrics_hold=7.5)):
        raise RuntimeError("a failed run is not held")
    assert waited == [7.5]


def test_the_hold_ends_on_sigint_even_when_it_was_ignored() -> None:
    """As ``inferwire load`` started by ``cmd &`` (SIGINT ignored) meets Ctrl-C."""
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
    held = threading.Event()

    def ctrl_c() -> None:  # until the hold has ended: one sent before it began is ignored
        while not held.wait(0.2):
            os.kill(os.getpid(), signal.SIGINT)

    sender = threading.Thread(target=ctrl_c)
    try:
        with live_metrics.serving(_args(metrics_hold=600.0)):
            sender.start()
        held.set()
    finally:
        held.set()
        sender.join()
        signal.signal(signal.SIGINT, previous)


# -- the benchmark's table in the report -------------------------------------------------------


def test_the_report_shows_what_live_metrics_cost(tmp_path: Path) -> None:
    figures = {"client_cpu_us_per_request": 40.0, "send_lag_ms": {"p99_ms": 0.3}}
    info = {
        "target": "null-live-metrics",
        "chunks_per_request": 16,
        "rate_rps": 2000.0,
        "pairs": 5,
        "modes": {"off": figures, "on": {**figures, "client_cpu_us_per_request": 41.5}},
        "live_cpu_us_per_request_added": 1.5,
        "live_cpu_per_request_vs_off": 1.0375,
        "scrape_cpu_us": 210.0,
    }
    (tmp_path / LOAD_RAW).write_text(json.dumps({"benchmarks": [{"extra_info": info}]}))
    section = report_load.section(tmp_path)
    assert "`inferwire load --metrics-port`" in section
    assert "| 16 | 2,000 | 40.0 | 41.5 | +1.5 | 1.038x | 0.30 ms | 210 |" in section
