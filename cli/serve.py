"""``inferwire serve`` and ``inferwire proxy``: their options; what they run is
:mod:`inferwire.transports.serve`'s."""

from __future__ import annotations

import argparse
import dataclasses
from typing import Final

import inferwire.codecs as ic
import inferwire.transports as it
from inferwire import workloads
from inferwire._runtime.arguments import (
    Commands,
    add_loop_argument,
    add_trace_arguments,
    connect_address,
    existing_file,
    listen_address,
    non_negative,
    port,
    positive,
    positive_count,
)
from inferwire.transports import serve

SERVE_DESCRIPTION: Final = """\
Runs one transport's server for the simulated inference service in this process, until
SIGINT or SIGTERM. The first line on stdout is "listening on HOST:PORT" (with a generated test
certificate, also "ca=PATH" of its CA), then "loop=asyncio" or "loop=uvloop", the event loop
that runs it, then with --metrics-port "metrics=HOST:PORT", so a parent that asked for port 0
learns the ports and can record the loop.

It records Prometheus metrics of what it serves (requests by outcome, time to first token,
inter-token and end-to-end latency, encode time, bytes, tokens, streams in flight), which
http1 and http2 answer at GET /metrics and any transport at --metrics-port; --no-metrics
turns them off.

The service streams seeded token chunks of the workload a request names, paced by
--prefill-ms (time to the first token) and --decode-ms (time per token); with both at 0 a
client measures serialization and transport alone. With --engine ENDPOINT the server is a
frontend: it checks each request itself, and the engine process at ENDPOINT (inferwire engine)
schedules, batches and paces it, its chunks crossing the hop in --engine-codec; a stream the
engine cannot finish (it died, restarted or was overloaded) fails, never ends short; /health
answers 503 while no engine is there.

On the OpenAI API (http1, http2): --enable-per-request-metrics adds vLLM's per-request
"metrics" object (queue_time_ms, time_to_first_token_ms, generation_time_ms, mean_itl_ms,
tokens_per_second) to a non-streamed answer and to the usage chunk of a stream that asks for
stream_options.include_usage; --stamps-file PATH writes one JSON line per answer with the
request's raw time.monotonic_ns() stamps (request_id, model, stream, outcome, tokens,
frontend_received_ns, engine_arrived_ns, engine_scheduled_ns, engine_first_token_ns,
engine_last_token_ns, frontend_last_chunk_written_ns). Every server's metrics include vLLM's
request histograms (vllm:request_queue_time_seconds, ..._prefill_..., ..._decode_...,
..._inference_..., vllm:e2e_request_latency_seconds, vllm:time_to_first_token_seconds)."""

PROXY_DESCRIPTION: Final = """\
A TCP proxy that forwards every chunk it reads --delay-ms after it arrived, in each direction,
with an optional bandwidth cap: a 20 ms delay makes a round trip about 40 ms longer, like two
hosts 20 ms apart. Runs until SIGINT or SIGTERM; the first line on stdout is "listening on
HOST:PORT loop=KIND"."""

SERVE_DEFAULTS: Final = serve.ServeOptions(transport="")
PROXY_DEFAULTS: Final = serve.ProxyOptions(upstream="")


def _serve(args: argparse.Namespace) -> int:
    fields = dataclasses.fields(serve.ServeOptions)
    return serve.serve(serve.ServeOptions(**{f.name: getattr(args, f.name) for f in fields}))


def _proxy(args: argparse.Namespace) -> int:
    fields = dataclasses.fields(serve.ProxyOptions)
    return serve.proxy(serve.ProxyOptions(**{f.name: getattr(args, f.name) for f in fields}))


def add_commands(commands: Commands) -> None:
    """``serve`` and ``proxy``."""
    defaults = SERVE_DEFAULTS
    srv = commands.add_parser(
        "serve",
        help="run one transport's server for the simulated service",
        description=SERVE_DESCRIPTION,
        epilog="workloads a request can name: " + ", ".join(workloads.names("stream")),
    )
    srv.add_argument(
        "--transport",
        required=True,
        choices=(*it.TRANSPORTS, *it.EXTRA_TRANSPORTS),
        help="the protocol to serve",
    )
    srv.add_argument(
        "--codec", default=defaults.codec, choices=ic.names(), help="how token chunks become bytes"
    )
    srv.add_argument(
        "--host", default=defaults.host, help="address to listen on; 0.0.0.0 or :: for all"
    )
    srv.add_argument(
        "--port", type=port, default=defaults.port, help="port to listen on; 0: any free port"
    )
    srv.add_argument(
        "--tls", action="store_true", help="serve TLS: a generated test CA unless given files"
    )
    srv.add_argument("--certfile", type=existing_file, help="PEM certificate chain, for --tls")
    srv.add_argument("--keyfile", type=existing_file, help="PEM private key, for --tls")
    srv.add_argument(
        "--ca-out",
        help="where to write the generated test CA's certificate (default: a temporary file)",
    )
    srv.add_argument(
        "--prefill-ms",
        type=non_negative,
        default=defaults.prefill_ms,
        help="time to the first token, ms",
    )
    srv.add_argument(
        "--decode-ms",
        type=non_negative,
        default=defaults.decode_ms,
        help="time per further token, ms",
    )
    srv.add_argument(
        "--max-message-bytes",
        type=positive_count,
        default=defaults.max_message_bytes,
        help="largest message accepted",
    )
    srv.add_argument(
        "--metrics-port",
        type=port,
        help="also answer Prometheus scrapes (GET /metrics) on this port of --host, from a side "
        "HTTP server (0: any free port; announced as metrics=HOST:PORT); http1 and http2 "
        "answer GET /metrics on their own port as well",
    )
    srv.add_argument(
        "--no-metrics",
        action="store_true",
        help="record no metrics (the benchmarks' servers: a floor measures the transport alone)",
    )
    srv.add_argument(
        "--engine",
        metavar="ENDPOINT",
        help="serve the streams of the engine process at ENDPOINT (ipc://PATH or "
        "tcp://HOST:PORT, see inferwire engine) over the hop, as a frontend; without it the "
        "service plays them itself",
    )
    srv.add_argument(
        "--engine-codec",
        default=defaults.engine_codec,
        help="the hop's codec, the engine's --codec: a codec of --codec's list that carries "
        "token chunks, or pickle (with --allow-pickle)",
    )
    srv.add_argument(
        "--allow-pickle",
        action="store_true",
        help="allow --engine-codec pickle: it runs code from the bytes it reads, so only "
        "with an engine you trust",
    )
    srv.add_argument(
        "--engine-liveness-timeout",
        type=positive,
        default=defaults.engine_liveness_timeout,
        help="seconds without a word from the engine before its open streams fail",
    )
    srv.add_argument(
        "--enable-per-request-metrics",
        action="store_true",
        help="add vLLM's per-request metrics object to OpenAI answers (http1, http2): on a "
        "non-streamed answer, and on the usage chunk of a stream that asks "
        "stream_options.include_usage",
    )
    srv.add_argument(
        "--stamps-file",
        metavar="PATH",
        help="write one JSON line per OpenAI answer (http1, http2) with the request's raw "
        "time.monotonic_ns() stamps, from the frontend's receipt through the engine's to the "
        "last chunk written (the file is created or emptied)",
    )
    srv.add_argument(
        "--compress",
        choices=serve.COMPRESS_CHOICES,
        default=defaults.compress,
        help="compress answers: auto negotiates Accept-Encoding on http1/http2 (zstd, gzip, br; "
        "streams flushed per event) and gzips grpc's; a coding offers only it; off, as vLLM "
        "serves",
    )
    srv.add_argument(
        "--allow-client-shm",
        action="store_true",
        help="let KServe v2 clients (http1, http2, grpc) register system shared memory regions, "
        "as Triton's --allow-client-shm: off by default, because a client that registers a "
        "region makes the server open, read and write any /dev/shm object the server's user can",
    )
    add_loop_argument(srv)
    add_trace_arguments(srv, "each stream's stages")
    srv.set_defaults(run=_serve)

    prx = commands.add_parser(
        "proxy",
        help="a TCP proxy adding one-way delay per direction",
        description=PROXY_DESCRIPTION,
    )
    prx.add_argument(
        "--listen",
        type=listen_address,
        default=PROXY_DEFAULTS.listen,
        help="HOST:PORT; port 0: any free",
    )
    prx.add_argument(
        "--upstream", type=connect_address, required=True, help="HOST:PORT of the server"
    )
    prx.add_argument(
        "--delay-ms",
        type=non_negative,
        default=PROXY_DEFAULTS.delay_ms,
        help="one-way delay per direction, ms",
    )
    prx.add_argument(
        "--bandwidth-mbps",
        type=positive,
        help="bandwidth cap per direction, Mbit/s (default: none)",
    )
    add_loop_argument(prx)
    prx.set_defaults(run=_proxy)
