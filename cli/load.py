"""``inferwire load`` and ``inferwire load-report``: their parsers; the options themselves are
:mod:`inferwire.load.load_arguments`' (the split run checks with them too), and what the
commands do is :func:`inferwire.load.load_command.run_load` and
:func:`inferwire.load.load_outputs.load_report`. Imported only with the ``bench`` extra."""

from __future__ import annotations

from pathlib import Path
from typing import Final

from inferwire._runtime import arguments
from inferwire.load import load_arguments, load_command, load_outputs

DESCRIPTION: Final = """\
Open-loop load against one server's token streams. Requests arrive on a schedule drawn before
the run from a seeded arrival process (Poisson at --rate, gamma, or constant; optionally ramped
up with --ramp-from/--ramp-s), whatever the server does, and every latency is timed from the
request's intended send time, so a stall shows in the percentiles of every request that was due
during it (no coordinated omission). A capacity search (--capacity) finds the highest rate that
meets the SLOs.

Reports, per point of the --rate x --concurrency sweep: TTFT, TPOT, inter-token latency, E2E
latency (P50/P90/P99/P99.9 from HDR histograms), request and token throughput, goodput under the
SLOs given, errors by type, stream integrity, and CPU per 1,000 tokens. Definitions in full:
python -m pydoc inferwire.load.load_command

SIGINT or SIGTERM stops the run: the records so far and the report of the points that ended
are written, and the exit status is 128 + the signal's number; during --metrics-hold it ends
the wait, the outputs written already.

With --metrics-port, the client's view (TTFT, ITL and E2E histograms, send lag, errors by kind,
requests in flight, tokens) is served for Prometheus while the run goes, beside the servers'
own metrics."""


def add_commands(commands: arguments.Commands) -> None:
    """``load`` and ``load-report``."""
    load = commands.add_parser(
        "load",
        help="open-loop load against one server: TTFT, TPOT, ITL, E2E percentiles",
        description=DESCRIPTION,
    )
    load_arguments.add_load_arguments(load)
    arguments.add_trace_arguments(load, "each request's stages (with --spawn, the server's too)")
    load_arguments.add_output_arguments(load)
    load_arguments.add_metrics_arguments(load)
    load_arguments.add_attribution_arguments(load)
    load.set_defaults(run=load_command.run_load)

    page = commands.add_parser(
        "load-report",
        help="rebuild the HTML report of `inferwire load` from its JSON",
        description="Writes the one-page HTML report (tables, latency CDFs, ITL over time) "
        "from a JSON report that `inferwire load --out` wrote.",
    )
    page.add_argument("report", type=Path, help="the JSON report")
    page.add_argument(
        "--html",
        type=load_arguments.html_path,
        required=True,
        metavar="FILE",
        help="the page to write",
    )
    page.set_defaults(run=load_outputs.load_report)
