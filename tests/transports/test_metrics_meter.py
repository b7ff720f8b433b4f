"""The server metrics' meter alone (:mod:`inferwire.transports.metrics`), read through the
text a scrape reads: what a stream's writes and a request's end record, the series that exist
from the start, and the outcome of a status or of what cut an answer short."""

from __future__ import annotations

import asyncio
from typing import Final

import pytest

import inferwire.transports as it
from inferwire.transports import metrics
from inferwire.transports.metrics import RequestMeter, ServerMetrics
from inferwire.transports.metrics_core import LATENCY_BUCKETS_S
from tests.transports.metrics_helpers import Scrape

CODEC: Final = "orjson"


def exposed(server_metrics: ServerMetrics) -> Scrape:
    text, content_type = metrics.exposition(server_metrics)
    assert content_type.startswith("text/plain")
    return Scrape.parse(text.decode())


def test_a_streams_writes_give_one_first_token_and_one_gap_per_token_after_it() -> None:
    server_metrics = ServerMetrics("tcp", CODEC)
    meter = server_metrics.start("stream")
    meter.written(1)  # a status byte: no chunk, no token timing
    meter.encoded(3, 3000)
    meter.written(300)  # three chunks in one write: the first token, then two gaps of 0
    meter.encoded(2, 1000)
    meter.written(200)  # a gap, then one of 0
    meter.written(10)  # an end marker: bytes only
    assert exposed(server_metrics).value("inferwire_streams_in_flight") == 1
    meter.finish("ok")
    meter.finish("error")  # a second end is ignored
    scrape = exposed(server_metrics)
    assert scrape.value("inferwire_requests_total", kind="stream", outcome="ok") == 1
    assert scrape.value("inferwire_requests_total", outcome="error") == 0
    assert scrape.value("inferwire_streams_in_flight") == 0
    assert scrape.value("inferwire_generation_tokens_total") == 5
    assert scrape.value("inferwire_response_bytes_total") == 511
    assert scrape.value("inferwire_time_to_first_token_seconds_count") == 1
    itl = scrape.buckets("inferwire_inter_token_latency_seconds")
    assert itl["+Inf"] == 4
    assert itl[repr(LATENCY_BUCKETS_S[0])] >= 3  # the three gaps of 0, at least
    encode = scrape.buckets("inferwire_encode_seconds", codec=CODEC)
    assert encode["+Inf"] == 5
    assert scrape.value("inferwire_encode_seconds_sum", codec=CODEC) == pytest.approx(4e-6)
    assert scrape.value("inferwire_e2e_request_latency_seconds_count", kind="stream") == 1


def test_every_series_exists_from_the_start_with_the_specs_names_and_labels() -> None:
    scrape = exposed(ServerMetrics("http2", "protobuf"))
    scrape.check_families()
    assert scrape.value("inferwire_requests_total") == 0
    outcomes = {
        (s.labels["kind"], s.labels["outcome"])
        for s in scrape.samples
        if s.name == "inferwire_requests_total"
    }
    assert outcomes == {(k, o) for k in metrics.KINDS for o in metrics.OUTCOMES}


def test_only_an_answer_that_completes_ok_has_an_end_to_end_latency() -> None:
    server_metrics = ServerMetrics("grpc", CODEC)
    for outcome in metrics.OUTCOMES:
        server_metrics.start("unary").finish(outcome)
    server_metrics.answered("unary", "bad_request", nbytes=7)
    scrape = exposed(server_metrics)
    assert scrape.value("inferwire_requests_total", kind="unary") == 5
    assert scrape.value("inferwire_requests_total", outcome="bad_request") == 2
    assert scrape.value("inferwire_e2e_request_latency_seconds_count", kind="unary") == 1
    assert scrape.value("inferwire_response_bytes_total") == 7
    assert scrape.value("inferwire_streams_in_flight") == 0


def test_the_encode_histogram_names_the_codec_that_encoded() -> None:
    server_metrics = ServerMetrics("http1", "protobuf")
    meter = server_metrics.start("stream", encoder="orjson")  # the OpenAI API's JSON chunks
    meter.encoded(4, 400)
    meter.written(100)
    meter.finish("ok")
    scrape = exposed(server_metrics)
    assert scrape.value("inferwire_encode_seconds_count", codec="orjson") == 4
    assert scrape.value("inferwire_encode_seconds_count", codec="protobuf") == 0
    assert scrape.value("inferwire_generation_tokens_total", codec="protobuf") == 4


@pytest.mark.parametrize(
    ("exc", "outcome"),
    [
        (asyncio.CancelledError(), "cancelled"),
        (GeneratorExit(), "cancelled"),
        (ConnectionResetError(), "cancelled"),
        (BrokenPipeError(), "cancelled"),
        (asyncio.IncompleteReadError(b"", 4), "cancelled"),
        (it.TransportTimeoutError("peer not reading"), "cancelled"),
        (RuntimeError("a bug"), "error"),
        (ValueError("a bug"), "error"),
    ],
)
def test_what_cut_an_answer_short_gives_its_outcome(exc: BaseException, outcome: str) -> None:
    assert metrics.outcome_of(exc) == outcome


@pytest.mark.parametrize(
    ("status", "outcome"),
    [(200, "ok"), (204, "ok"), (400, "bad_request"), (404, "bad_request"), (500, "error")],
)
def test_an_http_status_gives_its_outcome(status: int, outcome: str) -> None:
    assert metrics.outcome_of_status(status) == outcome


def test_a_meter_is_a_small_object() -> None:
    assert not hasattr(RequestMeter(ServerMetrics("tcp", CODEC), "unary", 1, CODEC), "__dict__")
