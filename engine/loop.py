"""The engine process's loop: one thread, the real clock, a ZeroMQ ROUTER socket (the wire
format is :mod:`inferwire.engine.hop`; the command around it, :mod:`inferwire.engine.process`).
Each turn:

1. receive every message pending (ADD queues a request on the core, ABORT frees its KV
   blocks, PAUSE/RESUME park a request, HELLO opens a frontend's session, PING and STATS are
   answered at once);
2. run one engine step (:meth:`EngineCore.step`) and wait its modelled ``duration_s``, still
   receiving (a ZeroMQ poller's timeout is the wait), as a GPU step runs while the engine
   core's input thread reads the socket in vLLM;
3. encode each output with its request's hop-codec stream encoder (the codec's end marker
   after its last chunk) and send **one OUTPUTS message per frontend** (with the stamps of the
   requests that finished in it and asked for them), then END_STATS for the requests that
   finished and asked for them;
4. heartbeats to idle frontends every ``--heartbeat-interval``; a frontend not heard from for
   ``--liveness-timeout`` (it pings every ~0.15 s) has its requests aborted, as does one that
   ZeroMQ can no longer route to (it disconnected) or that says HELLO with a new session.

Backpressure: an ADD over the core's ``max_waiting`` is answered ERROR ``overloaded``; a
frontend's PAUSE parks its request (its blocks held, its decode skipped); a frontend whose
socket is full (ZeroMQ's send high-water mark) gets nothing more until it drains: its
messages wait in an outbox and its requests are paused meanwhile, so the engine never blocks
on one slow frontend nor drops a frame of a stream.

Stage times (END_STATS, seconds on the engine's clock, when an ADD asks), from the core's
split (:class:`~inferwire.engine.core.RequestRecord`): ``queue_s`` waiting for admission (from
arrival, and again after a preemption), ``prefill_s`` the prefill iterations it was part of,
``decode_s`` the decode iterations it was part of (a decode step lasts as long for every
request in the batch), ``batch_wait_s`` the time it held a batch slot while other requests'
prefill ran or while paused (the core's ``stall_s``); then ``encode_s``, the engine's
hop-codec encode time of its frames (measured, ``perf_counter_ns``), ``first_scheduled_s``
arrival to its first iteration, ``ttft_s`` arrival to first chunk and ``engine_s`` arrival to
last chunk (as modelled: a chunk is due at the end of its step).

Stamps (:class:`~inferwire.engine.hop.EngineStamps`, in the OUTPUTS of its last output, when
an ADD asks), ``time.monotonic_ns()`` read by this loop: ``arrived_ns`` when its ADD was read,
``scheduled_ns`` when the step that first prefilled it started, ``first_token_ns`` and
``last_token_ns`` when the outputs of its first and last step were sent, their modelled time
waited out. The core keeps the same moments on its own clock, in seconds
(:meth:`EngineCore.request_times`); these are the ones a frontend on this host compares with
its own.
"""

from __future__ import annotations

import dataclasses
import functools
import secrets
import sys
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Final

import zmq

import inferwire.codecs as ic
from inferwire.codecs.framing import StreamEncoder
from inferwire.workloads import cut_stream, token_stream_source

from . import hop
from .core import EngineCore
from .errors import EngineFullError, InvalidRequestError
from .model import EngineRequest, StepResult

HEARTBEAT_INTERVAL_S: Final = 0.15
LIVENESS_TIMEOUT_S: Final = 3.0
SOCKET_HWM: Final = 10_000
"""Messages queued per peer before ZeroMQ pushes back (both directions, both sockets)."""
_DRAIN_AT_ONCE: Final = 10_000
_LOGGED_PROTOCOL_ERRORS: Final = 10
"""Unreadable messages logged (the rest are counted only: a hostile peer cannot flood the
log)."""
_BLOCKED_POLL_S: Final = 0.002
"""How often a frontend's outbox is retried while the engine has nothing else to do (a ROUTER
socket cannot say which peer became writable)."""


@dataclass(slots=True, eq=False)
class _Frontend:
    identity: bytes
    session: str
    number: int
    last_heard_s: float
    last_sent_s: float = 0.0
    requests: dict[str, _Request] = field(default_factory=dict)
    outbox: deque[list[bytes]] = field(default_factory=deque)


@dataclass(slots=True, eq=False)
class _Request:
    frontend: _Frontend
    rid: str
    key: str
    encoder: StreamEncoder
    want_times: bool
    want_stamps: bool = False
    paused_by_frontend: bool = False
    next_index: int = 0
    encode_ns: int = 0
    arrived_ns: int = 0
    scheduled_ns: int = 0
    first_token_ns: int = 0


class EngineLoop:
    """The loop of the module docstring around ``core`` on ``socket`` (a bound ROUTER);
    :meth:`run` until :meth:`stop`."""

    def __init__(
        self,
        core: EngineCore,
        codec: ic.Codec,
        socket: zmq.Socket[bytes],
        *,
        session: str | None = None,
        heartbeat_interval_s: float = HEARTBEAT_INTERVAL_S,
        liveness_timeout_s: float = LIVENESS_TIMEOUT_S,
        source: Callable[[str, int], Sequence[ic.TokenChunk]] = token_stream_source,
        log: Callable[[str], None] | None = None,
    ) -> None:
        self.core = core
        self.codec = codec
        self.socket = socket
        self.session = session or secrets.token_hex(8)
        self.heartbeat_interval_s = heartbeat_interval_s
        self.liveness_timeout_s = liveness_timeout_s
        self._source = functools.lru_cache(maxsize=64)(source)
        self._log = log or (lambda line: print(f"inferwire engine: {line}", file=sys.stderr))
        self._frontends: dict[bytes, _Frontend] = {}
        self._requests: dict[str, _Request] = {}
        self._numbered = 0
        self._poller = zmq.Poller()
        self._poller.register(socket, zmq.POLLIN)
        self._stopping = False
        self.counters: dict[str, int] = dict.fromkeys(
            (
                "requests_added",
                "requests_finished",
                "requests_aborted",
                "overloaded",
                "bad_requests",
                "protocol_errors",
                "frontends_dropped",
                "outputs_sent",
                "messages_sent",
                "encode_ns",
                "outbox_waits",
            ),
            0,
        )

    def stop(self) -> None:
        self._stopping = True

    @property
    def _blocked(self) -> bool:
        """Whether some frontend's messages wait in its outbox."""
        return any(frontend.outbox for frontend in self._frontends.values())

    # -- the loop --------------------------------------------------------------------------

    def run(self) -> None:
        clock = time.monotonic
        core = self.core
        while not self._stopping:
            self._receive(0.0)
            step_ns = time.monotonic_ns()
            result = core.step() if core.has_work() else None
            if result is None:
                # idle, all paused, or a static batch waiting to fill: until a message comes,
                # the policy's next wake-up, or the next heartbeat is due
                wait_s = self.heartbeat_interval_s if not self._blocked else _BLOCKED_POLL_S
                wakeup_s = core.next_wakeup_s() if core.has_work() else None
                if wakeup_s is not None:
                    wait_s = min(wait_s, max(0.0, wakeup_s - core.clock.now()))
                self._receive(wait_s)
            else:
                if result.prefilled:
                    self._scheduled(result.prefilled, step_ns)
                deadline_s = clock() + result.duration_s
                while (left_s := deadline_s - clock()) > 0 and not self._stopping:
                    self._receive(left_s)
                self._deliver(result)
            self._flush()
            self._housekeeping(clock())

    def _receive(self, timeout_s: float) -> None:
        """Every message pending, waiting up to ``timeout_s`` for the first."""
        if not self._poller.poll(max(0, round(timeout_s * 1000))):
            return
        for _ in range(_DRAIN_AT_ONCE):
            try:
                frames = self.socket.recv_multipart(zmq.NOBLOCK)
            except zmq.Again:
                return
            self._on_message(frames[0], frames[1:])

    # -- messages from frontends -----------------------------------------------------------

    def _on_message(self, identity: bytes, frames: list[bytes]) -> None:
        frontend = self._frontends.get(identity)
        if frontend is not None:
            frontend.last_heard_s = time.monotonic()
        try:
            message = hop.parse_from_frontend(frames)
        except hop.HopProtocolError as exc:
            self.counters["protocol_errors"] += 1
            if self.counters["protocol_errors"] <= _LOGGED_PROTOCOL_ERRORS:
                self._log(f"a message that does not parse: {exc}")
            self._send_to(identity, hop.failure("", "protocol", str(exc)))
            return
        if isinstance(message, hop.Hello):
            self._hello(identity, message)
        elif isinstance(message, hop.Bare):
            if message.kind == hop.PING:
                self._send_to(identity, self._heartbeat())
            else:
                self._send_to(identity, hop.stats_answer(self.stats()))
        elif frontend is None:
            if isinstance(message, hop.Add):
                self._send_to(
                    identity,
                    hop.failure(message.rid, "unknown-frontend", "send HELLO first"),
                )
        elif isinstance(message, hop.Add):
            self._add(frontend, message)
        else:
            self._control(frontend, message)

    def _hello(self, identity: bytes, hello: hop.Hello) -> None:
        if hello.version != hop.PROTOCOL_VERSION or hello.codec != self.codec.name:
            self._send_to(
                identity,
                hop.failure(
                    "",
                    "refused",
                    f"this engine speaks hop version {hop.PROTOCOL_VERSION} with codec "
                    f"{self.codec.name!r}, not version {hello.version} with {hello.codec!r}",
                ),
            )
            return
        old = self._frontends.get(identity)
        if old is not None and old.session != hello.session:
            self._drop(old, "said HELLO with a new session")
        if old is None or old.session != hello.session:
            self._numbered += 1
            now = time.monotonic()
            self._frontends[identity] = _Frontend(identity, hello.session, self._numbered, now)
        self._send_to(identity, hop.welcome(self.session, self.codec.name))

    def _add(self, frontend: _Frontend, add: hop.Add) -> None:
        arrived_ns = time.monotonic_ns()
        if add.rid in frontend.requests:
            self._fail(frontend, add.rid, "bad-request", f"request id {add.rid!r} is in use")
            return
        try:
            chunks = self._chunks(add)
            prompt_tokens = add.prompt_tokens or next(
                (c.usage.prompt_tokens for c in reversed(chunks) if c.usage is not None), 0
            )
            key = f"{frontend.number}/{add.rid}"
            self.core.add(
                EngineRequest(
                    rid=key,
                    chunks=chunks,
                    prompt_tokens=prompt_tokens,
                )
            )
        except EngineFullError as exc:
            self.counters["overloaded"] += 1
            self._fail(frontend, add.rid, "overloaded", str(exc))
            return
        except (InvalidRequestError, ValueError) as exc:
            self.counters["bad_requests"] += 1
            self._fail(frontend, add.rid, "bad-request", str(exc))
            return
        request = _Request(
            frontend,
            add.rid,
            key,
            self.codec.stream_encoder(),
            add.want_stage_times,
            add.want_stamps,
            arrived_ns=arrived_ns,
        )
        frontend.requests[add.rid] = request
        self._requests[key] = request
        self.counters["requests_added"] += 1
        if frontend.outbox:  # the frontend is not reading: this one waits too
            self.core.pause(key)

    def _chunks(self, add: hop.Add) -> Sequence[ic.TokenChunk]:
        try:
            chunks = self._source(add.workload, add.seed)
        except KeyError:
            raise ValueError(f"unknown workload {add.workload!r}") from None
        if not chunks or not isinstance(chunks[0], ic.TokenChunk):
            raise ValueError(f"workload {add.workload!r} is not a token stream")
        if add.max_tokens is not None:
            chunks = cut_stream(chunks, add.max_tokens)
        if add.model and add.model != chunks[0].model:
            chunks = [dataclasses.replace(c, model=add.model) for c in chunks]
        return chunks

    def _control(self, frontend: _Frontend, message: hop.RidMessage) -> None:
        request = frontend.requests.get(message.rid)
        if request is None:
            return  # it finished, or failed, while the message was on its way
        if message.kind == hop.ABORT:
            self._forget(request)
            self.core.abort(request.key)
            self.counters["requests_aborted"] += 1
        elif message.kind == hop.PAUSE:
            request.paused_by_frontend = True
            self.core.pause(request.key)
        else:
            request.paused_by_frontend = False
            if not frontend.outbox:
                self.core.resume(request.key)

    # -- outputs ---------------------------------------------------------------------------

    def _scheduled(self, keys: Sequence[str], step_ns: int) -> None:
        """The requests ``keys`` were prefilled by the step that started at ``step_ns``."""
        for key in keys:
            request = self._requests.get(key)
            if request is not None and not request.scheduled_ns:
                request.scheduled_ns = step_ns

    def _deliver(self, result: StepResult) -> None:
        per_frontend: dict[_Frontend, list[tuple[bytes, bytes]]] = {}
        stamps: dict[_Frontend, list[hop.EngineStamps]] = {}
        finished: list[_Request] = []
        perf = time.perf_counter_ns
        sent_ns = time.monotonic_ns()  # the step's modelled time is over: its outputs leave
        for output in result.outputs:
            request = self._requests.get(output.rid)
            if request is None or output.index < request.next_index:
                continue  # aborted while the step ran; or a chunk replayed after preemption
            request.next_index = output.index + 1
            if not request.first_token_ns:
                request.first_token_ns = sent_ns
            started = perf()
            data = request.encoder.encode(output.chunk)
            if output.finished:
                data += request.encoder.end()
            took = perf() - started
            request.encode_ns += took
            self.counters["encode_ns"] += took
            per_frontend.setdefault(request.frontend, []).append(
                (request.rid.encode("ascii"), data)
            )
            if output.finished:
                finished.append(request)
                if request.want_stamps:
                    stamps.setdefault(request.frontend, []).append(
                        hop.EngineStamps(
                            request.rid,
                            request.arrived_ns,
                            request.scheduled_ns or request.arrived_ns,
                            request.first_token_ns,
                            sent_ns,
                        )
                    )
        for frontend, items in per_frontend.items():
            self.counters["outputs_sent"] += len(items)
            self._send(frontend, hop.outputs(items, stamps.get(frontend, ())))
        for request in finished:
            self._forget(request)
            self.counters["requests_finished"] += 1
            if request.want_times:
                self._send(request.frontend, hop.end_stats(request.rid, self._times(request)))

    def _times(self, request: _Request) -> dict[str, float]:
        """The stage times of the module docstring, from the core's split (then forgotten)."""
        try:
            stamps = self.core.request_times(request.key)
        except KeyError:
            stamps = {}
        self.core.pop_record(request.key)
        times = {"encode_s": request.encode_ns / 1e9}
        for name in ("queue_s", "prefill_s", "decode_s"):
            if isinstance(stamps.get(name), float | int):
                times[name] = float(stamps[name])
        if isinstance(stamps.get("stall_s"), float | int):
            times["batch_wait_s"] = float(stamps["stall_s"])
        arrival = stamps.get("arrival_s")
        scheduled = stamps.get("first_scheduled_s")
        first = stamps.get("first_token_s")
        done = stamps.get("finished_s")
        if arrival is not None and scheduled is not None:
            times["first_scheduled_s"] = scheduled - arrival
        if arrival is not None and first is not None:
            times["ttft_s"] = first - arrival
        if arrival is not None and done is not None:
            times["engine_s"] = done - arrival
        return times

    def _forget(self, request: _Request) -> None:
        request.frontend.requests.pop(request.rid, None)
        self._requests.pop(request.key, None)

    def _fail(self, frontend: _Frontend, rid: str, kind: hop.ErrorKind, message: str) -> None:
        self._send(frontend, hop.failure(rid, kind, message))

    # -- sending ---------------------------------------------------------------------------

    def _send(self, frontend: _Frontend, frames: list[bytes]) -> None:
        """To ``frontend``, in order: behind its outbox if it has one."""
        frontend.last_sent_s = time.monotonic()
        if frontend.outbox:
            frontend.outbox.append(frames)
            return
        sent = self._try_send(frontend.identity, frames)
        if sent is None:
            self._drop(frontend, "disconnected")
        elif not sent:
            frontend.outbox.append(frames)
            self.counters["outbox_waits"] += 1
            for request in frontend.requests.values():
                self.core.pause(request.key)

    def _send_to(self, identity: bytes, frames: list[bytes]) -> None:
        """To a peer that may have no session (an answer to PING, STATS, a refusal)."""
        frontend = self._frontends.get(identity)
        if frontend is not None:
            self._send(frontend, frames)
        else:
            self._try_send(identity, frames)

    def _try_send(self, identity: bytes, frames: list[bytes]) -> bool | None:
        """True if sent, False if the peer's queue is full, None if ZeroMQ cannot route to
        it (ROUTER_MANDATORY: it disconnected)."""
        try:
            self.socket.send_multipart([identity, *frames], zmq.NOBLOCK)
        except zmq.Again:
            return False
        except zmq.ZMQError as exc:
            if exc.errno == zmq.EHOSTUNREACH:
                return None
            raise
        self.counters["messages_sent"] += 1
        return True

    def _flush(self) -> None:
        for frontend in list(self._frontends.values()):
            if not frontend.outbox:
                continue
            while frontend.outbox:
                sent = self._try_send(frontend.identity, frontend.outbox[0])
                if sent is None:
                    self._drop(frontend, "disconnected")
                    break
                if not sent:
                    break
                frontend.outbox.popleft()
            else:
                for request in frontend.requests.values():
                    if not request.paused_by_frontend:
                        self.core.resume(request.key)

    def _heartbeat(self) -> list[bytes]:
        stats = self.core.stats()
        return hop.heartbeat(
            self.session,
            waiting=int(stats.get("waiting", 0)),
            running=int(stats.get("running", 0)),
        )

    def _housekeeping(self, now_s: float) -> None:
        for frontend in list(self._frontends.values()):
            if now_s - frontend.last_heard_s > self.liveness_timeout_s:
                self._drop(frontend, f"not heard from for {self.liveness_timeout_s} s")
            elif not frontend.outbox and now_s - frontend.last_sent_s >= self.heartbeat_interval_s:
                self._send(frontend, self._heartbeat())

    def _drop(self, frontend: _Frontend, why: str) -> None:
        """Forget ``frontend``: abort its requests (their KV blocks are freed)."""
        if self._frontends.get(frontend.identity) is frontend:
            del self._frontends[frontend.identity]
        for request in list(frontend.requests.values()):
            self._forget(request)
            self.core.abort(request.key)
            self.counters["requests_aborted"] += 1
        frontend.outbox.clear()
        self.counters["frontends_dropped"] += 1
        self._log(f"frontend {frontend.number} {why}: its requests are aborted")

    def stats(self) -> hop.Stats:
        """The core's counters, the loop's, and the frontends and requests it holds."""
        stats: hop.Stats = {
            k: v for k, v in self.core.stats().items() if isinstance(v, int | float | str)
        }
        stats.update(self.counters)
        stats["frontends"] = len(self._frontends)
        stats["requests"] = len(self._requests)
        stats["session"] = self.session
        return stats


# -- the sockets of both ends ---------------------------------------------------------------


def configure(socket: zmq.Socket[Any], *, hwm: int = SOCKET_HWM) -> None:
    """The options both ends of the hop set: bounded queues, bounded messages, no linger."""
    socket.setsockopt(zmq.SNDHWM, hwm)
    socket.setsockopt(zmq.RCVHWM, hwm)
    socket.setsockopt(zmq.MAXMSGSIZE, hop.MAX_PART_BYTES)
    socket.setsockopt(zmq.LINGER, 0)
