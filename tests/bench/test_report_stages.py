"""The stages and connections sections of the report, and the claims that read them (C4-C7,
C9, C10), from raw files written here: P50 / P90 cells, paired ratios with their range over
repeats, and runs of the older unpaired format left out rather than divided."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from inferwire.bench import bench_stages
from inferwire.bench.report import claims, connections, stages
from inferwire.bench.report.results import CONNECTIONS_RAW, STAGES_RAW
from inferwire.transports.timing import REQUEST_STAGES


def _write(path: Path, infos: list[dict[str, Any]]) -> None:
    benchmarks = [{"extra_info": info, "stats": {"median": 1.0, "iqr": 0.1}} for info in infos]
    path.write_text(json.dumps({"benchmarks": benchmarks}))


def _stages(transport: str, codec: str, scale: float, **extra: Any) -> dict[str, Any]:
    names = ("serialize", "network", "parse", "end_to_end", "write")
    return {
        "transport": transport,
        "codec": codec,
        "op": "stages",
        "workload": "stream-256",
        "decode_ms": 1.0,
        "chunks": 256,
        "streams": 3,
        "warmup_streams": 1,
        "pooled_chunks": 768,
        "stages_us": {n: 10.0 * scale * (i + 1) for i, n in enumerate(names)},
        "stages_p90_us": {n: 20.0 * scale * (i + 1) for i, n in enumerate(names)},
        "shares": {
            "serialize_parse": 0.1 * scale,
            "serialize_parse_with_compute": 0.05 * scale,
            "transport_with_compute": 0.2 * scale,
        },
        "requests": 40,
        "warmup_requests": 5,
        "request_tokens": 4,
        "idle_gap_ms": 10.0,
        "request_stages_us": {n: 100.0 + i for i, n in enumerate(REQUEST_STAGES)},
        "request_stages_p90_us": {n: 300.0 + i for i, n in enumerate(REQUEST_STAGES)},
        "correct": True,
        **extra,
    }


def _wan(transport: str, pattern: str, share: float, **extra: Any) -> dict[str, Any]:
    return {
        "transport": transport,
        "codec": "protobuf",
        "op": "wan-share",
        "pattern": pattern,
        "tokens": 16,
        "compute_ms_per_token": 10.0,
        "one_way_delay_ms": 20.0,
        "pairs": 6,
        "direct_ms": 160.0,
        "proxied_ms": 160.0 / (1 - share),
        "network_share": share,
        "correct": True,
        **extra,
    }


def _setup(transport: str, concurrency: int, tls: bool, delay: int, saved: float) -> dict[str, Any]:
    return {
        "transport": transport,
        "codec": "protobuf",
        "op": "connection-setup",
        "concurrency": concurrency,
        "tls": tls,
        "delay_ms": delay,
        "pairs": 7,
        "new_ms": 100.0,
        "reused_ms": 100.0 * (1 - saved),
        "saved": saved,
        "connections_per_round": concurrency,
        "connections_opened": concurrency * 8,
        "correct": True,
    }


def _session(transport: str, mode: str, connections: int) -> dict[str, Any]:
    return {
        "transport": transport,
        "op": "session-connections",
        "mode": mode,
        "requests": 3,
        "connections": connections,
        "correct": True,
    }


OLD_WAN = {  # the unpaired format: one benchmark per path, nothing to read a share from
    "transport": "http2",
    "op": "wan-share",
    "path": "proxied",
    "pattern": "stream",
    "tokens": 16,
    "compute_ms_per_token": 10.0,
    "one_way_delay_ms": 20.0,
    "correct": True,
}


@pytest.fixture
def raw_dir(tmp_path: Path) -> Path:
    repeated = _wan(
        "http1",
        "request-per-token",
        0.8,
        repeats={"network_share": [0.78, 0.8, 0.83], "direct_ms": [150.0, 160.0, 170.0]},
    )
    _write(
        tmp_path / STAGES_RAW,
        [
            _stages("tcp", "orjson", 1.0),
            _stages(
                "grpc",
                "delta",
                2.0,
                repeats={
                    "shares.serialize_parse": [0.19, 0.2, 0.24],
                    "shares.transport_with_compute": [0.38, 0.4, 0.48],
                },
            ),
            _wan("http1", "stream", 0.2),
            _wan("grpc", "stream", 0.2001),  # the same share once printed: said once
            repeated,
            OLD_WAN,
        ],
    )
    _write(
        tmp_path / CONNECTIONS_RAW,
        [
            _setup("grpc", 100, False, 0, 0.55),
            {**_setup("grpc", 100, True, 0, 0.8), "repeats": {"saved": [0.79, 0.8, 0.86]}},
            {"op": "connection-setup", "transport": "http1", "mode": "new", "correct": True},
            _session("http1", "no-keepalive", 3),
            _session("http2", "reused", 1),
        ],
    )
    return tmp_path


def _row(text: str, *starts: str) -> str:
    """The one table row of ``text`` that starts with these cells."""
    prefix = "| " + " | ".join(starts) + " |"
    rows = [line for line in text.splitlines() if line.startswith(prefix)]
    assert len(rows) == 1, (prefix, rows)
    return rows[0]


def test_stage_cells_are_p50_and_p90_with_the_counts(raw_dir: Path) -> None:
    text = stages.section(raw_dir)
    per_chunk, per_request = text.split("### One request")
    tcp = _row(per_chunk, "`tcp`", "`orjson`")
    assert "| 10.0 / 20.0 | 20.0 / 40.0 | 30.0 / 60.0 | 40.0 / 80.0 | 10% |" in tcp
    # the share comes from the per-chunk shares, with its range over the repeats
    assert _row(per_chunk, "`grpc`", "`delta`").endswith("| 20% (19%-24%) |")
    assert "3 `stream-256` streams" in text
    assert "768 chunks a cell" in text
    assert "40 short requests (4 tokens each) per cell, each sent 10 ms after" in text
    assert "after 5 untimed requests" in text
    request_row = _row(per_request.split("### What")[0], "`tcp`", "`orjson`", "100.0 / 300.0")
    assert request_row.endswith(f"| {sum(100.0 + i for i in range(len(REQUEST_STAGES))):,.1f} |")


def test_wan_rows_are_the_paired_share(raw_dir: Path) -> None:
    text = stages.section(raw_dir)
    assert _row(text, "`http1`", "stream", "16").endswith("| 160.0 ms | 200.0 ms | 20% |")
    assert _row(text, "`http1`", "request-per-token", "16").endswith(
        "| 160.0 ms (150.0 ms-170.0 ms) | 800.0 ms | 80% (78%-83%) |"
    )
    assert "`http2`" not in text.split("### What the network adds")[1]  # the unpaired record
    assert "6 pairs" in text


def test_connection_rows_are_the_paired_saving(raw_dir: Path) -> None:
    text = connections.section(raw_dir)
    assert _row(text, "`grpc`", "100", "plain", "0 ms").endswith(
        "| 100.0 ms | 45.0 ms | 55% | yes |"
    )
    assert _row(text, "`grpc`", "100", "TLS", "0 ms").endswith("| 80% (79%-86%) | yes |")
    assert "`http1`" not in text.split("Connections (TCP handshakes)")[0]  # unpaired record
    assert "in 7 pairs" in text
    assert _row(text, "`http1`", "no-keepalive", "3", "3")


def _claim(raw_dir: Path, claim_id: str) -> list[str]:
    return next(row for row in claims.rows([], raw_dir) if row[0] == claim_id)


def test_c4_c9_c10_span_the_cells_with_their_repeats(raw_dir: Path) -> None:
    c4 = _claim(raw_dir, "C4")
    assert "768 chunks a cell" in c4[2]
    assert "serialize + parse: 10% to 20% (19%-24%)" in c4[3]
    assert "5% to 10% once 1 ms of compute" in c4[3]
    assert "20% to 40% (38%-48%) of a token's time" in _claim(raw_dir, "C9")[3]
    assert _claim(raw_dir, "C10")[3].startswith("compute 60% (52%-62%) to 80%")


def test_c5_c6_read_the_paired_saving(raw_dir: Path) -> None:
    c5 = _claim(raw_dir, "C5")
    assert c5[4].startswith("holds")
    c6 = _claim(raw_dir, "C6")
    assert "7 alternating pairs" in c6[2]
    assert c6[3] == "plain, 0 ms one way: 55%; TLS, 0 ms one way: 80% (79%-86%)"
    assert c6[4] == "holds only with TLS (the handshake is most of the setup)"


def test_c7_reads_the_paired_share(raw_dir: Path) -> None:
    c7 = _claim(raw_dir, "C7")
    assert "40 ms round trip" in c7[2]
    assert "6 pairs" in c7[2]
    assert c7[3] == ("network share: 20% streamed; 80% (78%-83%) with one request per token")


def test_claims_without_the_paired_runs_say_so(tmp_path: Path) -> None:
    _write(tmp_path / STAGES_RAW, [OLD_WAN])
    _write(tmp_path / CONNECTIONS_RAW, [{"op": "connection-setup", "transport": "grpc"}])
    assert _claim(tmp_path, "C7")[2] == "not in this run"
    assert _claim(tmp_path, "C6")[2] == "not in this run"
    assert _claim(tmp_path, "C4")[2] == "not in this run"


def test_plots_draw_the_p50s(raw_dir: Path, tmp_path: Path) -> None:
    paths = stages.plot(raw_dir, tmp_path / "out")
    assert [p.name for p in paths] == ["stages.png", "request_stages.png"]
    assert all(p.stat().st_size > 0 for p in paths)


def test_percentiles_are_per_stage() -> None:
    p50, p90 = bench_stages.percentiles_us({"parse": np.arange(1, 101) * 1000})
    assert p50 == {"parse": pytest.approx(50.5)}
    assert p90 == {"parse": pytest.approx(90.1)}


def test_chunk_shares_are_per_chunk_not_ratios_of_medians() -> None:
    # per chunk 0.5, 0.5, 0.03: median 0.5; the ratio of the medians would be 30 / 100
    ns = {
        "serialize": np.array([40, 10, 30]),
        "parse": np.array([10, 0, 0]),
        "end_to_end": np.array([100, 20, 1000]),
    }
    shares = bench_stages.chunk_shares(ns, decode_ms=0.0)
    assert shares["serialize_parse"] == pytest.approx(0.5)
    assert shares["transport_with_compute"] == pytest.approx(1.0)
    with_compute = bench_stages.chunk_shares(ns, decode_ms=0.001)  # 1000 ns of compute
    assert with_compute["serialize_parse_with_compute"] == pytest.approx(30 / 2000)
