"""``inferwire load``: an open-loop load generator for one server's token streams.

Requests arrive on a schedule drawn before the run from a seeded arrival process, whatever the
server does: a Poisson process at ``--rate`` requests/s, or gamma-distributed gaps of the same
mean whose shape is ``--burstiness`` (1 is Poisson; below 1 burstier, above 1 more regular; as
in vLLM's serving benchmark). ``--concurrency N`` caps the requests in flight: a request due
while N are running waits for a slot, and that wait counts in its latency. Every latency is
measured from the request's **intended** send time, not from when it was actually sent, so a
server that stalls shows the stall in the percentiles of every request that was due during it
(no coordinated omission, after Gil Tene's "How NOT to Measure Latency" and wrk2).

Metrics, per sweep point (vLLM's ``benchmarks/benchmark_serving.py`` definitions where it has
one; its latencies start at the actual send, ours at the intended one, which agree whenever
the generator keeps up and the cap is not reached)::

    TTFT            time to first token: intended send time to the arrival of the first chunk
                    that carries a token ("arrival": decoded and handed to the caller)
    TPOT            time per output token after the first: (E2E - TTFT) / (output tokens - 1),
                    one value per request of two tokens or more
    ITL per chunk   inter-token latency as vLLM records it: the time between successive
                    token-carrying chunks of a stream
    ITL per token   the same gaps spread over the tokens that arrived: a chunk of n tokens
                    after a gap g counts n times as g / n (the first chunk's tokens have none)
    E2E             end-to-end latency: intended send time to the stream's end marker
    duration        first request's intended send time to the last request's end
    request throughput        completed requests / duration
    output token throughput   output tokens of completed requests / duration
    goodput         completed requests that met every SLO given (--slo-ttft-ms,
                    --slo-tpot-ms, --slo-e2e-ms) / duration
    errors          failed requests by exception class (TransportError's subclasses by name,
                    anything else by qualified name); "Unfinished" is a request still running
                    when the drain timeout ran out. A failed request is in no latency.
    integrity       every stream is verified as it arrives (inferwire.codecs.integrity): its
                    chunks' sequence numbers 0, 1, 2, ... with none missing or repeated, and
                    an end marker (the last chunk's finish_reason) whose usage counts the
                    tokens delivered; and each chunk's tokens and text against the chunks the
                    simulated service sends for the request. "verified": the streams that
                    passed (the completed requests); lost, duplicated, reordered, truncated,
                    altered: the failed requests of the matching error classes
                    (SequenceGapError; DuplicateFrameError; ReorderedFrameError;
                    StreamTruncatedError or IncompleteStreamError; AlteredStreamError). A
                    stream that fails verification is an error, never a success. In a healthy
                    run all five are zero.
    send lag        the generator's own lateness: from intended send time to when it started
                    the request (uncapped) or queued it for a slot (capped)
    queue wait      intended send time to the moment the request had a slot and was sent
    CPU             user + system seconds of this process (client) and of the server process
                    (with --spawn, or --server-pid), over the point, per 1,000 output tokens

Latencies are kept in HDR histograms (microseconds, 3 significant digits) and reported as
P50/P90/P99/P99.9, mean and max in milliseconds. Output is a summary line per point on stdout
and, with ``--out``, a JSON file with every metric, the run's parameters, library versions and
the machine.

One asyncio event loop drives everything. The selector it waits on sets how precisely a request
leaves on time: ``select`` takes microsecond timeouts, epoll milliseconds (rounded up), so the
generator uses ``select`` whenever its sockets are sure to stay below select's 1,024
descriptors, and epoll otherwise (the JSON says which).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import gc
import json
import os
import sys
from collections.abc import Iterator
from dataclasses import asdict
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, TextIO

import inferwire.codecs as ic
import inferwire.transports as it
from inferwire import workloads
from inferwire.bench.procs import server_process
from inferwire.transports import arguments
from inferwire.transports.arguments import CommandError

from . import api_mode, metrics
from .metrics import Slo
from .openloop import (
    DEFAULT_DRAIN_TIMEOUT_S,
    DEFAULT_DURATION_S,
    LoadSpec,
    Target,
    event_loop_factory,
    finite_or_text,
    open_target,
    run_point,
    select_is_safe,
    warm_up,
)
from .records import STDOUT, RecordsError, RecordWriter, records_format


def _rates(text: str) -> list[float]:
    try:
        rates = [float(part) for part in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a list of rates: {text!r}") from None
    if not rates or not all(r > 0 for r in rates):
        raise argparse.ArgumentTypeError("rates must be positive (inf: all at once)")
    return rates


def _caps(text: str) -> list[int]:
    try:
        caps = [int(part) for part in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a list of integers: {text!r}") from None
    if not caps or not all(c >= 1 for c in caps):
        raise argparse.ArgumentTypeError("concurrency caps must be at least 1")
    return caps


@contextlib.contextmanager
def _server(args: argparse.Namespace) -> Iterator[tuple[str, int | None]]:
    """The address and, when known, the pid of the server to load."""
    if not args.spawn:
        yield args.address, args.server_pid
        return
    pacing = ["--prefill-ms", str(args.prefill_ms), "--decode-ms", str(args.decode_ms)]
    with server_process.serve(args.transport, args.codec, *pacing) as server:
        assert server.process is not None
        yield server.address, server.process.pid


async def _sweep(
    args: argparse.Namespace,
    spec: LoadSpec,
    address: str,
    pid: int | None,
    api: api_mode.ApiSweep | None = None,
    records: RecordWriter | None = None,
) -> list[dict[str, Any]]:
    if api is None:
        target: Target = open_target(args.transport, address, args.codec)
        expected = spec.expected_chunks()
        first: Any = spec.request()
    else:
        target = await api.open()
        expected = None
        api.requests(max(len(spec.offsets_ns(rate)) for rate in args.rate))  # drawn up front
        first = api.requests(1)[0]
    points: list[dict[str, Any]] = []
    try:
        try:
            await warm_up(target, first, args.warmup)
        except it.TransportError as exc:
            raise CommandError(f"the warm-up failed, nothing was measured: {exc}") from exc
        # what exists now is never garbage: keep the collector's passes short during the run
        gc.collect()
        gc.freeze()
        for rate in args.rate:
            for cap in args.concurrency:
                requests = None if api is None else api.requests(len(spec.offsets_ns(rate)))
                point = await run_point(
                    target,
                    spec,
                    rate_rps=rate,
                    concurrency=cap,
                    server_pid=pid,
                    progress=not args.quiet and sys.stderr.isatty(),
                    expected=expected,
                    request_for=None if requests is None else requests.__getitem__,
                    checks=None if api is None else api.check_factory(),
                    on_record=None
                    if records is None
                    else records.sink(point=len(points), rate_rps=rate),
                )
                print(summary_line(point), flush=True)
                points.append(point)
    finally:
        gc.unfreeze()
        await target.close()
    return points


def summary_line(point: dict[str, Any]) -> str:
    def ms(metric: str, percentile: str) -> str:
        value = point[metric][f"{percentile}_ms"]
        return "-" if value is None else f"{value:.2f}"

    rate = point["rate_rps"]
    parts = [
        f"rate {rate:g}/s" if isinstance(rate, float) else f"rate {rate}/s",
        f"cap {point['concurrency'] or '-'}:",
        f"{point['requests_completed']}/{point['requests_scheduled']} ok",
        "(" + (", ".join(f"{n} {k}" for k, n in point["errors"].items()) or "no errors") + ");",
        f"TTFT p50 {ms('ttft', 'p50')} p99 {ms('ttft', 'p99')} ms;",
        f"TPOT p50 {ms('tpot', 'p50')} p99 {ms('tpot', 'p99')} ms;",
        f"E2E p50 {ms('e2e', 'p50')} p99 {ms('e2e', 'p99')} ms;",
        f"{point['request_throughput_rps']:.1f} req/s,",
        f"{point['output_token_throughput_tps']:.0f} tok/s,",
    ]
    if point["goodput_rps"] is not None:
        parts.append(f"goodput {point['goodput_rps']:.1f} req/s,")
    parts.append(f"send lag p99 {ms('send_lag', 'p99')} ms;")
    parse = point.get("client_parse", {})
    if parse.get("count"):  # another API's stream: the client's own share of each gap
        parts.append(f"client parse p50 {parse['p50_ms'] * 1000:.1f} us an event;")
    counted = point.get("token_count", {})
    if counted and set(counted) != {"token_ids"}:
        parts.append("tokens counted by " + "/".join(sorted(counted)) + ";")
    parts.append(integrity_text(point["integrity"]))
    return " ".join(parts)


def integrity_text(integrity: dict[str, Any]) -> str:
    """``integrity: 120 verified, 0 lost, 0 duplicated, ...`` for a point's ``integrity``."""
    counts = [f"{integrity[kind]} {kind}" for kind, _ in metrics.INTEGRITY_KINDS]
    checked = "" if integrity.get("content_checked", True) else " (sequence only)"
    return f"integrity{checked}: {integrity['verified']} verified, " + ", ".join(counts)


def _process_exists(pid: int) -> bool:
    try:
        os.kill(pid, 0)  # signal 0 sends nothing: only kill(2)'s checks
    except ProcessLookupError:
        return False
    except PermissionError:
        pass  # another user's process
    return True


def _check_target(args: argparse.Namespace) -> None:
    """The ways to name a target: --transport with --address or --spawn (inferwire's own
    protocol); --api with --url, or with --spawn and --transport (a public API)."""
    if args.url is not None and args.api is None:
        raise CommandError("--url needs --api: which API the server speaks")
    if args.api is not None and args.address:
        raise CommandError("--api goes with --url (any server) or --spawn, not --address")
    if args.url is None and not args.address and not args.spawn:
        raise CommandError("give --url URL --api API, --address HOST:PORT, or --spawn")
    if args.transport is None and args.url is None:
        raise CommandError("--address and --spawn need --transport")
    if args.url is not None and (args.prefill_ms or args.decode_ms):
        raise CommandError("--prefill-ms/--decode-ms set a --spawn'ed server")


def _load(args: argparse.Namespace) -> int:
    _check_target(args)
    if args.address and (args.prefill_ms or args.decode_ms):
        raise CommandError("--prefill-ms/--decode-ms set a --spawn'ed server")
    if args.spawn and args.server_pid is not None:
        raise CommandError("--server-pid is for --address; a --spawn'ed server's pid is known")
    if args.server_pid is not None and not _process_exists(args.server_pid):
        raise CommandError(f"--server-pid {args.server_pid}: no such process")
    if args.out is not None and args.out.is_dir():
        raise CommandError(f"--out {args.out} is a directory; give a file name")
    if args.address:
        arguments.split_checked(args.address)
    if args.duration is None and args.requests is None:
        args.duration = DEFAULT_DURATION_S
    if args.concurrency is None:
        args.concurrency = [None]
    spec = LoadSpec(
        workload=args.workload,
        max_tokens=args.max_tokens,
        arrival=args.arrival,
        burstiness=args.burstiness,
        duration_s=args.duration,
        requests=args.requests,
        seed=args.seed,
        slo=Slo(ttft_ms=args.slo_ttft_ms, tpot_ms=args.slo_tpot_ms, e2e_ms=args.slo_e2e_ms),
        drain_timeout_s=args.drain_timeout,
    )
    for rate in args.rate:  # a bad combination fails now, not after the first points
        try:
            spec.offsets_ns(rate)
        except ValueError as exc:
            raise CommandError(str(exc)) from None
    # one connection for http2 and grpc, else one per request in flight
    sockets_transport = "grpc" if args.api == "kserve-v2-grpc" else (args.transport or "http1")
    precise = select_is_safe(sockets_transport, args.concurrency)
    started = datetime.now(UTC).isoformat(timespec="seconds")
    api: api_mode.ApiSweep | None = None
    if args.url is not None:  # checked before anything starts
        api = api_mode.ApiSweep(args, api_mode.endpoint_of(args, args.url))
    with (
        _server(args) as (address, pid),
        asyncio.Runner(loop_factory=event_loop_factory(precise)) as runner,
        _records(args) as records,
    ):
        if args.api is not None and args.spawn:
            url = api_mode.spawned_url(args.transport, address, args.api)
            api = api_mode.ApiSweep(args, api_mode.endpoint_of(args, url))
        points = runner.run(_sweep(args, spec, address, pid, api, records))
    if args.out is not None or args.html is not None:
        parameters = {
            "transport": args.transport,
            "codec": args.codec if api is None else None,
            "address": args.address,
            "spawned": args.spawn,
            # a spawned server's pacing is known; another's is not, and is not invented
            "prefill_ms": args.prefill_ms if args.spawn else None,
            "decode_ms": args.decode_ms if args.spawn else None,
            "rates_rps": [finite_or_text(rate) for rate in args.rate],
            "concurrencies": args.concurrency,
            "warmup_requests": args.warmup,
            "event_loop": "select" if precise else "epoll",
            **{k: v for k, v in asdict(spec).items() if k != "slo"},
            "slo": asdict(spec.slo),
        }
        if api is not None:
            parameters["workload"] = None  # the prompts say what was asked
            parameters["endpoint"] = api.parameters()
        report = {
            "kind": "inferwire-load",
            "started": started,
            "parameters": parameters,
            "versions": metrics.versions(),
            "machine": metrics.machine(),
            "points": points,
        }
        if args.out is not None:
            args.out.parent.mkdir(parents=True, exist_ok=True)
            args.out.write_text(json.dumps(report, indent=1, allow_nan=False) + "\n")
            print(f"wrote {args.out}", file=_notes(args))
        _write_html(args, report)
    failed = sum(p["requests_failed"] for p in points)
    return 1 if failed and all(p["requests_completed"] == 0 for p in points) else 0


DESCRIPTION = """\
Open-loop load against one server's token streams. Requests arrive on a schedule drawn before
the run from a seeded arrival process (Poisson at --rate, or gamma with --arrival gamma), whatever
the server does, and every latency is timed from the request's intended send time, so a stall
shows in the percentiles of every request that was due during it (no coordinated omission).

Reports, per point of the --rate x --concurrency sweep: TTFT, TPOT, inter-token latency, E2E
latency (P50/P90/P99/P99.9 from HDR histograms), request and token throughput, goodput under the
SLOs given, errors by type, stream integrity, and CPU per 1,000 tokens. Definitions in full:
python -m pydoc inferwire.bench.loadgen.load_command"""


def add_commands(commands: arguments.Commands) -> None:
    load = commands.add_parser(
        "load",
        help="open-loop load against one server: TTFT, TPOT, ITL, E2E percentiles",
        description=DESCRIPTION,
    )
    load.add_argument(
        "--transport", choices=it.TRANSPORTS, help="the protocol of inferwire's own server"
    )
    load.add_argument("--codec", default="orjson", choices=ic.names(), help="the server's codec")
    where = load.add_mutually_exclusive_group()
    where.add_argument(
        "--address", type=arguments.connect_address, help="HOST:PORT of a running server"
    )
    where.add_argument("--spawn", action="store_true", help="start `inferwire serve` for the run")
    api_mode.add_api_arguments(load, where)
    load.add_argument(
        "--server-pid",
        type=arguments.positive_count,
        help="with --address: the server's pid, to count its CPU time",
    )
    load.add_argument(
        "--prefill-ms",
        type=arguments.non_negative,
        default=0.0,
        help="with --spawn: the server's time to the first token, ms",
    )
    load.add_argument(
        "--decode-ms",
        type=arguments.non_negative,
        default=0.0,
        help="with --spawn: the server's time per further token, ms",
    )
    stream_workloads = workloads.names("stream")
    load.add_argument(
        "--workload",
        default="stream-256",
        choices=stream_workloads,
        metavar="NAME",
        help="what each request streams, one of: " + ", ".join(stream_workloads),
    )
    load.add_argument(
        "--max-tokens",
        type=arguments.positive_count,
        help="cut each stream after this many tokens (default: the whole workload)",
    )
    load.add_argument(
        "--rate",
        type=_rates,
        default="10",
        help="requests/s (inf: all at once); a list sweeps, e.g. 10,20,40",
    )
    load.add_argument(
        "--arrival", choices=("poisson", "gamma"), default="poisson", help="the arrival process"
    )
    load.add_argument(
        "--burstiness",
        type=arguments.positive,
        default=1.0,
        help="gamma's shape: 1 is Poisson, below 1 burstier, above 1 more regular",
    )
    load.add_argument(
        "--concurrency",
        type=_caps,
        help="cap on requests in flight; a list sweeps, e.g. 1,8 (default: no cap)",
    )
    load.add_argument(
        "--duration",
        type=arguments.positive,
        help=f"seconds of arrivals (default: {DEFAULT_DURATION_S:g} unless --requests is given)",
    )
    load.add_argument(
        "--requests",
        type=arguments.positive_count,
        help="number of requests (with --duration, whichever ends first)",
    )
    load.add_argument("--seed", type=int, default=0, help="seed of the arrival schedule")
    load.add_argument(
        "--slo-ttft-ms", type=arguments.positive, help="goodput counts TTFT at most this, ms"
    )
    load.add_argument(
        "--slo-tpot-ms", type=arguments.positive, help="goodput counts TPOT at most this, ms"
    )
    load.add_argument(
        "--slo-e2e-ms", type=arguments.positive, help="goodput counts E2E latency at most this, ms"
    )
    load.add_argument(
        "--warmup", type=arguments.count, default=8, help="untimed requests before the first point"
    )
    load.add_argument(
        "--drain-timeout",
        type=arguments.non_negative,
        default=DEFAULT_DRAIN_TIMEOUT_S,
        help="seconds to wait for requests in flight after the last is sent",
    )
    load.add_argument("--out", type=Path, help="write the JSON report to this file")
    load.add_argument("--quiet", action="store_true", help="no progress bar")
    load.set_defaults(run=_load)
    _add_output_commands(commands, load)


# -- per-request records and the HTML report (issue 13) ---------------------------------------


def _records_path(text: str) -> str:
    try:
        records_format(text)
    except RecordsError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    return text


def _html_path(text: str) -> Path:
    path = Path(text)
    if path.is_dir():
        raise argparse.ArgumentTypeError(f"{text} is a directory; give a file name")
    return path


def _notes(args: argparse.Namespace) -> TextIO:
    """Where a line for the user goes: stderr when the records take stdout."""
    return sys.stderr if getattr(args, "records", None) == STDOUT else sys.stdout


@contextlib.contextmanager
def _records(args: argparse.Namespace) -> Iterator[RecordWriter | None]:
    """The --records writer for the run (the summary lines go to stderr when it takes stdout)."""
    if args.records is None:
        yield None
        return
    try:
        writer = RecordWriter.open(args.records)
    except RecordsError as exc:
        raise CommandError(str(exc)) from exc
    with contextlib.ExitStack() as stack:
        if args.records == STDOUT:
            stack.enter_context(contextlib.redirect_stdout(sys.stderr))
        try:
            yield writer
        finally:
            try:
                writer.close()
            except RecordsError as exc:
                raise CommandError(str(exc)) from exc
    if args.records != STDOUT:
        print(f"wrote {writer.written} records to {args.records}")


def _write_html(args: argparse.Namespace, report: dict[str, Any]) -> None:
    if args.html is None:
        return
    from . import html_report  # matplotlib: only when a page is asked for

    args.html.parent.mkdir(parents=True, exist_ok=True)
    args.html.write_text(html_report.render(report))
    print(f"wrote {args.html}", file=_notes(args))


def _load_report(args: argparse.Namespace) -> int:
    try:
        report = json.loads(args.report.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise CommandError(f"cannot read the report {args.report}: {exc}") from exc
    if not isinstance(report, dict) or report.get("kind") != "inferwire-load":
        raise CommandError(f"{args.report} is not a report of `inferwire load` (its --out)")
    _write_html(args, report)
    return 0


def _add_output_commands(commands: arguments.Commands, load: argparse.ArgumentParser) -> None:
    load.add_argument(
        "--records",
        type=_records_path,
        metavar="FILE",
        help="write one record per request to FILE (.csv, or .jsonl; - for JSONL on stdout) "
        "as the run goes",
    )
    load.add_argument(
        "--html", type=_html_path, metavar="FILE", help="write a one-page HTML report to FILE"
    )
    page = commands.add_parser(
        "load-report",
        help="rebuild the HTML report of `inferwire load` from its JSON",
        description="Writes the one-page HTML report (tables, latency CDFs, ITL over time) "
        "from a JSON report that `inferwire load --out` wrote.",
    )
    page.add_argument("report", type=Path, help="the JSON report")
    page.add_argument(
        "--html", type=_html_path, required=True, metavar="FILE", help="the page to write"
    )
    page.set_defaults(run=_load_report)
