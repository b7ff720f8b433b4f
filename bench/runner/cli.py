"""The ``inferwire`` command: ``bench`` and ``report`` here, ``serve`` and ``proxy`` from
:mod:`inferwire.transports.serve`, ``load`` from :mod:`inferwire.bench.loadgen.load_command`.

Ordinary mistakes are one line on stderr and exit status 2 (:mod:`inferwire.transports.arguments`).
On a base install (no extras) ``--help`` works, and a subcommand whose libraries are missing
says which extra installs them.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path
from typing import Final

import inferwire.codecs as ic
import inferwire.transports as it
from inferwire import workloads
from inferwire.bench.report import results
from inferwire.transports import extras, serve
from inferwire.transports.arguments import CommandError, Commands, Parser, positive, run

DESCRIPTION: Final = """\
How much of your inference latency is serialization and transport: benchmarks of codecs and
transports for AI serving, and the servers, proxy and load generator they use."""

BENCH_DESCRIPTION: Final = """\
Runs the standard benchmark matrix (the pytest-benchmark suites bench_*.py: codecs,
transports, connections, stages, load, peers, faults), writes each suite's results to
OUT/raw/ and the tables to OUT/README.md. A suite that fails leaves its earlier results in
place. Every timed run is also saved by pytest-benchmark under ./.benchmarks/ of the working
directory."""

SUITES_DIR = Path(__file__).resolve().parents[1]
"""bench/, where the suites are."""
SUITES = (
    ("bench_codecs.py", results.CODECS_RAW),
    ("bench_transports.py", results.TRANSPORTS_RAW),
    ("bench_connections.py", results.CONNECTIONS_RAW),
    ("bench_stages.py", results.STAGES_RAW),
    ("bench_load.py", results.LOAD_RAW),
    ("bench_peers.py", results.PEERS_RAW),
    ("bench_faults.py", results.FAULTS_RAW),
)


def _bench(args: argparse.Namespace) -> int:
    # the suites run in another process: find a missing library before starting it
    extras.require("bench", "inferwire bench")
    from inferwire.bench.report import readme

    out: Path = args.out
    raw = out / "raw"
    try:
        raw.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise CommandError(f"cannot write results to {out}: {exc.strerror or exc}") from None
    for suite, raw_name in SUITES:
        raw_path = raw / raw_name
        partial = raw_path.with_suffix(".partial.json")
        command = [
            sys.executable,
            "-m",
            "pytest",
            str(SUITES_DIR / suite),
            "-p",
            "no:cacheprovider",
            "-q",
            "--import-mode=importlib",
            # the suites' naming, so an installed (non-checkout) copy collects them too
            "-o",
            "python_files=bench_*.py",
            "-o",
            "python_functions=bench_*",
            f"--benchmark-json={partial}",
            "--benchmark-warmup=on",
            f"--benchmark-max-time={args.max_time}",
            "--benchmark-min-rounds=5",
            "--benchmark-columns=median,iqr,rounds",
            "--benchmark-sort=name",
            # a -k that selects nothing in one suite is not an error (exit 5 is handled below)
            "-W",
            "ignore:Not saving anything:pytest_benchmark.logger.PytestBenchmarkWarning",
        ]
        if args.filter:
            command += ["-k", args.filter]
        # in the caller's working directory, so pytest-benchmark's storage (./.benchmarks) and
        # the commit it names a saved run by are theirs, never the installed package's; the
        # project's pytest settings still apply from a checkout (pytest finds them from the
        # suite's path)
        completed = subprocess.run(command, check=False)
        if completed.returncode == 5 and args.filter:
            print(f"{suite}: nothing matches -k {args.filter!r}; its results are kept as they were")
            continue
        if completed.returncode != 0:
            partial.unlink(missing_ok=True)
            print(
                f"benchmark run {suite} failed (exit {completed.returncode}); results not written",
                file=sys.stderr,
            )
            return completed.returncode
        _trim(partial)
        partial.replace(raw_path)
    written = readme.write(raw / results.CODECS_RAW, out)
    print(f"wrote {written}")
    return 0


def _trim(raw_path: Path) -> None:
    """Drop each benchmark's list of every round's time: the statistics stay, and the file
    shrinks from hundreds of MB to what can be committed."""
    raw = json.loads(raw_path.read_text())
    for bench in raw["benchmarks"]:
        bench["stats"].pop("data", None)
    raw_path.write_text(json.dumps(raw, indent=1))


def _report(args: argparse.Namespace) -> int:
    from inferwire.bench.report import readme

    codecs_raw = args.out / "raw" / results.CODECS_RAW
    if not codecs_raw.is_file():
        raise CommandError(
            f"no results to report: {codecs_raw} does not exist (inferwire bench writes it)"
        )
    try:
        with extras.needs_extras("plotting the report"):
            written = readme.write(codecs_raw, args.out)
    except json.JSONDecodeError as exc:
        raise CommandError(f"a result file under {codecs_raw.parent} is not JSON: {exc}") from None
    print(f"wrote {written}")
    return 0


def _unavailable(
    commands: Commands,
    name: str,
    summary: str,
    missing: extras.MissingExtraError,
) -> None:
    """``name`` as a subcommand that only says which extra it needs."""

    def refuse(args: argparse.Namespace) -> int:
        raise missing

    unavailable = commands.add_parser(
        name, help=f"{summary} (needs inferwire[{missing.extra}])", description=str(missing)
    )
    unavailable.set_defaults(run=refuse, any_arguments=True)


def build_parser() -> Parser:
    """The ``inferwire`` command's parser, every subcommand added."""
    parser = Parser(prog="inferwire", description=DESCRIPTION)
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

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
        "-k",
        dest="filter",
        metavar="EXPRESSION",
        help="only benchmarks whose names match (pytest -k), e.g. 'protobuf and stream-256'",
    )
    bench.set_defaults(run=_bench)

    rep = commands.add_parser(
        "report",
        help="rebuild results/README.md from results/raw/",
        description="Rebuilds OUT/README.md and its plots from the raw JSON of a run in OUT/raw/.",
    )
    rep.add_argument("--out", type=Path, default=Path("results"), help="results directory")
    rep.set_defaults(run=_report)

    serve.add_commands(commands)
    try:
        with extras.needs_extras("the load generator"):
            from inferwire.bench.loadgen import load_command
    except extras.MissingExtraError as missing:
        _unavailable(commands, "load", "open-loop load against one server", missing)
    else:
        load_command.add_commands(commands)
    return parser


def main(argv: list[str] | None = None) -> int:
    return run(build_parser(), argv)


if __name__ == "__main__":
    sys.exit(main())
