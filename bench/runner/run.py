"""``inferwire bench`` and ``inferwire report``: the benchmark matrix run suite by suite, each
repeat in a fresh process, its results merged and published to ``OUT/raw/``, and the report
written from them (:mod:`inferwire.cli.bench` parses their options).

A run that is unstable is not published over a stable one unless forced: exit status
:data:`UNSTABLE_EXIT`, the run kept in ``OUT/raw-unstable/``. If any suite fails, nothing is
written.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Final

from inferwire import bench as bench_package
from inferwire._runtime import extras, loops
from inferwire._runtime.arguments import CommandError
from inferwire._runtime.loops import LOOP_ENV
from inferwire.bench.report import results
from inferwire.bench.report.engine import ENGINE_RAW
from inferwire.bench.report.instructions import INSTRUCTIONS_RAW
from inferwire.bench.report.vllm_hop import VLLM_HOP_RAW
from inferwire.bench.runner import merge

STAGING: Final = "raw-staging"
"""Under OUT: the run being made, moved into raw/ once every suite and repeat has passed."""
UNSTABLE_DIR: Final = "raw-unstable"
"""Under OUT: an unstable run that was not published over a stable one."""
REPEATS_DIR: Final = results.REPEATS_DIR
UNSTABLE_EXIT: Final = 3

SUITES_DIR = Path(bench_package.__file__).resolve().parent
"""bench/, where the suites are."""
SUITES = (
    # (suite, its raw file, repeated): a suite that is not repeated runs in the first repeat
    # only, because repeating it measures nothing new: the faults suite's figures are counts of
    # what each fault did to requests (no timing is compared), and instruction counts are the
    # same in every process by construction
    ("bench_codecs.py", results.CODECS_RAW, True),
    ("bench_transports.py", results.TRANSPORTS_RAW, True),
    ("bench_grpc.py", results.GRPC_RAW, True),
    ("bench_connections.py", results.CONNECTIONS_RAW, True),
    ("bench_stages.py", results.STAGES_RAW, True),
    ("bench_load.py", results.LOAD_RAW, True),
    ("bench_peers.py", results.PEERS_RAW, True),
    ("bench_serving.py", results.SERVING_RAW, True),
    ("bench_compression.py", results.COMPRESSION_RAW, True),
    ("bench_kserve_shm.py", results.KSERVE_SHM_RAW, True),
    ("bench_vllm_hop.py", VLLM_HOP_RAW, True),
    ("bench_faults.py", results.FAULTS_RAW, False),
    ("bench_instructions.py", INSTRUCTIONS_RAW, False),
    # the engine's virtual clock is deterministic (the same figures in every process), and its
    # real-stack points run their trials interleaved within the one run
    ("bench_engine.py", ENGINE_RAW, False),
)


def _suite_command(
    suite: str, json_path: Path, *, max_time: float, expression: str | None
) -> list[str]:
    command = [
        sys.executable,
        "-m",
        "pytest",
        str(SUITES_DIR / suite),
        "-p",
        "no:cacheprovider",
        # the hypothesis plugin (installed with the dev extra) costs seconds of imports per
        # suite process and no benchmark uses it
        "-p",
        "no:hypothesispytest",
        "-q",
        "--import-mode=importlib",
        # the suites' naming, so an installed (non-checkout) copy collects them too
        "-o",
        "python_files=bench_*.py",
        "-o",
        "python_functions=bench_*",
        # benchmarks kept for `pytest bench/ --benchmark-compare` whose figures the report
        # takes from an interleaved benchmark of the same suite instead
        "-m",
        "not standalone",
        f"--benchmark-json={json_path}",
        "--benchmark-warmup=on",
        f"--benchmark-max-time={max_time}",
        "--benchmark-min-rounds=5",
        "--benchmark-columns=median,iqr,rounds",
        "--benchmark-sort=name",
        # a -k that selects nothing in one suite is not an error (exit 5 is handled below)
        "-W",
        "ignore:Not saving anything:pytest_benchmark.logger.PytestBenchmarkWarning",
    ]
    if expression:
        command += ["-k", expression]
    return command


def suite_names() -> list[str]:
    """The suites' short names (``bench_codecs.py`` is ``codecs``), for ``--suite``."""
    return [suite.removeprefix("bench_").removesuffix(".py") for suite, _, _ in SUITES]


def run_matrix(
    out: Path,
    *,
    max_time: float = 0.3,
    repeats: int = 1,
    force: bool = False,
    expression: str | None = None,
    loop: str = "auto",
    suites: Sequence[str] | None = None,
) -> int:
    """Runs the suites (those named in ``suites``, all if None; only the benchmarks that the
    pytest ``-k`` ``expression`` matches) ``repeats`` times with ``max_time`` seconds of rounds
    per benchmark, on ``loop``, publishes their merged results to ``out/raw/`` (the suites that
    did not run keep theirs) and writes ``out/README.md``: exit status 0, a suite's status if
    one failed, :data:`UNSTABLE_EXIT` if the run was not published."""
    unknown = sorted(set(suites or ()) - set(suite_names()))
    if unknown:
        raise CommandError(f"no suite {', '.join(unknown)}: the suites are {suite_names()}")
    chosen = [
        entry
        for entry, name in zip(SUITES, suite_names(), strict=True)
        if suites is None or name in suites
    ]
    # the suites run in another process: find a missing library before starting it
    extras.require("bench", "inferwire bench")
    loops.resolve(loop)  # uvloop asked for and missing: said before any suite runs
    from inferwire.bench.report import readme

    raw = out / "raw"
    staging = out / STAGING
    try:
        raw.mkdir(parents=True, exist_ok=True)
        shutil.rmtree(staging, ignore_errors=True)
        staging.mkdir(parents=True)
    except OSError as exc:
        raise CommandError(f"cannot write results to {out}: {exc.strerror or exc}") from None
    started = datetime.now(UTC).isoformat()
    ran: dict[str, list[Path]] = {}
    # repeats outermost: each suite's repeats are spread over the whole session, so a slow
    # spell of the machine lands in one repeat of several suites, not in every repeat of one
    for repeat in range(1, repeats + 1):
        for suite, raw_name, repeated in chosen:
            if repeat > 1 and (raw_name not in ran or not repeated):
                continue  # nothing matched -k in the first repeat, or once is enough
            path = staging / REPEATS_DIR / str(repeat) / raw_name
            path.parent.mkdir(parents=True, exist_ok=True)
            label = f"{suite} (repeat {repeat} of {repeats})" if repeats > 1 else suite
            print(f"running {label}", flush=True)
            # in the caller's working directory, so pytest-benchmark's storage (./.benchmarks)
            # and the commit it names a saved run by are theirs, never the installed package's;
            # the project's pytest settings still apply from a checkout (pytest finds them from
            # the suite's path)
            completed = subprocess.run(
                _suite_command(suite, path, max_time=max_time, expression=expression),
                check=False,
                env={**os.environ, LOOP_ENV: loop},  # every suite, server and client
            )
            if completed.returncode == 5 and expression:
                print(f"{suite}: nothing matches -k {expression!r}; its results are kept")
                continue
            if completed.returncode != 0:
                shutil.rmtree(staging, ignore_errors=True)
                print(
                    f"benchmark run {label} failed (exit {completed.returncode}); "
                    "no results written",
                    file=sys.stderr,
                )
                return completed.returncode
            _trim(path)
            ran.setdefault(raw_name, []).append(path)
    if not ran:
        shutil.rmtree(staging, ignore_errors=True)
        raise CommandError(f"no benchmark matches -k {expression!r}")
    merged = {
        name: merge.merge([json.loads(p.read_text()) for p in paths]) for name, paths in ran.items()
    }
    run_info: dict[str, Any] = {
        "started": started,
        "finished": datetime.now(UTC).isoformat(),
        "repeats": repeats,
        "max_time_s": max_time,
        "filter": expression,
        "suites": sorted(ran),
        "stable": all(merge.stable(m) for m in merged.values()),
        "unstable": {
            n: merge.unstable_reasons(m) for n, m in merged.items() if not merge.stable(m)
        },
    }
    for name, result in merged.items():
        result["run"] = run_info
        (staging / name).write_text(json.dumps(result, indent=1))
    refused = _refusal(raw, merged, force)
    if refused:
        kept = out / UNSTABLE_DIR
        shutil.rmtree(kept, ignore_errors=True)
        staging.replace(kept)
        print(refused + f" This run is kept in {kept}; --force publishes it.", file=sys.stderr)
        return UNSTABLE_EXIT
    _publish(staging, raw, ran, keep_repeats=repeats > 1)
    if not run_info["stable"]:
        for name, reasons in run_info["unstable"].items():
            print(f"{name}: unstable run ({'; '.join(reasons)})", file=sys.stderr)
    codecs_raw = raw / results.CODECS_RAW
    if not codecs_raw.is_file():  # a -k that selected no codec benchmark, into a new OUT
        print(f"published to {raw}; no README.md until {codecs_raw} exists (inferwire report)")
        return 0
    written = readme.write(codecs_raw, out)
    print(f"wrote {written}")
    return 0


def _refusal(raw: Path, merged: dict[str, dict[str, Any]], force: bool) -> str:
    """Why this run must not replace the published one ("" if it may): an unstable run never
    overwrites a stable one unless forced."""
    if force:
        return ""
    for name, result in merged.items():
        published = raw / name
        if merge.stable(result) or not published.is_file():
            continue
        try:
            old = json.loads(published.read_text())
        except (OSError, json.JSONDecodeError):
            continue  # nothing trustworthy to protect
        if merge.stable(old):
            reasons = "; ".join(merge.unstable_reasons(result))
            return (
                f"not published: this run of {name} was unstable ({reasons}), and the "
                f"published one in {published} is stable."
            )
    return ""


def _publish(
    staging: Path, raw: Path, ran: dict[str, list[Path]], *, keep_repeats: bool = True
) -> None:
    """Each suite's merged file to raw/, its repeats to raw/repeats/N/ (an older run's
    repeats of the same suite removed first, so no stale repeat is read as this run's; a run
    of one repeat keeps none: its one file is the merged one)."""
    for old in (raw / REPEATS_DIR).glob("*/*.json"):
        if old.name in ran:
            old.unlink()
    for name, paths in ran.items():
        for path in paths if keep_repeats else ():
            target = raw / path.relative_to(staging)
            target.parent.mkdir(parents=True, exist_ok=True)
            path.replace(target)
        (staging / name).replace(raw / name)
    for empty in sorted((raw / REPEATS_DIR).glob("*"), reverse=True):
        if empty.is_dir() and not any(empty.iterdir()):
            empty.rmdir()
    shutil.rmtree(staging, ignore_errors=True)


def _trim(raw_path: Path) -> None:
    """Drop each benchmark's list of every round's time: the statistics stay, and the file
    shrinks from hundreds of MB to what can be committed."""
    raw = json.loads(raw_path.read_text())
    for bench in raw["benchmarks"]:
        bench["stats"].pop("data", None)
    raw_path.write_text(json.dumps(raw, indent=1))


def write_report(out: Path) -> int:
    """Rebuilds ``out/README.md`` and its plots from the raw JSON in ``out/raw/``."""
    from inferwire.bench.report import readme

    codecs_raw = out / "raw" / results.CODECS_RAW
    if not codecs_raw.is_file():
        raise CommandError(
            f"no results to report: {codecs_raw} does not exist (inferwire bench writes it)"
        )
    try:
        with extras.needs_extras("plotting the report"):
            written = readme.write(codecs_raw, out)
    except json.JSONDecodeError as exc:
        raise CommandError(f"a result file under {codecs_raw.parent} is not JSON: {exc}") from None
    print(f"wrote {written}")
    return 0
