"""The callgrind instruction counts: the dump parser, the client-request extension outside
valgrind, the report's reading of raw/instructions.json, and one real count under valgrind."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from inferwire.bench.measure import _callgrind, instructions
from inferwire.bench.measure.instructions import Cell
from inferwire.bench.report import instructions as report

# A dump callgrind 3.19.0 wrote for one counted call (the child of instructions.count): the
# header as written, the cost lines cut to one function's.
CAPTURED = """\
# callgrind format
version: 1
creator: callgrind-3.19.0
pid: 8003
cmd:  /work/h3/.venv/bin/python -m inferwire.bench.measure.instructions --child \
{"cells":["protobuf|embed-1x384|decode"],"repeat":["protobuf|embed-1x384|decode"]} \
--manifest m.json
part: 19


desc: I1 cache:\x20
desc: D1 cache:\x20
desc: LL cache:\x20

desc: Timerange: Basic block 10271 - 18335
desc: Trigger: Client Request: protobuf|embed-1x384|decode

positions: line
events: Ir
summary: 0


ob=(5) /usr/lib/x86_64-linux-gnu/libc.so.6
fl=(46) ./string/../sysdeps/x86_64/multiarch/memcmp-avx2-movbe.S
fn=(424) __memcmp_avx2_movbe
80 12
+1 12
401 12

totals: 36555
"""
AT_EXIT = """\
# callgrind format
version: 1
creator: callgrind-3.19.0
pid: 8003
part: 20

desc: Timerange: Basic block 18335 - 18336
desc: Trigger: Program termination

positions: line
events: Ir
summary: 0


totals: 0
"""


def _dump(label: str, total: int) -> str:
    return CAPTURED.replace("protobuf|embed-1x384|decode", label).replace("36555", str(total))


def test_parse_dump_reads_the_label_and_the_closing_total() -> None:
    assert instructions.parse_dump(CAPTURED) == ("protobuf|embed-1x384|decode", 36555)


def test_parse_dump_skips_the_dump_written_at_exit() -> None:
    assert instructions.parse_dump(AT_EXIT) is None


def test_parse_dump_refuses_a_dump_without_a_total() -> None:
    with pytest.raises(ValueError, match="no totals"):
        instructions.parse_dump(CAPTURED.replace("totals: 36555", "").replace("summary: 0", ""))


def test_parse_dumps_keeps_dump_order(tmp_path: Path) -> None:
    # part 10 was written after part 2: sorted as text it would come first
    (tmp_path / "cg.77.2").write_text(_dump("a|b|encode", 100))
    (tmp_path / "cg.77.10").write_text(_dump("a|b|encode", 90))
    (tmp_path / "cg.77.3").write_text(_dump("overhead", 5))
    (tmp_path / "cg.77").write_text(AT_EXIT)
    assert instructions.parse_dumps(tmp_path) == {"a|b|encode": [100, 90], "overhead": [5]}


def test_from_dumps_subtracts_the_overhead_and_divides_by_the_chunks() -> None:
    stream = Cell(codec="orjson", workload="stream-16", op="encode")
    unary = Cell(codec="protobuf", workload="embed-1x384", op="decode")
    counts = instructions.from_dumps(
        [stream, unary],
        [stream],
        {"overhead": [500], stream.label: [16_500, 16_533], unary.label: [36_555]},
        {
            stream.label: {"messages": 16, "seconds": 1.0},
            unary.label: {"messages": 1, "seconds": 0.5},
        },
    )
    assert counts.instructions_per_chunk == {stream.label: 1000.0, unary.label: 36_055.0}
    assert counts.instructions == {stream.label: 16_500, unary.label: 36_555}
    assert counts.repeat_difference == {stream.label: pytest.approx(0.002)}
    assert counts.overhead == 500


def test_from_dumps_refuses_a_missing_dump() -> None:
    cell = Cell(codec="orjson", workload="stream-16", op="encode")
    with pytest.raises(RuntimeError, match="expected 1 callgrind dump"):
        instructions.from_dumps(
            [cell], [], {"overhead": [500]}, {cell.label: {"messages": 16, "seconds": 1.0}}
        )


def test_cell_labels_round_trip_and_carry_no_dot() -> None:
    for cell in instructions.timed_cells():
        assert Cell.parse(cell.label) == cell
        assert "." not in cell.label  # the repeats' dotted paths split on dots


def test_timed_cells_leave_out_the_long_ones() -> None:
    timed = instructions.timed_cells()
    workloads_counted = {c.workload for c in timed}
    assert not any(w.startswith("stream-2048") for w in workloads_counted)
    assert not any((c.codec, c.workload) == ("json", "image-fp32") for c in timed)
    assert {c.op for c in timed} == {"encode", "decode"}
    # every codec that carries stream-256 is counted on it, both ways
    stream = [c for c in timed if c.workload == "stream-256"]
    assert len(stream) == 2 * len({c.codec for c in stream}) >= 16


def test_left_out_note_names_every_workload_not_counted() -> None:
    from inferwire import workloads

    for workload in set(workloads.names()) - set(instructions.TIMED_WORKLOADS):
        if not workload.startswith("stream-2048"):
            assert workload in instructions.LEFT_OUT_NOTE
    assert "stream-2048" in instructions.LEFT_OUT_NOTE
    for codec, workload in instructions.LEFT_OUT:
        assert f"{codec} of {workload}" in instructions.LEFT_OUT_NOTE


def test_extension_is_a_no_op_outside_valgrind() -> None:
    assert _callgrind.running_on_valgrind() == 0
    # natively the requests are no-ops: nothing raised, nothing written
    _callgrind.start()
    _callgrind.stop("orjson|stream-16|encode")


def test_extension_refuses_a_label_that_would_break_the_dump() -> None:
    with pytest.raises(ValueError, match="newline"):
        _callgrind.stop("a\nb")
    with pytest.raises(TypeError):
        _callgrind.stop(1)  # type: ignore[arg-type]


def test_child_counts_nothing_outside_valgrind(tmp_path: Path) -> None:
    spec = json.dumps({"cells": ["orjson|stream-16|encode"], "repeat": []})
    with pytest.raises(SystemExit, match="outside valgrind"):
        instructions.main(["--child", spec, "--manifest", str(tmp_path / "m.json")])
    assert not (tmp_path / "m.json").exists()


@pytest.mark.skipif(shutil.which("valgrind") is None, reason="valgrind not installed")
def test_counts_under_valgrind_grow_with_the_input_and_repeat() -> None:
    small = Cell(codec="orjson", workload="stream-16", op="encode")
    large = Cell(codec="orjson", workload="stream-256", op="encode")
    counts = instructions.count([small, large], repeat=[small, large])
    assert counts.instructions[large.label] > 4 * counts.instructions[small.label]
    assert counts.messages == {small.label: 16, large.label: 256}
    for label in (small.label, large.label):
        assert 0 <= counts.repeat_difference[label] < 0.01
        assert counts.instructions_per_chunk[label] > 0
    assert 0 < counts.overhead < 10_000
    assert counts.valgrind.startswith("valgrind-")


# --- the report ------------------------------------------------------------------------------


def _raw(tmp_path: Path, benchmarks: list[dict[str, object]]) -> Path:
    (tmp_path / report.INSTRUCTIONS_RAW).write_text(json.dumps({"benchmarks": benchmarks}))
    return tmp_path


def test_report_reads_instructions_per_chunk(tmp_path: Path) -> None:
    raw = _raw(
        tmp_path,
        [
            {
                "name": "bench_instructions",
                "stats": {"median": 80.0},
                "extra_info": {
                    "instructions": {
                        "orjson|stream-256|encode": 14656.0,
                        "protobuf|embed-1x384|decode": 36351.0,
                    },
                    "valgrind": "valgrind-3.19.0",
                    "left_out": "json of image-fp32 not counted",
                },
            }
        ],
    )
    assert report.per_chunk(raw) == {
        ("orjson", "stream-256", "encode"): 14656.0,
        ("protobuf", "embed-1x384", "decode"): 36351.0,
    }
    assert report.note(raw) == "json of image-fp32 not counted"
    assert report.label("orjson", "stream-256", "encode") == "orjson|stream-256|encode"


def test_report_notes_a_run_without_valgrind(tmp_path: Path) -> None:
    raw = _raw(tmp_path, [])  # the suite's only benchmark skipped
    assert report.per_chunk(raw) == {}
    assert report.note(raw) == "not measured: valgrind not installed"


def test_report_notes_a_run_without_the_suite(tmp_path: Path) -> None:
    assert report.per_chunk(tmp_path) == {}
    assert report.note(tmp_path) == report.NOT_RUN


@pytest.mark.parametrize(
    ("value", "text"), [(519.0, "519"), (14656.0, "14.7k"), (1_372_756.0, "1.37M")]
)
def test_report_formats_a_count(value: float, text: str) -> None:
    assert report.per_chunk_cell(value) == text
