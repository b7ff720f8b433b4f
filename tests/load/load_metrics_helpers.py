"""Reading the load generator's live metrics in the tests: the exposition text parsed with
prometheus_client's parser, and the check that they say what the run's report says."""

from __future__ import annotations

from typing import Any

import pytest
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from inferwire.load.live_metrics import PRESET_ERROR_KINDS, LiveMetrics

SPEC = {  # exposed family name (no _total): type, label names
    "inferwire_load_requests": ("counter", {"outcome"}),
    "inferwire_load_errors": ("counter", {"kind"}),
    "inferwire_load_time_to_first_token_seconds": ("histogram", set()),
    "inferwire_load_time_to_first_output_token_seconds": ("histogram", set()),
    "inferwire_load_inter_token_latency_seconds": ("histogram", set()),
    "inferwire_load_inter_token_latency_per_token_seconds": ("histogram", set()),
    "inferwire_load_e2e_request_latency_seconds": ("histogram", set()),
    "inferwire_load_send_lag_seconds": ("histogram", set()),
    "inferwire_load_requests_in_flight": ("gauge", set()),
    "inferwire_load_output_tokens": ("counter", set()),
    "inferwire_load_token_chunks": ("counter", set()),
    "inferwire_load_reasoning_tokens": ("counter", set()),
    "inferwire_load_tool_calls": ("counter", set()),
}
HISTOGRAMS = {
    "ttft": "inferwire_load_time_to_first_token_seconds",
    "ttfot": "inferwire_load_time_to_first_output_token_seconds",
    "itl_per_chunk": "inferwire_load_inter_token_latency_seconds",
    "itl_per_token": "inferwire_load_inter_token_latency_per_token_seconds",
    "e2e": "inferwire_load_e2e_request_latency_seconds",
    "send_lag": "inferwire_load_send_lag_seconds",
}


def scrape(live: LiveMetrics) -> dict[str, Any]:
    """The exposition text, parsed: ``{family: {"type", "samples": {(name, labels): value}}}``."""
    text = generate_latest(live.registry).decode()
    return parse(text)


def parse(text: str) -> dict[str, Any]:
    families: dict[str, Any] = {}
    for family in text_string_to_metric_families(text):
        samples = {(s.name, tuple(sorted(s.labels.items()))): s.value for s in family.samples}
        families[family.name] = {"type": family.type, "samples": samples}
    return families


def value(families: dict[str, Any], sample: str, **labels: str) -> float:
    family = sample.removesuffix("_total").removesuffix("_count").removesuffix("_sum")
    samples = families[family]["samples"]
    return float(samples.get((sample, tuple(sorted(labels.items()))), 0.0))


def buckets(families: dict[str, Any], family: str) -> list[tuple[float, float]]:
    """``(le, cumulative count)`` of a histogram, in order of ``le``."""
    found = [
        (float(dict(labels)["le"]), count)
        for (name, labels), count in families[family]["samples"].items()
        if name == family + "_bucket"
    ]
    return sorted(found)


def assert_agree(families: dict[str, Any], points: list[dict[str, Any]]) -> None:
    """The live metrics of a run say what its points (the JSON report's) say, summed."""

    def total(key: str) -> int:
        return sum(int(p[key]) for p in points)

    assert value(families, "inferwire_load_requests_total", outcome="ok") == total(
        "requests_completed"
    )
    assert value(families, "inferwire_load_requests_total", outcome="error") == total(
        "requests_failed"
    )
    errors: dict[str, int] = {}
    for point in points:
        for kind, count in point["errors"].items():
            errors[kind] = errors.get(kind, 0) + count
    live_errors = {
        dict(labels)["kind"]: count
        for (_, labels), count in families["inferwire_load_errors"]["samples"].items()
    }
    # the preset kinds are exposed at 0 before any failure; the others only once they occur
    assert {kind: n for kind, n in live_errors.items() if n} == errors
    assert set(PRESET_ERROR_KINDS) <= set(live_errors)
    assert value(families, "inferwire_load_output_tokens_total") == total("output_tokens")
    for key, sample in (
        ("reasoning_tokens", "inferwire_load_reasoning_tokens_total"),
        ("tool_calls", "inferwire_load_tool_calls_total"),
    ):
        if key in points[0]:
            assert value(families, sample) == total(key), key
    if "tokens_per_chunk" in points[0]:
        chunks = sum(sum(p["tokens_per_chunk"].values()) for p in points)
        assert value(families, "inferwire_load_token_chunks_total") == chunks
    for key, family in HISTOGRAMS.items():
        if key not in points[0]:  # a report from before it
            continue
        count = sum(int(p[key]["count"]) for p in points)
        assert value(families, family + "_count") == count, key
        assert buckets(families, family)[-1][1] == count
        if "hdr" in points[0]:  # the report's exact sums
            sum_ns = sum(int(p["hdr"][key]["sum_ns"]) for p in points)
            assert value(families, family + "_sum") == pytest.approx(sum_ns / 1e9, rel=1e-9)
    assert value(families, "inferwire_load_requests_in_flight") == 0
