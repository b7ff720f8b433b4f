"""The guidellm comparison's own parts, without guidellm: the digest of guidellm's JSON, the
figures and verdicts the page computes from it, and the CPU accounting of a process tree."""

from __future__ import annotations

import dataclasses
import json
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

from inferwire.bench.report import load_agreement as la
from inferwire.bench.report import load_agreement_figures as laf
from inferwire.load import guidellm_compare as gc

T0 = 1_800_000_000.0  # a Unix time


def _request(
    index: int, *, lag_s: float, ttft_s: float, targeted: float | None = None
) -> dict[str, Any]:
    """A guidellm request of its JSON output: 256 tokens 10 ms apart."""
    target = T0 + index * 0.1 if targeted is None else targeted
    start = (T0 + index * 0.1) + lag_s
    first = start + ttft_s
    last = first + 2.55
    return {
        "info": {
            "timings": {
                "targeted_start": target,
                "request_start": start,
                "first_token_iteration": first,
                "last_token_iteration": last,
                "request_end": last + 0.001,
            }
        },
        "output_tokens": 256,
        "prompt_tokens": 128,
        "time_to_first_token_ms": 1e3 * ttft_s,
        "inter_token_latency_ms": 1e3 * 2.55 / 255,
        "time_per_output_token_ms": 1e3 * (last - start) / 256,
        "request_latency": last + 0.001 - start,
    }


def _summary(p50: float) -> dict[str, Any]:
    return {"successful": {"mean": p50, "percentiles": {"p50": p50}}}


def _guidellm_output() -> dict[str, Any]:
    ok = [_request(i, lag_s=0.004, ttft_s=0.021) for i in range(1, 100)]
    ok.append(_request(0, lag_s=0.0, ttft_s=0.021, targeted=-0.9))  # the offset race
    return {
        "metadata": {"guidellm_version": "0.8.1"},
        "benchmarks": [
            {
                "config": {"strategy": {"type_": "poisson", "worker_count": 10, "rate": 10.0}},
                "start_time": T0,
                "end_time": T0 + 10,
                "duration": 10.0,
                "scheduler_metrics": {"start_time": T0, "generation_delay": {"big": 1}},
                "metrics": {name: _summary(1.0) for name in gc.GUIDELLM_METRICS},
                "requests": {
                    "successful": ok,
                    "incomplete": [_request(100, lag_s=0.004, ttft_s=0.021)],
                    "errored": [],
                },
            }
        ],
    }


def _inferwire_report(*, ttft_p50: float, queue_wait_p50: float, tpot_p50: float) -> dict[str, Any]:
    def h(p50: float) -> dict[str, float]:
        return {"p50_ms": p50, "p99_ms": p50 * 1.5}

    return {
        "points": [
            {
                "requests_completed": 100,
                "requests_failed": 0,
                "offered_rate_rps": 10.0,
                "ttft": h(ttft_p50),
                "tpot": h(tpot_p50),
                "itl_per_chunk": h(tpot_p50),
                "e2e": h(2600.0),
                "queue_wait": h(queue_wait_p50),
                "client_cpu_s": 0.5,
                "duration_s": 12.6,
            }
        ]
    }


def _raw(tmp_path: Path, ttft_p50: float) -> Path:
    digest = gc.guidellm_digest(_guidellm_output())
    samples = [[T0 - 5, 0.0], [T0 + 20, 25.0]]  # 1 CPU second per second
    # the relay: a GET (no events), then streams written in 1 ms, first event 20 ms after
    wire = [[T0 - 1, T0 - 1, 0.0, 0.0]] + [
        [T0 + i * 0.1, T0 + i * 0.1 + 0.001, T0 + i * 0.1 + 0.021, T0 + 3] for i in range(100)
    ]
    # inferwire's warm-up: more than the measured streams, 500 ms each, to be left out
    warmup = [[T0 - 2, T0 - 2, T0 - 1.5, T0 - 1.0]] * 120
    runs = []
    for round_index in range(2):
        report = _inferwire_report(ttft_p50=ttft_p50, queue_wait_p50=1.0, tpot_p50=10.0)
        report["parameters"] = {"warmup_requests": 120}
        # per-request records: 1.5 ms of queue wait each (the histogram's p50 says 1.0)
        records = [[i * 0.1, 1.5, True, ttft_p50, 10.0, 2600.0, 256] for i in range(100)]
        runs.append(
            {
                "tool": "inferwire",
                "round": round_index,
                "report": report,
                "request_columns": list(gc.INFERWIRE_COLUMNS),
                "requests": records,
                "process_cpu_s": 1.0,
                "wire_columns": list(gc.WIRE_COLUMNS),
                "wire": warmup + wire,
            }
        )
        runs.append(
            {
                "tool": "guidellm",
                "round": round_index,
                "digest": digest,
                "cpu_samples": samples,
                "process_cpu_s": 30.0,
                "wire_columns": list(gc.WIRE_COLUMNS),
                "wire": wire,
            }
        )
    raw = {
        "started": "2026-12-01T00:00:00+00:00",
        "spec": dataclasses.asdict(gc.CompareSpec()),
        "server": {"transport": "http1", "codec": "orjson", "workload": "stream-256"},
        "versions": {"python": "3.11"},
        "machine": {"cpus": 2, "cpus_usable": 2},
        "runs": runs,
    }
    path = tmp_path / "load-agreement.json"
    path.write_text(json.dumps(raw))
    return path


def test_digest_keeps_every_request_and_drops_the_rest() -> None:
    digest = gc.guidellm_digest(_guidellm_output())
    assert digest["request_columns"] == list(gc.REQUEST_COLUMNS)
    statuses = [row[0] for row in digest["requests"]]
    assert statuses.count("successful") == 100
    assert statuses.count("incomplete") == 1
    assert "generation_delay" not in digest["scheduler_metrics"]
    assert all(len(row) == len(gc.REQUEST_COLUMNS) for row in digest["requests"])


def test_guidellm_figures_come_from_its_timings(tmp_path: Path) -> None:
    raw = json.loads(_raw(tmp_path, ttft_p50=22.0).read_text())
    row = laf.guidellm_row(raw["runs"][1])
    assert row["sent"] == 101
    assert row["completed"] == 100
    assert row["lag_invalid"] == 1  # the request scheduled at -0.9 s
    assert row["lag_p50"] == pytest.approx(4.0, abs=1e-3)
    assert row["ttft_p50"] == pytest.approx(21.0)
    assert row["ttft_from_target_p50"] == pytest.approx(25.0, abs=1e-3)
    assert row["tpot_p50"] == pytest.approx(10.0)
    assert row["distinct_gaps"] == (1, 98)  # every scheduled gap 100 ms: one value
    # 101 starts 0.1 s apart but the first (sent on time from -0.9): 100 gaps in 10.004 s
    assert row["rate_rps"] == pytest.approx(100 / 10.004, rel=1e-6)
    # one CPU second per wall second over the window from the first start to the last end
    window_s = (T0 + 10.0 + 0.004 + 0.021 + 2.55 + 0.001) - T0
    assert row["cpu_ms_per_request"] == pytest.approx(1e3 * window_s / 101, rel=1e-6)


def test_wire_figures_leave_out_the_warm_up_and_requests_without_events(tmp_path: Path) -> None:
    raw = json.loads(_raw(tmp_path, ttft_p50=22.0).read_text())
    ours, theirs = laf.inferwire_row(raw["runs"][0]), laf.guidellm_row(raw["runs"][1])
    for row in (ours, theirs):
        assert row["wire_streams"] == 100
        assert row["wire_ttft_p50"] == pytest.approx(21.0, abs=1e-3)
        assert row["wire_write_p50"] == pytest.approx(1.0, abs=1e-3)
        assert row["wire_server_p50"] == pytest.approx(20.0, abs=1e-3)
        assert row["wire_rate_rps"] == pytest.approx(10.0)
    # inferwire: 22 ms from the intended send, 1.5 ms of it its own queue wait (per request)
    assert ours["ttft_from_send_p50"] == pytest.approx(20.5)
    assert ours["sent_rate_rps"] == pytest.approx(10.0)


@pytest.mark.parametrize(("ttft_p50", "agrees"), [(22.0, True), (40.0, False)])
def test_ttft_verdict_allows_the_clock_difference_only(
    tmp_path: Path, ttft_p50: float, agrees: bool
) -> None:
    text = la.page(_raw(tmp_path, ttft_p50=ttft_p50))
    # guidellm's TTFT is 21 ms, inferwire's queue wait 1 ms: a 1 ms gap is the clocks, 19 is not
    assert ("**agree**; the gap left" in text) is agrees
    assert "TPOT p50**: inferwire 10.000, guidellm 10.000" in text
    assert "2 successful guidellm request(s)" in text  # one a round


def test_tree_cpu_counts_a_grandchild(tmp_path: Path) -> None:
    burn = textwrap.dedent(
        """
        import subprocess, sys, time
        code = "import time\\nwhile time.process_time() < 0.3: pass"
        subprocess.run([sys.executable, "-c", code], check=True)
        time.sleep(0.5)
        """
    )
    samples, whole_s = gc._run_tool([sys.executable, "-c", burn], env={}, log=tmp_path / "log.txt")
    assert whole_s >= 0.3
    assert samples[-1][1] >= 0.3  # the grandchild's time, reaped into its parent's


def test_a_failing_tool_is_an_error_with_its_output(tmp_path: Path) -> None:
    with pytest.raises(gc.CompareError, match="exited 3:\nboom"):
        gc._run_tool(
            [sys.executable, "-c", "print('boom'); raise SystemExit(3)"],
            env={},
            log=tmp_path / "log.txt",
        )


def test_stream_tap_times_each_exchange_of_a_connection() -> None:
    """A real server on loopback answers a GET whole, then streams two answers 50 ms late on
    the same keep-alive connection; the tap sees three exchanges in order."""
    import asyncio
    import time

    from inferwire.load.stream_tap import Exchange, StreamTap

    delay_s = 0.05

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            await answer(reader, writer)
        except asyncio.IncompleteReadError:
            pass  # the client closed: the test's end
        finally:
            writer.close()

    async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while head := await reader.readuntil(b"\r\n\r\n"):
            if b"content-length: 2" in head:
                await reader.readexactly(2)
            if head.startswith(b"GET"):
                writer.write(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\n{}")
                await writer.drain()
                continue
            writer.write(b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n")
            await writer.drain()
            await asyncio.sleep(delay_s)
            for event in (b"data: {}\n\n", b"data: [DONE]\n\n"):
                writer.write(b"%x\r\n%s\r\n" % (len(event), event))
                await writer.drain()
            writer.write(b"0\r\n\r\n")
            await writer.drain()

    async def client(address: str) -> None:
        host, port = address.rsplit(":", 1)
        reader, writer = await asyncio.open_connection(host, int(port))
        writer.write(b"GET /v1/models HTTP/1.1\r\nhost: x\r\n\r\n")
        await reader.readexactly(len(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\n{}"))
        for _ in range(2):
            # the headers, then the body apart, as httpx may write them
            writer.write(b"POST /v1/chat/completions HTTP/1.1\r\ncontent-length: 2\r\n\r\n")
            await writer.drain()
            await asyncio.sleep(delay_s)
            writer.write(b"{}")
            await reader.readuntil(b"0\r\n\r\n")
        writer.close()
        await writer.wait_closed()

    async def main() -> list[Exchange]:
        server = await asyncio.start_server(serve, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        with StreamTap("127.0.0.1", port) as tap:
            before = time.time()
            await asyncio.wait_for(client(tap.address), 30)
            exchanges = tap.take()
            assert tap.take() == []
        server.close()
        await server.wait_closed()
        assert all(e.request_in >= before for e in exchanges)
        return exchanges

    get, first, second = asyncio.run(main())
    assert get.first_event_out == 0.0  # answered, but not a stream
    assert get.done_out == 0.0
    assert get.request_whole >= get.request_in
    for stream in (first, second):
        assert stream.request_whole - stream.request_in >= delay_s  # the body came late
        assert stream.first_event_out - stream.request_whole >= delay_s
        assert stream.done_out >= stream.first_event_out
    assert second.request_in >= first.done_out
