"""The bare grpcio floor of a token stream: a server that streams prebuilt messages and
nothing else, as a process of its own.

    python -m inferwire.bench.procs.grpc_floor --codec orjson --workload stream-256

It holds the exact gRPC messages our ``grpc`` server sends for that stream, encoded once at
start: :meth:`~inferwire.codecs.Codec.message_encoder`'s output, one chunk (or delta frame) a
message, the end message included where the codec has one (``Messages``), and the codec's
stream bytes of each batch of due chunks, as the batched RPC sends them (``Batches``). A
call of either streams them all, with grpcio's generic handler and identity (de)serializers:
no codec, no service, no pacing. Everything our server does beyond that (building the
messages, the service's batches, the codec) is what a per-message figure above this floor
costs. A third method (``Encoded``) streams the same messages encoded as it goes, with the
codec's message encoder and nothing else: beside the floor, the codec's own share of it.

It runs on the loop and the API our server runs on (``grpc.aio``; uvloop when installed, as
``inferwire serve``'s ``--loop auto``), with the same channel options, and announces itself as
``inferwire serve`` does (``listening on HOST:PORT loop=...``), so
:class:`~inferwire.transports.server_process.ServerProcess` starts and pins it like ours.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import signal
from collections.abc import AsyncIterator, Sequence
from typing import Final

import grpc
import grpc.aio

import inferwire.codecs as ic
from inferwire._runtime import loops
from inferwire.transports import DEFAULT_MAX_MESSAGE_BYTES
from inferwire.transports.service import MAX_BATCH_CHUNKS
from inferwire.workloads import token_stream_source

SERVICE: Final = "inferwire.bench.Floor"
MESSAGES: Final = f"/{SERVICE}/Messages"
"""The per-message stream: what ``Generate`` sends, one message a chunk."""
BATCHES: Final = f"/{SERVICE}/Batches"
"""The batched stream: what ``GenerateBatched`` sends unpaced, one message a batch."""
ENCODED: Final = f"/{SERVICE}/Encoded"
"""The per-message stream encoded as it goes: the codec's message encoder over the chunks,
one call a message, and nothing else (no service, no server of ours)."""


def messages(codec: ic.Codec, chunks: Sequence[ic.TokenChunk]) -> list[bytes]:
    """The gRPC messages of ``Generate`` for ``chunks``: the codec's message stream."""
    encoder = codec.message_encoder()
    out = [encoder.encode(chunk) for chunk in chunks]
    end = encoder.end()
    return [*out, end] if end else out


def batches(codec: ic.Codec, chunks: Sequence[ic.TokenChunk]) -> list[bytes]:
    """The gRPC messages of ``GenerateBatched`` for ``chunks`` when the model outruns the
    wire: the codec's stream bytes of each ``MAX_BATCH_CHUNKS`` chunks, the end marker with
    the last."""
    encoder = codec.stream_encoder()
    out = [
        b"".join(encoder.encode(chunk) for chunk in chunks[i : i + MAX_BATCH_CHUNKS])
        for i in range(0, len(chunks), MAX_BATCH_CHUNKS)
    ]
    out[-1] += encoder.end()
    return out


def _encoder(codec: ic.Codec, chunks: Sequence[ic.TokenChunk]) -> grpc.RpcMethodHandler:
    async def stream(request: bytes, context: grpc.aio.ServicerContext) -> AsyncIterator[bytes]:
        encoder = codec.message_encoder()
        for chunk in chunks:
            yield encoder.encode(chunk)
        end = encoder.end()
        if end:
            yield end

    return grpc.unary_stream_rpc_method_handler(stream)


def _streamer(prebuilt: list[bytes]) -> grpc.RpcMethodHandler:
    async def stream(request: bytes, context: grpc.aio.ServicerContext) -> AsyncIterator[bytes]:
        for message in prebuilt:
            yield message

    return grpc.unary_stream_rpc_method_handler(stream)  # no (de)serializers: bytes as they are


async def _serve(args: argparse.Namespace) -> None:
    codec = ic.get(args.codec, extensions=True)
    chunks = list(token_stream_source(args.workload, args.seed))
    handlers = {
        "Messages": _streamer(messages(codec, chunks)),
        "Batches": _streamer(batches(codec, chunks)),
        "Encoded": _encoder(codec, chunks),
    }
    server = grpc.aio.server(
        options=[
            ("grpc.max_receive_message_length", DEFAULT_MAX_MESSAGE_BYTES),
            ("grpc.max_send_message_length", DEFAULT_MAX_MESSAGE_BYTES),
            ("grpc.so_reuseport", 0),
        ]
    )
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(SERVICE, handlers),))
    port = server.add_insecure_port(f"{args.host}:{args.port}")
    if port == 0:
        raise SystemExit(f"grpc_floor: cannot bind {args.host}:{args.port}")
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    await server.start()
    print(f"listening on {args.host}:{port} loop={loops.running()}", flush=True)
    try:
        await stop.wait()
    finally:
        with contextlib.suppress(asyncio.CancelledError):
            await server.stop(grace=1.0)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m inferwire.bench.procs.grpc_floor",
        description="Stream a workload's prebuilt gRPC messages with a bare grpcio server.",
    )
    parser.add_argument("--codec", default="orjson", choices=ic.names())
    parser.add_argument("--workload", default="stream-256")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--loop", default="auto", choices=loops.LOOPS)
    args = parser.parse_args(argv)
    loops.run(_serve(args), args.loop)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
