"""The load generator: its schedules, its histograms, and the property it exists for: a server
that stalls shows the stall in the percentiles (no coordinated omission)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import math
import time
from collections.abc import AsyncGenerator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hdrh.histogram import HdrHistogram  # type: ignore[import-untyped, unused-ignore]

import inferwire.codecs as ic
import inferwire.transports as it
from inferwire.cli import main as cli
from inferwire.load import metrics, openloop
from inferwire.load.metrics import Histogram, Recorder, Slo
from inferwire.transports import server_process
from inferwire.workloads import token_stream_source
from tests.helpers.faults import thread_server

STALL_S = 0.2


class StallingService(it.SimulatedService):
    """Every ``every``-th stream blocks the server's event loop for ``stall_s`` before its first
    chunk, as a garbage-collection pause would: every connection waits, not just that one."""

    def __init__(self, *, every: int = 0, stall_s: float = STALL_S, **kwargs: Any) -> None:
        super().__init__(token_stream_source, **kwargs)
        self.every = every
        self.stall_s = stall_s
        self.max_active = 0

    async def batches(
        self, stream: it.TokenStream, *, max_chunks: int = 32
    ) -> AsyncGenerator[list[ic.TokenChunk], None]:
        # every server streams from here (generate() too)
        if self.every and (self.streams_started + 1) % self.every == 0:
            time.sleep(self.stall_s)  # blocking on purpose
        async with contextlib.aclosing(super().batches(stream, max_chunks=max_chunks)) as it_:
            async for batch in it_:
                self.max_active = max(self.max_active, self.active_streams)
                yield batch


async def _drive(
    address: str, spec: openloop.LoadSpec, *, rate_rps: float, concurrency: int | None = None
) -> dict[str, Any]:
    target = openloop.open_target("tcp", address, "orjson")
    try:
        await openloop.warm_up(target, spec.request(), 4)
        return await openloop.run_point(target, spec, rate_rps=rate_rps, concurrency=concurrency)
    finally:
        await target.close()


def _accounted(point: dict[str, Any]) -> bool:
    done: int = point["requests_completed"] + point["requests_failed"]
    return done == int(point["requests_scheduled"])


# -- schedules ----------------------------------------------------------------------------


def _gaps_s(**kwargs: Any) -> np.ndarray:
    return np.diff(openloop.arrival_offsets_ns(**kwargs)) / 1e9


def test_same_seed_same_schedule() -> None:
    kwargs: dict[str, Any] = {"rate_rps": 50.0, "arrival": "gamma", "burstiness": 0.5}
    first = openloop.arrival_offsets_ns(seed=7, duration_s=20, **kwargs)
    again = openloop.arrival_offsets_ns(seed=7, duration_s=20, **kwargs)
    other = openloop.arrival_offsets_ns(seed=8, duration_s=20, **kwargs)
    assert np.array_equal(first, again)
    assert not np.array_equal(first[:100], other[:100])
    # a request count draws the same schedule's prefix
    assert np.array_equal(openloop.arrival_offsets_ns(seed=7, requests=100, **kwargs), first[:100])


def test_schedule_bounds() -> None:
    by_count = openloop.arrival_offsets_ns(100.0, requests=250)
    assert len(by_count) == 250
    assert by_count[0] == 0
    assert np.all(np.diff(by_count) >= 0)
    by_time = openloop.arrival_offsets_ns(100.0, duration_s=3.0)
    assert by_time[-1] < 3e9
    assert 200 < len(by_time) < 400
    assert len(openloop.arrival_offsets_ns(100.0, duration_s=60.0, requests=10)) == 10
    assert np.all(openloop.arrival_offsets_ns(math.inf, requests=5) == 0)


def test_poisson_mean_gap_is_one_over_rate() -> None:
    gaps = _gaps_s(rate_rps=1000.0, requests=50_000, seed=1)
    assert gaps.mean() == pytest.approx(1e-3, rel=0.02)
    assert gaps.std() / gaps.mean() == pytest.approx(1.0, rel=0.05)  # exponential: CV 1


@pytest.mark.parametrize("shape", [0.25, 0.5])
def test_gamma_below_one_is_burstier(shape: float) -> None:
    poisson = _gaps_s(rate_rps=1000.0, requests=50_000, seed=2)
    bursty = _gaps_s(rate_rps=1000.0, requests=50_000, seed=2, arrival="gamma", burstiness=shape)
    assert bursty.mean() == pytest.approx(1e-3, rel=0.05)  # same rate
    cv = bursty.std() / bursty.mean()
    assert cv == pytest.approx(1 / math.sqrt(shape), rel=0.1)
    assert cv > 1.3 * poisson.std() / poisson.mean()


@pytest.mark.parametrize(
    "kwargs",
    [
        {"rate_rps": 10.0},  # neither count nor duration
        {"rate_rps": 0.0, "requests": 5},
        {"rate_rps": 10.0, "requests": 5, "burstiness": 0.5},  # poisson has no shape
        {"rate_rps": 10.0, "requests": 5, "arrival": "gamma", "burstiness": 0.0},
        {"rate_rps": math.inf, "duration_s": 1.0},
        {"rate_rps": 10.0, "requests": 0},
    ],
)
def test_bad_schedules_are_refused(kwargs: dict[str, Any]) -> None:
    with pytest.raises(ValueError):  # noqa: PT011
        openloop.arrival_offsets_ns(**kwargs)


# -- metrics ------------------------------------------------------------------------------


def test_histogram_matches_numpy() -> None:
    rng = np.random.default_rng(3)
    values_ns = (rng.lognormal(13, 1, size=100_000)).astype(np.int64)  # about 0.4 ms
    histogram = Histogram()
    for value in values_ns[:40_000].tolist():
        histogram.record_ns(value)
    histogram.record_all_ns(values_ns[40_000:70_000].tolist())
    histogram.record_many_ns(values_ns[70_000:].tolist(), [1] * 30_000)
    summary = histogram.summary_ms()
    assert summary["count"] == len(values_ns)
    for name, percentile in (("p50", 50), ("p99", 99), ("p99_9", 99.9)):
        expected_ms = np.percentile(values_ns, percentile) / 1e6
        assert summary[f"{name}_ms"] == pytest.approx(expected_ms, rel=0.01)
    assert summary["max_ms"] == pytest.approx(values_ns.max() / 1e6, rel=0.002)


def test_histogram_buckets_as_hdrh_records_each_value() -> None:
    """The bucket counts added with numpy hold what hdrh's own record_value of every value
    (in microseconds, clamped to the range) would: every percentile and the total agree."""
    rng = np.random.default_rng(5)
    values_ns = np.concatenate(
        [
            rng.lognormal(13, 2.5, size=50_000),  # about 0.4 ms, spread over decades
            rng.integers(0, 3_000, size=5_000) * 1_000.0,  # the exact buckets below 2,048 us
            [0, 499, 500, 2_047_499, 2_048_000, 10**16],  # rounding edges, and one past the top
        ]
    ).astype(np.int64)
    histogram = Histogram()
    histogram.record_all_ns(values_ns.tolist())
    reference = HdrHistogram(1, metrics.HIGHEST_US, metrics.SIGNIFICANT_DIGITS)
    for value_us in ((values_ns + 500) // 1000).clip(None, metrics.HIGHEST_US).tolist():
        reference.record_value(value_us)
    percentiles = [0, 1, 10, 50, 90, 99, 99.9, 99.99, 100]
    summary = histogram.summary_ms()
    assert summary["count"] == reference.get_total_count() == len(values_ns)
    ours = HdrHistogram.decode(histogram.encode()["hdr"].encode("ascii"))
    assert ours.get_percentile_to_value_dict(percentiles) == (
        reference.get_percentile_to_value_dict(percentiles)
    )


def test_recorder_vllm_definitions() -> None:
    recorder = Recorder(Slo(ttft_ms=15, tpot_ms=3))
    ms = 1_000_000
    # 11 tokens: TTFT 10 ms, then 10 more over 20 ms: TPOT 2 ms; meets both SLOs
    recorder.completed_stream(
        intended_ns=0, first_token_ns=10 * ms, done_ns=30 * ms, output_tokens=11
    )
    # TTFT 20 ms: misses the TTFT SLO
    recorder.completed_stream(
        intended_ns=0, first_token_ns=20 * ms, done_ns=40 * ms, output_tokens=11
    )
    recorder.failed(it.ConnectError("refused"), 40 * ms)
    summary = recorder.summary(start_ns=0, scheduled=3)
    assert summary["ttft"]["p50_ms"] == pytest.approx(10, rel=1e-3)
    assert summary["tpot"]["max_ms"] == pytest.approx(2, rel=1e-3)
    assert summary["e2e"]["max_ms"] == pytest.approx(40, rel=1e-3)
    assert summary["duration_s"] == pytest.approx(0.04)
    assert summary["goodput_rps"] == pytest.approx(1 / 0.04)
    assert summary["request_throughput_rps"] == pytest.approx(2 / 0.04)
    assert summary["output_token_throughput_tps"] == pytest.approx(22 / 0.04)
    assert summary["errors"] == {"ConnectError": 1}


# -- against a server ---------------------------------------------------------------------


@pytest.mark.parametrize(("concurrency", "rate_rps"), [(None, 200.0), (1, 100.0)])
def test_a_stalling_server_shows_in_p99(concurrency: int | None, rate_rps: float) -> None:
    """One stall of the server a second (every rate-th stream stalls it 200 ms), for 3 s.

    Capped at one request in flight (how a closed-loop client runs), the requests due during a
    stall wait in the generator: timed from their actual send, only the ~3 stalled ones of
    ~300 would be slow, at the P99. Timed from the intended send, every one of them counts the
    wait. Uncapped, they leave on time and wait at the server instead. The capped run is at
    100 requests/s: one at a time, client and server in this one process must each take
    under 10 ms a request to catch up after a stall, which a machine busy with other work
    (load average 20 on 2 cores) did not do at 200 requests/s (5 ms), and then every request
    queued behind the last stall and the P50 said so."""
    service = StallingService(every=round(rate_rps))
    spec = openloop.LoadSpec(workload="stream-16", duration_s=3.0, seed=5)
    with thread_server("tcp", service) as address:
        point = asyncio.run(_drive(address, spec, rate_rps=rate_rps, concurrency=concurrency))
    print(json.dumps({k: point[k] for k in ("e2e", "ttft", "send_lag", "max_in_flight")}))
    assert point["requests_failed"] == 0, point["errors"]
    assert _accounted(point)
    assert point["requests_completed"] > 2 * rate_rps
    assert point["e2e"]["p99_ms"] >= 150
    assert point["ttft"]["p99_ms"] >= 150
    assert point["e2e"]["p50_ms"] < 100  # generous: most requests come nowhere near a stall
    if concurrency == 1:  # the wait was in the generator's queue, and it still counted
        assert point["queue_wait"]["p99_ms"] >= 150


def test_concurrency_cap_is_respected() -> None:
    service = StallingService(decode_s=0.001)  # 16 ms a stream
    spec = openloop.LoadSpec(workload="stream-16", duration_s=1.0, seed=6)
    with thread_server("tcp", service) as address:
        point = asyncio.run(_drive(address, spec, rate_rps=500.0, concurrency=4))
    assert point["requests_failed"] == 0, point["errors"]
    assert _accounted(point)
    assert point["max_in_flight"] == 4  # reached, and never passed
    assert service.max_active <= 4
    # the cap makes requests wait: far fewer than 500/s can go through 4 slots of 16 ms
    assert point["queue_wait"]["max_ms"] > 100


def test_a_dying_server_is_counted_not_dropped() -> None:
    spec = openloop.LoadSpec(workload="stream-16", duration_s=2.0, seed=7, drain_timeout_s=30)

    async def run(server: server_process.ServerProcess) -> dict[str, Any]:
        asyncio.get_running_loop().call_later(0.8, server.kill)
        return await _drive(server.address, spec, rate_rps=100.0)

    with server_process.serve("tcp", "orjson", "--decode-ms", "1") as server:
        point = asyncio.run(run(server))
    assert point["requests_completed"] > 0
    assert point["requests_failed"] > 0
    assert _accounted(point)
    for name in point["errors"]:
        assert issubclass(getattr(it, name), it.TransportError), name


def test_the_command(tmp_path: Path) -> None:
    out = tmp_path / "load.json"
    argv = ["load", "--transport", "tcp", "--spawn", "--workload", "stream-16"]
    argv += ["--rate", "50,100", "--concurrency", "2", "--duration", "0.5", "--quiet"]
    argv += ["--slo-ttft-ms", "1000", "--out", str(out)]
    assert cli.main(argv) == 0
    report = json.loads(out.read_text())
    assert report["parameters"]["rates_rps"] == [50.0, 100.0]
    assert report["versions"]["hdrhistogram"] != "not installed"
    assert [p["rate_rps"] for p in report["points"]] == [50.0, 100.0]
    for point in report["points"]:
        assert point["requests_completed"] == point["requests_scheduled"] > 0
        assert point["max_in_flight"] <= 2
        assert point["server_cpu_s"] is not None
        assert point["goodput_rps"] is not None
        assert point["output_tokens"] == 16 * point["requests_completed"]


def test_the_command_refuses_poisson_with_a_shape(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["load", "--transport", "tcp", "--address", "127.0.0.1:9", "--burstiness", "0.5"]
    assert cli.main(argv) == 2
    assert "gamma" in capsys.readouterr().err
