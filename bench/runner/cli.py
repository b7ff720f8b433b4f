"""The ``inferwire`` command.

inferwire bench [--out results] [-k EXPR]  run the benchmark matrix, write results/
inferwire report [--out results]            rebuild results/README.md from results/raw/
inferwire serve --transport T --codec C     one transport's server (prints its address)
inferwire proxy --upstream H:P --delay-ms X the WAN-delay proxy
inferwire load --transport T --spawn ...    the open-loop load generator (bench/loadgen/)
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

from inferwire.bench.report import results

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
    from inferwire.bench.report import readme

    out: Path = args.out
    raw = out / "raw"
    raw.mkdir(parents=True, exist_ok=True)
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

    written = readme.write(args.out / "raw" / results.CODECS_RAW, args.out)
    print(f"wrote {written}")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="inferwire", description=__doc__.splitlines()[0])
    commands = parser.add_subparsers(dest="command", required=True)

    bench = commands.add_parser("bench", help="run the benchmark matrix and write results/")
    bench.add_argument("--out", type=Path, default=Path("results"))
    bench.add_argument(
        "--max-time",
        type=float,
        default=0.3,
        help="seconds of rounds per benchmark (pytest-benchmark max-time)",
    )
    bench.add_argument("-k", dest="filter", help="only benchmarks matching this expression")
    bench.set_defaults(run=_bench)

    rep = commands.add_parser("report", help="rebuild results/README.md from raw JSON")
    rep.add_argument("--out", type=Path, default=Path("results"))
    rep.set_defaults(run=_report)

    from inferwire.bench.loadgen import load_command
    from inferwire.transports import serve

    serve.add_commands(commands)
    load_command.add_commands(commands)

    args = parser.parse_args(argv)
    return int(args.run(args))


if __name__ == "__main__":
    sys.exit(main())
