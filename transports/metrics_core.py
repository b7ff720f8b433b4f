"""Counters, gauges and histograms cheap enough to update per token, exposed through
``prometheus_client``.

Why not ``prometheus_client``'s own metric classes: their ``observe`` takes a lock and walks
the buckets in Python (about 1.5 us on this machine), and a server streaming at a token a
microsecond would spend more on its metrics than on encoding. These are updated from one event
loop's thread, without a lock: a histogram finds the bucket with :func:`bisect.bisect_left`
and can count ``n`` equal observations at once (the tokens of one write share one gap). A
scrape reads them through a collector (:class:`MetricSet`), possibly from another thread: each
family is copied under the GIL, and a histogram's count is the sum of its buckets, so the
exposition is always consistent (``+Inf`` equals ``_count``).

Names follow Prometheus' conventions: base units in the name (``_seconds``, ``_bytes``),
``_total`` on counters (``prometheus_client`` adds it on exposition; a family is declared
without it).
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Iterator, Sequence
from typing import Final, TypeVar

from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector, CollectorRegistry

LATENCY_BUCKETS_S: Final = (
    0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5,
    1.0, 2.5, 5.0, 10.0, 30.0, 60.0,
)  # fmt: skip
"""Time to first token, inter-token and end-to-end latency: from 100 us (a loopback token
gap) to a minute, with 0.5 s a bound, so an alert on P99 > 500 ms reads an exact bucket."""

ENCODE_BUCKETS_S: Final = (
    1e-7, 2.5e-7, 5e-7, 1e-6, 2.5e-6, 5e-6, 1e-5, 2.5e-5, 5e-5, 1e-4, 2.5e-4, 5e-4, 1e-3, 1e-2,
)  # fmt: skip
"""Encode time of one chunk: 100 ns (a compiled codec on a small chunk) to 10 ms."""


VLLM_TTFT_BUCKETS_S: Final = (
    0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
    20.0, 40.0, 80.0, 160.0, 640.0, 2560.0,
)  # fmt: skip
"""vLLM's ``vllm:time_to_first_token_seconds`` buckets (``vllm/v1/metrics/loggers.py``)."""

VLLM_REQUEST_BUCKETS_S: Final = (
    0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0,
    240.0, 480.0, 960.0, 1920.0, 7680.0,
)  # fmt: skip
"""vLLM's ``request_latency_buckets``: its end-to-end, queue, prefill, decode and inference
histograms (``vllm/v1/metrics/loggers.py``). Coarse under a second: a queue or prefill of a few
milliseconds counts in the first bucket, and only the mean (``_sum`` over ``_count``) is exact."""


class Histogram:
    """One labelled child: bucket counts (the last is ``+Inf``) and the sum."""

    __slots__ = ("_bounds", "counts", "sum")

    def __init__(self, bounds: Sequence[float]) -> None:
        self._bounds = tuple(bounds)
        self.counts = [0] * (len(self._bounds) + 1)
        self.sum = 0.0

    def observe(self, value: float, n: int = 1) -> None:
        """``n`` observations of ``value`` (le semantics: a value on a bound counts in it)."""
        self.counts[bisect_left(self._bounds, value)] += n
        self.sum += value * n


class Counter:
    __slots__ = ("value",)

    def __init__(self) -> None:
        self.value = 0.0

    def inc(self, amount: float = 1.0) -> None:
        self.value += amount


class Gauge:
    __slots__ = ("value",)

    def __init__(self) -> None:
        self.value = 0.0

    def inc(self, amount: float = 1.0) -> None:
        self.value += amount

    def dec(self, amount: float = 1.0) -> None:
        self.value -= amount

    def set(self, value: float) -> None:
        self.value = value


class _Family:
    """A metric name, its help and label names, and one child per tuple of label values."""

    kind = ""

    def __init__(self, name: str, documentation: str, labelnames: Sequence[str]) -> None:
        self.name = name
        self.documentation = documentation
        self.labelnames = tuple(labelnames)
        self.children: dict[tuple[str, ...], object] = {}

    def _check(self, values: tuple[str, ...]) -> None:
        if len(values) != len(self.labelnames):
            raise ValueError(f"{self.name} takes labels {self.labelnames}, given {values}")


class CounterFamily(_Family):
    def labels(self, *values: str) -> Counter:
        child = self.children.get(values)
        if child is None:
            self._check(values)
            child = self.children[values] = Counter()
        assert isinstance(child, Counter)
        return child

    def collect(self) -> Metric:
        family = CounterMetricFamily(self.name, self.documentation, labels=self.labelnames)
        for values, child in list(self.children.items()):
            assert isinstance(child, Counter)
            family.add_metric(list(values), child.value)
        return family


class GaugeFamily(_Family):
    def labels(self, *values: str) -> Gauge:
        child = self.children.get(values)
        if child is None:
            self._check(values)
            child = self.children[values] = Gauge()
        assert isinstance(child, Gauge)
        return child

    def collect(self) -> Metric:
        family = GaugeMetricFamily(self.name, self.documentation, labels=self.labelnames)
        for values, child in list(self.children.items()):
            assert isinstance(child, Gauge)
            family.add_metric(list(values), child.value)
        return family


class HistogramFamily(_Family):
    def __init__(
        self,
        name: str,
        documentation: str,
        labelnames: Sequence[str],
        buckets: Sequence[float] = LATENCY_BUCKETS_S,
    ) -> None:
        super().__init__(name, documentation, labelnames)
        self.buckets = tuple(buckets)

    def labels(self, *values: str) -> Histogram:
        child = self.children.get(values)
        if child is None:
            self._check(values)
            child = self.children[values] = Histogram(self.buckets)
        assert isinstance(child, Histogram)
        return child

    def collect(self) -> Metric:
        family = HistogramMetricFamily(self.name, self.documentation, labels=self.labelnames)
        bounds = [*(repr(float(b)) for b in self.buckets), "+Inf"]
        for values, child in list(self.children.items()):
            assert isinstance(child, Histogram)
            counts = list(child.counts)
            cumulative = []
            running = 0
            for bound, count in zip(bounds, counts, strict=True):
                running += count
                cumulative.append((bound, float(running)))
            family.add_metric(list(values), cumulative, child.sum)
        return family


_F = TypeVar("_F", CounterFamily, GaugeFamily, HistogramFamily)


class MetricSet(Collector):
    """The families of one process, registered as one collector on ``registry`` (a new
    :class:`CollectorRegistry` by default, so two sets in one process, as in tests, do not
    clash)."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry if registry is not None else CollectorRegistry(auto_describe=True)
        self._families: list[CounterFamily | GaugeFamily | HistogramFamily] = []
        self.registry.register(self)

    def counter(self, name: str, documentation: str, labelnames: Sequence[str]) -> CounterFamily:
        return self._add(CounterFamily(name, documentation, labelnames))

    def gauge(self, name: str, documentation: str, labelnames: Sequence[str]) -> GaugeFamily:
        return self._add(GaugeFamily(name, documentation, labelnames))

    def histogram(
        self,
        name: str,
        documentation: str,
        labelnames: Sequence[str],
        buckets: Sequence[float] = LATENCY_BUCKETS_S,
    ) -> HistogramFamily:
        return self._add(HistogramFamily(name, documentation, labelnames, buckets))

    def _add(self, family: _F) -> _F:
        if any(f.name == family.name for f in self._families):
            raise ValueError(f"metric {family.name} is declared twice")
        self._families.append(family)
        return family

    def collect(self) -> Iterator[Metric]:
        for family in self._families:
            yield family.collect()
