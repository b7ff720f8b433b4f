"""The options of ``inferwire load``, added to the parser :mod:`inferwire.cli.load` builds, and
to the one the split run checks its parts' arguments with (:mod:`.split_run`: the Locust glue
runs without the CLI, below it); what they do is :mod:`.load_command`'s."""

from __future__ import annotations

import argparse
from pathlib import Path

import inferwire.codecs as ic
import inferwire.transports as it
from inferwire import workloads
from inferwire._runtime import arguments

from . import api_mode, capacity, conversations, live_metrics, traces
from .openloop import ARRIVALS, DEFAULT_DRAIN_TIMEOUT_S, DEFAULT_DURATION_S, DEFAULT_MAX_IN_FLIGHT
from .records import RecordsError, records_format


def rates(text: str) -> list[float]:
    try:
        rates = [float(part) for part in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a list of rates: {text!r}") from None
    if not rates or not all(r > 0 for r in rates):
        raise argparse.ArgumentTypeError("rates must be positive (inf: all at once)")
    return rates


def caps(text: str) -> list[int]:
    try:
        caps = [int(part) for part in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a list of integers: {text!r}") from None
    if not caps or not all(c >= 1 for c in caps):
        raise argparse.ArgumentTypeError("concurrency caps must be at least 1")
    return caps


def part(text: str) -> tuple[int, int]:
    index, slash, parts = text.partition("/")
    try:
        part = (int(index), int(parts))
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a part I/N: {text!r}") from None
    if not slash or not 0 <= part[0] < part[1]:
        raise argparse.ArgumentTypeError(f"part {text!r}: give I/N with 0 <= I < N")
    return part


def records_path(text: str) -> str:
    try:
        records_format(text)
    except RecordsError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    return text


def think_time(text: str) -> conversations.ThinkTime:
    try:
        return conversations.ThinkTime.parse(text)
    except conversations.ThinkTimeError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def html_path(text: str) -> Path:
    path = Path(text)
    if path.is_dir():
        raise argparse.ArgumentTypeError(f"{text} is a directory; give a file name")
    return path


def add_load_arguments(load: argparse.ArgumentParser) -> None:
    """Every option of ``inferwire load``, but the outputs'."""
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
        "--accept-encoding",
        metavar="CODINGS",
        help="with --api, or --transport http1/http2: ask for compressed answers, e.g. "
        "'zstd, gzip, br' (sent as the Accept-Encoding header; answers are decoded as they "
        "arrive, bounded; default: none)",
    )
    add_workload_arguments(load)
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
        type=rates,
        default="10",
        help="requests/s (inf: all at once); a list sweeps, e.g. 10,20,40",
    )
    load.add_argument("--arrival", choices=ARRIVALS, default="poisson", help="the arrival process")
    load.add_argument(
        "--burstiness",
        type=arguments.positive,
        default=1.0,
        help="gamma's shape: 1 is Poisson, below 1 burstier, above 1 more regular",
    )
    load.add_argument(
        "--concurrency",
        type=caps,
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
    runs = load.add_argument_group("arrivals, measured windows, in-flight bound, capacity search")
    runs.add_argument(
        "--ramp-from",
        type=arguments.non_negative,
        metavar="RATE",
        help="with --ramp-s: the rate rises linearly from RATE req/s to --rate, then holds",
    )
    runs.add_argument("--ramp-s", type=arguments.positive, metavar="S", help="seconds of the ramp")
    runs.add_argument(
        "--warmup-s",
        type=arguments.non_negative,
        metavar="S",
        default=0.0,
        help="requests intended in each point's first S seconds are sent but not measured",
    )
    runs.add_argument(
        "--cooldown-s",
        type=arguments.non_negative,
        metavar="S",
        default=0.0,
        help="requests intended in each point's last S seconds are sent but not measured",
    )
    runs.add_argument(
        "--max-in-flight",
        type=arguments.count,
        metavar="N",
        default=DEFAULT_MAX_IN_FLIGHT,
        help="without --concurrency: a request due while N are in flight waits, and its wait"
        " counts in its latency (0: no bound)",
    )
    runs.add_argument(
        "--capacity",
        action="store_true",
        help="search the highest rate meeting the SLOs (--slo-*), starting at --rate",
    )
    runs.add_argument(
        "--capacity-goodput",
        type=capacity.fraction,
        metavar="FRACTION",
        default=capacity.DEFAULT_GOODPUT_FRACTION,
        help="the share of requests that must meet every SLO",
    )
    runs.add_argument(
        "--capacity-precision",
        type=arguments.positive,
        metavar="FRACTION",
        default=capacity.DEFAULT_PRECISION,
        help="stop when the bracket is this narrow (relative)",
    )
    runs.add_argument(
        "--capacity-max-points",
        type=arguments.positive_count,
        metavar="N",
        default=capacity.DEFAULT_MAX_POINTS,
        help="at most this many points",
    )
    runs.add_argument(
        "--capacity-max-lag-ms",
        type=arguments.positive,
        metavar="MS",
        default=capacity.DEFAULT_MAX_SEND_LAG_MS,
        help="a point whose send lag P99 is over this failed for the generator, not the server",
    )
    arguments.add_loop_argument(load)  # --spawn starts the server on the same loop
    load.add_argument("--out", type=Path, help="write the JSON report to this file")
    load.add_argument("--quiet", action="store_true", help="no progress bar")
    # a share of one schedule, for a run split across processes (loadgen/locust_user.py)
    load.add_argument(
        "--part",
        type=part,
        metavar="I/N",
        help="send only requests I, I+N, I+2N, ... of the schedule (0 <= I < N)",
    )
    load.add_argument(
        "--start-at",
        type=arguments.positive,
        metavar="UNIX_TIME",
        help="start the schedule at this wall-clock time (one point only; default: now)",
    )


def add_workload_arguments(load: argparse.ArgumentParser) -> None:
    """Conversations and trace replay (with --api)."""
    work = load.add_argument_group(
        "conversations and traces (--api)",
        "multi-turn conversations (--api openai-chat), whose starts the schedule gives, each turn"
        " sending the history with the server's replies; or a timestamped trace replayed at its"
        " own times; see python -m pydoc inferwire.load.conversations / inferwire.load.traces",
    )
    work.add_argument(
        "--turns",
        type=arguments.positive_count,
        metavar="N",
        help="conversations of N turns, each user message a prompt drawn from --prompts; with"
        " --conversations, each conversation's first N turns",
    )
    work.add_argument(
        "--conversations",
        type=Path,
        metavar="PATH",
        help="a JSONL or ShareGPT-style JSON file of conversations ({'conversations': [{'from',"
        " 'value'}, ...]} or {'messages': [{'role', 'content'}, ...]}): a turn per user message,"
        " asking for its reply's length",
    )
    work.add_argument(
        "--think-time-s",
        type=think_time,
        metavar="DIST",
        help="seconds between a turn's end and the next turn: S, uniform:LOW,HIGH,"
        " normal:MEAN,STD or lognormal:MEDIAN,SIGMA, drawn per turn from --seed (default: 0)",
    )
    work.add_argument(
        "--max-context-tokens",
        type=arguments.positive_count,
        metavar="N",
        help="a conversation's history (replies included) may not pass N tokens: checked before"
        " the run where replies are bounded (--max-tokens, each turn's own), else as it goes",
    )
    work.add_argument(
        "--trace-file",
        type=Path,
        metavar="PATH",
        help="replay a trace: a Mooncake JSONL (timestamp, input_length, output_length, hash_ids)"
        " or an Azure LLM inference CSV (TIMESTAMP, ContextTokens, GeneratedTokens); its times"
        " replace --rate and --duration; --requests N replays its first N",
    )
    work.add_argument(
        "--trace-format",
        choices=traces.FORMATS,
        help="the trace's format (default: from its suffix, else its first line)",
    )
    work.add_argument(
        "--trace-speed",
        type=arguments.positive,
        default=1.0,
        metavar="X",
        help="replay X times as fast as the trace (default: 1)",
    )


def add_output_arguments(load: argparse.ArgumentParser) -> None:
    load.add_argument(
        "--records",
        type=records_path,
        metavar="FILE",
        help="write one record per request to FILE (.csv, or .jsonl; - for JSONL on stdout) "
        "as the run goes",
    )
    load.add_argument(
        "--html", type=html_path, metavar="FILE", help="write a one-page HTML report to FILE"
    )


def add_metrics_arguments(load: argparse.ArgumentParser) -> None:
    live = load.add_argument_group(
        "live metrics",
        "serve the run's client-side metrics for Prometheus (GET /metrics) while it goes: "
        "TTFT, ITL and E2E histograms, send lag, errors by kind, requests in flight, tokens, "
        "counted as the report counts them (the --warmup requests and those of the "
        "--warmup-s/--cooldown-s windows are not); names and meanings: "
        "python -m pydoc inferwire.load.live_metrics",
    )
    live.add_argument(
        "--metrics-port",
        type=arguments.port,
        metavar="PORT",
        help="serve the metrics on this port (0: any free one), announced on stderr as "
        "metrics=HOST:PORT before the first request (default: no metrics)",
    )
    live.add_argument(
        "--metrics-host",
        metavar="HOST",
        help="with --metrics-port: the address to serve them on"
        f" (default: {live_metrics.DEFAULT_HOST})",
    )
    live.add_argument(
        "--metrics-hold",
        type=arguments.non_negative,
        metavar="S",
        help="with --metrics-port: keep serving S seconds after the run (its outputs written), "
        "so a scraper sees the final values; SIGINT (Ctrl-C) or SIGTERM ends the wait "
        "(default: 0)",
    )


def add_attribution_arguments(load: argparse.ArgumentParser) -> None:
    where = load.add_argument_group(
        "where the time goes",
        "each request's client stages (connect, write, wait for the head, first event, parse)"
        " and the server's own account of it, from up to three sources, each found"
        " automatically: the per-request metrics object (vLLM's --enable-per-request-metrics),"
        " the server's Prometheus /metrics (vLLM, SGLang, TGI, Triton), and its OpenTelemetry"
        " spans (--otlp-listen); the split: queue, model, outside the engine; see"
        " docs/measure-your-server.md",
    )
    where.add_argument(
        "--server-metrics",
        default="auto",
        metavar="{auto,off,URL}",
        help="the server's Prometheus endpoint, scraped before, during and after each point:"
        " auto (the target's /metrics; Triton's gRPC: port 8002), off, or its URL",
    )
    where.add_argument(
        "--request-metrics",
        choices=("auto", "off"),
        default="auto",
        help="read the per-request metrics object when the server sends one (default: auto)",
    )
    where.add_argument(
        "--otlp-listen",
        metavar="HOST:PORT",
        help="receive the server's spans over OTLP/HTTP here (point the server's exporter at"
        " http://HOST:PORT/v1/traces) and join them to requests by their traceparent",
    )
    where.add_argument(
        "--span-wait-s",
        type=arguments.non_negative,
        default=10.0,
        metavar="S",
        help="with --otlp-listen: how long each point waits for spans still in flight"
        " (default: 10, twice the OpenTelemetry SDK's export interval)",
    )
    where.add_argument(
        "--no-attribution",
        action="store_true",
        help="no stamps, no traceparent, no server sources: the generator as it was",
    )
