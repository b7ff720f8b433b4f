"""``inferwire engine``: its options; what it runs is :mod:`inferwire.engine.process`'s.
Imported only with the ``engine`` extra (pyzmq) installed."""

from __future__ import annotations

from typing import Final

from inferwire._runtime.arguments import Commands, non_negative, positive, positive_count
from inferwire.engine import process
from inferwire.engine.hop_codecs import DEFAULT_HOP_CODEC, hop_names
from inferwire.engine.loop import HEARTBEAT_INTERVAL_S, LIVENESS_TIMEOUT_S, SOCKET_HWM
from inferwire.engine.scheduler import POLICIES

DESCRIPTION: Final = """\
Runs the simulated inference engine (batching policy, step-time model, KV cache) in this
process, behind a ZeroMQ ROUTER socket, until SIGINT or SIGTERM; frontends (inferwire serve
--engine ENDPOINT) connect to it. The first line on stdout is "listening on ENDPOINT codec=NAME
policy=POLICY session=ID": with tcp://HOST:0, ENDPOINT is the port bound.

Each request's chunks are a seeded workload's, one per decode step, encoded with the hop codec
(--codec; every frontend must speak the same). pickle runs code from the bytes it reads and is
refused unless --allow-pickle is given here and on the frontends: only for trusted peers."""


def add_commands(commands: Commands) -> None:
    """``engine``."""
    parser = commands.add_parser(
        "engine", help="run the simulated engine behind ZeroMQ", description=DESCRIPTION
    )
    parser.add_argument(
        "--endpoint",
        default=process.DEFAULT_ENDPOINT,
        help="where to listen: ipc://PATH or tcp://HOST:PORT (port 0: any free port)",
    )
    parser.add_argument(
        "--codec",
        default=DEFAULT_HOP_CODEC,
        choices=hop_names(),
        help="how token chunks cross the hop (vLLM: msgspec-msgpack; SGLang: pickle)",
    )
    parser.add_argument(
        "--allow-pickle",
        action="store_true",
        help="allow --codec pickle: unsafe unless every peer is trusted",
    )
    parser.add_argument("--policy", default="continuous", choices=POLICIES, help="batching policy")
    parser.add_argument("--max-batch", type=positive_count, help="most requests in one batch")
    parser.add_argument("--kv-blocks", type=positive_count, help="KV-cache capacity, in blocks")
    parser.add_argument("--block-tokens", type=positive_count, help="tokens per KV block")
    parser.add_argument(
        "--max-waiting",
        type=positive_count,
        help="requests that may wait; one more is refused as overloaded",
    )
    parser.add_argument(
        "--static-timeout-ms",
        type=non_negative,
        help="static policy: how long a batch waits to fill",
    )
    parser.add_argument(
        "--admit-batch",
        type=positive_count,
        help="continuous policy: most requests one prefill iteration admits",
    )
    parser.add_argument(
        "--max-prefill-tokens",
        type=positive_count,
        help="continuous and adaptive: most prompt tokens one prefill iteration computes",
    )
    parser.add_argument(
        "--adaptive-bmax", type=positive_count, help="adaptive policy: the largest batch (Bmax)"
    )
    parser.add_argument(
        "--adaptive-target-step-ms",
        type=positive,
        help="adaptive policy: the decode step time that counts as load 1",
    )
    parser.add_argument(
        "--step",
        action="append",
        metavar="NAME=SECONDS",
        help="set one parameter of the step-time model (e.g. decode_base_s=0.005); repeatable",
    )
    parser.add_argument(
        "--step-scale",
        type=non_negative,
        default=1.0,
        help="multiply every step time by this (below 1: a faster engine, for tests)",
    )
    parser.add_argument(
        "--heartbeat-interval",
        type=positive,
        default=HEARTBEAT_INTERVAL_S,
        help="seconds between heartbeats to an idle frontend",
    )
    parser.add_argument(
        "--hwm",
        type=positive_count,
        default=SOCKET_HWM,
        help="messages ZeroMQ queues per frontend each way before it pushes back",
    )
    parser.add_argument(
        "--liveness-timeout",
        type=positive,
        default=LIVENESS_TIMEOUT_S,
        help="seconds without a word from a frontend before its requests are aborted",
    )
    parser.set_defaults(run=process.run)
