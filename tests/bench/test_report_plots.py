"""The report's pictures as data (:mod:`inferwire.bench.report.figures`): each plot holds exactly
the figures of its table (the codec matrix per workload, per-token cost by transport x codec,
tokens per server CPU-second, the load runs' CDFs), a run without a suite's data has neither the
picture nor its link, and a CDF is drawn only from what the run recorded."""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path
from typing import Any, Final

import pytest

from inferwire import workloads
from inferwire.bench.report import (
    codecs,
    codecs_plot,
    figures,
    load_plot,
    peers,
    readme,
    transports,
)
from inferwire.bench.report.figures import Plot
from inferwire.bench.report.results import CODECS_RAW, Result

COMMITTED_RAW: Final = Path(__file__).resolve().parents[2] / "results" / "raw"


def _result(codec: str, workload: str, op: str, median_s: float, wire_bytes: int) -> Result:
    return Result(
        codec=codec,
        workload=workload,
        op=op,
        median_s=median_s,
        iqr_s=median_s / 10,
        rounds=9,
        wire_bytes=wire_bytes,
        messages=256 if workload.startswith("stream") else 1,
        correct=True,
    )


CODEC_RESULTS: Final = [
    _result("json", "stream-256", "encode", 256e-6, 256_000),
    _result("json", "stream-256", "decode", 512e-6, 256_000),
    _result("delta", "stream-256", "encode", 25.6e-6, 2_560),
    _result("delta", "stream-256", "decode", 51.2e-6, 2_560),
    _result("tensor", "image-fp32", "encode", 40e-6, 602_304),  # no decode timed: one point
    _result("json", "image-fp32", "round-trip-vs-orjson", 1.0, 1),  # not an encode or decode
]


def test_the_codec_plot_is_a_point_per_codec_and_operation_per_workload() -> None:
    plot = codecs_plot.plot_data(CODEC_RESULTS)

    assert plot is not None
    assert [p.title for p in plot.panels] == ["stream-256 (per chunk)", "image-fp32 (per message)"]
    stream, image = plot.panels
    points = {(s.label, s.kind): (s.x, tuple(round(y, 9) for y in s.y)) for s in stream.series}
    assert points == {  # bytes and microseconds per chunk
        ("json", "encode"): ((1000.0,), (1.0,)),
        ("json", "decode"): ((1000.0,), (2.0,)),
        ("delta", "encode"): ((10.0,), (0.1,)),
        ("delta", "decode"): ((10.0,), (0.2,)),
    }
    assert [(s.label, s.kind, s.x) for s in image.series] == [("tensor", "encode", (602_304.0,))]


def test_the_codec_plot_follows_the_workload_order_of_the_tables() -> None:
    plot = codecs_plot.plot_data(list(reversed(CODEC_RESULTS)))

    assert plot is not None
    order = [name for name in workloads.names() if name in ("stream-256", "image-fp32")]
    assert [p.title.split(" ")[0] for p in plot.panels] == order


def _stream(transport: str, codec: str, median_s: float) -> dict[str, Any]:
    return {
        "extra_info": {
            "transport": transport,
            "codec": codec,
            "op": "stream",
            "workload": "stream-256",
            "tokens": 256,
            "vs_tcp": 1.0,
            "correct": True,
        },
        "stats": {"median": median_s, "iqr": median_s / 10},
    }


def test_the_transport_plot_is_the_per_token_cost_of_each_transport_and_codec(
    tmp_path: Path,
) -> None:
    path = tmp_path / "transports.json"
    benchmarks = [
        _stream("grpc", "orjson", 256e-4),
        _stream("tcp", "orjson", 256e-5),
        _stream("tcp", "delta", 256e-6),
    ]
    unary = _stream("tcp", "delta", 1.0)
    unary["extra_info"] |= {"op": "unary", "calls": 20}
    path.write_text(json.dumps({"benchmarks": [*benchmarks, unary]}))

    plot = transports.plot_data(transports.load(path))

    assert plot is not None
    (panel,) = plot.panels
    by_codec = {s.label: dict(zip(s.x, s.y, strict=True)) for s in panel.series}
    assert by_codec == {
        "delta": {"tcp": pytest.approx(1.0)},
        "orjson": {"tcp": pytest.approx(10.0), "grpc": pytest.approx(100.0)},
    }
    assert transports.plot_data([r for r in transports.load(path) if r.op == "unary"]) is None


def _peer(server: str, tokens_per_server_cpu_s: float, baseline: str | None) -> peers.Row:
    return peers.Row(
        server=server,
        stack=server.split("-")[0],
        protocol="HTTP/1.1",
        tokens_per_s=1.0,
        tokens_per_server_cpu_s=tokens_per_server_cpu_s,
        itl_p50_us=1.0,
        itl_p99_us=1.0,
        itl_p999_us=1.0,
        tpot_mean_us=1.0,
        server_cpu_utilization=0.5,
        client_cpu_utilization=0.5,
        correct=True,
        baseline=baseline,
    )


def test_the_peers_plot_keeps_the_tables_order_and_tells_ours_from_theirs() -> None:
    table = [
        _peer("inferwire-http1", 700_000.0, None),
        _peer("uvicorn", 190_000.0, "inferwire-http1"),
    ]

    plot = peers.plot_data(table)

    assert plot is not None
    (panel,) = plot.panels
    assert [(s.x, s.y, s.kind) for s in panel.series] == [
        (("inferwire-http1",), (700_000.0,), peers.OURS),
        (("uvicorn",), (190_000.0,), peers.PEER),
    ]
    assert peers.plot_data([]) is None


def _load_run(transport: str, **metrics: dict[str, Any]) -> dict[str, Any]:
    return {"op": "load", "transport": transport, "codec": "orjson", **metrics}


@pytest.mark.parametrize(
    ("metric", "points", "source"),
    [
        (
            {"p50_ms": 2.0, "p99_ms": 4.0, "cdf": [[1.0, 0.0], [2.0, 0.5], [4.0, 1.0]]},
            [[1.0, 0.0], [2.0, 0.5], [4.0, 1.0]],
            load_plot.RECORDED,
        ),
        (
            {"p50_ms": 2.0, "p90_ms": 3.0, "p99_ms": 4.0, "p99_9_ms": 5.0},
            [[2.0, 0.5], [3.0, 0.9], [4.0, 0.99], [5.0, 0.999]],
            load_plot.FROM_PERCENTILES,
        ),
        ({"p50_ms": 2.0, "p90_ms": None, "cdf": []}, [[2.0, 0.5]], load_plot.FROM_PERCENTILES),
        ({"count": 0, "p50_ms": None, "cdf": []}, [], load_plot.FROM_PERCENTILES),
    ],
)
def test_a_cdf_is_drawn_from_what_the_run_recorded(
    metric: dict[str, Any], points: list[list[float]], source: str
) -> None:
    assert load_plot.cdf_points(metric) == (points, source)


def test_the_load_plot_has_a_panel_per_metric_with_values_and_a_line_per_run() -> None:
    cdf = {"cdf": [[1.0, 0.0], [2.0, 1.0]]}
    runs = [
        _load_run("tcp", ttft=cdf, e2e={"p50_ms": 9.0}),
        _load_run("grpc", ttft=cdf, tpot={"count": 0, "cdf": []}),
    ]

    plot = load_plot.plot_data(runs)

    assert plot is not None
    assert [(p.title, [s.label for s in p.series]) for p in plot.panels] == [
        ("TTFT", ["tcp", "grpc"]),
        ("E2E latency", ["tcp"]),
    ]
    assert load_plot.plot_data([_load_run("tcp")]) is None
    assert load_plot.plot_data([]) is None


def test_the_load_caption_says_when_only_percentiles_were_recorded() -> None:
    recorded = load_plot.plot_data([_load_run("tcp", ttft={"cdf": [[1.0, 0.0], [2.0, 1.0]]})])
    percentiles = load_plot.plot_data([_load_run("tcp", ttft={"p50_ms": 1.0})])

    assert recorded is not None
    assert percentiles is not None
    assert "recorded CDF" in " ".join(load_plot.caption(recorded))
    assert "only its P50, P90, P99 and P99.9" in " ".join(load_plot.caption(percentiles))


def test_a_plots_data_file_is_the_plot_and_refuses_what_json_cannot_hold(tmp_path: Path) -> None:
    plot = codecs_plot.plot_data(CODEC_RESULTS)
    assert plot is not None

    path = figures.write_data(tmp_path, plot)

    assert path == tmp_path / "plots" / "codecs.json"
    assert json.loads(path.read_text())["panels"][0]["series"][0]["label"] == "json"
    assert path.read_text() == figures.data_text(plot)
    nan = figures.Series(label="nan", x=(1.0,), y=(math.nan,))
    with pytest.raises(ValueError, match="JSON"):
        figures.data_text(
            Plot(
                name="x",
                title="",
                alt="",
                x_label="",
                y_label="",
                panels=(figures.Panel(title="", series=(nan,)),),
            )
        )


def test_a_run_with_only_codec_results_draws_and_links_only_their_picture(
    tmp_path: Path,
) -> None:
    results = tmp_path / "results"
    (results / "raw").mkdir(parents=True)
    shutil.copy(COMMITTED_RAW / CODECS_RAW, results / "raw" / CODECS_RAW)
    (results / "plots").mkdir()
    (results / "plots" / "peers.png").write_bytes(b"a picture of another run")

    written = readme.write(results / "raw" / CODECS_RAW, results)

    text = written.read_text()
    assert "](plots/codecs.png)" in text
    assert text.count("](plots/") == 1
    assert sorted(p.name for p in (results / "plots").iterdir()) == ["codecs.json", "codecs.png"]


def test_the_codec_tables_link_their_picture_only_when_there_is_one() -> None:
    assert "](plots/codecs.png)" in codecs.codec_tables(CODEC_RESULTS)
    assert "](plots/" not in codecs.codec_tables([])
