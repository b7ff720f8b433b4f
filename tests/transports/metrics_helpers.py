"""Scrapes of a server's metrics, parsed with prometheus_client's parser, for the metrics
tests (:mod:`tests.test_metrics`, :mod:`tests.test_metrics_meter`)."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Final

import httpx
from prometheus_client.parser import text_string_to_metric_families

SETTLE_TIMEOUT_S: Final = 60.0
SCRAPE_TIMEOUT_S: Final = 120.0

FAMILIES: Final = {
    "inferwire_requests": ("counter", {"transport", "codec", "kind", "outcome"}),
    "inferwire_time_to_first_token_seconds": ("histogram", {"transport", "codec"}),
    "inferwire_inter_token_latency_seconds": ("histogram", {"transport", "codec"}),
    "inferwire_e2e_request_latency_seconds": ("histogram", {"transport", "codec", "kind"}),
    "inferwire_encode_seconds": ("histogram", {"codec"}),
    "inferwire_response_bytes": ("counter", {"transport", "codec"}),
    "inferwire_generation_tokens": ("counter", {"transport", "codec"}),
    "inferwire_streams_in_flight": ("gauge", {"transport"}),
}
"""OBSERVE-SPEC.md's server metrics, as the parser names the families (a counter without
``_total``), with their types and label names."""


@dataclass(frozen=True, slots=True)
class Scrape:
    """One exposition, parsed."""

    families: dict[str, tuple[str, list[tuple[str, dict[str, str], float]]]]
    samples: list[_Sample]

    @classmethod
    def parse(cls, text: str) -> Scrape:
        families = {}
        samples = []
        for family in text_string_to_metric_families(text):
            rows = [(s.name, dict(s.labels), s.value) for s in family.samples]
            families[family.name] = (family.type, rows)
            samples += [_Sample(s.name, dict(s.labels), s.value) for s in family.samples]
        return cls(families, samples)

    def value(self, name: str, **labels: str) -> float:
        """The sum of ``name``'s samples whose labels include ``labels``."""
        return sum(
            s.value for s in self.samples if s.name == name and labels.items() <= s.labels.items()
        )

    def buckets(self, name: str, **labels: str) -> dict[str, float]:
        out: dict[str, float] = {}
        for s in self.samples:
            if s.name == f"{name}_bucket" and labels.items() <= s.labels.items():
                out[s.labels["le"]] = out.get(s.labels["le"], 0.0) + s.value
        return out

    def check_families(self) -> None:
        """Every family of the spec, of its type, with exactly its label names; every
        histogram consistent (``+Inf`` equals ``_count``, cumulative buckets)."""
        for name, (kind, labels) in FAMILIES.items():
            assert name in self.families, f"{name} is not exposed"
            exposed_kind, rows = self.families[name]
            assert exposed_kind == kind, name
            assert rows, f"{name} has no series"
            for sample_name, sample_labels, _ in rows:
                assert set(sample_labels) - {"le"} == labels, (sample_name, sample_labels)
            if kind == "histogram":
                self._check_histogram(name)

    def _check_histogram(self, name: str) -> None:
        series: dict[tuple[tuple[str, str], ...], list[float]] = {}
        counts = {}
        for s in self.samples:
            key = tuple(sorted((k, v) for k, v in s.labels.items() if k != "le"))
            if s.name == f"{name}_bucket":
                series.setdefault(key, []).append(s.value)
            elif s.name == f"{name}_count":
                counts[key] = s.value
        for key, cumulative in series.items():
            assert cumulative == sorted(cumulative), (name, key)
            assert cumulative[-1] == counts[key], (name, key)


@dataclass(frozen=True, slots=True)
class _Sample:
    name: str
    labels: dict[str, str]
    value: float


def scrape(url: str, *, http2: bool = False) -> Scrape:
    with httpx.Client(http1=not http2, http2=http2, timeout=SCRAPE_TIMEOUT_S) as client:
        response = client.get(url)
    assert response.status_code == 200, response.text
    assert response.headers["content-type"].startswith("text/plain; version=")
    return Scrape.parse(response.text)


def settled(url: str, done: Callable[[Scrape], bool]) -> Scrape:
    """Scrape until ``done`` holds (the server records an answer as it ends, a moment after
    its client has read it) or the bound passes; the last scrape either way."""
    deadline = time.monotonic() + SETTLE_TIMEOUT_S
    while True:
        last = scrape(url)
        if done(last) or time.monotonic() > deadline:
            return last
        time.sleep(0.05)


def delta(after: Scrape, before: Scrape, name: str, **labels: str) -> float:
    return after.value(name, **labels) - before.value(name, **labels)
