"""Instructions per chunk of the codec operations, counted by valgrind's callgrind.

A wall-clock median moves with the machine's neighbours; an instruction count does not. The
driver (:func:`count`) runs one child process::

    valgrind --tool=callgrind --instr-atstart=no --callgrind-out-file=<tmp>/cg.%p \\
        python -m inferwire.bench.measure.instructions --child <spec>

with ``PYTHONHASHSEED=0``. The child builds every :class:`Cell` (codec x workload x op, the
operations of ``bench_codec`` in bench/bench_codecs.py: a token stream through
``stream_encoder``/``stream_decoder`` with one ``feed`` per frame, any other workload one
unary ``encode``/``decode``) and runs each a few times uninstrumented so CPython 3.11's
adaptive specialization has settled, all before the first count. Then, cell by cell, one more
uninstrumented call and one counted with instrumentation on only around it
(:mod:`inferwire.bench.measure._callgrind`: zero, start; stop, dump under the cell's label),
as pytest-codspeed's instrumentation mode does. The parent reads every dump file's label and
total (:func:`parse_dump`).

The start/stop calls and the call into the measured closure cost a few hundred instructions of
their own: an empty closure is counted the same way and subtracted (``overhead``).
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import platform
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

VALGRIND: Final = "valgrind"
NOT_INSTALLED: Final = "valgrind not installed"
WARMUPS: Final = 3
"""Uninstrumented calls of a stream before the counted one."""
UNARY_WARMUPS: Final = 64
"""The same for a unary message of at most :data:`LARGE_WIRE_BYTES`: CPython 3.11 quickens a
code object after 8 calls and specializes its instructions on the next executions, and a unary
call runs each codec function once (a stream's loop runs them once per chunk). An instruction
that failed to specialize retries after 1, 2, 4, ... executions: with 16 warm-ups one of two
counts of a protobuf decode still caught a retry (+2.8%), with 64 none did (< 0.5% apart)."""
LARGE_WIRE_BYTES: Final = 64 * 1024
"""Past this, a unary call's few thousand interpreted instructions are lost in its millions
spent in C, and 64 uninstrumented calls of it would cost more than all the counting: it gets
:data:`LARGE_WARMUPS`. Decided by the wire size, never by a time, so every run warms alike."""
LARGE_WARMUPS: Final = 1
OVERHEAD_LABEL: Final = "overhead"
OPS: Final = ("encode", "decode")
TIMEOUT_S: Final = 900.0

_TRIGGER = re.compile(r"^desc: Trigger: Client Request: (.*)$", re.MULTILINE)
_TOTAL = re.compile(r"^(?:totals|summary): *(\d+)", re.MULTILINE)


@dataclass(frozen=True, slots=True, kw_only=True)
class Cell:
    codec: str
    workload: str
    op: str

    @property
    def label(self) -> str:
        """The dump's label and the key in ``extra_info["instructions"]``: ``codec|workload|op``
        (no dot, so the repeats' dotted paths stay unambiguous)."""
        return f"{self.codec}|{self.workload}|{self.op}"

    @classmethod
    def parse(cls, label: str) -> Cell:
        codec, workload, op = label.split("|")
        return cls(codec=codec, workload=workload, op=op)


@dataclass(frozen=True, slots=True, kw_only=True)
class Counts:
    instructions_per_chunk: dict[str, float]
    """label -> instructions of one call, less the overhead, over the workload's chunks."""
    instructions: dict[str, int]
    """label -> instructions of one call as counted (overhead included)."""
    messages: dict[str, int]
    """label -> chunks (messages) in the workload."""
    overhead: int
    """Instructions of counting an empty closure: subtracted from every cell."""
    repeat_difference: dict[str, float]
    """label -> |second - first| / first, for the cells counted twice."""
    seconds: dict[str, float]
    """label -> wall time of the cell in the child (building, warm-ups, counting): how the
    budget went, not a result."""
    valgrind: str
    python: str


TIMED_WORKLOADS: Final = ("stream-16", "stream-256", "stream-256-top5", "embed-1x384", "image-fp32")
"""The workloads a timed run counts: one of each kind that fits in about two minutes here.
Left out: the stream-2048 workloads, stream-16-top5, stream-256-top5-f32, stream-256-multi,
embed-32x1024, embed-8x4096 and image-fp16 (each like one counted, and every start/stop costs
valgrind a retranslation of all the code the next call runs)."""
LEFT_OUT: Final = frozenset({("json", "image-fp32")})
"""(codec, workload) pairs not counted: the standard library's JSON of the fp32 image is over a
billion instructions each way, a minute of callgrind alone."""
LEFT_OUT_NOTE: Final = (
    "not counted (callgrind's time): the stream-2048 workloads, stream-16-top5,"
    " stream-256-top5-f32, stream-256-multi, embed-32x1024, embed-8x4096, image-fp16, and json"
    " of image-fp32"
)
"""What a timed run leaves out, as the report prints it (``extra_info["left_out"]``)."""
DISABLED_CELLS: Final = (
    ("delta", "stream-16", "encode"),
    ("protobuf", "embed-1x384", "decode"),
)
"""What an untimed (--benchmark-disable) run counts: one stream and one unary cell, so CI
exercises the whole path in seconds."""


def timed_cells() -> list[Cell]:
    """The cells of a timed run (:data:`TIMED_WORKLOADS` less :data:`LEFT_OUT`)."""
    return [c for c in cells(TIMED_WORKLOADS) if (c.codec, c.workload) not in LEFT_OUT]


def disabled_cells() -> list[Cell]:
    return [Cell(codec=c, workload=w, op=o) for c, w, o in DISABLED_CELLS]


def unavailable() -> str | None:
    """Why instructions cannot be counted here, or None when they can."""
    if shutil.which(VALGRIND) is None:
        return NOT_INSTALLED
    return None


def valgrind_version() -> str:
    """``valgrind-3.19.0`` as ``valgrind --version`` prints it."""
    out = subprocess.run([VALGRIND, "--version"], capture_output=True, text=True, check=True)
    return out.stdout.strip()


def cells(workload_names: Iterable[str], codec_names: Iterable[str] | None = None) -> list[Cell]:
    """Every codec that carries the workload's messages (bench_codecs' MATRIX) x encode, decode."""
    import inferwire.codecs as ic
    from inferwire import workloads

    wanted = None if codec_names is None else set(codec_names)
    out = []
    for workload in workload_names:
        type_ = type(workloads.get(workload).messages()[0])
        for codec in ic.names():
            if (wanted is None or codec in wanted) and type_ in ic.get(codec).types:
                out += [Cell(codec=codec, workload=workload, op=op) for op in OPS]
    return out


def parse_dump(text: str) -> tuple[str, int] | None:
    """The client-request label and instruction total of one callgrind dump file, or None for a
    dump that no client request triggered (the one written at exit)."""
    trigger = _TRIGGER.search(text)
    if trigger is None:
        return None
    # "totals:" closes the file; older callgrinds wrote only "summary:" in the header
    totals = _TOTAL.findall(text)
    if not totals:
        raise ValueError(f"callgrind dump {trigger.group(1)!r} has no totals or summary line")
    return trigger.group(1), int(totals[-1])


def parse_dumps(directory: Path) -> dict[str, list[int]]:
    """label -> the totals of every dump under that label, in dump order."""

    def dump_number(path: Path) -> int:
        suffix = path.name.rsplit(".", 1)[-1]
        return int(suffix) if path.name.count(".") >= 2 and suffix.isdigit() else 1 << 62

    out: dict[str, list[int]] = {}
    for path in sorted(directory.glob("cg.*"), key=dump_number):
        parsed = parse_dump(path.read_text(errors="replace"))
        if parsed is not None:
            out.setdefault(parsed[0], []).append(parsed[1])
    return out


def count(cells_: Sequence[Cell], *, repeat: Sequence[Cell] = ()) -> Counts:
    """Count one call of each cell (and a second of each cell in ``repeat``) in one child
    process under callgrind."""
    reason = unavailable()
    if reason is not None:
        raise RuntimeError(f"cannot count instructions: {reason}")
    spec = {"cells": [c.label for c in cells_], "repeat": [c.label for c in repeat]}
    env = {
        **os.environ,
        "PYTHONHASHSEED": "0",
        # numpy's BLAS would start idle threads: slow to start under valgrind, and not ours
        "OPENBLAS_NUM_THREADS": "1",
        "OMP_NUM_THREADS": "1",
        "MKL_NUM_THREADS": "1",
    }
    with tempfile.TemporaryDirectory(prefix="inferwire-callgrind-") as tmp:
        directory = Path(tmp)
        command = [
            VALGRIND,
            "--tool=callgrind",
            "--instr-atstart=no",
            f"--callgrind-out-file={directory / 'cg.%p'}",
            f"--log-file={directory / 'valgrind.log'}",
            sys.executable,
            "-m",
            "inferwire.bench.measure.instructions",
            "--child",
            json.dumps(spec),
            "--manifest",
            str(directory / "manifest.json"),
        ]
        completed = subprocess.run(
            command, env=env, capture_output=True, text=True, timeout=TIMEOUT_S, check=False
        )
        log = directory / "valgrind.log"
        if completed.returncode != 0:
            raise RuntimeError(
                f"the callgrind child exited {completed.returncode}:\n{completed.stderr[-4000:]}"
                f"\n{log.read_text()[-2000:] if log.exists() else ''}"
            )
        manifest: dict[str, dict[str, float]] = json.loads(
            (directory / "manifest.json").read_text()
        )
        dumps = parse_dumps(directory)
    return from_dumps(cells_, repeat, dumps, manifest)


def from_dumps(
    cells_: Sequence[Cell],
    repeat: Sequence[Cell],
    dumps: dict[str, list[int]],
    manifest: dict[str, dict[str, float]],
) -> Counts:
    """The counts of the cells from the parsed dumps (:func:`parse_dumps`) and the child's
    manifest (label -> ``messages`` and ``seconds``)."""

    def one(label: str, n: int) -> list[int]:
        got = dumps.get(label, [])
        if len(got) != n:
            raise RuntimeError(f"expected {n} callgrind dump(s) for {label!r}, found {len(got)}")
        return got

    (overhead,) = one(OVERHEAD_LABEL, 1)
    repeated = {c.label for c in repeat}
    instructions: dict[str, int] = {}
    per_chunk: dict[str, float] = {}
    difference: dict[str, float] = {}
    messages = {c.label: int(manifest[c.label]["messages"]) for c in cells_}
    for cell in cells_:
        counted = one(cell.label, 2 if cell.label in repeated else 1)
        instructions[cell.label] = counted[0]
        per_chunk[cell.label] = (counted[0] - overhead) / messages[cell.label]
        if len(counted) == 2:
            difference[cell.label] = abs(counted[1] - counted[0]) / counted[0]
    return Counts(
        instructions_per_chunk=per_chunk,
        instructions=instructions,
        messages=messages,
        seconds={c.label: manifest[c.label]["seconds"] for c in cells_},
        overhead=overhead,
        repeat_difference=difference,
        valgrind=valgrind_version(),
        python=platform.python_version(),
    )


# --- the child, under callgrind ---------------------------------------------------------------


@dataclass(frozen=True, slots=True, kw_only=True)
class _Operations:
    by_op: dict[str, Callable[[], Any]]
    messages: int
    warmups: int


def _operations(codec_name: str, workload: str) -> _Operations:
    """The closures bench_codec times for a codec and workload (checked to round trip)."""
    import inferwire.codecs as ic
    from inferwire import workloads
    from inferwire.bench.measure.codec_ops import decode_stream, encode_stream

    codec = ic.get(codec_name, extensions=True)
    messages = workloads.get(workload).messages()
    type_: type[Any] = type(messages[0])
    if workloads.get(workload).kind == "stream":
        frames = encode_stream(codec, messages)

        def encode() -> list[bytes]:
            return encode_stream(codec, messages)

        def decode() -> list[Any]:
            return decode_stream(codec, frames, type_)

        ok = decode() == messages
        warmups = WARMUPS
    else:
        (message,) = messages
        data = codec.encode(message)

        def encode() -> bytes:  # type: ignore[misc]
            return codec.encode(message)

        def decode() -> Any:  # type: ignore[misc]
            return codec.decode(data, type_)

        ok = decode() == message
        warmups = UNARY_WARMUPS if len(data) <= LARGE_WIRE_BYTES else LARGE_WARMUPS
    if not ok:
        raise AssertionError(f"{codec_name} did not round trip {workload}")
    return _Operations(
        by_op={"encode": encode, "decode": decode}, messages=len(messages), warmups=warmups
    )


def _measure(label: str, operation: Callable[[], Any]) -> None:
    from inferwire.bench.measure import _callgrind

    # a collection pass is never billed to the call: the heap is collected, then the
    # collector is off while counting (as the timed suites run with it off)
    gc.collect()
    gc.disable()
    try:
        _callgrind.start()
        operation()
        _callgrind.stop(label)
    finally:
        gc.enable()


def _child(spec: dict[str, list[str]], manifest_path: Path) -> None:
    from inferwire.bench.measure import _callgrind

    if not _callgrind.running_on_valgrind():
        raise SystemExit("the --child mode counts nothing outside valgrind")
    cells_ = [Cell.parse(label) for label in spec["cells"]]
    repeat = set(spec["repeat"])
    # Everything is built and warmed before the first start(): valgrind discards its translated
    # code at every start and stop, and code first run after one is translated anew, slowly.
    built: dict[tuple[str, str], _Operations] = {}
    for cell in cells_:
        key = (cell.codec, cell.workload)
        if key not in built:
            built[key] = _operations(*key)
        for _ in range(built[key].warmups):
            built[key].by_op[cell.op]()
    gc.collect()
    gc.freeze()  # each count's collection then walks only what was made since

    def empty() -> None:
        return None

    for _ in range(UNARY_WARMUPS):  # quickens _measure itself; the parent ignores these dumps
        _measure("warm-up", empty)
    _measure(OVERHEAD_LABEL, empty)
    manifest: dict[str, dict[str, float]] = {}
    for cell in cells_:
        started = time.perf_counter()
        operations = built[(cell.codec, cell.workload)]
        operation = operations.by_op[cell.op]
        # the cells between its warm-ups and now may have respecialized shared code
        operation()
        _measure(cell.label, operation)
        if cell.label in repeat:
            _measure(cell.label, operation)
        manifest[cell.label] = {
            "messages": operations.messages,
            "seconds": time.perf_counter() - started,
        }
    manifest_path.write_text(json.dumps(manifest))


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0] if __doc__ else None)
    parser.add_argument("--child", required=True, help="JSON: cells and repeat, as labels")
    parser.add_argument("--manifest", required=True, type=Path, help="where to write chunks")
    args = parser.parse_args(argv)
    _child(json.loads(args.child), args.manifest)


if __name__ == "__main__":
    main()
