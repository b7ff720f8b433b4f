"""The hop's two ZeroMQ sockets as vLLM V1 makes them, and the engine's side of the benchmark.

vLLM's frontend binds both ends (``vllm/v1/engine/core_client.py``; ``make_zmq_socket`` of
``vllm/utils/network_utils.py`` binds every socket type but PUSH and SUB): an input socket the
engine core reads requests from, and a PULL socket the engine core's output thread PUSHes each
step's outputs to (``vllm/v1/engine/core.py``, ``process_output_sockets``: ``send_multipart(buffers,
copy=False)``, tracked while a step's buffers are in ZeroMQ's hands); the address is an
``ipc://`` path under a temporary directory on one host, ``tcp://`` across hosts. vLLM's input
socket is a ROUTER (engines connect DEALERs); here it is a PUSH the engine PULLs: the benchmark
has one engine and measures the outputs' direction.

Input messages (frontend -> engine), frame 0 their kind::

    b"r" RUN  [kind, RunOrder]            send ``steps`` steps of (case, batch) with ``codec``
    b"a" ADD  [kind, codec, *frames]      a request, in ``codec``'s frames: the engine decodes
                                          it and answers an Ack with what it read
    b"q" QUIT [kind]                      the engine exits

Output messages (engine -> frontend), in the order the frontend expects them: an
:class:`Ack` to every RUN or ADD (``ok`` false and ``error`` when refused: a bad order, pickle
not allowed, an ADD that does not decode); after an accepted RUN, its ``steps`` step messages
in the codec's frames, then a :class:`RunReport` of the engine's own costs per step.

The engine times what it does per step with its thread's CPU clock: ``build`` (making the
step's structs and marking its tensors: the model's work here, not the hop's), ``encode``
(the codec), ``send`` (handing the frames to ZeroMQ).
"""

from __future__ import annotations

import sys
import time
from collections.abc import Sequence
from typing import Annotated, Any, Final

import msgspec
import zmq

from ..hop import HopError, HopProtocolError
from .codecs import MAX_MESSAGE_BYTES, BytesLike, frame_bytes, step_codec
from .messages import MAX_NAME_CHARS, EngineCoreOutputs, EngineCoreRequest
from .steps import SETS, StepSource
from .token_hop import TokenHopEncoder, is_token_hop

RUN: Final = b"r"
ADD: Final = b"a"
QUIT: Final = b"q"
HWM: Final = 8
"""Messages queued per socket and direction: a slow frontend makes the engine wait rather than
grow a queue of steps (vLLM sets no limit; here a step can be hundreds of MB)."""
SEND_TIMEOUT_MS: Final = 60_000
"""The engine gives up a run whose frontend has read nothing for this long."""
MAX_BATCH: Final = 4096
MAX_STEPS: Final = 100_000

Name = Annotated[str, msgspec.Meta(max_length=MAX_NAME_CHARS)]


class RunOrder(msgspec.Struct, frozen=True, array_like=True, forbid_unknown_fields=True):
    codec: Name
    case: Name
    batch: Annotated[int, msgspec.Meta(ge=1, le=MAX_BATCH)]
    steps: Annotated[int, msgspec.Meta(ge=1, le=MAX_STEPS)]
    seed: Annotated[int, msgspec.Meta(ge=0, le=(1 << 31) - 1)] = 0


class Ack(msgspec.Struct, frozen=True, array_like=True, forbid_unknown_fields=True):
    ok: bool
    error: Annotated[str, msgspec.Meta(max_length=4096)] = ""
    summary: dict[Name, float | int | str] = {}


class RunReport(msgspec.Struct, frozen=True, array_like=True, forbid_unknown_fields=True):
    """The engine's costs of one run, per step: thread CPU ns of build, encode and send, the
    bytes of the step's frames; and its process CPU ns over the run (every thread)."""

    build_ns: list[int]
    encode_ns: list[int]
    send_ns: list[int]
    bytes: list[int]
    process_ns: int
    error: str = ""


_encode = msgspec.msgpack.Encoder().encode
ORDER_DECODER: Final = msgspec.msgpack.Decoder(RunOrder)
ACK_DECODER: Final = msgspec.msgpack.Decoder(Ack)
REPORT_DECODER: Final = msgspec.msgpack.Decoder(RunReport)


def encode_control(message: msgspec.Struct) -> bytes:
    return _encode(message)


def decode_control(decoder: msgspec.msgpack.Decoder[Any], data: BytesLike) -> Any:
    """A control message; raises :class:`~inferwire.engine.hop.HopProtocolError`."""
    try:
        return decoder.decode(data)
    except (msgspec.DecodeError, msgspec.ValidationError) as exc:
        raise HopProtocolError(f"a control message that does not decode: {exc}") from exc


def configure(socket: zmq.Socket[Any]) -> None:
    """Bounded queues, bounded frames, no linger: both ends, both sockets."""
    socket.setsockopt(zmq.SNDHWM, HWM)
    socket.setsockopt(zmq.RCVHWM, HWM)
    socket.setsockopt(zmq.MAXMSGSIZE, MAX_MESSAGE_BYTES)
    socket.setsockopt(zmq.LINGER, 0)


# -- the engine ---------------------------------------------------------------------------------


class Engine:
    """The engine's side: reads orders from ``inputs``, sends steps to ``outputs``."""

    def __init__(
        self, inputs: zmq.Socket[Any], outputs: zmq.Socket[Any], *, allow_pickle: bool
    ) -> None:
        self.inputs = inputs
        self.outputs = outputs
        self.allow_pickle = allow_pickle
        self._source: StepSource | None = None
        """The last (case, batch, seed) built: a benchmark runs every codec on one before the
        next, and a logprobs source of 256 requests holds 256 MB."""

    def serve(self) -> None:
        """Until QUIT: a message that is not a known order is answered with a refusal."""
        while True:
            frames = self.inputs.recv_multipart(copy=False)
            kind = bytes(frames[0].buffer)
            if kind == QUIT:
                return
            try:
                if kind == RUN and len(frames) == 2:
                    self._run(decode_control(ORDER_DECODER, frames[1].buffer))
                elif kind == ADD and len(frames) >= 3:
                    self._add(bytes(frames[1].buffer), [f.buffer for f in frames[2:]])
                else:
                    raise HopProtocolError(f"a message of kind {kind!r} and {len(frames)} frames")
            except (HopError, ValueError) as exc:
                self._answer(Ack(ok=False, error=str(exc)[:4096]))
            except (zmq.Again, zmq.NotDone):
                print("vllm-hop engine: the frontend stopped reading a run", file=sys.stderr)

    def _answer(self, message: msgspec.Struct) -> None:
        self.outputs.send(encode_control(message))

    def _add(self, codec_name: bytes, frames: Sequence[BytesLike]) -> None:
        codec = step_codec(
            codec_name.decode("ascii", "replace"), EngineCoreRequest, allow_pickle=self.allow_pickle
        )
        request = codec.decode(frames)
        embeds = request.prompt_embeds
        summary: dict[str, float | int | str] = {
            "request_id": request.request_id,
            "prompt_tokens": len(request.prompt_token_ids or ()),
            "token_sum": sum(request.prompt_token_ids or ()),
            "max_tokens": request.sampling_params.max_tokens if request.sampling_params else 0,
            "embeds_shape": "x".join(map(str, embeds.shape)) if embeds is not None else "",
            "embeds_sum": float(embeds.sum(dtype="f8")) if embeds is not None else 0.0,
        }
        self._answer(Ack(ok=True, summary=summary))

    def _source_of(self, order: RunOrder) -> StepSource:
        key = (order.case, order.batch, order.seed)
        source = self._source
        if source is None or (source.case, source.batch, source.seed) != key:
            self._source = None  # free the last one's tensors before building the next
            source = self._source = StepSource.build(*key)
        return source

    def _run(self, order: RunOrder) -> None:
        if is_token_hop(order.codec):
            self._run_token_hop(order)
            return
        codec = step_codec(order.codec, EngineCoreOutputs, allow_pickle=self.allow_pickle)
        source = self._source_of(order)
        self._answer(Ack(ok=True))
        report = _Costs()
        trackers: list[zmq.MessageTracker | None] = [None] * SETS
        for step in range(order.steps):
            last = step == order.steps - 1
            used = source.set_of(step)
            pending = trackers[used]
            if pending is not None:  # that set's buffers, sent without a copy, are free again
                pending.wait(SEND_TIMEOUT_MS / 1000)
            started = time.thread_time_ns()
            message = source.step(step, last=last)
            built = time.thread_time_ns()
            frames = codec.encode(message)
            encoded = time.thread_time_ns()
            # the tracker of the last frame (ZeroMQ writes a message's frames in order): at
            # most SETS steps are in flight, whatever the codec, so memory stays bounded
            trackers[used] = self.outputs.send_multipart(frames, copy=False, track=True)
            report.add(started, built, encoded, time.thread_time_ns(), frame_bytes(frames))
            del message, frames  # ZeroMQ's references alone keep the buffers while it sends
        for pending in trackers:
            if pending is not None:
                pending.wait(SEND_TIMEOUT_MS / 1000)
        self._answer(report.done())

    def _run_token_hop(self, order: RunOrder) -> None:
        encoder = TokenHopEncoder(order.codec, order.case, order.batch, order.seed)
        self._answer(Ack(ok=True))
        report = _Costs()
        for step in range(order.steps):
            last = step == order.steps - 1
            started = time.thread_time_ns()
            chunks = encoder.chunks(step, last=last)
            built = time.thread_time_ns()
            frames = encoder.encode(chunks, last=last)
            encoded = time.thread_time_ns()
            self.outputs.send_multipart(frames)
            report.add(started, built, encoded, time.thread_time_ns(), frame_bytes(frames))
        self._answer(report.done())


class _Costs:
    def __init__(self) -> None:
        self.build_ns: list[int] = []
        self.encode_ns: list[int] = []
        self.send_ns: list[int] = []
        self.bytes: list[int] = []
        self._process_started = time.process_time_ns()

    def add(self, started: int, built: int, encoded: int, sent: int, size: int) -> None:
        self.build_ns.append(built - started)
        self.encode_ns.append(encoded - built)
        self.send_ns.append(sent - encoded)
        self.bytes.append(size)

    def done(self) -> RunReport:
        return RunReport(
            build_ns=self.build_ns,
            encode_ns=self.encode_ns,
            send_ns=self.send_ns,
            bytes=self.bytes,
            process_ns=time.process_time_ns() - self._process_started,
        )


def connect_engine(
    context: zmq.Context[Any], input_endpoint: str, output_endpoint: str, *, allow_pickle: bool
) -> Engine:
    """The engine's sockets, connected to a frontend's (which bound them)."""
    inputs = context.socket(zmq.PULL)
    outputs = context.socket(zmq.PUSH)
    for socket, endpoint in ((inputs, input_endpoint), (outputs, output_endpoint)):
        configure(socket)
        socket.connect(endpoint)
    outputs.setsockopt(zmq.SNDTIMEO, SEND_TIMEOUT_MS)
    return Engine(inputs, outputs, allow_pickle=allow_pickle)
