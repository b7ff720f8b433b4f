"""The attribution benchmark's own parts, without processes: the join of the generator's
records to the frontend's stamps lines (by when the frontend received each request, and its
tokens), the truth made of a line, the bounds, the comparison, and the report's part "Where a
request's time goes" from a raw file written here."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from inferwire.bench.measure import attribution_truth as at
from inferwire.bench.report import engine_attribution
from inferwire.load.metrics import RequestRecord
from inferwire.transports.timing import StreamTiming

MS = 1_000_000


def record(index: int, tokens: int = 16, **fields: Any) -> RequestRecord:
    """A completed request: 100 ms end to end, 0.5 ms of generator lag, 0.25 ms pool wait,
    and the server's report of 2 ms queue and 90 ms model time."""
    base: dict[str, Any] = {
        "index": index,
        "intended_s": index / 10,
        "queue_wait_ms": 0.5,
        "ok": True,
        "error": None,
        "ttft_ms": 10.0,
        "e2e_ms": 100.0,
        "output_tokens": tokens,
        "chunks": tokens,
        "tpot_ms": 5.0,
        "itl_max_ms": 6.0,
        "input_tokens": 256,
        "pool_wait_ms": 0.25,
        "server_queue_ms": 2.0,
        "server_model_ms": 90.0,
        "outside_engine_ms": 100.0 - 0.75 - 92.0,
    }
    return RequestRecord(**{**base, **fields})


def timing(acquired_ms: float, head_ms: float) -> StreamTiming:
    stamps = StreamTiming(server_stamps=False)
    stamps.acquired_ns = round(acquired_ms * MS)
    stamps.head_ns = round(head_ms * MS)
    return stamps


def line(received_ms: float, tokens: int = 16, outcome: str = "ok") -> dict[str, Any]:
    """A stamps line with 2 ms in the queue and 90 ms of model time."""
    arrived = round(received_ms * MS) + MS // 10
    return {
        "request_id": f"chatcmpl-{received_ms}",
        "outcome": outcome,
        "tokens": tokens,
        "frontend_received_ns": round(received_ms * MS),
        "engine_arrived_ns": arrived,
        "engine_scheduled_ns": arrived + 2 * MS,
        "engine_last_token_ns": arrived + 92 * MS,
    }


def test_a_line_joins_the_record_whose_window_holds_its_receipt() -> None:
    records = [record(0), record(1, tokens=20), record(2)]
    timings = {0: timing(100, 101), 1: timing(200, 201), 2: timing(300, 301)}
    lines = [line(300.5), line(100.5), line(200.5, tokens=20)]
    joined = at.join(records, timings, lines)
    assert [(r.index, ln["frontend_received_ns"]) for r, ln in joined.pairs] == [
        (0, 100_500_000),
        (1, 200_500_000),
        (2, 300_500_000),
    ]
    assert (joined.ambiguous, joined.records_unjoined, joined.lines_unjoined) == (0, 0, 0)


def test_tokens_settle_overlapping_windows() -> None:
    """Two requests written at once: each line fits both windows, but only one's tokens."""
    records = [record(0, tokens=16), record(1, tokens=20)]
    timings = {0: timing(100, 103), 1: timing(100.1, 103)}
    lines = [line(101, tokens=20), line(102, tokens=16)]
    joined = at.join(records, timings, lines)
    assert {r.index: ln["tokens"] for r, ln in joined.pairs} == {0: 16, 1: 20}
    assert joined.ambiguous == 0


def test_a_line_left_to_one_record_settles_the_other() -> None:
    """Record 1 fits only the second line; record 0 fits both, so takes the first."""
    records = [record(0), record(1)]
    timings = {0: timing(100, 103), 1: timing(101.5, 103)}
    lines = [line(101), line(102)]
    joined = at.join(records, timings, lines)
    assert {r.index: ln["frontend_received_ns"] for r, ln in joined.pairs} == {
        0: 101 * MS,
        1: 102 * MS,
    }
    assert joined.ambiguous == 0


def test_lines_that_fit_several_records_are_assigned_in_order_and_counted() -> None:
    records = [record(0), record(1)]
    timings = {0: timing(100, 103), 1: timing(100.5, 103)}
    joined = at.join(records, timings, [line(101), line(102)])
    assert len(joined.pairs) == 2
    assert joined.ambiguous == 2  # either could be either: both pairs rest on the order


def test_warm_up_lines_failures_and_strays_are_not_joined() -> None:
    records = [
        record(0),
        record(1, ok=False, error="ServerStreamError"),
        record(2),
        record(3),  # no timing: its window is unknown
    ]
    timings = {0: timing(100, 101), 1: timing(150, 151), 2: timing(200, 201)}
    lines = [
        line(50),  # an untimed warm-up request's, before the point
        line(100.5),
        line(150.5, outcome="error"),
        line(200.5, tokens=99),  # tokens that are not the record's
        line(250),  # fits no window
    ]
    joined = at.join(records, timings, lines)
    assert [r.index for r, _ in joined.pairs] == [0]
    assert joined.records_unjoined == 2  # request 2 (its line's tokens differ) and request 3
    assert joined.lines_unjoined == 2  # the lines at 200.5 and 250 ms


def test_the_truth_of_a_line() -> None:
    truth = at.truth_ms(record(0), line(100.5))
    assert truth == pytest.approx({"queue": 2.0, "model": 90.0, "outside": 7.25})


@pytest.mark.parametrize(
    ("attributed", "truth", "agree"),
    [
        (100.0, 100.0, True),
        (110.0, 100.0, True),  # 10%
        (110.5, 100.0, False),
        (90.0, 100.0, True),
        (3.0, 2.0, True),  # 1 ms, where 10% is less
        (3.1, 2.0, False),
        (0.0, 0.9, True),
        (None, 2.0, False),  # not attributed
    ],
)
def test_bounds_are_ten_percent_or_one_millisecond(
    attributed: float | None, truth: float, agree: bool
) -> None:
    assert at.agrees(attributed, truth) is agree


def _point(**split: float) -> dict[str, Any]:
    means = {"e2e_mean_ms": 100.0, "queue_mean_ms": 2.0, "model_mean_ms": 90.0}
    means["outside_mean_ms"] = 7.25
    means.update(split)
    return {
        "requests_completed": 2,
        "requests_failed": 0,
        "errors": {},
        "integrity": {},
        "e2e": {"p50_ms": 100.0},
        "attribution": {
            "sources": {
                "prometheus": {"state": "used", "stages": {"queue": {"count": 2}}, "split": means}
            }
        },
    }


def _run(point: dict[str, Any], records: list[RequestRecord]) -> at.AttributedRun:
    timings = {r.index: timing(100 * (r.index + 1), 100 * (r.index + 1) + 1) for r in records}
    return at.AttributedRun(point=point, records=records, timings=timings)


def _lines(records: list[RequestRecord]) -> list[dict[str, Any]]:
    return [line(100 * (r.index + 1) + 0.5, tokens=r.output_tokens) for r in records]


def test_agreeing_accounts_are_correct() -> None:
    records = [record(0), record(1)]
    figures = at.compare(_run(_point(), records), _lines(records))
    assert figures["correct"], figures
    assert figures["per_request"]["outside"]["truth_p50_ms"] == pytest.approx(7.25)
    assert figures["per_point"]["model"]["ratio"] == pytest.approx(1.0)
    assert figures["join"] == {
        "pairs": 2,
        "ambiguous": 0,
        "records_unjoined": 0,
        "lines_unjoined": 0,
    }


@pytest.mark.parametrize(
    ("records", "point", "fault"),
    [
        ([record(0, server_queue_ms=4.0), record(1, server_queue_ms=4.0)], _point(), "request"),
        ([record(0, server_model_ms=None), record(1)], _point(), "request"),
        ([record(0), record(1)], _point(model_mean_ms=80.0), "point"),
        ([record(0), record(1)], _point(queue_mean_ms=None), "point"),  # type: ignore[arg-type]
    ],
)
def test_a_stage_out_of_bounds_is_not_correct(
    records: list[RequestRecord], point: dict[str, Any], fault: str
) -> None:
    figures = at.compare(_run(point, records), _lines(records))
    assert not figures["correct"]
    assert not figures["within_bounds"]
    key = "per_request" if fault == "request" else "per_point"
    assert not all(figures[key][s]["within"] for s in at.STAGES)


def test_an_unjoined_request_or_a_failed_stream_is_not_correct() -> None:
    records = [record(0), record(1)]
    assert not at.compare(_run(_point(), records), _lines(records)[:1])["correct"]
    failed = {**_point(), "requests_failed": 1}
    assert not at.compare(_run(failed, records), _lines(records))["correct"]


# -- the report's part ----------------------------------------------------------------------------


def _raw(tmp_path: Path, *infos: dict[str, Any]) -> Path:
    raw = tmp_path / "raw"
    raw.mkdir()
    benchmarks = [{"extra_info": info} for info in infos]
    (raw / "engine.json").write_text(json.dumps({"benchmarks": benchmarks}))
    return raw


def _info(hop: str, figures: dict[str, Any]) -> dict[str, Any]:
    return {
        "op": "engine-attribution",
        "hop_codec": hop,
        "frontend_codec": "orjson",
        "policy": "continuous",
        "rate_rps": 20.0,
        "window_s": 10.0,
        "bound_share": at.BOUND_SHARE,
        "bound_ms": at.BOUND_MS,
        **figures,
    }


def test_the_section_shows_attributed_beside_truth_per_hop(tmp_path: Path) -> None:
    records = [record(0), record(1)]
    good = at.compare(_run(_point(), records), _lines(records))
    bad = at.compare(_run(_point(model_mean_ms=80.0), records), _lines(records))
    raw = _raw(tmp_path, {"op": "c8-virtual"}, _info("orjson", good), _info("pickle", bad))
    text = engine_attribution.section(raw)
    assert text.startswith("### Where a request's time goes")
    rows = [r for r in text.splitlines() if r.startswith("| `")]
    assert rows[0] == (
        "| `orjson` | 100.0 | 2.0 / 2.0 | 90.0 / 90.0 | 7.2 / 7.2 "
        "| metrics object, P50 over requests | yes |"
    )
    assert rows[1].startswith(
        "| `orjson` | 100.0 | 2.0 / 2.0 | 90.0 / 90.0 | 7.2 / 7.2 | `/metrics`"
    )
    assert rows[3].endswith("| no: model |")  # pickle's point means
    assert "4 requests joined (0 by order among several that fit, 0 not joined)" in text


def test_the_section_says_when_the_run_lacks_it(tmp_path: Path) -> None:
    text = engine_attribution.section(_raw(tmp_path, {"op": "c8-virtual"}))
    assert "Not in this run (its benchmark" in text
    assert engine_attribution.section(tmp_path / "nothing") == ""
