"""``inferwire engine``: the simulated engine in its own process, behind a ZeroMQ ROUTER
(:mod:`inferwire.cli.engine` parses its options).

    inferwire engine --endpoint ipc:///tmp/engine.sock --codec msgspec-msgpack
    python -m inferwire.cli engine --endpoint tcp://127.0.0.1:0 --policy static --step-scale 0.1

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
import sys
from typing import Any, Final

import zmq

import inferwire.codecs as ic
from inferwire._runtime import signals

from . import hop
from .clock import RealClock
from .core import EngineCore
from .hop_codecs import hop_codec
from .loop import EngineLoop, configure
from .scheduler import EngineConfig
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


def run(args: argparse.Namespace) -> int:
    """Runs the engine of ``inferwire engine``'s options until SIGINT or SIGTERM, then
    closes its socket: exit status 0; a mistake is one line on stderr, status 2."""
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
        with signals.handled(lambda signum: loop.stop()):
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
