"""Instructions per chunk of the codec operations, counted under valgrind's callgrind.

The deterministic column beside bench_codecs' microseconds: one call of each cell (codec x
workload x {encode, decode}, the operations ``bench_codec`` times) counted with callgrind's
instrumentation on only around the call, in one child process (see
:mod:`inferwire.bench.measure.instructions`). A neighbour on the machine moves a time, not a
count.

Counted in a timed run: the workloads of ``instructions.TIMED_WORKLOADS`` (stream-16,
stream-256, stream-256-top5, embed-1x384, image-fp32), every codec that carries them, less the
standard library's JSON of image-fp32. The stream-2048 workloads are left out (minutes under
callgrind), and so are the workloads like one counted (stream-16-top5, stream-256-multi,
embed-32x1024, embed-8x4096, image-fp16): the run takes about two minutes here. Under
--benchmark-disable, two cells only.

``extra_info``: ``instructions`` (``"codec|workload|op"`` -> instructions per chunk, per
message for unary workloads, the counting overhead subtracted), ``overhead_instructions``,
``repeat_difference`` (cell -> relative difference of two counts of it in the same process),
``repeatable`` (every such difference under 1%), ``valgrind``, ``python``, ``left_out`` (the
cells not counted, one line for the report). Without valgrind the benchmark skips and says so.
"""

from __future__ import annotations

from typing import Any

import pytest

from inferwire.bench.measure import instructions

REPEATABLE_WITHIN = 0.01
REPEATED_CELLS = (
    ("orjson", "stream-256", "encode"),
    ("protobuf", "embed-1x384", "decode"),
)
"""Counted twice in a timed run: a stream and a unary cell."""


def bench_instructions(benchmark: Any) -> None:
    reason = instructions.unavailable()
    if reason is not None:
        pytest.skip(f"instructions not counted: {reason}")
    if benchmark.disabled:
        cells = instructions.disabled_cells()
        repeat = cells[:1]
        left_out = "an untimed run: two cells only"
    else:
        cells = instructions.timed_cells()
        repeat = [instructions.Cell(codec=c, workload=w, op=o) for c, w, o in REPEATED_CELLS]
        left_out = instructions.LEFT_OUT_NOTE
    benchmark.group = "instructions"
    counts = benchmark.pedantic(
        instructions.count, args=(cells,), kwargs={"repeat": repeat}, rounds=1, iterations=1
    )
    benchmark.extra_info.update(
        instructions=counts.instructions_per_chunk,
        overhead_instructions=float(counts.overhead),
        repeat_difference=counts.repeat_difference,
        repeatable=all(d < REPEATABLE_WITHIN for d in counts.repeat_difference.values()),
        valgrind=counts.valgrind,
        python=counts.python,
        left_out=left_out,
    )
    assert set(counts.instructions_per_chunk) == {c.label for c in cells}
    assert all(v > 0 for v in counts.instructions_per_chunk.values())
