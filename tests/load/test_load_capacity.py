"""The capacity search: its bracketing and bisection on points whose outcome is known, and one
search against `inferwire serve` whose capacity follows from its pacing; and the report's
verdict on the generator's own capacity."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from inferwire.bench.report import load as report_load
from inferwire.bench.report.results import LOAD_RAW
from inferwire.cli import main as cli
from inferwire.load import capacity


def point(
    rate: float, *, good: float = 1.0, lag_ms: float = 0.2, failed: int = 0, measured: int = 1000
) -> dict[str, Any]:
    """The parts of a point the search reads."""
    return {
        "rate_rps": rate,
        "requests_scheduled": measured,
        "requests_measured": measured,
        "requests_good": round(good * (measured - failed)),
        "requests_failed": failed,
        "errors": {"ConnectError": failed} if failed else {},
        "send_lag": {"p99_ms": lag_ms},
        "requests_waited_for_bound": 0,
    }


def search(measure: Callable[[float], dict[str, Any]], **kwargs: Any) -> dict[str, Any]:
    tried: list[float] = []

    async def recorded(rate: float) -> dict[str, Any]:
        tried.append(rate)
        return measure(rate)

    found = asyncio.run(capacity.search(recorded, capacity.CapacitySpec(**kwargs)))
    assert [p["rate_rps"] for p in found["points"]] == tried  # every point tried is reported
    return found


def server_of_capacity(capacity_rps: float) -> Callable[[float], dict[str, Any]]:
    """Meets the SLOs for every request up to its capacity, for half of them above."""
    return lambda rate: point(rate, good=1.0 if rate <= capacity_rps else 0.5)


@pytest.mark.parametrize("start_rps", [1.0, 10.0, 123.0, 5000.0])
def test_the_search_brackets_a_known_capacity(start_rps: float) -> None:
    found = search(server_of_capacity(123.0), start_rps=start_rps, max_points=30)
    low, high = found["bracket_rps"]
    assert low == found["rate_rps"]
    assert low <= 123.0 < high
    assert high / low - 1 <= 0.1
    assert found["precision_reached"]
    assert found["limited_by"] == "server"
    for tried in found["points"]:
        assert tried["passed"] == (tried["rate_rps"] <= 123.0)
        if not tried["passed"]:
            assert "goodput 0.500" in tried["reason"]


def test_the_search_is_bounded_in_points() -> None:
    found = search(server_of_capacity(123.0), start_rps=1.0, precision=1e-6, max_points=9)
    assert len(found["points"]) == 9
    assert not found["precision_reached"]
    low, high = found["bracket_rps"]
    assert low <= 123.0 < high  # still a bracket, only wider


def test_a_generator_that_falls_behind_is_named() -> None:
    """The server meets the SLOs at any rate; the generator lags from 300 req/s on."""
    found = search(
        lambda rate: point(rate, lag_ms=40.0 if rate >= 300 else 0.5),
        start_rps=50.0,
        max_send_lag_p99_ms=5.0,
    )
    assert found["limited_by"] == "generator"
    assert "generator" in found["note"]
    assert 200 <= found["rate_rps"] < 300
    lagging = [p for p in found["points"] if not p["passed"]]
    assert lagging
    assert all("send lag P99 40.00 ms" in p["reason"] for p in lagging)


def test_errors_fail_a_point() -> None:
    found = search(lambda rate: point(rate, failed=1 if rate > 40 else 0), start_rps=10.0)
    assert found["rate_rps"] <= 40 < found["bracket_rps"][1]
    failing = next(p for p in found["points"] if not p["passed"])
    assert "1 of 1000 requests failed (1 ConnectError)" in failing["reason"]


def test_no_failure_within_the_points_says_so() -> None:
    found = search(lambda rate: point(rate), start_rps=10.0, max_points=4)
    assert found["rate_rps"] == 80.0
    assert found["bracket_rps"] == [80.0, None]
    assert found["limited_by"] is None
    assert "above 80" in found["note"]


@pytest.mark.parametrize(
    "kwargs",
    [
        {"start_rps": 0.0},
        {"start_rps": float("inf")},
        {"start_rps": 1.0, "goodput_fraction": 1.5},
        {"start_rps": 1.0, "precision": 0.0},
        {"start_rps": 1.0, "growth": 1.0},
        {"start_rps": 1.0, "max_points": 1},
    ],
)
def test_bad_searches_are_refused(kwargs: dict[str, Any]) -> None:
    with pytest.raises(ValueError):  # noqa: PT011
        capacity.CapacitySpec(**kwargs)


def test_the_command_finds_a_paced_servers_capacity(tmp_path: Path) -> None:
    """`inferwire serve` paced at 20 ms to the first token and 2 ms a token streams 16 tokens in
    about 52 ms; four at a time (--concurrency 4) carry at most 4 / 0.052 = ~77 req/s. With
    constant arrivals, a rate under that never queues (TTFT ~22 ms); at a rate r over it the
    queue grows all point long, and a request intended t seconds in waits about t (r / 77 - 1).
    With a 600 ms TTFT SLO that 10% of a 3 s point may miss, rates from ~1.25x the capacity
    fail and rates under it pass, even with the generator's process stalled for half a second
    (a busy 2-core machine does that: seen 0.3 s at a load average of 35). The generator's own
    criterion (send lag) is set out of reach here: the search's tests above cover it."""
    out = tmp_path / "capacity.json"
    argv = ["load", "--transport", "tcp", "--spawn", "--prefill-ms", "20", "--decode-ms", "2"]
    argv += ["--workload", "stream-16", "--arrival", "constant", "--concurrency", "4"]
    argv += ["--duration", "3", "--rate", "20", "--capacity", "--slo-ttft-ms", "600"]
    argv += ["--capacity-goodput", "0.9", "--capacity-precision", "0.2"]
    argv += ["--capacity-max-lag-ms", "5000", "--quiet"]
    argv += ["--out", str(out)]
    assert cli.main(argv) == 0
    report = json.loads(out.read_text())
    found = report["capacity"]
    print(json.dumps(found, indent=1))
    expected_rps = 4 / 0.052
    low, high = found["bracket_rps"]
    assert found["limited_by"] == "server"
    assert expected_rps / 2 <= low <= expected_rps * 1.5
    assert high is not None
    assert high <= expected_rps * 3
    assert len(report["points"]) == len(found["points"]) <= capacity.DEFAULT_MAX_POINTS
    assert report["parameters"]["capacity_search"] is True
    for tried, measured in zip(found["points"], report["points"], strict=True):
        assert tried["rate_rps"] == measured["rate_rps"]
        if not tried["passed"]:
            assert tried["reason"]
    # far under the capacity every request met the SLO; far over it many did not
    first = found["points"][0]
    assert first["rate_rps"] == 20.0
    assert first["passed"]
    assert min(p["goodput_fraction"] for p in found["points"]) < 0.9
    assert report["points"][0]["ttft"]["p50_ms"] < 100


def test_the_command_refuses_a_search_without_an_slo(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["load", "--transport", "tcp", "--address", "127.0.0.1:9", "--capacity"]
    assert cli.main(argv) == 2
    assert "SLO" in capsys.readouterr().err


# -- the generator's own capacity target, in the report ---------------------------------------


def _capacity_info(**changes: Any) -> dict[str, Any]:
    info: dict[str, Any] = {
        "target": "null",
        "loop": "uvloop",
        "scheduling": "normal",
        "pinned_core": 1,
        "rate_rps": 5_000.0,
        "concurrency": None,
        "achieved_rps": 5_001.0,
        "send_lag_ms": {"p50_ms": 0.1, "p99_ms": 0.6},
        "load_average": [0.5, 0.5, 0.5],
    }
    return {**info, **changes}


def _target_row(tmp_path: Path, *infos: dict[str, Any]) -> list[list[str]]:
    (tmp_path / LOAD_RAW).write_text(
        json.dumps({"benchmarks": [{"extra_info": info} for info in infos]})
    )
    return report_load.capacity_target_row(tmp_path)


def test_the_capacity_target_is_judged_on_uvloop_as_a_user_runs_it(tmp_path: Path) -> None:
    """Only the uncapped uvloop point under normal scheduling counts: a better asyncio,
    SCHED_FIFO or capped point beside a missed one does not make the target met."""
    missed = _capacity_info(send_lag_ms={"p50_ms": 0.1, "p99_ms": 4.2})
    others = [
        _capacity_info(loop="asyncio"),
        _capacity_info(scheduling="fifo"),
        _capacity_info(concurrency=64),
        _capacity_info(rate_rps=10_000.0, achieved_rps=10_000.0),
    ]
    (row,) = _target_row(tmp_path, *others, missed)
    assert row[-1] == "**missed**"
    assert "uvloop" in row[1]
    assert "pinned to core 1" in row[1]
    assert row[2].startswith("5,001 req/s, P99 lag 4.20 ms")
    (row,) = _target_row(tmp_path, *others, _capacity_info())
    assert row[-1] == "met"
    (row,) = _target_row(tmp_path, _capacity_info(achieved_rps=4_800.0))
    assert row[-1] == "**missed**"  # it did not keep the rate
    # a run from before the loop was recorded ran asyncio's loop: no uvloop figure to judge
    assert _target_row(tmp_path, *others[:1], {**_capacity_info(), "loop": None}) == []
