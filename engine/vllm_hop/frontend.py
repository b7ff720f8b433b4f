"""The frontend's side of the hop benchmark: binds the two sockets, starts the engine process,
orders runs and receives, decodes and checks every step, timing its own CPU.

    with Frontend("ipc", allow_pickle=True) as frontend:
        result = frontend.run("msgspec-oob", "logprobs", batch=64, steps=20)
        result.correct, result.frontend_ns_per_step, result.engine.encode_ns

Per step the frontend reads its thread's CPU clock around receive + decode
(``recv_multipart(copy=False)``, then the codec's decode of the frames' buffers) and around
the check; over the run it reads its process CPU clock, which also counts ZeroMQ's I/O thread
(it reads the socket and assembles the messages): :attr:`RunResult.frontend_ns_per_step` is
that, less the checks, per step. A blocked receive costs no CPU, so neither clock counts the
wait for the engine.
"""

from __future__ import annotations

import contextlib
import re
import shutil
import sys
import tempfile
import time
from dataclasses import dataclass, field
from types import TracebackType
from typing import Any, Final, Literal, Self

import zmq

from inferwire._runtime.child import ChildProcess

from ..hop import EngineGoneError, HopError, HopProtocolError
from .codecs import BytesLike, StepCodec, step_codec
from .messages import EngineCoreOutputs, EngineCoreRequest
from .steps import check_step
from .token_hop import TokenHopDecoder, check_token_step, is_token_hop
from .wire import (
    ACK_DECODER,
    ADD,
    QUIT,
    REPORT_DECODER,
    RUN,
    Ack,
    RunOrder,
    RunReport,
    configure,
    decode_control,
    encode_control,
)

Transport = Literal["ipc", "tcp"]
TRANSPORTS: Final[tuple[Transport, ...]] = ("ipc", "tcp")
RECEIVE_TIMEOUT_MS: Final = 120_000
"""Generous: a 2-core machine under load may take seconds to build a large step."""
_ANNOUNCEMENT: Final = re.compile(r"vllm-hop engine ready pid=(\d+)")


class EngineProcess(ChildProcess):
    """``python -m inferwire.engine.vllm_hop.engine_main`` as a child process."""

    def __init__(self, input_endpoint: str, output_endpoint: str, *, allow_pickle: bool) -> None:
        command = [
            sys.executable,
            "-m",
            "inferwire.engine.vllm_hop.engine_main",
            "--input",
            input_endpoint,
            "--output",
            output_endpoint,
        ]
        super().__init__([*command, "--allow-pickle"] if allow_pickle else command, _ANNOUNCEMENT)


@dataclass(slots=True, kw_only=True)
class RunResult:
    """One run of ``steps`` steps as the frontend received them, and the engine's report."""

    codec: str
    case: str
    batch: int
    steps: int
    transport: str
    decode_thread_ns: list[int] = field(default_factory=list)
    """Per step: the frontend thread's CPU for receive + decode."""
    check_ns: list[int] = field(default_factory=list)
    bytes: list[int] = field(default_factory=list)
    """Per step: all the bytes of its frames, as received."""
    frontend_process_ns: int = 0
    """The frontend process's CPU over the run (every thread), less the checks."""
    problems: list[str] = field(default_factory=list)
    engine: RunReport | None = None
    last: EngineCoreOutputs | None = None
    """The last step's decoded outputs (``keep_last``), with its frames in :attr:`last_frames`."""
    last_frames: list[zmq.Frame] = field(default_factory=list)

    @property
    def correct(self) -> bool:
        """Every step arrived, whole, in order, with the values sent; the engine reported."""
        return (
            not self.problems
            and len(self.decode_thread_ns) == self.steps
            and self.engine is not None
            and not self.engine.error
            and self.engine.bytes == self.bytes
        )

    @property
    def frontend_ns_per_step(self) -> float:
        return self.frontend_process_ns / self.steps


class Frontend:
    """The frontend's two sockets over ``transport`` and an engine process connected to them;
    a context manager (the engine is stopped and the ``ipc://`` directory removed on exit)."""

    def __init__(self, transport: Transport, *, allow_pickle: bool = False) -> None:
        if transport not in TRANSPORTS:
            raise ValueError(f"transport {transport!r}: one of {', '.join(TRANSPORTS)}")
        self.transport = transport
        self.allow_pickle = allow_pickle
        self._context: zmq.Context[Any] = zmq.Context()
        self.inputs: zmq.Socket[Any] = self._context.socket(zmq.PUSH)
        self.outputs: zmq.Socket[Any] = self._context.socket(zmq.PULL)
        self._directory = (
            tempfile.mkdtemp(prefix="inferwire-vllm-hop-") if transport == "ipc" else ""
        )
        self.engine: EngineProcess | None = None
        self.endpoints = ("", "")

    def __enter__(self) -> Self:
        try:
            endpoints = []
            for socket, name in ((self.inputs, "input"), (self.outputs, "output")):
                configure(socket)
                if self.transport == "ipc":
                    socket.bind(f"ipc://{self._directory}/{name}")
                else:
                    socket.bind("tcp://127.0.0.1:*")
                endpoints.append(socket.getsockopt_string(zmq.LAST_ENDPOINT))
            self.endpoints = (endpoints[0], endpoints[1])
            self.outputs.setsockopt(zmq.RCVTIMEO, RECEIVE_TIMEOUT_MS)
            self.inputs.setsockopt(zmq.SNDTIMEO, RECEIVE_TIMEOUT_MS)
            self.engine = EngineProcess(*self.endpoints, allow_pickle=self.allow_pickle).start()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def close(self) -> None:
        if self.engine is not None:
            with contextlib.suppress(zmq.ZMQError):
                self.inputs.send(QUIT, zmq.NOBLOCK)
            self.engine.stop()
            self.engine = None
        self.inputs.close(linger=0)
        self.outputs.close(linger=0)
        self._context.term()
        if self._directory:
            shutil.rmtree(self._directory, ignore_errors=True)

    # -- talking to the engine --

    def _receive(self, *, copy: bool = False) -> list[Any]:
        try:
            frames: list[Any] = (
                self.outputs.recv_multipart() if copy else self.outputs.recv_multipart(copy=False)
            )
        except zmq.Again:
            alive = self.engine is not None and self.engine.process is not None
            alive = alive and self.engine.process.poll() is None  # type: ignore[union-attr]
            raise EngineGoneError(
                f"nothing from the engine within {RECEIVE_TIMEOUT_MS / 1000:g} s"
                + ("" if alive else " (it exited)")
            ) from None
        return frames

    def _control(self, decoder: Any) -> Any:
        frames = self._receive()
        if len(frames) != 1:
            raise HopProtocolError(f"a control message of {len(frames)} frames")
        return decode_control(decoder, frames[0].buffer)

    def send_raw(self, frames: list[BytesLike]) -> Ack:
        """Any message to the engine, and its answer (for the hostile cases' tests)."""
        self.inputs.send_multipart(frames)
        ack: Ack = self._control(ACK_DECODER)
        return ack

    def add_request(self, codec: str, request: EngineCoreRequest) -> Ack:
        """``request`` to the engine in ``codec``'s frames; its answer says what it decoded."""
        frames = step_codec(codec, EngineCoreRequest, allow_pickle=self.allow_pickle).encode(
            request
        )
        return self.send_raw([ADD, codec.encode("ascii"), *frames])

    def run(
        self,
        codec: str,
        case: str,
        *,
        batch: int,
        steps: int,
        seed: int = 0,
        keep_last: bool = False,
    ) -> RunResult:
        """Orders a run and receives it: every step is read, a step that does not decode or
        differs from the one sent is in :attr:`RunResult.problems` (the run is not
        :attr:`~RunResult.correct`). Raises :class:`~inferwire.engine.hop.HopError` when the
        engine refuses the run (the Ack's error) or a control message does not decode, and
        :class:`~inferwire.engine.hop.EngineGoneError` when nothing comes."""
        order = RunOrder(codec=codec, case=case, batch=batch, steps=steps, seed=seed)
        decoder: TokenHopDecoder | StepCodec[EngineCoreOutputs] = (
            TokenHopDecoder(codec, batch)
            if is_token_hop(codec)
            else step_codec(codec, EngineCoreOutputs, allow_pickle=self.allow_pickle)
        )
        self.inputs.send_multipart([RUN, encode_control(order)])
        ack: Ack = self._control(ACK_DECODER)
        if not ack.ok:
            raise HopError(f"the engine refused the run: {ack.error}")
        result = RunResult(
            codec=codec, case=case, batch=batch, steps=steps, transport=self.transport
        )
        thread_ns = time.thread_time_ns
        process_started = time.process_time_ns()
        for step in range(steps):
            last = step == steps - 1
            size = 0
            started = thread_ns()
            try:
                if isinstance(decoder, TokenHopDecoder):
                    data = self._receive(copy=True)  # as the hop's EngineClient reads
                    found = decoder.decode(data)
                    decoded = thread_ns()
                    size = sum(len(f) for f in data)
                    problem = check_token_step(found, batch, seed, step, last=last)
                else:
                    frames = self._receive()
                    message = decoder.decode([f.buffer for f in frames])
                    decoded = thread_ns()
                    size = sum(f.buffer.nbytes for f in frames)
                    problem = check_step(message, case, batch, seed, step, last=last)
                    if last and keep_last:
                        result.last, result.last_frames = message, frames
            except HopProtocolError as exc:
                # reported, and the run read to its end: the next run starts in step
                decoded = thread_ns()
                problem = f"step {step}: {exc}"
            checked = thread_ns()
            result.decode_thread_ns.append(decoded - started)
            result.check_ns.append(checked - decoded)
            result.bytes.append(size)
            if problem:
                result.problems.append(problem)
        result.frontend_process_ns = time.process_time_ns() - process_started - sum(result.check_ns)
        result.engine = self._control(REPORT_DECODER)
        return result


def engine_pid(frontend: Frontend) -> int:
    """The engine process's pid (for pinning it to a core)."""
    if frontend.engine is None:
        raise RuntimeError("the frontend has no engine running")
    return frontend.engine.pid


__all__ = ["TRANSPORTS", "EngineProcess", "Frontend", "RunResult", "Transport", "engine_pid"]
