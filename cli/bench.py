"""``inferwire bench`` and ``inferwire report``: their options; what they run is
:mod:`inferwire.bench.runner.run`'s."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Final

import inferwire.codecs as ic
import inferwire.transports as it
from inferwire import workloads
from inferwire._runtime.arguments import Commands, add_loop_argument, positive
from inferwire.bench.runner import run

BENCH_DESCRIPTION: Final = """\
Runs the standard benchmark matrix (the pytest-benchmark suites bench_*.py: codecs, transports,
grpc, connections, stages, load, peers, serving, compression, kserve_shm (KServe shared memory),
vllm_hop (the vLLM-style frontend-engine hop), faults, instructions, engine), each --repeat times
in a fresh process (the faults suite once: its figures are counts, not timings; the
instruction counts under callgrind once: they are the same in every process; the engine suite
once: its virtual-clock figures are the same in every process, and its real-stack points
interleave their own trials), writes each suite's results
to OUT/raw/ (the median over repeats; every repeat under OUT/raw/repeats/N/) and the tables to
OUT/README.md. Every suite times calibration workloads at its start, middle and end and reads
the machine's CPU counters: a run in which they moved, or other processes or CPU steal took
their share of the machine, is unstable, and is not published over a stable run unless --force
is given (exit status 3; the run is kept in OUT/raw-unstable/). If any suite fails, nothing is
written. Every timed run is also saved by pytest-benchmark under ./.benchmarks/ of the working
directory."""


def _repeats(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number of repeats (1 or more)")
    return value


def _bench(args: argparse.Namespace) -> int:
    return run.run_matrix(
        args.out,
        max_time=args.max_time,
        repeats=args.repeat,
        force=args.force,
        expression=args.filter,
        loop=args.loop,
        suites=args.suite,
    )


def _report(args: argparse.Namespace) -> int:
    return run.write_report(args.out)


def add_commands(commands: Commands) -> None:
    """``bench`` and ``report``."""
    bench = commands.add_parser(
        "bench",
        help="run the benchmark matrix and write results/",
        description=BENCH_DESCRIPTION,
        epilog=(
            "Names for -k: codecs "
            + ", ".join(ic.names())
            + "; transports "
            + ", ".join(it.TRANSPORTS)
            + "; workloads "
            + ", ".join(workloads.names())
            + "."
        ),
    )
    bench.add_argument("--out", type=Path, default=Path("results"), help="results directory")
    bench.add_argument(
        "--max-time",
        type=positive,
        default=0.3,
        help="seconds of rounds per benchmark (pytest-benchmark's --benchmark-max-time)",
    )
    bench.add_argument(
        "--repeat",
        type=_repeats,
        default=1,
        metavar="N",
        help="run every suite N times, each in a fresh process, and publish the median over "
        "the repeats with their spread (default 1)",
    )
    bench.add_argument(
        "--force",
        action="store_true",
        help="publish the run even if it is unstable and the published one is not",
    )
    bench.add_argument(
        "-k",
        dest="filter",
        metavar="EXPRESSION",
        help="only benchmarks whose names match (pytest -k), e.g. 'protobuf and stream-256'",
    )
    bench.add_argument(
        "--suite",
        action="append",
        choices=run.suite_names(),
        metavar="NAME",
        help="only this suite (repeat the option for more; default: all): "
        + ", ".join(run.suite_names())
        + ". The other suites' published results are kept",
    )
    add_loop_argument(bench)
    bench.set_defaults(run=_bench)

    rep = commands.add_parser(
        "report",
        help="rebuild results/README.md from results/raw/",
        description="Rebuilds OUT/README.md and its plots from the raw JSON of a run in OUT/raw/.",
    )
    rep.add_argument("--out", type=Path, default=Path("results"), help="results directory")
    rep.set_defaults(run=_report)
