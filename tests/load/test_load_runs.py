"""How a load point runs: warm-up and cool-down windows kept out of the statistics, and the
bound on requests in flight that keeps an uncapped generator from opening a connection per
late request."""

from __future__ import annotations

import asyncio
import contextlib
import json
import sys
import time
from collections.abc import AsyncGenerator, AsyncIterator
from pathlib import Path
from typing import Any

import pytest

import inferwire.codecs as ic
import inferwire.transports as it
from inferwire._runtime import loops
from inferwire.cli import main as cli
from inferwire.load import alarm, openloop
from inferwire.load.metrics import Recorder, RequestRecord, Slo, Window
from inferwire.transports import server_process
from inferwire.workloads import token_stream_source
from tests.helpers.faults import thread_server

MS = 1_000_000
_TOKEN = ic.TokenChunk(
    id="null",
    model="null",
    created=0,
    index=0,
    seq=0,
    token_ids=(1,),
    text="x",
    finish_reason="length",
    usage=ic.Usage(prompt_tokens=0, completion_tokens=1),
)


class NullTarget:
    """One chunk, its own end marker, at once."""

    async def generate(self, request: Any, /) -> AsyncIterator[ic.TokenChunk]:
        yield _TOKEN

    async def close(self) -> None:
        pass


class CountingService(it.SimulatedService):
    """Paced streams that remember the most the server ever ran at once."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(token_stream_source, **kwargs)
        self.max_active = 0

    async def batches(
        self, stream: it.TokenStream, *, max_chunks: int = 32
    ) -> AsyncGenerator[list[ic.TokenChunk], None]:
        async with contextlib.aclosing(super().batches(stream, max_chunks=max_chunks)) as it_:
            async for batch in it_:
                self.max_active = max(self.max_active, self.active_streams)
                yield batch


# -- warm-up and cool-down ----------------------------------------------------------------


def test_the_recorder_counts_only_its_window() -> None:
    recorder = Recorder(Slo(ttft_ms=50), window=Window(from_ns=100 * MS, until_ns=200 * MS))
    recorder.begin(1_000 * MS)
    start = 1_000 * MS
    for offset_ms in (50, 150, 250):  # before, in, after the window
        intended = start + offset_ms * MS
        recorder.sent(intended, intended + 1 * MS)
        recorder.lagged(intended, intended)
        recorder.completed_stream(
            intended_ns=intended,
            first_token_ns=intended + 10 * MS,
            done_ns=intended + 30 * MS,
            output_tokens=5,
        )
        recorder.failed(it.ConnectError("x"), intended + 5 * MS, intended_ns=intended)
    assert not recorder.measures(start + 99 * MS)
    assert recorder.measures(start + 100 * MS)
    assert recorder.measures(start + 200 * MS)
    summary = recorder.summary(start_ns=start, scheduled=6, excluded=4)
    assert summary["requests_completed"] == 1
    assert summary["requests_failed"] == 1
    assert summary["requests_good"] == 1
    assert summary["requests_measured"] == 2
    assert summary["measured_window_s"] == [0.1, 0.2]
    for name in ("ttft", "e2e", "send_lag", "queue_wait", "tpot"):
        assert summary[name]["count"] == 1, name
    # throughput over the window: from its start (100 ms) to the last measured end (180 ms)
    assert summary["duration_s"] == pytest.approx(0.08)
    assert summary["output_tokens"] == 5


def test_windows_leave_something_to_measure() -> None:
    spec = openloop.LoadSpec(duration_s=2.0, warmup_s=1.0, cooldown_s=1.5)
    with pytest.raises(ValueError, match="no request"):
        spec.window(spec.offsets_ns(100.0))
    # by count, the schedule ends at its last request
    spec = openloop.LoadSpec(requests=10, warmup_s=0.05, cooldown_s=0.02, arrival="constant")
    window = spec.window(spec.offsets_ns(100.0))  # requests at 0, 10, ..., 90 ms
    assert window == Window(from_ns=50 * MS, until_ns=70 * MS)


def test_warmup_and_cooldown_are_sent_but_not_measured(monkeypatch: pytest.MonkeyPatch) -> None:
    """200 req/s evenly for 2 s, the first and last half second excluded: the 201 requests
    intended from 0.5 s to 1.5 s are the point; the other 199 are sent all the same."""
    records: list[RequestRecord] = []
    service = CountingService()
    spec = openloop.LoadSpec(
        workload="stream-16",
        arrival="constant",
        duration_s=2.0,
        warmup_s=0.5,
        cooldown_s=0.5,
        slo=Slo(e2e_ms=10_000),
    )

    async def drive(address: str) -> dict[str, Any]:
        target = openloop.open_target("tcp", address, "orjson")
        try:
            return await openloop.run_point(target, spec, rate_rps=200.0, on_record=records.append)
        finally:
            await target.close()

    with thread_server("tcp", service) as address:
        point = asyncio.run(drive(address))
    assert service.streams_started == 400  # every request was sent
    assert point["requests_scheduled"] == 400
    assert point["requests_excluded"] == 199
    assert point["requests_measured"] == point["requests_completed"] == 201, point["errors"]
    assert point["requests_good"] == 201
    assert point["measured_window_s"] == [0.5, 1.5]
    for name in ("ttft", "tpot", "e2e", "send_lag", "queue_wait"):
        assert point[name]["count"] == 201, name
    assert point["output_tokens"] == 16 * 201
    assert point["integrity"]["verified"] == 201
    assert len(records) == 400
    measured = [r for r in records if r.measured]
    assert len(measured) == 201
    assert all(0.5 <= r.intended_s <= 1.5 for r in measured)
    assert all(not 0.5 <= r.intended_s <= 1.5 for r in records if not r.measured)
    # rates are over the window: from its start to the last measured request's end (a second
    # and a stream), not from the schedule's start to the last request's end (two seconds)
    measured_end_s = max(r.intended_s + r.e2e_ms / 1e3 for r in measured)
    assert point["duration_s"] == pytest.approx(measured_end_s - 0.5, abs=1e-5)
    assert point["duration_s"] < max(r.intended_s + r.e2e_ms / 1e3 for r in records) - 0.5
    assert point["request_throughput_rps"] == pytest.approx(201 / point["duration_s"])


# -- the bound on requests in flight ------------------------------------------------------


@pytest.mark.parametrize("transport", ["http1", "tcp"])
def test_a_slow_server_meets_a_bounded_generator(transport: str) -> None:
    """A server of ~64 ms streams, offered 800 req/s for half a second: 50 would be in flight.
    Bounded at 8, the generator never has more than 8 requests (nor the server more than 8
    streams, nor the http1 pool more than 8 connections); the rest wait, the wait counts in
    their latency, and every request is accounted for."""
    bound = 8
    service = CountingService(decode_s=0.004)
    spec = openloop.LoadSpec(
        workload="stream-16", duration_s=0.5, seed=3, max_in_flight=bound, drain_timeout_s=120
    )
    opened: list[int] = []

    async def drive(address: str) -> dict[str, Any]:
        target: openloop.Target
        if transport == "http1":  # an idle pool that never closes one: opened = the most open
            client = it.connect("http1", address, codec="orjson", max_idle=10_000)
            target = client
        else:
            target = openloop.open_target(transport, address, "orjson")
        try:
            return await openloop.run_point(target, spec, rate_rps=800.0)
        finally:
            if transport == "http1":
                opened.append(client.connections_opened)  # type: ignore[attr-defined]
            await target.close()

    with thread_server(transport, service) as address:
        point = asyncio.run(drive(address))
    print({k: point[k] for k in ("max_in_flight", "requests_waited_for_bound", "queue_wait")})
    assert point["requests_failed"] == 0, point["errors"]
    assert point["requests_completed"] == point["requests_scheduled"] > 300
    assert point["in_flight_bound"] == bound
    assert point["max_in_flight"] == bound  # reached, never passed
    assert service.max_active <= bound
    if opened:
        assert 1 <= opened[0] <= bound
    assert point["requests_waited_for_bound"] > 100
    # the waits count: with ~125 req/s through 8 slots, the last requests waited seconds
    assert point["queue_wait"]["max_ms"] > 500
    assert point["e2e"]["max_ms"] >= point["queue_wait"]["max_ms"]
    # and the generator itself kept up: it queued each request on time
    assert point["send_lag"]["count"] == point["requests_scheduled"]


def test_without_the_bound_the_same_run_goes_past_it() -> None:
    """The control: the same server and schedule with no bound runs far more at once."""
    service = CountingService(decode_s=0.004)
    spec = openloop.LoadSpec(
        workload="stream-16", duration_s=0.5, seed=3, max_in_flight=None, drain_timeout_s=120
    )

    async def drive(address: str) -> dict[str, Any]:
        target = openloop.open_target("tcp", address, "orjson")
        try:
            return await openloop.run_point(target, spec, rate_rps=800.0)
        finally:
            await target.close()

    with thread_server("tcp", service) as address:
        point = asyncio.run(drive(address))
    assert point["requests_failed"] == 0, point["errors"]
    assert point["in_flight_bound"] is None
    assert point["requests_waited_for_bound"] == 0
    assert point["max_in_flight"] > 16


def test_a_cap_is_its_own_bound() -> None:
    spec = openloop.LoadSpec(workload="stream-16", requests=40, max_in_flight=2)

    async def drive(address: str) -> dict[str, Any]:
        target = openloop.open_target("tcp", address, "orjson")
        try:
            return await openloop.run_point(target, spec, rate_rps=400.0, concurrency=4)
        finally:
            await target.close()

    with thread_server("tcp", CountingService(decode_s=0.002)) as address:
        point = asyncio.run(drive(address))
    assert point["in_flight_bound"] is None
    assert point["requests_waited_for_bound"] == 0
    assert point["max_in_flight"] == 4


@pytest.mark.parametrize("loop", ["asyncio", "uvloop"])
def test_the_alarm_never_wakes_early(loop: str) -> None:
    """uvloop's own timers return at once below half a millisecond (a request sent early);
    the scheduler's alarm returns at or after the instant, on either loop, and says which
    timer it used."""
    if loop == "uvloop" and not loops.uvloop_installed():
        pytest.skip("uvloop is not installed")

    async def early_by_ns() -> tuple[str, list[int]]:
        found = alarm.Alarm()
        try:
            lateness = []
            for delay_us in (1, 50, 200, 400, 600, 1_500, 0, -100):
                when_ns = time.monotonic_ns() + delay_us * 1_000
                await found.sleep_until(when_ns)
                lateness.append(time.monotonic_ns() - when_ns)
            return found.kind, lateness
        finally:
            found.close()

    kind, lateness = loops.run(early_by_ns(), loop)
    assert kind == ("timerfd" if sys.platform.startswith("linux") else "loop")
    assert min(lateness[:6]) >= 0  # the past instants (0, -100 us) return at once, late


def test_a_point_records_its_loop_and_timer() -> None:
    async def point() -> dict[str, Any]:
        return await openloop.run_point(
            NullTarget(), openloop.LoadSpec(requests=20, seed=1), rate_rps=2_000.0
        )

    ran = loops.run(point(), "asyncio")
    assert (ran["loop"], ran["timer"]) == ("asyncio", "timerfd")
    assert ran["requests_completed"] == 20
    assert ran["send_lag"]["count"] == 20


# -- the command --------------------------------------------------------------------------


def test_the_command_records_the_run_flags(tmp_path: Path) -> None:
    out = tmp_path / "load.json"
    argv = ["load", "--transport", "tcp", "--spawn", "--workload", "stream-16", "--quiet"]
    argv += ["--arrival", "constant", "--rate", "100", "--ramp-from", "20", "--ramp-s", "0.5"]
    argv += ["--duration", "1", "--warmup-s", "0.25", "--cooldown-s", "0.25"]
    argv += ["--max-in-flight", "16", "--out", str(out)]
    assert cli.main(argv) == 0
    report = json.loads(out.read_text())
    parameters = report["parameters"]
    assert parameters["arrival"] == "constant"
    assert parameters["ramp_from_rps"] == 20.0
    assert parameters["ramp_s"] == 0.5
    assert parameters["warmup_s"] == parameters["cooldown_s"] == 0.25
    assert parameters["max_in_flight"] == 16
    assert parameters["loop"] == loops.resolve("auto")  # the loop that ran
    assert parameters["timer"] == "timerfd"
    assert parameters["live_metrics"] is False
    (point,) = report["points"]
    # Lambda(1 s) = 30 (the ramp's half second) + 50 = 80 requests; 0.25-0.75 s is measured
    assert point["requests_scheduled"] == 80
    assert point["measured_window_s"] == [0.25, 0.75]
    assert point["requests_completed"] == point["requests_measured"]
    assert point["requests_excluded"] == 80 - point["requests_measured"]
    assert 30 < point["requests_measured"] < 50
    assert point["in_flight_bound"] == 16
    assert point["max_in_flight"] <= 16


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--ramp-from", "5"], "--ramp-s"),
        (["--ramp-s", "5"], "--ramp-from"),
        (["--duration", "1", "--warmup-s", "0.6", "--cooldown-s", "0.6"], "no request"),
        (["--max-in-flight", "100000000"], "ulimit"),
        (["--capacity", "--slo-ttft-ms", "9", "--rate", "1,2"], "one --rate"),
        (["--capacity", "--slo-ttft-ms", "9", "--capacity-max-points", "1"], "two points"),
    ],
)
def test_the_command_refuses_bad_run_flags(
    flags: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["load", "--transport", "tcp", "--address", "127.0.0.1:9", *flags]
    assert cli.main(argv) == 2
    assert message in capsys.readouterr().err


def test_windows_and_the_bound_hold_for_another_api(tmp_path: Path) -> None:
    """Through the OpenAI API (our server spawned behind it): the excluded requests are in no
    token count and no client parse time either, and the bound holds."""
    out = tmp_path / "api.json"
    argv = ["load", "--spawn", "--transport", "http1", "--api", "openai-chat", "--quiet"]
    argv += ["--workload", "stream-16", "--max-tokens", "10", "--decode-ms", "1"]
    argv += ["--arrival", "constant", "--rate", "40", "--duration", "1"]
    argv += ["--warmup-s", "0.25", "--cooldown-s", "0.25", "--max-in-flight", "4"]
    argv += ["--out", str(out)]
    assert cli.main(argv) == 0
    (point,) = json.loads(out.read_text())["points"]
    assert point["requests_scheduled"] == 40
    assert point["requests_measured"] == point["requests_completed"] == 21  # 0.25 s to 0.75 s
    assert sum(point["token_count"].values()) == 21
    assert point["output_tokens"] == 210
    assert 210 <= point["client_parse"]["count"] <= 21 * 20  # a stream has ~13 events
    assert point["max_in_flight"] <= 4


def test_spawn_starts_the_server_on_the_loop_asked(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    started: list[tuple[str, ...]] = []
    serve = server_process.serve

    def watched(transport: str, codec: str, *options: str) -> server_process.ServerProcess:
        started.append(options)
        return serve(transport, codec, *options)

    monkeypatch.setattr(server_process, "serve", watched)
    out = tmp_path / "load.json"
    argv = ["load", "--transport", "tcp", "--spawn", "--loop", "asyncio", "--quiet"]
    argv += ["--workload", "stream-16", "--rate", "50", "--requests", "5", "--out", str(out)]
    assert cli.main(argv) == 0
    (options,) = started
    assert options[options.index("--loop") + 1] == "asyncio"
    report = json.loads(out.read_text())
    assert report["parameters"]["loop"] == "asyncio"
    assert report["points"][0]["loop"] == "asyncio"
