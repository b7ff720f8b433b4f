"""The lock-free metrics of :mod:`inferwire.transports.metrics_core`, through the text a scrape
reads: bucket bounds with Prometheus' ``le`` (less than or equal) semantics, ``n``
observations at once, an exposition that stays consistent while another thread observes, and
the mistakes a declaration can make."""

from __future__ import annotations

import threading
from typing import Final

import pytest
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.samples import Sample

from inferwire.transports.metrics_core import (
    ENCODE_BUCKETS_S,
    LATENCY_BUCKETS_S,
    MetricSet,
)

BOUNDS: Final = (0.001, 0.01, 0.1)


def samples(metric_set: MetricSet) -> list[Sample]:
    text = generate_latest(metric_set.registry).decode()
    return [s for family in text_string_to_metric_families(text) for s in family.samples]


def buckets(metric_set: MetricSet, name: str) -> dict[str, float]:
    """``le`` -> cumulative count of histogram ``name``'s only child."""
    return {s.labels["le"]: s.value for s in samples(metric_set) if s.name == f"{name}_bucket"}


def one(metric_set: MetricSet, name: str, **labels: str) -> float:
    (value,) = [
        s.value
        for s in samples(metric_set)
        if s.name == name and labels.items() <= s.labels.items()
    ]
    return value


@pytest.mark.parametrize(
    ("value", "first_bucket_holding_it"),
    [
        (0.0, "0.001"),
        (0.001, "0.001"),  # on a bound: counted in it (le)
        (0.0010000001, "0.01"),
        (0.01, "0.01"),
        (0.05, "0.1"),
        (0.1, "0.1"),
        (0.1000001, "+Inf"),
        (1e9, "+Inf"),
    ],
)
def test_a_value_falls_in_the_first_bucket_whose_bound_it_does_not_pass(
    value: float, first_bucket_holding_it: str
) -> None:
    metric_set = MetricSet()
    metric_set.histogram("t_seconds", "test", (), BOUNDS).labels().observe(value)
    cumulative = buckets(metric_set, "t_seconds")
    order = ["0.001", "0.01", "0.1", "+Inf"]
    first = order.index(first_bucket_holding_it)
    assert [cumulative[le] for le in order] == [0.0] * first + [1.0] * (len(order) - first)


def test_n_observations_at_once_count_n_times_and_add_n_times_the_value() -> None:
    metric_set = MetricSet()
    child = metric_set.histogram("t_seconds", "test", (), BOUNDS).labels()
    child.observe(0.0, 5)  # the tokens of one write after its first: gaps of 0
    child.observe(0.05, 3)
    child.observe(0.5)
    assert buckets(metric_set, "t_seconds") == {"0.001": 5, "0.01": 5, "0.1": 8, "+Inf": 9}
    assert one(metric_set, "t_seconds_count") == 9
    assert one(metric_set, "t_seconds_sum") == pytest.approx(0.15 + 0.5)


def test_counters_gauges_and_labelled_children_as_exposed() -> None:
    metric_set = MetricSet()
    requests = metric_set.counter("t_requests", "test", ("outcome",))
    requests.labels("ok").inc()
    requests.labels("ok").inc(2)
    requests.labels("error").inc()
    gauge = metric_set.gauge("t_in_flight", "test", ("transport",)).labels("tcp")
    gauge.inc(3)
    gauge.dec()
    assert requests.labels("ok") is requests.labels("ok")  # a child is made once
    assert one(metric_set, "t_requests_total", outcome="ok") == 3
    assert one(metric_set, "t_requests_total", outcome="error") == 1
    assert one(metric_set, "t_in_flight", transport="tcp") == 2
    gauge.set(0)
    assert one(metric_set, "t_in_flight", transport="tcp") == 0


@pytest.mark.parametrize("values", [(), ("a", "b", "c")])
def test_a_child_with_the_wrong_number_of_labels_is_refused(values: tuple[str, ...]) -> None:
    metric_set = MetricSet()
    for family in (
        metric_set.counter("t_c", "test", ("a", "b")),
        metric_set.gauge("t_g", "test", ("a", "b")),
        metric_set.histogram("t_h", "test", ("a", "b")),
    ):
        with pytest.raises(ValueError, match="takes labels"):
            family.labels(*values)
        assert family.children == {}


def test_a_name_declared_twice_is_refused() -> None:
    metric_set = MetricSet()
    metric_set.counter("t_requests", "test", ())
    with pytest.raises(ValueError, match="declared twice"):
        metric_set.histogram("t_requests", "test", ())


def test_two_sets_in_one_process_do_not_clash() -> None:
    first, second = MetricSet(), MetricSet()
    first.counter("t_requests", "test", ()).labels().inc()
    second.counter("t_requests", "test", ()).labels().inc(5)
    assert one(first, "t_requests_total") == 1
    assert one(second, "t_requests_total") == 5


def test_the_buckets_are_sorted_and_half_a_second_is_a_bound() -> None:
    for bounds in (LATENCY_BUCKETS_S, ENCODE_BUCKETS_S):
        assert list(bounds) == sorted(set(bounds))
    assert 0.5 in LATENCY_BUCKETS_S  # an alert on P99 > 500 ms reads an exact bucket


def test_a_scrape_from_another_thread_sees_consistent_histograms() -> None:
    """A scrape copies each child's buckets, and the count is their sum: ``+Inf`` always
    equals ``_count`` and the buckets never decrease, however the observations interleave."""
    metric_set = MetricSet()
    child = metric_set.histogram("t_seconds", "test", (), BOUNDS).labels()
    done = threading.Event()
    seen: list[tuple[list[float], float]] = []

    def scrape() -> None:
        while not done.is_set() or len(seen) < 5:
            exposed = samples(metric_set)  # one scrape: its buckets and count together
            series = {s.labels["le"]: s.value for s in exposed if s.name == "t_seconds_bucket"}
            (count,) = [s.value for s in exposed if s.name == "t_seconds_count"]
            seen.append(([series[le] for le in ("0.001", "0.01", "0.1", "+Inf")], count))

    scraper = threading.Thread(target=scrape)
    scraper.start()
    try:
        for i in range(200_000):
            child.observe((i % 7) * 0.02, 1 + i % 3)
            if len(seen) >= 50:
                break
    finally:
        done.set()
        scraper.join()
    assert len(seen) >= 5
    for cumulative, count in seen:
        assert cumulative == sorted(cumulative)
        assert cumulative[-1] == count
