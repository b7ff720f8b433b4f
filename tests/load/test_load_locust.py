"""The load generator split across processes: ``--part I/N`` and ``--start-at``, the points'
HDR histograms and their merge, and the Locust user class run as a real master and two real
workers on loopback against ``inferwire serve``."""

from __future__ import annotations

import asyncio
import csv
import json
import socket
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any, Final

import numpy as np
import pytest

import inferwire.codecs as ic
import inferwire.transports as it
from inferwire.cli import main as cli
from inferwire.load import (
    hdr_merge,
    html_report,
    locust_local,
    openloop,
    split_run,
)
from inferwire.load.metrics import Histogram, RequestRecord
from inferwire.transports import server_process

_TOKEN: Final = ic.TokenChunk(
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
    """One chunk (its own end marker) at once, no I/O."""

    async def generate(self, request: it.GenerateRequest, /) -> AsyncIterator[ic.TokenChunk]:
        yield _TOKEN

    async def close(self) -> None:
        pass


def _records_of(spec: openloop.LoadSpec, rate_rps: float) -> list[RequestRecord]:
    records: list[RequestRecord] = []

    async def go() -> None:
        await openloop.run_point(NullTarget(), spec, rate_rps=rate_rps, on_record=records.append)

    asyncio.run(go())
    return records


@pytest.mark.parametrize("parts", [1, 2, 3, 7])
@pytest.mark.parametrize(
    "schedule",
    [
        {"requests": 500},
        {"duration_s": 3.0, "arrival": "gamma", "burstiness": 0.5},
        {"requests": 10, "duration_s": 60.0},
    ],
)
def test_the_parts_together_are_the_whole_schedule(parts: int, schedule: dict[str, Any]) -> None:
    whole = openloop.LoadSpec(seed=7, **schedule)
    offsets_ns = whole.offsets_ns(80.0)
    sent: dict[int, int] = {}
    for index in range(parts):
        share = openloop.LoadSpec(seed=7, part=(index, parts), **schedule)
        mine, first, step = share.part_of(share.offsets_ns(80.0))
        assert (first, step) == (index, parts)
        for position, offset_ns in enumerate(mine.tolist()):
            assert sent.setdefault(first + position * step, offset_ns) == offset_ns
    assert sorted(sent) == list(range(len(offsets_ns)))
    assert [sent[i] for i in range(len(offsets_ns))] == offsets_ns.tolist()


def test_a_part_sends_its_share_under_the_whole_schedules_indices() -> None:
    """Run through the scheduler: each part's records carry the whole schedule's indices and
    intended times, and the parts' records together are the single run's."""
    whole = _records_of(openloop.LoadSpec(requests=60, seed=3), 2_000.0)
    start = time.time() + 0.05  # a shared start: intended times relative to it
    shares = [
        _records_of(
            openloop.LoadSpec(requests=60, seed=3, part=(i, 3), start_at_unix_s=start), 2_000.0
        )
        for i in range(3)
    ]
    for i, share in enumerate(shares):
        assert [r.index for r in share] == list(range(i, 60, 3))
    merged = sorted((r for share in shares for r in share), key=lambda r: r.index)
    assert [r.index for r in merged] == [r.index for r in whole] == list(range(60))
    assert [r.intended_s for r in merged] == pytest.approx([r.intended_s for r in whole])


class AskedTarget(NullTarget):
    """Keeps the requests it was asked for."""

    def __init__(self) -> None:
        self.asked: list[Any] = []

    async def generate(self, request: Any, /) -> AsyncIterator[ic.TokenChunk]:
        self.asked.append(request)
        yield _TOKEN


def test_a_part_asks_for_the_requests_of_its_indices() -> None:
    """With a request per index (prompts), a part sends request i of the whole schedule."""
    targets = [AskedTarget() for _ in range(3)]

    async def go() -> None:
        start = time.time() + 0.05
        for index, target in enumerate(targets):
            spec = openloop.LoadSpec(requests=30, seed=2, part=(index, 3), start_at_unix_s=start)
            await openloop.run_point(target, spec, rate_rps=5_000.0, request_for=lambda i: i)

    asyncio.run(go())
    for index, target in enumerate(targets):
        assert sorted(target.asked) == list(range(index, 30, 3))


@pytest.mark.parametrize("part", [(2, 2), (-1, 2), (0, 0)])
def test_a_part_out_of_range_is_refused(part: tuple[int, int]) -> None:
    with pytest.raises(ValueError, match="0 <= I < N"):
        openloop.LoadSpec(requests=10, part=part)


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--part", "2/2"], "give I/N with 0 <= I < N"),
        (["--part", "1"], "not a part I/N"),
        (["--part", "a/b"], "not a part I/N"),
        (["--start-at", "-5"], "--start-at"),
        (["--start-at", "1e12", "--rate", "10,20"], "--start-at starts one point"),
    ],
)
def test_the_command_refuses_bad_parts(
    extra: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["load", "--transport", "tcp", "--address", "127.0.0.1:9", "--requests", "4", *extra]
    try:
        status = cli.main(argv)
    except SystemExit as exc:  # argparse's own refusals exit
        status = int(exc.code or 0)
    assert status == 2
    assert message in capsys.readouterr().err


def test_a_histogram_survives_encoding_and_adds_up() -> None:
    rng = np.random.default_rng(5)
    values_a = rng.integers(1_000, 50_000_000, 3_000).tolist()
    values_b = rng.integers(10_000, 900_000_000, 2_000).tolist()
    a, b, both = Histogram(), Histogram(), Histogram()
    a.record_many_ns(values_a, [1] * len(values_a))
    b.record_many_ns(values_b, [1] * len(values_b))
    both.record_many_ns(values_a + values_b, [1] * (len(values_a) + len(values_b)))
    copy = Histogram.decode(json.loads(json.dumps(a.encode())))
    assert copy.summary_ms() == a.summary_ms()
    copy.add(Histogram.decode(b.encode()))
    merged, single = copy.summary_ms(), both.summary_ms()
    assert merged["count"] == 5_000
    assert merged.pop("mean_ms") == pytest.approx(single.pop("mean_ms"), rel=1e-12)
    assert merged == single
    empty = Histogram.decode(Histogram().encode())
    assert empty.summary_ms()["count"] == 0


@pytest.mark.parametrize(
    "encoded",
    [
        {"hdr": "not base64 of a histogram", "sum_ns": 0, "max_ns": 0, "spread": False},
        {"sum_ns": 0, "max_ns": 0, "spread": False},
        {"hdr": Histogram().encode()["hdr"], "sum_ns": "x", "max_ns": 0, "spread": False},
    ],
)
def test_a_bad_encoded_histogram_is_a_value_error(encoded: dict[str, Any]) -> None:
    with pytest.raises(ValueError, match="not an encoded histogram"):
        Histogram.decode(encoded)


def test_a_histogram_of_another_precision_is_refused() -> None:
    from hdrh.histogram import HdrHistogram  # type: ignore[import-untyped]

    other = HdrHistogram(1, 1_000_000, 2).encode().decode("ascii")
    encoded = {"hdr": other, "sum_ns": 0, "max_ns": 0, "spread": False}
    with pytest.raises(ValueError, match="another range or precision"):
        Histogram.decode(encoded)


def _run_points(specs: list[openloop.LoadSpec], rate_rps: float) -> list[dict[str, Any]]:
    async def go() -> list[dict[str, Any]]:
        points = [openloop.run_point(NullTarget(), spec, rate_rps=rate_rps) for spec in specs]
        return list(await asyncio.gather(*points))

    return asyncio.run(go())


def test_merged_parts_are_the_whole_point() -> None:
    """Two parts run side by side from one start merge into the counts, histogram counts and
    offered rate of the single run of the same schedule."""
    (whole,) = _run_points([openloop.LoadSpec(requests=300, seed=11)], 3_000.0)
    start = time.time() + 0.1
    parts = _run_points(
        [
            openloop.LoadSpec(requests=300, seed=11, part=(i, 2), start_at_unix_s=start)
            for i in (1, 0)
        ],
        3_000.0,
    )
    merged = hdr_merge.merge_points(parts)
    assert set(merged) == set(whole)
    for key in (
        "requests_scheduled",
        "requests_completed",
        "output_tokens",
        "errors",
        "token_count",
    ):
        assert merged[key] == whole[key], key
    assert merged["offered_rate_rps"] == pytest.approx(whole["offered_rate_rps"])
    for name in ("ttft", "e2e", "send_lag", "queue_wait"):
        assert merged[name]["count"] == whole[name]["count"] == 300
        assert merged[name]["count"] == sum(p[name]["count"] for p in parts)
    assert merged["duration_s"] == max(p["duration_s"] for p in parts)
    assert merged["integrity"]["verified"] == 300
    assert sum(merged["token_count"].values()) == 300  # each part counted its own
    timeline = merged["timeline"]
    assert sum(timeline["completed"]) == 300
    assert sum(timeline["tokens"]) == merged["output_tokens"]
    assert timeline["percentiles"] == "upper bound"
    with pytest.raises(hdr_merge.MergeError, match=r"each of 0\.\.N-1 once"):
        hdr_merge.merge_points([parts[0]])
    with pytest.raises(hdr_merge.MergeError, match=r"each of 0\.\.N-1 once"):
        hdr_merge.merge_points([parts[0], parts[0]])
    with pytest.raises(hdr_merge.MergeError, match="without its part"):
        hdr_merge.merge_points([whole])
    unknown = [{**p, "note": p["part"]["index"], "same": "x"} for p in parts]
    assert hdr_merge.merge_points(unknown)["note"] == [0, 1]  # in part order, not guessed
    assert hdr_merge.merge_points(unknown)["same"] == "x"


def test_timelines_of_different_widths_merge_into_a_width_both_divide() -> None:
    """Each part picks its bucket width from its own span: parts that ended a little apart
    (here 0.02 s and 0.05 s buckets) still merge, in 0.1 s buckets, counts kept whole and the
    percentiles an upper bound."""
    narrow: dict[str, Any] = {
        "bucket_s": 0.02,
        "buckets": 10,
        "completed": [1] * 10,
        "tokens": [2] * 10,
        "itl_p99_ms": [1.0, 9.0, None, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0],
    }
    wide: dict[str, Any] = {
        "bucket_s": 0.05,
        "buckets": 3,
        "completed": [4, 5, 6],
        "tokens": [1, 1, 1],
        "itl_p99_ms": [0.5, 20.0, None],
    }
    merged = hdr_merge._merged_timeline([narrow, wide])
    assert merged is not None
    assert merged["bucket_s"] == pytest.approx(0.1)
    assert merged["buckets"] == 2
    assert merged["completed"] == [5 + 9, 5 + 6]
    assert sum(merged["completed"]) == sum(narrow["completed"]) + sum(wide["completed"])
    assert merged["tokens"] == [10 + 2, 10 + 1]
    assert merged["itl_p99_ms"] == [20.0, 8.0]
    assert merged["percentiles"] == "upper bound"


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("--transport tcp --address 127.0.0.1:9 --part 0/2", "--part is set by"),
        ("--transport tcp --address 127.0.0.1:9 --out=x.json", "--out is set by"),
        ("--transport tcp --spawn", "--spawn is set by"),
        ("--transport tcp --address 127.0.0.1:9 --rate 1,2", "one --rate"),
        ("--transport tcp --address 127.0.0.1:9 --no-such-option", "does not know"),
        ("--transport pigeon --address 127.0.0.1:9", "not valid"),
        ("--transport tcp --address '127.0.0.1:9", "No closing quotation"),
    ],
)
def test_load_arguments_that_cannot_be_split_are_refused(text: str, message: str) -> None:
    with pytest.raises(split_run.SplitRunError, match=message):
        split_run.check_load_arguments(text)


def test_load_arguments_name_the_requests() -> None:
    load = split_run.check_load_arguments("--transport http2 --codec msgpack --address h:1")
    assert load.name == "http2/msgpack"
    assert load.args == ("--transport", "http2", "--codec", "msgpack", "--address", "h:1")
    plan = split_run.PartPlan(
        load_args=load.args, part=1, parts=2, start_at_unix_s=1e9, name=load.name
    )
    assert split_run.PartPlan.from_message(json.loads(json.dumps(plan.to_message()))) == plan
    command = plan.command(out=Path("o.json"), records=Path("r.jsonl"))
    assert command[command.index("--part") + 1] == "1/2"
    with pytest.raises(split_run.SplitRunError, match="not a part plan"):
        split_run.PartPlan.from_message({"part": 0})


def test_the_tail_reads_whole_lines_only(tmp_path: Path) -> None:
    path = tmp_path / "records.jsonl"
    tail = split_run.RecordTail(path)
    assert tail.read() == []  # not there yet
    with path.open("wb") as out:
        out.write(b'{"index": 0}\n{"ind')
        out.flush()
        assert tail.read() == [{"index": 0}]
        out.write(b'ex": 1}\n')
        out.flush()
        assert tail.read() == [{"index": 1}]
        assert tail.read() == []
    tail.close()


def test_a_record_becomes_locust_entries() -> None:
    ok = {"ok": True, "e2e_ms": 9.0, "ttft_ms": 2.0, "tpot_ms": 0.5, "itl_max_ms": None}
    assert split_run.stat_entries(ok) == [
        ("E2E", 9.0, None),
        ("TTFT", 2.0, None),
        ("TPOT", 0.5, None),
    ]
    failed = {"ok": False, "e2e_ms": 3.0, "error": "ConnectError", "ttft_ms": None}
    assert split_run.stat_entries(failed) == [("E2E", 3.0, "ConnectError")]
    assert split_run.stat_entries({**ok, "measured": False}) == []


# -- a real master and two real workers ----------------------------------------------------


def _locust_rows(stats_csv: Path) -> dict[tuple[str, str], dict[str, str]]:
    with stats_csv.open(newline="") as rows:
        return {(row["Type"], row["Name"]): row for row in csv.DictReader(rows)}


@pytest.mark.slow
def test_a_master_and_two_workers_send_the_whole_schedule(tmp_path: Path) -> None:
    requests, rate_rps, seed = 120, 40.0, 5
    scheduled = len(openloop.LoadSpec(requests=requests, seed=seed).offsets_ns(rate_rps))
    with server_process.serve("http2", "orjson") as server:
        load = (
            f"--transport http2 --address {server.address} --rate {rate_rps:g} "
            f"--requests {requests} --seed {seed} --warmup 2"
        )
        run = locust_local.run_local(
            load,
            workers=2,
            folder=tmp_path,
            lead_s=8.0,  # a late start shows as send lag, never as lost requests
            timeout_s=240.0,
            master_options=[f"--csv={tmp_path / 'locust'}"],
        )
    assert run.status == 0, run.log()[-3000:]
    report = run.report
    (point,) = report["points"]
    assert point["requests_scheduled"] == scheduled
    assert point["requests_completed"] == scheduled, point["errors"]
    assert report["parameters"]["split"]["kind"] == "locust"
    assert report["parameters"]["split"]["workers"] == 2
    # each worker's own report of its part, as its generator wrote it
    parts = run.part_points()
    assert sorted(p["part"]["index"] for p in parts) == [0, 1]
    assert sum(p["requests_scheduled"] for p in parts) == scheduled
    for name in ("ttft", "tpot", "itl_per_token", "itl_per_chunk", "e2e", "send_lag"):
        assert point[name]["count"] == sum(p[name]["count"] for p in parts), name
    assert point["ttft"]["count"] == scheduled
    assert sum(point["token_count"].values()) == scheduled
    assert f"{scheduled}/{scheduled} ok" in run.log()  # the master's summary line
    assert "<svg" in html_report.render(report)  # the merged report draws as a single one
    # Locust's own statistics saw every request, from the records the parts streamed
    rows = _locust_rows(tmp_path / "locust_stats.csv")
    assert int(rows[("E2E", "http2/orjson")]["Request Count"]) == scheduled
    assert int(rows[("E2E", "http2/orjson")]["Failure Count"]) == 0
    assert int(rows[("TTFT", "http2/orjson")]["Request Count"]) == scheduled


@pytest.mark.slow
def test_a_part_that_fails_fails_the_run_and_writes_no_report(tmp_path: Path) -> None:
    with socket.socket() as probe:  # a port that nothing listens on
        probe.bind(("127.0.0.1", 0))
        address = f"127.0.0.1:{probe.getsockname()[1]}"
        run = locust_local.run_local(
            f"--transport http2 --address {address} --requests 5 --warmup 1",
            workers=1,
            folder=tmp_path,
            lead_s=2.0,
            timeout_s=180.0,
        )
    assert run.status == 2, run.log()[-3000:]
    assert "part 0/1 failed: exit 2" in run.log()
    assert "the warm-up failed" in run.log()
    assert not (tmp_path / "merged.json").exists()
