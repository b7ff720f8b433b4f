"""The hop benchmark's engine core as a process of its own (started by
:class:`~inferwire.engine.vllm_hop.frontend.Frontend`):

    python -m inferwire.engine.vllm_hop.engine_main --input ENDPOINT --output ENDPOINT

It connects to the frontend's two sockets (the frontend binds them, as vLLM's does), prints
``vllm-hop engine ready pid=PID`` and serves orders (:class:`~.wire.Engine`) until QUIT,
SIGTERM or SIGINT.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence

import zmq

from .wire import connect_engine


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m inferwire.engine.vllm_hop.engine_main")
    parser.add_argument("--input", required=True, help="the frontend's input socket")
    parser.add_argument("--output", required=True, help="the frontend's output socket")
    parser.add_argument(
        "--allow-pickle",
        action="store_true",
        help="accept the pickle codecs (they run code from the bytes: trusted peers only)",
    )
    args = parser.parse_args(argv)
    context = zmq.Context()
    try:
        engine = connect_engine(context, args.input, args.output, allow_pickle=args.allow_pickle)
    except zmq.ZMQError as exc:
        print(f"vllm-hop engine: error: {exc}", file=sys.stderr)
        return 2
    try:
        print(f"vllm-hop engine ready pid={os.getpid()}", flush=True)
        engine.serve()
    except KeyboardInterrupt:
        pass
    finally:
        engine.inputs.close(linger=0)
        engine.outputs.close(linger=0)
        context.term()
    return 0


if __name__ == "__main__":
    sys.exit(main())
