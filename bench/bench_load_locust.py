"""Capacity of the load generator split across Locust workers: one headless Locust run with one
worker and one with two, each sending the same seeded schedule to ``inferwire serve`` (tcp,
orjson, ``stream-16``, no pacing: the server answers as fast as it can) at a rate near what one
generator process sustains on one core.

Recorded in ``extra_info``: the achieved request rate (completed requests / the run's
duration, from the merged report), the send lag's P99 (how late the generators started their
requests: the sign that a generator is out of CPU), TTFT percentiles, the generators' CPU
seconds, and the merged counts; ``correct`` is whether the merged report has every scheduled
request, each of the workers' histograms counted once. The timed value is the run's wall time,
fixed mostly by the schedule and Locust's start-up: read ``extra_info``.

On a 2-core machine the server, the Locust processes and the generators share the two cores,
so two workers cannot double the capacity of one: the comparison shows what a second process
buys when the cores are already shared (on separate machines each worker brings its own
cores). Under ``--benchmark-disable`` the schedule is cut to a second at a low rate.
"""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any, Final

import pytest

from inferwire.load import locust_local, metrics, openloop
from inferwire.transports import server_process

RATE_RPS: Final = 1_000.0
"""About one generator core's worth against this server on this machine (tcp, stream-16)."""
DURATION_S: Final = 5.0
DISABLED_RATE_RPS: Final = 100.0
DISABLED_DURATION_S: Final = 1.0
WORKLOAD: Final = "stream-16"
SEED: Final = 1
HISTOGRAMS: Final = ("ttft", "e2e", "send_lag", "itl_per_chunk")


@pytest.mark.parametrize("workers", [1, 2], ids=lambda n: f"{n}worker")
def bench_locust_capacity(benchmark: Any, workers: int) -> None:
    rate_rps = DISABLED_RATE_RPS if benchmark.disabled else RATE_RPS
    duration_s = DISABLED_DURATION_S if benchmark.disabled else DURATION_S
    scheduled = len(openloop.LoadSpec(duration_s=duration_s, seed=SEED).offsets_ns(rate_rps))
    benchmark.group = "load generator on Locust workers"
    with (
        server_process.serve("tcp", "orjson") as server,
        tempfile.TemporaryDirectory(prefix="inferwire-locust-") as folder,
    ):
        assert server.process is not None
        load = (
            f"--transport tcp --codec orjson --address {server.address} --workload {WORKLOAD} "
            f"--rate {rate_rps:g} --duration {duration_s:g} --seed {SEED} "
            f"--server-pid {server.process.pid}"
        )

        def run() -> locust_local.LocalRun:
            return locust_local.run_local(
                load,
                workers=workers,
                folder=Path(folder),
                lead_s=4.0 if benchmark.disabled else 6.0,
                timeout_s=240.0,
            )

        finished = benchmark.pedantic(run, rounds=1, iterations=1)
        assert finished.status in (0, 1), finished.log()[-3000:]  # 1: some requests failed
        (point,) = finished.report["points"]
        parts = finished.part_points()
    counted = all(
        point[name]["count"] == sum(p[name]["count"] for p in parts) for name in HISTOGRAMS
    )
    complete = point["requests_completed"] + point["requests_failed"] == scheduled
    lag = point["send_lag"]
    benchmark.extra_info.update(
        workers=workers,
        transport="tcp",
        codec="orjson",
        workload=WORKLOAD,
        rate_rps=rate_rps,
        loop=point.get("loop"),  # each worker's generator's (the parts ran alike, or it is a list)
        requests_scheduled=point["requests_scheduled"],
        requests_completed=point["requests_completed"],
        requests_failed=point["requests_failed"],
        errors=point["errors"],
        achieved_rps=point["request_throughput_rps"],
        offered_rps=point["offered_rate_rps"],
        send_lag_ms={k: lag[k] for k in ("p50_ms", "p90_ms", "p99_ms", "max_ms")},
        ttft_ms={k: point["ttft"][k] for k in ("p50_ms", "p99_ms")},
        client_cpu_s=point["client_cpu_s"],
        server_cpu_s=point["server_cpu_s"],
        part_achieved_rps=[p["request_throughput_rps"] for p in parts],
        load_average=metrics.machine()["load_average"],  # other work on the cores skews all
        correct=point["requests_scheduled"] == scheduled and complete and counted,
    )
    assert point["requests_scheduled"] == scheduled
    assert complete
    assert counted
