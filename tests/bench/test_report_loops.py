"""The report names the event loops a run measured on: the tcp-over-raw-echo target rows, the
floors table under ``tcp``, the peers table's loop column and the machine section."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from inferwire.bench.report import machine, peers, transports


def _unary(transport: str, codec: str, **info: Any) -> dict[str, Any]:
    extra = {"transport": transport, "codec": codec, "op": "unary", "calls": 20, "vs_tcp": 1.0}
    extra |= {"correct": True, "loop": "uvloop", "server_loop": "uvloop", **info}
    return {"stats": {"median": 1e-3, "iqr": 1e-4}, "extra_info": extra}


def test_the_echo_target_row_per_tcp_codec(tmp_path: Path) -> None:
    floors = {"echo_loop": "uvloop", "echo_request_bytes": 98, "echo_response_bytes": 105}
    raw = {
        "benchmarks": [
            _unary("tcp", "protobuf", vs_echo=2.5, vs_echo_cpu=2.8, **floors),
            _unary("tcp", "orjson", vs_echo=3.4, asyncio_vs_uvloop=1.2, **floors),
            _unary("http1", "orjson"),
        ]
    }
    path = tmp_path / "transports.json"
    path.write_text(json.dumps(raw))
    rows, section = transports.render_parts(path)
    echo_rows = [row for row in rows if "raw uvloop echo" in row[0]]
    assert [(row[2], row[4]) for row in echo_rows] == [("3.40x", "**missed**"), ("2.50x", "met")]
    assert "the client on uvloop, the servers on uvloop" in section
    assert "| `protobuf` | 50.0 us | 98 / 105 | 2.50x | 2.80x | n/a |" in section
    assert "| `orjson` | 50.0 us | 98 / 105 | 3.40x | n/a | 1.20x |" in section


def test_a_run_without_loops_shows_no_loop_line(tmp_path: Path) -> None:
    bench = _unary("http1", "orjson")
    for key in ("loop", "server_loop"):
        del bench["extra_info"][key]
    path = tmp_path / "transports.json"
    path.write_text(json.dumps({"benchmarks": [bench]}))
    rows, section = transports.render_parts(path)
    assert "Event loop" not in section
    assert not [row for row in rows if "echo" in row[0]]


def test_the_peers_loop_column_names_a_mismatch() -> None:
    common: dict[str, Any] = {
        "stack": "s",
        "protocol": "HTTP/1.1",
        "tokens_per_s": 1.0,
        "tokens_per_server_cpu_s": 1.0,
        "itl_p50_us": 1.0,
        "itl_p99_us": 1.0,
        "itl_p999_us": 1.0,
        "tpot_mean_us": 1.0,
        "server_cpu_utilization": 1.0,
        "client_cpu_utilization": 1.0,
        "correct": True,
    }
    ours = peers.Row(server="inferwire-http1", server_loop="uvloop", **common)
    same = peers.Row(
        server="uvicorn",
        baseline="inferwire-http1",
        server_loop="uvloop",
        baseline_server_loop="uvloop",
        **common,
    )
    other = peers.Row(
        server="uvicorn",
        baseline="inferwire-http1",
        server_loop="uvloop",
        baseline_server_loop="asyncio",
        **common,
    )
    assert [r.loops_cell() for r in (ours, same, other)] == [
        "uvloop",
        "uvloop",
        "uvloop (ours: asyncio)",
    ]


def test_the_machine_section_names_the_loop() -> None:
    raw = {"machine_info": {"event_loop": "uvloop", "event_loop_requested": "auto"}}
    assert "event loop `uvloop` (`--loop auto`)" in machine.machine_section(raw)
    raw = {"machine_info": {"event_loop": "asyncio", "event_loop_requested": "asyncio"}}
    text = machine.machine_section(raw)
    assert "protobuf backend `?`, event loop `asyncio`\n" in text
    assert "--loop" not in text
