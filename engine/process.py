"""``inferwire engine``: the simulated engine in its own process, behind a ZeroMQ ROUTER.

    python -m inferwire.engine.process --endpoint ipc:///tmp/engine.sock --codec msgspec-msgpack
    inferwire engine --endpoint tcp://127.0.0.1:0 --policy static --step-scale 0.1

The first line on stdout says where it listens, as ``inferwire serve`` does:
``listening on ENDPOINT codec=NAME policy=POLICY session=ID`` (with ``tcp://HOST:0`` the
endpoint is the one bound, so a parent that asked for any port learns it).
:class:`~inferwire.engine.launch.EngineProcess` starts it and reads that line.

The loop it runs, its backpressure and the stage times it reports are
:mod:`inferwire.engine.loop`'s.
"""

from __future__ import annotations

import argparse
import dataclasses
import signal
import sys
from collections.abc import Callable, Sequence
from types import FrameType
from typing import Any, Final

import zmq

import inferwire.codecs as ic

from . import hop
from .clock import RealClock
from .core import EngineCore
from .hop_codecs import DEFAULT_HOP_CODEC, hop_codec, hop_names
from .loop import HEARTBEAT_INTERVAL_S, LIVENESS_TIMEOUT_S, SOCKET_HWM, EngineLoop, configure
from .scheduler import POLICIES, EngineConfig
from .steps import StepModel

DEFAULT_ENDPOINT: Final = "tcp://127.0.0.1:0"
_USAGE_ERROR: Final = 2


def bind_endpoint(socket: zmq.Socket[bytes], endpoint: str) -> str:
    """Binds ``socket`` to ``endpoint`` (``tcp://HOST:0``: any free port) and returns the
    endpoint bound. Raises ValueError for an endpoint that is not ``ipc://`` or ``tcp://``."""
    if endpoint.startswith("tcp://"):
        host, _, port_text = endpoint[len("tcp://") :].rpartition(":")
        if not host or not port_text.isdigit():
            raise ValueError(f"{endpoint!r} is not tcp://HOST:PORT")
        if int(port_text) == 0:
            endpoint = f"tcp://{host}:*"
    elif not endpoint.startswith("ipc://") or len(endpoint) == len("ipc://"):
        raise ValueError(f"{endpoint!r} is neither ipc://PATH nor tcp://HOST:PORT")
    socket.bind(endpoint)
    bound: str = socket.getsockopt_string(zmq.LAST_ENDPOINT)
    return bound


def _config(args: argparse.Namespace) -> EngineConfig:
    step = StepModel()
    for assignment in args.step or ():
        name, _, value = assignment.partition("=")
        try:
            step = dataclasses.replace(step, **{name: float(value)})
        except (TypeError, ValueError) as exc:
            raise ValueError(f"--step {assignment}: {exc}") from None
    if args.step_scale != 1.0:
        step = step.scaled(args.step_scale)
    options: dict[str, Any] = {"policy": args.policy, "step": step}
    for name in (
        "max_batch",
        "kv_blocks",
        "block_tokens",
        "max_waiting",
        "admit_batch",
        "max_prefill_tokens",
        "adaptive_bmax",
    ):
        if getattr(args, name) is not None:
            options[name] = getattr(args, name)
    if args.static_timeout_ms is not None:
        options["static_timeout_s"] = args.static_timeout_ms / 1000
    if args.adaptive_target_step_ms is not None:
        options["adaptive_target_step_s"] = args.adaptive_target_step_ms / 1000
    return EngineConfig(**options)


def engine_command(args: argparse.Namespace) -> int:
    """Runs the engine until SIGINT or SIGTERM; a mistake is one line on stderr, status 2."""
    try:
        codec = hop_codec(args.codec, allow_pickle=args.allow_pickle)
        config = _config(args)
    except (hop.HopError, ic.CodecError, ValueError) as exc:
        print(f"inferwire engine: error: {exc}", file=sys.stderr)
        return _USAGE_ERROR
    context = zmq.Context()
    socket = context.socket(zmq.ROUTER)
    configure(socket, hwm=args.hwm)
    socket.setsockopt(zmq.ROUTER_MANDATORY, 1)  # an unroutable frontend is an error, not a drop
    try:
        try:
            endpoint = bind_endpoint(socket, args.endpoint)
        except (ValueError, zmq.ZMQError) as exc:
            print(
                f"inferwire engine: error: cannot listen on {args.endpoint}: {exc}", file=sys.stderr
            )
            return _USAGE_ERROR
        loop = EngineLoop(
            EngineCore(config, RealClock()),
            codec,
            socket,
            heartbeat_interval_s=args.heartbeat_interval,
            liveness_timeout_s=args.liveness_timeout,
        )

        def stop(signum: int, frame: FrameType | None) -> None:
            loop.stop()

        for sig in (signal.SIGINT, signal.SIGTERM):
            signal.signal(sig, stop)
        print(
            f"listening on {endpoint} codec={codec.name} policy={config.policy} "
            f"session={loop.session}",
            flush=True,
        )
        loop.run()
    finally:
        socket.close(linger=0)
        context.term()
    return 0


ENGINE_DESCRIPTION: Final = """\
Runs the simulated inference engine (batching policy, step-time model, KV cache) in this
process, behind a ZeroMQ ROUTER socket, until SIGINT or SIGTERM; frontends (inferwire serve
--engine ENDPOINT) connect to it. The first line on stdout is "listening on ENDPOINT codec=NAME
policy=POLICY session=ID": with tcp://HOST:0, ENDPOINT is the port bound.

Each request's chunks are a seeded workload's, one per decode step, encoded with the hop codec
(--codec; every frontend must speak the same). pickle runs code from the bytes it reads and is
refused unless --allow-pickle is given here and on the frontends: only for trusted peers."""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--endpoint",
        default=DEFAULT_ENDPOINT,
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
    parser.add_argument("--max-batch", type=_positive_int, help="most requests in one batch")
    parser.add_argument("--kv-blocks", type=_positive_int, help="KV-cache capacity, in blocks")
    parser.add_argument("--block-tokens", type=_positive_int, help="tokens per KV block")
    parser.add_argument(
        "--max-waiting",
        type=_positive_int,
        help="requests that may wait; one more is refused as overloaded",
    )
    parser.add_argument(
        "--static-timeout-ms",
        type=_non_negative,
        help="static policy: how long a batch waits to fill",
    )
    parser.add_argument(
        "--admit-batch",
        type=_positive_int,
        help="continuous policy: most requests one prefill iteration admits",
    )
    parser.add_argument(
        "--max-prefill-tokens",
        type=_positive_int,
        help="continuous and adaptive: most prompt tokens one prefill iteration computes",
    )
    parser.add_argument(
        "--adaptive-bmax", type=_positive_int, help="adaptive policy: the largest batch (Bmax)"
    )
    parser.add_argument(
        "--adaptive-target-step-ms",
        type=_positive_float,
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
        type=_non_negative,
        default=1.0,
        help="multiply every step time by this (below 1: a faster engine, for tests)",
    )
    parser.add_argument(
        "--heartbeat-interval",
        type=_positive_float,
        default=HEARTBEAT_INTERVAL_S,
        help="seconds between heartbeats to an idle frontend",
    )
    parser.add_argument(
        "--hwm",
        type=_positive_int,
        default=SOCKET_HWM,
        help="messages ZeroMQ queues per frontend each way before it pushes back",
    )
    parser.add_argument(
        "--liveness-timeout",
        type=_positive_float,
        default=LIVENESS_TIMEOUT_S,
        help="seconds without a word from a frontend before its requests are aborted",
    )


def add_commands(commands: argparse._SubParsersAction[Any]) -> None:
    """``engine`` as a subcommand of the ``inferwire`` command."""
    parser = commands.add_parser(
        "engine", help="run the simulated engine behind ZeroMQ", description=ENGINE_DESCRIPTION
    )
    add_arguments(parser)
    parser.set_defaults(run=engine_command)


def _number(
    text: str, convert: Callable[[str], float], test: Callable[[float], bool], what: str
) -> Any:
    try:
        value = convert(text)
    except ValueError:
        value = None
    if value is None or not test(value) or value != value or value in (float("inf"),):
        raise argparse.ArgumentTypeError(f"{text!r} is not {what}")
    return value


def _positive_int(text: str) -> int:
    return int(_number(text, int, lambda v: v > 0, "a whole number above 0"))


def _positive_float(text: str) -> float:
    return float(_number(text, float, lambda v: v > 0, "a number above 0"))


def _non_negative(text: str) -> float:
    return float(_number(text, float, lambda v: v >= 0, "a number, 0 or more"))


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m inferwire.engine.process", description=ENGINE_DESCRIPTION
    )
    add_arguments(parser)
    return engine_command(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
