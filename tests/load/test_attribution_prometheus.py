"""The Prometheus source of the attribution: the families table, the parse of the text format,
the delta over a point for each engine's families (vLLM and SGLang exposition made by
``prometheus_client``, the library both serve it with; TGI's and Triton's written as their
exporters print them), the interpolation against hand-computed values, and what cannot be right
(a reset, changed buckets, a vanished series, a restart) as notes, never figures. The scraper
against a stdlib HTTP server on 127.0.0.1: 404, other statuses, unreachable, no answer, a body
that is not Prometheus, one over the limit.

No wall-clock assertion: snapshots carry the times the tests give them.
"""

from __future__ import annotations

import asyncio
import contextlib
import http.server
import json
import math
import socket
import threading
from collections.abc import Iterator, Sequence
from typing import Any, ClassVar

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry, Gauge, Histogram, generate_latest

from inferwire.load.attribution import families as fam
from inferwire.load.attribution import prometheus as prom
from inferwire.load.attribution import scrape
from inferwire.load.attribution.reports import STAGES

SECOND_NS = 1_000_000_000
VLLM_BUCKETS = (0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0)
"""vLLM's request-latency buckets (vllm/v1/metrics/loggers.py), cut at 60 s."""
VLLM_TTFT_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0)
SGLANG_QUEUE_BUCKETS = (0.0, 0.1, 0.2, 0.5, 1, 2, 3, 4, 5, 10, 15, 20, 30)
SGLANG_E2E_BUCKETS = (0.1, 0.2, 0.4, 0.6, 0.8, 1, 2, 4, 6, 8, 10, 20, 40)
TGI_BUCKETS = tuple(0.0001 * 1.5**k for k in range(1, 36))
"""TGI's duration buckets: a geometric series from 0.15 ms (router/src/server.rs)."""


# --- exposition text, as each engine's exporter writes it -------------------------------------


class Engine:
    """A registry of prometheus_client histograms, as vLLM and SGLang keep theirs."""

    def __init__(self, labels: dict[str, str]) -> None:
        self.registry = CollectorRegistry()
        self.labels = labels
        self.histograms: dict[str, Histogram] = {}

    def histogram(self, name: str, buckets: Sequence[float]) -> Histogram:
        self.histograms[name] = Histogram(
            name, "help", list(self.labels), buckets=buckets, registry=self.registry
        )
        return self.histograms[name]

    def observe(self, name: str, values: Sequence[float], **labels: str) -> None:
        child = self.histograms[name].labels(**{**self.labels, **labels})
        for value in values:
            child.observe(value)

    def text(self) -> bytes:
        return generate_latest(self.registry)


def vllm_engine() -> Engine:
    engine = Engine({"model_name": "meta-llama/Llama-3.1-8B-Instruct", "engine": "0"})
    for name in ("queue_time", "prefill_time", "decode_time", "inference_time"):
        engine.histogram(f"vllm:request_{name}_seconds", VLLM_BUCKETS)
    engine.histogram("vllm:e2e_request_latency_seconds", VLLM_BUCKETS)
    engine.histogram("vllm:time_to_first_token_seconds", VLLM_TTFT_BUCKETS)
    return engine


def sglang_engine() -> Engine:
    engine = Engine({"model_name": "meta-llama/Llama-3.1-8B-Instruct", "tp_rank": "0"})
    engine.histogram("sglang:queue_time_seconds", SGLANG_QUEUE_BUCKETS)
    engine.histogram("sglang:e2e_request_latency_seconds", SGLANG_E2E_BUCKETS)
    engine.histogram("sglang:time_to_first_token_seconds", SGLANG_E2E_BUCKETS)
    return engine


def histogram_text(
    name: str, values: Sequence[float], buckets: Sequence[float], labels: str = ""
) -> str:
    """A histogram as Rust's metrics-exporter-prometheus (TGI's router) prints one."""
    sep = "," if labels else ""
    lines = [f"# TYPE {name} histogram"]
    for bound in buckets:
        below = sum(1 for v in values if v <= bound)
        lines.append(f'{name}_bucket{{{labels}{sep}le="{bound}"}} {below}')
    lines.append(f'{name}_bucket{{{labels}{sep}le="+Inf"}} {len(values)}')
    braces = f"{{{labels}}}" if labels else ""
    lines += [f"{name}_sum{braces} {sum(values)}", f"{name}_count{braces} {len(values)}"]
    return "\n".join(lines) + "\n"


def tgi_text(validation: Sequence[float], queue: Sequence[float], infer: Sequence[float]) -> str:
    total = [a + b + c for a, b, c in zip(validation, queue, infer, strict=True)]
    return (
        "# TYPE tgi_request_count counter\n"
        f"tgi_request_count {len(total)}\n"
        "# TYPE tgi_queue_size gauge\ntgi_queue_size 0\n"
        + histogram_text("tgi_request_validation_duration", validation, TGI_BUCKETS)
        + histogram_text("tgi_request_queue_duration", queue, TGI_BUCKETS)
        + histogram_text("tgi_request_inference_duration", infer, TGI_BUCKETS)
        + histogram_text("tgi_request_duration", total, TGI_BUCKETS)
    )


TRITON_COUNTERS = (
    "nv_inference_request_success",
    "nv_inference_count",
    "nv_cache_num_hits_per_model",
    "nv_inference_request_duration_us",
    "nv_inference_queue_duration_us",
    "nv_inference_compute_input_duration_us",
    "nv_inference_compute_infer_duration_us",
    "nv_inference_compute_output_duration_us",
)


def triton_text(values: dict[str, dict[str, float]]) -> str:
    """Triton's counters (``{family: {model: value}}``), as its C++ exporter prints them."""
    lines = []
    for name in TRITON_COUNTERS:
        lines += [f"# HELP {name} {name.replace('_', ' ')}", f"# TYPE {name} counter"]
        for model, value in values.get(name, {}).items():
            lines.append(f'{name}{{model="{model}",version="1"}} {value:g}')
    lines += ["# TYPE nv_gpu_utilization gauge", 'nv_gpu_utilization{gpu_uuid="GPU-1"} 0.5']
    return "\n".join(lines) + "\n"


def snap(text: str | bytes, at_s: float = 0.0) -> scrape.Snapshot:
    return scrape.parse_exposition(text, taken_ns=int(at_s * SECOND_NS), source_url="test")


def stage(point: prom.PointMetrics, name: str) -> dict[str, Any]:
    return point.to_json()["stages"][name]  # type: ignore[no-any-return]


# --- the table -----------------------------------------------------------------------------


def test_families_table_is_consistent() -> None:
    names = [(f.engine, f.name) for f in fam.FAMILIES]
    assert len(names) == len(set(names))
    for family in fam.FAMILIES:
        assert family.engine in fam.ENGINES
        assert family.kind in fam.KINDS
        assert family.stage in STAGES or family.stage in fam.EXTRA_MEASURES
        assert (family.kind == fam.COUNTER) == (family.count_family is not None)
        assert family.url.startswith("https://")
        assert family.meaning
        assert family.to_ms == (0.001 if family.name.endswith("_us") else 1000.0)
    for engine in fam.ENGINES:
        stages = {f.stage for f in fam.engine_families(engine)}
        assert {"queue", "server_e2e"} <= stages, engine


# --- the interpolation, against values worked by hand ----------------------------------------

FOUR = ((0.1, 10.0), (0.5, 30.0), (1.0, 40.0), (math.inf, 40.0))


@pytest.mark.parametrize(
    ("q", "buckets", "expected"),
    [
        # rank 20 in (0.1, 0.5]: 10 below, 20 inside -> 0.1 + 0.4 * 10/20
        (0.5, FOUR, (0.3, False)),
        # rank 36 in (0.5, 1.0]: 30 below, 10 inside -> 0.5 + 0.5 * 6/10
        (0.9, FOUR, (0.8, False)),
        (0.99, FOUR, (0.98, False)),
        # rank 4 in the first bucket, whose lower bound is 0 -> 0.1 * 4/10
        (0.1, FOUR, (0.04, False)),
        # rank 9 of 10 lies in +Inf: the highest finite bound, flagged
        (0.9, ((0.1, 5.0), (0.5, 8.0), (math.inf, 10.0)), (0.5, True)),
        (0.5, ((0.1, 5.0), (0.5, 8.0), (math.inf, 10.0)), (0.1, False)),
        # a first bucket at le=0 (SGLang's queue): ranks in it are 0
        (0.25, ((0.0, 4.0), (0.1, 10.0), (math.inf, 10.0)), (0.0, False)),
        (0.5, ((0.0, 4.0), (0.1, 10.0), (math.inf, 10.0)), (0.1 / 6, False)),
        # counts that go down are forced monotonic first, as Prometheus does: [10, 10, 12]
        (0.5, ((0.1, 10.0), (0.5, 8.0), (math.inf, 12.0)), (0.06, False)),
    ],
)
def test_bucket_quantile(
    q: float, buckets: Sequence[tuple[float, float]], expected: tuple[float, bool]
) -> None:
    found = prom.bucket_quantile(q, buckets)
    assert found is not None
    assert found[0] == pytest.approx(expected[0])
    assert found[1] is expected[1]


@pytest.mark.parametrize(
    "buckets",
    [
        (),
        ((math.inf, 10.0),),  # no finite bucket
        ((0.1, 0.0), (math.inf, 0.0)),  # no observation
        ((0.1, 5.0), (0.5, 10.0)),  # no +Inf bucket
    ],
)
def test_bucket_quantile_says_nothing(buckets: Sequence[tuple[float, float]]) -> None:
    assert prom.bucket_quantile(0.5, buckets) is None


# --- each engine's families over a point -----------------------------------------------------


def test_vllm_point() -> None:
    engine = vllm_engine()
    engine.observe("vllm:request_queue_time_seconds", [0.2] * 7)
    before = snap(engine.text(), 1.0)
    engine.observe("vllm:request_queue_time_seconds", [0.1] * 10 + [0.4] * 10)
    engine.observe("vllm:request_prefill_time_seconds", [0.6] * 20)
    engine.observe("vllm:request_decode_time_seconds", [1.2] * 20)
    engine.observe("vllm:request_inference_time_seconds", [1.8] * 20)
    engine.observe("vllm:e2e_request_latency_seconds", [2.2] * 20)
    engine.observe("vllm:time_to_first_token_seconds", [0.09] * 20)
    point = prom.delta(before, snap(engine.text(), 3.5))
    assert point.engine == "vllm"
    assert point.interval_s == 2.5
    queue = stage(point, "queue")
    # 20 requests: 10 in (0, 0.3], 10 in (0.3, 0.5]; the 7 before the point are not counted
    assert queue["family"] == "vllm:request_queue_time_seconds"
    assert queue["count"] == 20
    assert queue["mean_ms"] == pytest.approx(250.0)
    assert queue["p50_ms"] == pytest.approx(300.0)  # rank 10: the top of (0, 0.3]
    assert queue["p90_ms"] == pytest.approx(460.0)  # rank 18: 0.3 + 0.2 * 8/10
    assert queue["p99_ms"] == pytest.approx(496.0)
    for name, mean_ms in (("prefill", 600), ("decode", 1200), ("inference", 1800)):
        assert stage(point, name)["mean_ms"] == pytest.approx(mean_ms)
    assert stage(point, "server_e2e")["mean_ms"] == pytest.approx(2200.0)
    assert point.to_json()["extra"]["ttft"]["mean_ms"] == pytest.approx(90.0)
    assert point.notes == ()
    assert point.dropped == ()


def test_label_sets_are_summed() -> None:
    engine = vllm_engine()
    before = snap(engine.text())
    engine.observe("vllm:request_queue_time_seconds", [0.1] * 4, engine="0")
    engine.observe("vllm:request_queue_time_seconds", [0.4] * 4, engine="1")
    queue = stage(prom.delta(before, snap(engine.text(), 1.0)), "queue")
    assert queue["count"] == 8
    assert queue["mean_ms"] == pytest.approx(250.0)
    assert queue["p50_ms"] == pytest.approx(300.0)


def test_sglang_point() -> None:
    engine = sglang_engine()
    engine.observe("sglang:queue_time_seconds", [0.0] * 3)
    before = snap(engine.text())
    engine.observe("sglang:queue_time_seconds", [0.0] * 4 + [0.05] * 6)
    engine.observe("sglang:e2e_request_latency_seconds", [1.5] * 10)
    engine.observe("sglang:time_to_first_token_seconds", [0.3] * 10)
    point = prom.delta(before, snap(engine.text(), 1.0))
    assert point.engine == "sglang"
    queue = stage(point, "queue")
    assert queue["count"] == 10
    assert queue["mean_ms"] == pytest.approx(30.0)
    assert queue["p50_ms"] == pytest.approx(100.0 / 6)  # rank 5 of 10: 4 at le=0, 6 in (0, 0.1]
    assert stage(point, "server_e2e")["mean_ms"] == pytest.approx(1500.0)
    assert point.to_json()["extra"]["ttft"]["mean_ms"] == pytest.approx(300.0)
    assert point.notes == ("sglang publishes no per-request time of the model (prefill, decode)",)


def test_tgi_point() -> None:
    before = snap(tgi_text([0.001] * 2, [0.01] * 2, [0.5] * 2))
    after = snap(tgi_text([0.001] * 2 + [0.003] * 4, [0.01] * 2 + [0.02] * 4, [0.5] * 6), 1.0)
    point = prom.delta(before, after)
    assert point.engine == "tgi"
    frontend = stage(point, "frontend")
    assert frontend["family"] == "tgi_request_validation_duration"
    assert frontend["count"] == 4
    assert frontend["mean_ms"] == pytest.approx(3.0)
    assert stage(point, "queue")["mean_ms"] == pytest.approx(20.0)
    assert stage(point, "inference")["mean_ms"] == pytest.approx(500.0)
    assert stage(point, "server_e2e")["mean_ms"] == pytest.approx(523.0)
    assert stage(point, "queue")["p50_ms"] == pytest.approx(20.0, rel=0.5)  # within its bucket


def test_tgi_families_that_appear_during_the_point_start_from_zero() -> None:
    # TGI's exporter registers a histogram at its first observation
    before = snap("# TYPE tgi_queue_size gauge\ntgi_queue_size 0\n")
    point = prom.delta(before, snap(tgi_text([0.002] * 3, [0.01] * 3, [0.2] * 3), 1.0))
    assert stage(point, "queue")["count"] == 3


TRITON_BEFORE: dict[str, dict[str, float]] = {
    "nv_inference_request_success": {"resnet": 100, "bert": 50},
    "nv_inference_count": {"resnet": 800, "bert": 50},
    "nv_cache_num_hits_per_model": {"resnet": 5},
    "nv_inference_request_duration_us": {"resnet": 2e6, "bert": 1e6},
    "nv_inference_queue_duration_us": {"resnet": 1e5, "bert": 5e4},
    "nv_inference_compute_input_duration_us": {"resnet": 1e4, "bert": 5e3},
    "nv_inference_compute_infer_duration_us": {"resnet": 1e6, "bert": 5e5},
    "nv_inference_compute_output_duration_us": {"resnet": 3e3, "bert": 1e3},
}


def triton_after(**changes: dict[str, float]) -> dict[str, dict[str, float]]:
    after = {name: dict(models) for name, models in TRITON_BEFORE.items()}
    for name, models in changes.items():
        for model, change in models.items():
            after[name][model] = after[name].get(model, 0.0) + change
    return after


def test_triton_point() -> None:
    after = triton_after(
        nv_inference_request_success={"resnet": 20, "bert": 10},
        nv_inference_count={"resnet": 160, "bert": 10},  # batch 8: not the divisor
        nv_cache_num_hits_per_model={"resnet": 10},
        nv_inference_request_duration_us={"resnet": 4e5, "bert": 2e5},
        nv_inference_queue_duration_us={"resnet": 4e4, "bert": 2e4},
        nv_inference_compute_input_duration_us={"resnet": 2e3, "bert": 1e3},
        nv_inference_compute_infer_duration_us={"resnet": 1.5e5, "bert": 5e4},
        nv_inference_compute_output_duration_us={"resnet": 500, "bert": 500},
    )
    point = prom.delta(snap(triton_text(TRITON_BEFORE)), snap(triton_text(after), 1.0))
    assert point.engine == "triton"
    assert point.notes == ()
    # 30 requests; 10 of them cache hits, which ran no compute: compute is over 20
    assert stage(point, "server_e2e") == {
        "family": "nv_inference_request_duration_us",
        "count": 30,
        "mean_ms": pytest.approx(20.0),
    }
    assert stage(point, "queue")["mean_ms"] == pytest.approx(2.0)
    assert stage(point, "input") == {
        "family": "nv_inference_compute_input_duration_us",
        "count": 20,
        "mean_ms": pytest.approx(0.15),
    }
    assert stage(point, "inference")["mean_ms"] == pytest.approx(10.0)
    assert stage(point, "output")["mean_ms"] == pytest.approx(0.05)


def test_triton_summaries_stand_in_for_counters() -> None:
    def text(count: int, total_us: float) -> str:
        return (
            "# TYPE nv_inference_queue_summary_us summary\n"
            f'nv_inference_queue_summary_us_count{{model="m",version="1"}} {count}\n'
            f'nv_inference_queue_summary_us_sum{{model="m",version="1"}} {total_us}\n'
            'nv_inference_queue_summary_us{model="m",version="1",quantile="0.5"} 55\n'
        )

    point = prom.delta(snap(text(161, 11110)), snap(text(171, 13110), 1.0))
    assert stage(point, "queue") == {
        "family": "nv_inference_queue_summary_us",
        "count": 10,
        "mean_ms": pytest.approx(0.2),
    }


# --- what cannot be right: notes, no figures --------------------------------------------------


def test_a_reset_mid_point_drops_the_family() -> None:
    engine = vllm_engine()
    engine.observe("vllm:request_queue_time_seconds", [0.1] * 50)
    engine.observe("vllm:e2e_request_latency_seconds", [1.0] * 50)
    before = snap(engine.text())
    restarted = vllm_engine()  # the server came back with fresh histograms
    restarted.observe("vllm:request_queue_time_seconds", [0.1] * 5)
    restarted.observe("vllm:e2e_request_latency_seconds", [1.0] * 60)  # moved past the old
    point = prom.delta(before, snap(restarted.text(), 1.0))
    # both are new series by their _created gauge, even the one whose counts climbed past
    assert point.stages == {}
    assert set(point.dropped) == {
        "vllm:request_queue_time_seconds",
        "vllm:e2e_request_latency_seconds",
    }
    assert any("reset" in n and "request_queue_time" in n for n in point.notes)
    assert any("reset" in n and "e2e_request_latency" in n for n in point.notes)


def test_counts_that_went_down_drop_the_family_without_a_created_gauge() -> None:
    name = "tgi_request_queue_duration"
    before = snap(histogram_text(name, [0.1] * 9, (0.5,)))
    after = snap(histogram_text(name, [0.1] * 4, (0.5,)), 1.0)  # Rust exporters have none
    point = prom.delta(before, after)
    assert point.dropped == (name,)
    assert any("went down" in n and name in n for n in point.notes)


def test_a_restart_seen_by_the_process_start_time_drops_everything() -> None:
    def text(start_s: float, observed: int) -> bytes:
        engine = vllm_engine()
        engine.observe("vllm:e2e_request_latency_seconds", [1.0] * observed)
        gauge = Gauge("process_start_time_seconds", "start", registry=engine.registry)
        gauge.set(start_s)
        return engine.text()

    point = prom.delta(snap(text(1000.0, 5)), snap(text(2000.0, 9), 1.0))
    assert point.stages == {}
    assert "vllm:e2e_request_latency_seconds" in point.dropped
    assert any("restarted" in note for note in point.notes)


def test_changed_buckets_drop_the_family() -> None:
    name = "vllm:request_queue_time_seconds"
    before = snap(histogram_text(name, [0.1] * 4, (0.3, 0.5), 'model_name="m"'))
    after = snap(histogram_text(name, [0.1] * 9, (0.25, 0.5), 'model_name="m"'), 1.0)
    point = prom.delta(before, after)
    assert point.stages == {}
    assert point.dropped == (name,)
    assert any("bucket boundaries changed" in note for note in point.notes)


def test_a_vanished_series_drops_the_family() -> None:
    name = "tgi_request_queue_duration"
    one = histogram_text(name, [0.1], (0.5,), 'a="1"')
    two = histogram_text(name, [0.1], (0.5,), 'a="2"').split("\n", 1)[1]  # one # TYPE line
    before = snap(one + two)
    assert len(before.histograms[name]) == 2
    point = prom.delta(before, snap(histogram_text(name, [0.1] * 3, (0.5,), 'a="1"'), 1.0))
    assert "queue" not in point.stages
    assert name in point.dropped
    assert any("vanished" in note for note in point.notes)


def test_any_buckets_work_and_the_inf_bucket_is_said() -> None:
    name = "vllm:e2e_request_latency_seconds"
    before = snap(histogram_text(name, [], (1.0, 2.0)))
    after = snap(histogram_text(name, [0.5] * 5 + [9.0] * 5, (1.0, 2.0)), 1.0)
    e2e = stage(prom.delta(before, after), "server_e2e")
    assert e2e["p50_ms"] == pytest.approx(1000.0)
    assert e2e["p90_ms"] == e2e["p99_ms"] == 2000.0  # the highest finite bound
    assert e2e["above_top_bucket"] == ["p90_ms", "p99_ms"]
    assert e2e["mean_ms"] == pytest.approx(4750.0)


def test_a_histogram_with_no_finite_bucket_has_no_percentiles() -> None:
    name = "tgi_request_duration"
    point = prom.delta(
        snap(histogram_text(name, [0.1], ())), snap(histogram_text(name, [0.1] * 3, ()))
    )
    assert stage(point, "server_e2e") == {
        "family": name,
        "count": 2,
        "mean_ms": pytest.approx(100.0),
        "p50_ms": None,
        "p90_ms": None,
        "p99_ms": None,
    }
    assert any("no finite bucket" in note for note in point.notes)


def test_no_request_during_the_point() -> None:
    engine = vllm_engine()
    engine.observe("vllm:request_queue_time_seconds", [0.1] * 5)
    engine.observe("vllm:e2e_request_latency_seconds", [0.1] * 5)
    point = prom.delta(snap(engine.text()), snap(engine.text(), 1.0))
    assert point.stages == {}
    assert point.dropped == ()
    assert any("no request counted" in note for note in point.notes)


def test_an_endpoint_of_no_known_engine() -> None:
    text = "# TYPE http_requests_total counter\nhttp_requests_total 5\n"
    point = prom.delta(snap(text), snap(text, 1.0))
    assert point.engine is None
    assert point.stages == {}
    assert any("none of the vLLM, SGLang, TGI or Triton" in note for note in point.notes)


def test_triton_without_its_request_counter() -> None:
    text = (
        "# TYPE nv_inference_queue_duration_us counter\n"
        'nv_inference_queue_duration_us{model="m"} 5\n'
    )
    point = prom.delta(snap(text), snap(text.replace("} 5", "} 9"), 1.0))
    assert point.stages == {}
    assert any("no nv_inference_request_success" in note for note in point.notes)


def test_json_of_a_point() -> None:
    engine = vllm_engine()
    before = snap(engine.text())
    engine.observe("vllm:request_queue_time_seconds", [0.1])
    out = json.loads(json.dumps(prom.delta(before, snap(engine.text(), 1.0)).to_json()))
    assert set(out) == {"engine", "source_url", "interval_s", "stages", "extra", "notes"}
    assert out["source_url"] == "test"
    assert out["stages"]["queue"]["count"] == 1


def test_timeline() -> None:
    engine = vllm_engine()
    snapshots = [snap(engine.text(), 10.0)]
    for at_s, queued in ((15.0, [0.1] * 3), (20.0, []), (25.0, [0.4] * 2)):
        engine.observe("vllm:request_queue_time_seconds", queued)
        snapshots.append(snap(engine.text(), at_s))
    intervals = prom.timeline(snapshots)
    assert [i["t_s"] for i in intervals] == [5.0, 10.0, 15.0]
    assert [i["stages"].get("queue", {}).get("count") for i in intervals] == [3, None, 2]
    assert intervals[2]["stages"]["queue"]["mean_ms"] == pytest.approx(400.0)
    assert prom.timeline(snapshots[:1]) == []


# --- the parse: Prometheus text or a ScrapeError ---------------------------------------------


def test_parse_keeps_the_kinds_apart() -> None:
    text = triton_text(TRITON_BEFORE) + histogram_text("tgi_request_duration", [0.1], (0.5,))
    found = snap(text + "untyped_thing 3\n")
    success = found.counter("nv_inference_request_success")
    assert success == {
        (("model", "bert"), ("version", "1")): 50.0,
        (("model", "resnet"), ("version", "1")): 100.0,
    }
    assert found.gauges["nv_gpu_utilization"] == {(("gpu_uuid", "GPU-1"),): 0.5}
    assert found.counter("untyped_thing") == {(): 3.0}
    series = found.histograms["tgi_request_duration"][()]
    assert series.buckets == ((0.5, 1.0), (math.inf, 1.0))
    assert series.count == 1


@pytest.mark.parametrize(
    "body",
    [
        b"<!DOCTYPE html><html><body>Not the metrics</body></html>",
        b'{"object": "error", "message": "Not Found"}',
        b"Not Found",
        b"",
        b"# only a comment\n",
        b"\xff\xfe metric 1\n",
        b'# TYPE h histogram\nh_bucket{le="soon"} 1\n',
    ],
)
def test_not_prometheus(body: bytes) -> None:
    with pytest.raises(scrape.ScrapeError, match="not Prometheus"):
        scrape.parse_exposition(body)


def test_a_body_over_the_limit_is_refused() -> None:
    with pytest.raises(scrape.ScrapeError, match="over"):
        scrape.parse_exposition(b"x 1\n" * (scrape.MAX_BODY_BYTES // 4 + 1))


@settings(max_examples=300, deadline=None)
@given(st.text(max_size=200) | st.binary(max_size=200))
def test_any_body_is_a_snapshot_or_a_scrape_error(body: str | bytes) -> None:
    with contextlib.suppress(scrape.ScrapeError):
        scrape.parse_exposition(body)


@settings(max_examples=300, deadline=None)
@given(
    st.integers(0, 600), st.integers(0, 600), st.text(alphabet='{}",=# \n\\le+Inf0.5', max_size=4)
)
def test_any_damaged_exposition_is_a_snapshot_or_a_scrape_error(
    start: int, end: int, noise: str
) -> None:
    text = tgi_text([0.001], [0.01], [0.5])
    with contextlib.suppress(scrape.ScrapeError):
        scrape.parse_exposition(text[:start] + noise + text[end:])


# --- the scraper, against a real socket ------------------------------------------------------


class MetricsHandler(http.server.BaseHTTPRequestHandler):
    routes: ClassVar[dict[str, tuple[int, dict[str, str], bytes]]] = {}
    seen_headers: ClassVar[list[dict[str, str]]] = []

    def do_GET(self) -> None:
        self.seen_headers.append({k.lower(): v for k, v in self.headers.items()})
        status, headers, body = self.routes.get(self.path, (404, {}, b"Not Found"))
        self.send_response(status)
        for name, value in {"content-length": str(len(body)), **headers}.items():
            self.send_header(name, value)
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:
        pass


@pytest.fixture(scope="module")
def server() -> Iterator[str]:
    engine = vllm_engine()
    engine.observe("vllm:request_queue_time_seconds", [0.1] * 3)
    text = engine.text()
    MetricsHandler.routes = {
        "/metrics": (200, {"content-type": "text/plain; version=0.0.4"}, text),
        "/moved": (307, {"location": "/metrics"}, b""),
        "/elsewhere": (307, {"location": "http://192.0.2.1/metrics"}, b""),
        "/html": (200, {"content-type": "text/html"}, b"<html><body>hello</body></html>"),
        "/broken": (500, {"content-type": "application/json"}, b'{"error": "engine died"}'),
        "/big": (200, {}, b"x 1\n" * 1024),
    }
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), MetricsHandler)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}"
    httpd.shutdown()
    httpd.server_close()
    thread.join()


async def scrape_once(url: str, **kwargs: Any) -> scrape.Snapshot:
    scraper = scrape.Scraper(url, **kwargs)
    try:
        return await scraper.scrape()
    finally:
        await scraper.close()


@pytest.mark.parametrize("path", ["/metrics", "", "/moved"])
def test_scrape(server: str, path: str) -> None:
    found = asyncio.run(scrape_once(server + path, timeout_s=10.0, headers=[("x-scrape", "1")]))
    assert found.source_url == server + path
    assert "vllm:request_queue_time_seconds" in found.histograms
    assert MetricsHandler.seen_headers[-1]["x-scrape"] == "1"


def test_two_scrapes_on_one_scraper(server: str) -> None:
    async def twice() -> list[scrape.Snapshot]:
        scraper = scrape.Scraper(server + "/moved", timeout_s=10.0)
        try:
            return [await scraper.scrape(), await scraper.scrape()]
        finally:
            await scraper.close()

    first, second = asyncio.run(twice())
    assert second.taken_ns >= first.taken_ns
    assert first.histograms == second.histograms


@pytest.mark.parametrize(
    ("path", "kwargs", "message"),
    [
        ("/nothing", {}, "404 Not Found"),
        ("/broken", {}, "HTTP 500.*engine died"),
        ("/elsewhere", {}, "HTTP 307"),
        ("/html", {}, "not Prometheus"),
        ("/big", {"max_bytes": 1000}, "over 1000 bytes"),
    ],
)
def test_scrape_errors(server: str, path: str, kwargs: dict[str, Any], message: str) -> None:
    with pytest.raises(scrape.ScrapeError, match=message):
        asyncio.run(scrape_once(server + path, timeout_s=10.0, **kwargs))


def test_unreachable() -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]  # closed again: nothing listens there
    with pytest.raises(scrape.ScrapeError, match="unreachable"):
        asyncio.run(scrape_once(f"http://127.0.0.1:{port}/metrics", timeout_s=10.0))


def test_no_answer() -> None:
    with socket.socket() as sock:  # accepts (the kernel's backlog) and never answers
        sock.bind(("127.0.0.1", 0))
        sock.listen(1)
        url = f"http://127.0.0.1:{sock.getsockname()[1]}/metrics"
        with pytest.raises(scrape.ScrapeError, match="no answer within"):
            asyncio.run(scrape_once(url, timeout_s=0.2))


def test_a_url_that_is_not_http() -> None:
    with pytest.raises(scrape.ScrapeError, match="http"):
        scrape.Scraper("ftp://example.com/metrics")
