"""``inferwire load``: an open-loop load generator for one server's token streams.

Requests arrive on a schedule drawn before the run from a seeded arrival process, whatever the
server does (``--arrival``): ``poisson``, a Poisson process at ``--rate`` requests/s; ``gamma``,
gamma-distributed gaps of the same mean whose shape is ``--burstiness`` (1 is Poisson; below 1
burstier, above 1 more regular; as in vLLM's serving benchmark); ``constant``, exactly
1/``--rate`` apart. ``--ramp-from R --ramp-s S`` ramps any of them: the rate rises linearly from
R to ``--rate`` over the first S seconds, then holds (the process drawn at ``--rate`` on a
clock rescaled by the integrated rate, so its gaps at each moment are those of the current
rate). ``--concurrency N`` caps the requests in flight: a request due while N are running waits
for a slot, and that wait counts in its latency. Without a cap, ``--max-in-flight`` (512 by
default) bounds them the same way, so a generator or server that falls behind queues requests
(reported: how many waited) instead of opening a connection per late request.
``--warmup-s``/``--cooldown-s``: the requests intended in a point's first/last seconds are sent
as usual but kept out of every statistic below; rates are then over the measured window.
``--capacity`` searches the highest rate whose points meet the SLOs
(:mod:`inferwire.load.capacity`). Every latency is
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
    duration        first request's intended send time to the last request's end (with
                    --warmup-s/--cooldown-s: the measured window's start to the last measured
                    request's end)
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
                    the request (uncapped) or queued it for a slot (capped, or uncapped with
                    --max-in-flight reached)
    queue wait      intended send time to the moment the request had a slot and was sent
    CPU             user + system seconds of this process (client) and of the server process
                    (with --spawn, or --server-pid), over the point, per 1,000 output tokens

Latencies are kept in HDR histograms (microseconds, 3 significant digits) and reported as
P50/P90/P99/P99.9, mean and max in milliseconds. Output is a summary line per point on stdout
and, with ``--out``, a JSON file with every metric, the run's parameters, library versions and
the machine. With ``--metrics-port``, the same values are served live for Prometheus as the
run goes (:mod:`inferwire.load.live_metrics`: TTFT, ITL, E2E, send lag, errors by
name, requests in flight, tokens), from before the first request until the run ends, or
``--metrics-hold`` seconds after.

SIGINT or SIGTERM (whatever their disposition when it started: a shell's ``cmd &`` ignores
SIGINT) ends the command cleanly. During ``--metrics-hold`` it ends the wait: the outputs are
written already, and the exit status is the run's. During the run it stops the point under
way (its requests cancelled, its figures dropped): the records so far and the report of the
points that ended are written, with ``"stopped_by": "SIGINT"`` (or ``"SIGTERM"``), and the
exit status is 128 + the signal's number, as a shell reports a command a signal ended.

What the requests are, with ``--api``: prompts (:mod:`inferwire.load.prompts`), each before
one of a few shared prefixes with ``--prefix-tokens`` (the point's ``prefix_cache``: the share
of its input a prefix cache should serve, beside the server's own, :mod:`.prefix_cache`);
conversations (``--turns``, ``--conversations``), whose starts the schedule gives, each later
turn sent after the one before with the history (the point's ``conversations``, by turn,
:mod:`.conversations`); or a trace (``--trace-file``) replayed at its own times in place of the
schedule (:mod:`.traces`).

One event loop drives everything: uvloop when it is installed, else asyncio's (``--loop``; the
JSON records the loop that ran, and ``--spawn`` starts the server on the same kind). Neither
loop's timers can send a request on time to the microsecond (both keep milliseconds), so the
scheduler wakes on a Linux timerfd armed at each intended send time
(:mod:`inferwire.load.alarm`; ``timer`` in the JSON).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import gc
import json
import os
import resource
import sys
from collections.abc import Coroutine, Iterator
from dataclasses import asdict
from datetime import UTC, datetime
from typing import Any, Final, TypeVar

import inferwire.transports as it
from inferwire._runtime import arguments, loops, signals
from inferwire._runtime.arguments import CommandError
from inferwire.transports import server_process
from inferwire.transports.compression import check_accept_encoding
from inferwire.transports.tracing import CLIENT_SERVICE, Tracer, default_endpoint

from . import (
    api_mode,
    capacity,
    conversations,
    live_metrics,
    load_outputs,
    metrics,
    prefix_cache,
    traces,
)
from .attribution.session import attribution_from_args
from .endpoints import URL_ONLY_APIS
from .metrics import Slo
from .openloop import (
    DEFAULT_DURATION_S,
    LoadSpec,
    Target,
    finite_or_text,
    open_target,
    run_point,
    warm_up,
)
from .records import RecordWriter
from .traced import TracedTarget

T = TypeVar("T")


@contextlib.contextmanager
def _server(args: argparse.Namespace) -> Iterator[tuple[str, int | None, str]]:
    """The address and, when known, the pid of the server to load, and where a spawned one
    answers Prometheus scrapes ("" if nowhere)."""
    if not args.spawn:
        yield args.address, args.server_pid, ""
        return
    pacing = ["--prefill-ms", str(args.prefill_ms), "--decode-ms", str(args.decode_ms)]
    if not args.no_attribution:  # its own account of each request, as vLLM's would give it
        pacing += ["--metrics-port", "0"]
        if args.api in ("openai-chat", "openai-completions"):
            pacing.append("--enable-per-request-metrics")
    if args.trace:  # the spawned server's spans go where the generator's go
        pacing += ["--trace", "--trace-endpoint", args.trace_endpoint or default_endpoint()]
    with server_process.serve(args.transport, args.codec, *pacing, "--loop", args.loop) as server:
        assert server.process is not None
        yield server.address, server.process.pid, server.metrics_address


async def _sweep(
    args: argparse.Namespace,
    spec: LoadSpec,
    address: str,
    pid: int | None,
    api: api_mode.ApiSweep | None = None,
    records: RecordWriter | None = None,
    live: live_metrics.LiveMetrics | None = None,
    stopped: asyncio.Event | None = None,
    metrics_address: str = "",
) -> tuple[list[dict[str, Any]], dict[str, Any] | None, bool]:
    """The points of the sweep (or of the capacity search), the search's section, and whether
    ``stopped`` was set before the sweep's end: then the warm-up or the point under way is
    cancelled, and the points that ended are kept."""
    tracer: Tracer | None = None
    if api is None:
        client = open_target(
            args.transport,
            address,
            args.codec,
            accept_encoding=getattr(args, "accept_encoding", None),
        )
        target: Target = client
        if args.trace:
            tracer = Tracer.open(
                CLIENT_SERVICE, args.trace_endpoint, transport=args.transport, codec=args.codec
            )
            target = TracedTarget(client, tracer)
        expected = spec.expected_chunks()
        first: Any = spec.request()
    else:
        # drawn up front, before any connection: a history past the context limit fails now
        api.plans.prepare(max(len(spec.offsets_ns(rate)) for rate in args.rate))
        target = await api.open()
        expected = None
        first = api.plans.warmup_request()
    points: list[dict[str, Any]] = []
    found = None
    cut = False
    attribution = attribution_from_args(
        args,
        None if api is None else api.endpoint.url,
        metrics_address=metrics_address or (address if args.transport == "http1" else ""),
    )
    if attribution is not None:
        await attribution.open()
    try:

        async def warmed() -> bool:
            await warm_up(target, first, args.warmup)
            return True

        try:
            warm = await _unless_stopped(stopped, warmed())
        except it.TransportError as exc:
            raise CommandError(f"the warm-up failed, nothing was measured: {exc}") from exc
        if warm is None:
            return points, None, True
        if api is not None:
            api.plans.warmed(args.warmup)
        # what exists now is never garbage: keep the collector's passes short during the run
        gc.collect()
        gc.freeze()

        async def measure(rate: float, cap: int | None) -> dict[str, Any]:
            plan = None if api is None else api.plans.plan(len(spec.offsets_ns(rate)))
            sink = None if records is None else records.sink(point=len(points), rate_rps=rate)
            if sink is not None and plan is not None and plan.conversations is not None:
                sink = plan.conversations.tagged(sink)  # each record's conversation and turn
            point = await run_point(
                target,
                spec,
                rate_rps=rate,
                concurrency=cap,
                server_pid=pid,
                progress=not args.quiet and sys.stderr.isatty(),
                expected=expected,
                request_for=None if plan is None else plan.request_for,
                checks=None if api is None else api.check_factory(),
                on_record=sink,
                live=live,
                attribution=None if attribution is None else attribution.point(),
                schedule_ns=None if plan is None else plan.schedule_ns,
                conversations=None if plan is None else plan.conversations,
            )
            cache = None if plan is None else prefix_cache.report(plan.expected, point)
            if cache is not None:
                point["prefix_cache"] = cache
            print(summary_line(point), file=load_outputs.notes(args), flush=True)
            points.append(point)
            return point

        async def sweep() -> tuple[dict[str, Any] | None]:
            if not args.capacity:
                for rate in args.rate:
                    for cap in args.concurrency:
                        await measure(rate, cap)
                return (None,)
            cap = args.concurrency[0]
            found = await capacity.search(
                lambda rate: measure(rate, cap),
                capacity.spec_from_args(args),
                on_verdict=lambda verdict: print(
                    capacity.verdict_line(verdict), file=load_outputs.notes(args), flush=True
                ),
            )
            print(capacity.result_line(found), file=load_outputs.notes(args), flush=True)
            return (found,)

        swept = await _unless_stopped(stopped, sweep())
        cut = swept is None
        found = None if swept is None else swept[0]
    finally:
        gc.unfreeze()
        await target.close()
        if attribution is not None:
            await attribution.close()
        if tracer is not None:
            await asyncio.to_thread(tracer.close)  # exports what is queued
    return points, found, cut


async def _unless_stopped(stopped: asyncio.Event | None, work: Coroutine[Any, Any, T]) -> T | None:
    """``work``'s result, or None if ``stopped`` is set first (``work`` is then cancelled, and
    awaited: its own ``finally`` runs)."""
    if stopped is None:
        return await work
    task = asyncio.ensure_future(work)
    signalled = asyncio.ensure_future(stopped.wait())
    try:
        await asyncio.wait((task, signalled), return_when=asyncio.FIRST_COMPLETED)
    finally:
        signalled.cancel()
    if task.done():
        return task.result()
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task
    return None


FD_HEADROOM: Final = 64
"""Descriptors the process needs besides the generator's sockets (files, pipes, the loop)."""


def _check_descriptors(transport: str, caps: list[int | None], bound: int | None) -> None:
    """A socket per request in flight (tcp, http1) must fit the process's descriptor limit:
    past it, every new connection fails with EMFILE, counted as the server's errors."""
    if transport in ("http2", "grpc"):
        return
    needed = [bound if cap is None else cap for cap in caps]
    if None in needed:
        return  # no bound asked for: the user's choice
    most = max(n for n in needed if n is not None)
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != resource.RLIM_INFINITY and most + FD_HEADROOM > soft:
        raise CommandError(
            f"{most} requests in flight need about {most + FD_HEADROOM} file descriptors and"
            f" this process may open {soft} (ulimit -n): raise the limit, or lower"
            " --max-in-flight / --concurrency"
        )


def summary_line(point: dict[str, Any]) -> str:
    def ms(metric: str, percentile: str) -> str:
        value = point[metric][f"{percentile}_ms"]
        return "-" if value is None else f"{value:.2f}"

    rate = point["rate_rps"]
    measured = point.get("requests_measured", point["requests_scheduled"])
    parts = [
        f"rate {rate:g}/s" if isinstance(rate, float) else f"rate {rate}/s",
        f"cap {point['concurrency'] or '-'}:",
        f"{point['requests_completed']}/{measured} ok",
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
    parts += load_outputs.stream_parts(point)
    parse = point.get("client_parse", {})
    if parse.get("count"):  # another API's stream: the client's own share of each gap
        parts.append(f"client parse p50 {parse['p50_ms'] * 1000:.1f} us an event;")
    counted = point.get("token_count", {})
    if counted and set(counted) != {"token_ids"}:
        parts.append("tokens counted by " + "/".join(sorted(counted)) + ";")
    if point.get("requests_excluded"):
        parts.append(f"{point['requests_excluded']} in warm-up/cool-down not measured;")
    if point.get("requests_waited_for_bound"):
        bound = point["in_flight_bound"]
        parts.append(f"{point['requests_waited_for_bound']} waited for the bound of {bound};")
    parts.append(integrity_text(point["integrity"]))
    if point.get("conversations"):
        parts.append("\n  " + conversations.summary_text(point["conversations"]))
    if point.get("prefix_cache"):
        parts.append("\n  " + prefix_cache.text(point["prefix_cache"]))
    attribution = point.get("attribution")
    if isinstance(attribution, dict):  # a merged split run's parts keep their own
        parts.append("\n  " + attribution["text"])
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
    if args.spawn and args.api in URL_ONLY_APIS:  # said before a server is started for it
        raise CommandError(f"--api {args.api}: inferwire's own server does not serve it; use --url")
    if args.url is not None and (args.prefill_ms or args.decode_ms):
        raise CommandError("--prefill-ms/--decode-ms set a --spawn'ed server")
    coded = getattr(args, "accept_encoding", None)
    if coded is not None and args.api is None:
        if args.transport not in ("http1", "http2"):
            raise CommandError(
                f"--accept-encoding is for --api, http1 or http2, not {args.transport}"
            )
        try:
            check_accept_encoding(coded)
        except ValueError as exc:
            raise CommandError(str(exc)) from None


async def _stoppable_sweep(
    stop: signals.StopSignal,
    args: argparse.Namespace,
    spec: LoadSpec,
    address: str,
    pid: int | None,
    api: api_mode.ApiSweep | None,
    records: RecordWriter | None,
    live: live_metrics.LiveMetrics | None,
    metrics_address: str = "",
) -> tuple[list[dict[str, Any]], dict[str, Any] | None, bool]:
    """:func:`_sweep`, that SIGINT and SIGTERM stop (``stop`` notes them)."""
    with signals.stop_event(stop) as stopped:
        if stop.received:  # while the server was starting
            stopped.set()
        return await _sweep(args, spec, address, pid, api, records, live, stopped, metrics_address)


def run_load(args: argparse.Namespace) -> int:
    """``inferwire load`` with its parsed options (:mod:`inferwire.cli.load`): the exit status
    (0; 1 if every request failed; 128 + a signal's number if one stopped the run)."""
    _check_target(args)
    if args.address and (args.prefill_ms or args.decode_ms):
        raise CommandError("--prefill-ms/--decode-ms set a --spawn'ed server")
    arguments.check_trace_arguments(args)
    if args.trace and (args.api is not None or args.url is not None):
        raise CommandError("--trace traces inferwire's own transports, not --api or --url")
    if args.spawn and args.server_pid is not None:
        raise CommandError("--server-pid is for --address; a --spawn'ed server's pid is known")
    if args.server_pid is not None and not _process_exists(args.server_pid):
        raise CommandError(f"--server-pid {args.server_pid}: no such process")
    if args.out is not None and args.out.is_dir():
        raise CommandError(f"--out {args.out} is a directory; give a file name")
    if args.address:
        arguments.split_checked(args.address)
    trace = _workload(args)
    if args.duration is None and args.requests is None:
        args.duration = DEFAULT_DURATION_S
    if args.concurrency is None:
        args.concurrency = [None]
    if args.capacity:
        if not (args.slo_ttft_ms or args.slo_tpot_ms or args.slo_e2e_ms):
            raise CommandError(
                "--capacity needs an SLO: --slo-ttft-ms, --slo-tpot-ms, --slo-e2e-ms"
            )
        if len(args.rate) != 1 or len(args.concurrency) != 1:
            raise CommandError("--capacity searches from one --rate, with one --concurrency")
        capacity.spec_from_args(args)
    if (args.ramp_from is None) != (args.ramp_s is None):
        raise CommandError("a ramp takes both --ramp-from RATE and --ramp-s SECONDS")
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
        ramp_from_rps=args.ramp_from,
        ramp_s=args.ramp_s or 0.0,
        warmup_s=args.warmup_s,
        cooldown_s=args.cooldown_s,
        max_in_flight=args.max_in_flight or None,
        part=args.part,
        start_at_unix_s=args.start_at,
    )
    if args.start_at is not None and len(args.rate) * len(args.concurrency) > 1:
        raise CommandError("--start-at starts one point: give one --rate and --concurrency")
    for rate in args.rate:  # a bad combination fails now, not after the first points
        try:
            spec.window(
                spec.offsets_ns(rate) if trace is None else trace.offsets_ns(args.trace_speed)
            )
        except ValueError as exc:
            raise CommandError(str(exc)) from None
    # one connection for http2 and grpc, else one per request in flight
    sockets_transport = "grpc" if args.api == "kserve-v2-grpc" else (args.transport or "http1")
    _check_descriptors(sockets_transport, args.concurrency, spec.max_in_flight)
    loops.resolve(args.loop)  # a missing uvloop is named before anything starts
    live_metrics.check_metrics_arguments(args)
    started = datetime.now(UTC).isoformat(timespec="seconds")
    api: api_mode.ApiSweep | None = None
    if args.url is not None:  # checked before anything starts
        api = api_mode.ApiSweep(args, api_mode.endpoint_of(args, args.url), trace=trace)
    # from here on a signal is noted, not raised: what is under way ends cleanly and the
    # outputs are written; the run (on its loop) and the hold look for it
    stop = signals.StopSignal()
    # served from before the first request (the warm-up's too) to after the outputs are written
    with signals.handled(stop), live_metrics.serving(args, stop=stop) as live:
        with _server(args) as (address, pid, metrics), load_outputs.records(args) as records:
            if args.api is not None and args.spawn:
                url = api_mode.spawned_url(args.transport, address, args.api)
                api = api_mode.ApiSweep(args, api_mode.endpoint_of(args, url), trace=trace)
            run = _stoppable_sweep(stop, args, spec, address, pid, api, records, live, metrics)
            points, found, cut = loops.run(run, args.loop)
        stopped_by = stop.name if cut else ""
        if stopped_by:
            print(
                f"inferwire load: stopped by {stopped_by} after {len(points)} point(s); "
                "writing what was measured",
                file=sys.stderr,
                flush=True,
            )
        _write_report(args, spec, api, started, points, found, stopped_by)
    if stopped_by and stop.signum is not None:
        return 128 + stop.signum
    failed = sum(p["requests_failed"] for p in points)
    return 1 if failed and all(p["requests_completed"] == 0 for p in points) else 0


def _workload(args: argparse.Namespace) -> traces.Trace | None:
    """Check the options of conversations, shared prefixes and traces (each needs --api, and
    they do not go together); the trace, read: its times replace the schedule (one point of
    ``--requests``, its first N, at its mean rate)."""
    conversational = args.turns is not None or args.conversations is not None
    if not conversational and (args.think_time_s is not None or args.max_context_tokens):
        raise CommandError(
            "--think-time-s and --max-context-tokens go with --turns or --conversations"
        )
    if args.trace_file is None and (args.trace_format is not None or args.trace_speed != 1.0):
        raise CommandError("--trace-format and --trace-speed go with --trace-file")
    used = [
        name
        for name, on in (
            ("--turns/--conversations", conversational),
            ("--trace-file", args.trace_file is not None),
            ("--prefix-tokens", getattr(args, "prefix_tokens", None) is not None),
        )
        if on
    ]
    if used and args.api is None:
        raise CommandError(f"{used[0]} needs --api: the requests carry prompts")
    if len(used) > 1:
        raise CommandError(f"{' and '.join(used)} do not go together")
    if conversational and args.api != "openai-chat":
        raise CommandError(
            f"--turns and --conversations send a chat history: --api openai-chat, not {args.api}"
        )
    if conversational and args.part is not None:
        raise CommandError("--part splits a schedule of requests, not of conversations")
    if args.trace_file is None:
        return None
    refused = [
        ("--duration", args.duration is not None),
        ("a list of --rate", len(args.rate) > 1),
        ("--capacity", args.capacity),
        ("--ramp-from", args.ramp_from is not None),
        ("--arrival", args.arrival != "poisson" or args.burstiness != 1.0),
    ]
    for name, given in refused:
        if given:
            raise CommandError(
                f"--trace-file sets each request's time: no {name} (--trace-speed sets the pace,"
                " --requests N replays the first N)"
            )
    try:
        trace = traces.read_trace(args.trace_file, args.trace_format, limit=args.requests)
    except traces.TraceFileError as exc:
        raise CommandError(f"--trace-file: {exc}") from None
    args.requests = len(trace.requests)
    args.rate = [trace.rate_rps(args.trace_speed)]  # --rate is ignored: this labels the point
    return trace


def _write_report(
    args: argparse.Namespace,
    spec: LoadSpec,
    api: api_mode.ApiSweep | None,
    started: str,
    points: list[dict[str, Any]],
    found: dict[str, Any] | None,
    stopped_by: str = "",
) -> None:
    """The JSON report (--out) and its page (--html); ``stopped_by``: the signal that stopped
    the run before its end, if one did."""
    if args.out is None and args.html is None:
        return
    parameters = {
        "transport": args.transport,
        "codec": args.codec if api is None else None,
        # with --api, the endpoint's parameters say it
        "accept_encoding": getattr(args, "accept_encoding", None) if api is None else None,
        "address": args.address,
        "spawned": args.spawn,
        # a spawned server's pacing is known; another's is not, and is not invented
        "prefill_ms": args.prefill_ms if args.spawn else None,
        "decode_ms": args.decode_ms if args.spawn else None,
        "rates_rps": [finite_or_text(rate) for rate in args.rate],
        "concurrencies": args.concurrency,
        "warmup_requests": args.warmup,
        # what ran, not the option: the points say it too
        "loop": points[0]["loop"] if points else loops.resolve(args.loop),
        "timer": points[0]["timer"] if points else None,
        "capacity_search": args.capacity,
        "live_metrics": args.metrics_port is not None,  # their small cost is in the client CPU
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
    if found is not None:
        report["capacity"] = found
    if stopped_by:
        report["stopped_by"] = stopped_by
    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(report, indent=1, allow_nan=False) + "\n")
        print(f"wrote {args.out}", file=load_outputs.notes(args))
    load_outputs.write_html(args, report)
