"""The split of a request's time (inferwire.load.attribution.split) and the reader of vLLM's
per-request metrics object (.reports): arithmetic on stamps, refusals of reports that cannot be
right."""

from __future__ import annotations

import math

import pytest

from inferwire.load.attribution import reports, split
from inferwire.transports.timing import StreamTiming

MS = 1_000_000


def _timing(**stamps: int | str) -> StreamTiming:
    timing = StreamTiming(server_stamps=False)
    for name, value in stamps.items():
        setattr(timing, name, value)
    return timing


def test_the_client_stages_are_differences_of_stamps_in_causal_order() -> None:
    timing = _timing(
        acquired_ns=110 * MS,
        connect_ns=4 * MS,
        request_sent_ns=111 * MS,
        head_ns=120 * MS,
        traceparent="00-" + "a" * 32 + "-" + "b" * 16 + "-01",
    )
    stages = split.client_stages_ns(
        timing, intended_ns=100 * MS, sent_ns=102 * MS, first_ns=150 * MS, parse_ns=3 * MS
    )
    assert stages == {
        "lag": 2 * MS,
        "parse": 3 * MS,
        "pool_wait": 4 * MS,  # 8 ms from the start to the connection, 4 of them the connect
        "connect": 4 * MS,
        "write": 1 * MS,
        "wait_head": 9 * MS,
        "first_event": 30 * MS,
    }
    assert all(v >= 0 for v in stages.values())


def test_a_transport_without_a_head_has_no_head_stage() -> None:
    timing = _timing(request_start_ns=100 * MS, request_sent_ns=101 * MS)
    stages = split.client_stages_ns(
        timing, intended_ns=100 * MS, sent_ns=100 * MS, first_ns=110 * MS, parse_ns=0
    )
    assert "wait_head" not in stages
    assert stages["first_event"] == 9 * MS


@pytest.mark.parametrize(
    ("metrics", "kind"),
    [
        ({"queue_time_ms": -1.0, "time_to_first_token_ms": 5, "generation_time_ms": 5}, "negative"),
        ({"queue_time_ms": "1", "time_to_first_token_ms": 5}, "not a number"),
        ({"queue_time_ms": math.nan}, "not a number"),
        ({"queue_time_ms": True}, "not a number"),
        ([1, 2], "not an object"),
        (
            {"queue_time_ms": 10, "time_to_first_token_ms": 50, "generation_time_ms": 100},
            "longer than the request",
        ),
    ],
)
def test_a_metrics_object_that_cannot_be_right_is_refused(metrics: object, kind: str) -> None:
    with pytest.raises(reports.BadReport) as caught:
        reports.from_metrics_object(metrics, e2e_ms=100.0)
    assert caught.value.kind == kind


def test_vllms_fields_map_to_queue_prefill_decode() -> None:
    report = reports.from_metrics_object(
        {
            "queue_time_ms": 12.5,
            "time_to_first_token_ms": 20,
            "generation_time_ms": 300,
            "mean_itl_ms": 3,
            "tokens_per_second": 330,
        },
        e2e_ms=400.0,
    )
    assert report == reports.ServerReport(
        source=reports.METRICS_OBJECT, queue_ms=12.5, prefill_ms=20.0, decode_ms=300.0
    )
    assert report.engine_ms() == pytest.approx(332.5)


def test_a_metrics_object_of_nulls_reports_nothing() -> None:
    nulls = {"queue_time_ms": None, "time_to_first_token_ms": None, "generation_time_ms": None}
    assert reports.from_metrics_object(nulls, e2e_ms=10.0) is None


def _request(point: split.PointSplit, metrics: object, e2e_ms: float) -> dict[str, object] | None:
    timing = _timing(acquired_ns=1 * MS, request_sent_ns=2 * MS, head_ns=3 * MS)
    return point.request(
        timing,
        intended_ns=0,
        sent_ns=1 * MS,
        first_ns=30 * MS,
        done_ns=round(e2e_ms * MS),
        parse_ns=MS // 10,
        metrics_object=metrics,
    )


def test_outside_the_engine_is_what_neither_the_client_nor_the_engine_spent() -> None:
    point = split.PointSplit()
    fields = _request(
        point, {"queue_time_ms": 10, "time_to_first_token_ms": 20, "generation_time_ms": 60}, 100
    )
    assert fields is not None
    # 100 ms E2E, 1 ms of the generator's lag, 90 ms in the engine: 9 ms outside
    assert fields["outside_engine_ms"] == pytest.approx(9.0)
    assert fields["server_source"] == reports.METRICS_OBJECT
    summary = point.summary()
    assert summary["per_request"]["requests"] == 1
    assert summary["per_request"]["outside_share_of_e2e"] == pytest.approx(0.09)


def test_a_bad_report_is_a_note_and_no_figure() -> None:
    point = split.PointSplit()
    fields = _request(point, {"queue_time_ms": -5}, 100)
    assert fields is not None
    assert fields["server_source"] is None
    assert fields["outside_engine_ms"] is None
    summary = point.summary()
    assert summary["per_request"]["requests"] == 0
    assert summary["notes"] == ["a metrics object was refused (negative) (1x)"]


def test_stages_past_what_the_client_waited_are_refused() -> None:
    point = split.PointSplit()
    report = reports.ServerReport(source=reports.OTLP, queue_ms=50, prefill_ms=40, decode_ms=30)
    assert point.record_split(report, e2e_ns=100 * MS, client_ns={"lag": 0}) == {}
    assert point.summary()["per_request"]["requests"] == 0
    assert point.notes


def test_deferred_requests_are_joined_to_their_spans_or_counted_missing() -> None:
    point = split.PointSplit()
    got: list[dict[str, object]] = []
    ids = ["1" * 32, "2" * 32]
    for trace_id in ids:
        timing = _timing(
            acquired_ns=MS, request_sent_ns=2 * MS, traceparent=f"00-{trace_id}-{'b' * 16}-01"
        )
        fields = point.request(
            timing,
            intended_ns=0,
            sent_ns=0,
            first_ns=10 * MS,
            done_ns=100 * MS,
            parse_ns=0,
            metrics_object=None,
            deferred=got.append,
        )
        assert fields is None
    assert point.waiting_trace_ids() == ids
    found = reports.ServerReport(source=reports.OTLP, queue_ms=5, inference_ms=80)
    point.join(lambda trace_id: found if trace_id == ids[0] else None)
    assert [g["trace_id"] for g in got] == ids
    assert got[0]["outside_engine_ms"] == pytest.approx(14.0)  # 1 ms waiting for a connection
    assert got[1]["server_source"] is None
    assert point.spans_missing == 1
