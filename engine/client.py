"""The frontend's end of the hop: a ZeroMQ DEALER on the frontend's asyncio loop
(``zmq.asyncio``; asyncio's own loop or uvloop).

    client = EngineClient("ipc:///tmp/engine.sock", hop_codec("msgspec-msgpack"))
    await client.start()
    stream = await client.open_stream(hop.Add(rid="", workload="stream-256"))
    while batch := await stream.next_batch(32):
        ...
    await client.close()

Per request the client holds the hop codec's stream decoder, fed each frame of the engine's
OUTPUTS messages: a stream is complete only when the codec's end marker arrived and the
decoder closes cleanly (and, when asked, its END_STATS came); every other end is a typed
error (:mod:`inferwire.engine.hop`): :class:`EngineGoneError` when the engine's connection
closes (at once: see below), its process exits (``process`` given), it stops answering
(nothing heard for ``liveness_timeout_s``: it sends a heartbeat every ~0.15 s and answers the
client's pings) or restarts (a new session);
:class:`EngineOverloadedError` when its waiting queue is full; :class:`StreamFailedError` when
hop bytes do not decode.

Backpressure: each stream's decoded chunks wait in a queue for the consumer; at
``high_water`` chunks the client sends PAUSE (the engine parks the request, keeping its KV
blocks) and below ``low_water`` RESUME, so a slow client never makes the frontend buffer a
whole stream, and nothing is lost or reordered. The socket's high-water marks bound what
ZeroMQ queues either way.

A closed engine socket is noticed at once: the client watches its socket's ZeroMQ monitor for
``EVENT_DISCONNECTED``, which the kernel's end of the connection (a FIN or a reset on tcp, the
peer's close on ipc) raises however the engine ended: a clean exit, a crash, SIGKILL, on this
host or another whose kernel is alive. The other two ways were weighed: a goodbye sent by the
engine on shutdown says nothing when it is killed or crashes (the case that matters: streams
were cut), and watching the engine's process works only when this frontend started it
(``process``; kept, as it names the exit status). What none of them sees, a host that vanished
or a network that dropped packets, the liveness timeout still catches.

After the engine dies, the client keeps pinging; when an engine answers (ZeroMQ reconnects by
itself) it says HELLO again and new streams work. :meth:`EngineClient.stats` holds what a
benchmark reads: ``decode_ns``, the time spent in the hop codec's decoder (``perf_counter_ns``
around each ``feed``), and ``chunks_decoded``.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import secrets
import subprocess
import time
from collections import deque
from typing import Final

import msgspec
import zmq
import zmq.asyncio
from zmq.utils.monitor import parse_monitor_message

import inferwire.codecs as ic
from inferwire.codecs.framing import StreamDecoder

from . import hop
from .loop import SOCKET_HWM, configure

PING_INTERVAL_S: Final = 0.15
LIVENESS_TIMEOUT_S: Final = 5.0
HIGH_WATER: Final = 256
LOW_WATER: Final = 64
_PING_BACKLOG: Final = 16
_log = logging.getLogger(__name__)


class EngineStream:
    """One request's stream of chunks from the engine: :meth:`next_batch` until it returns an
    empty list (the stream ended whole) or raises (it did not)."""

    __slots__ = (
        "_chunks",
        "_client",
        "_ended",
        "_error",
        "_wakeup",
        "decode_ns",
        "decoder",
        "paused",
        "request",
        "stage_times",
        "stamps",
    )

    def __init__(self, client: EngineClient, request: hop.Add) -> None:
        self._client = client
        self.request = request
        self.decoder: StreamDecoder[ic.TokenChunk] = client.codec.stream_decoder(
            max_frame_bytes=hop.MAX_PART_BYTES
        )
        self._chunks: deque[ic.TokenChunk] = deque()
        self._wakeup = asyncio.Event()
        self._error: BaseException | None = None
        self._ended = False
        self.paused = False
        self.stage_times: dict[str, float] | None = None
        """The engine's stage times (END_STATS), when the request asked for them."""
        self.stamps: hop.EngineStamps | None = None
        """The engine's stamps of this request (``want_stamps``), set before its last chunk
        is pushed."""
        self.decode_ns = 0
        """Time this stream's frames spent in the hop codec's decoder, ns."""

    @property
    def rid(self) -> str:
        return self.request.rid

    @property
    def done(self) -> bool:
        """Whether the stream ended, whole or not (chunks may still wait to be taken)."""
        return self._ended or self._error is not None

    async def next_batch(self, max_chunks: int) -> list[ic.TokenChunk]:
        """Up to ``max_chunks`` chunks, waiting for one; ``[]`` once the stream ended whole.
        Raises the stream's :class:`~inferwire.engine.hop.HopError` once its chunks are
        taken."""
        chunks = self._chunks
        while not chunks:
            if self._error is not None:
                raise self._error
            if self._ended:
                return []
            self._wakeup.clear()
            await self._wakeup.wait()
        if len(chunks) <= max_chunks:
            batch = list(chunks)
            chunks.clear()
        else:
            batch = [chunks.popleft() for _ in range(max_chunks)]
        if self.paused and len(chunks) <= self._client.low_water:
            self._client._resume(self)
        return batch

    def abort(self) -> None:
        """The consumer went away: the engine is told to drop the request (a no-op once the
        stream ended)."""
        self._client._abort(self)

    # -- what the client's receiver tells it --

    def _push(self, chunks: list[ic.TokenChunk]) -> None:
        self._chunks.extend(chunks)
        self._wakeup.set()
        if not self.paused and len(self._chunks) >= self._client.high_water:
            self._client._pause(self)

    def _end(self) -> None:
        self._ended = True
        self._wakeup.set()

    def _fail(self, error: BaseException) -> None:
        if not self.done:
            self._error = error
            self._wakeup.set()


class EngineClient:
    """A frontend's connection to the engine at ``endpoint``, speaking ``codec`` on the hop
    (the engine must speak the same; see :mod:`inferwire.engine.hop_codecs`). ``process``: the
    engine's process when this frontend started it, so its exit is noticed at once."""

    def __init__(
        self,
        endpoint: str,
        codec: ic.Codec,
        *,
        liveness_timeout_s: float = LIVENESS_TIMEOUT_S,
        ping_interval_s: float = PING_INTERVAL_S,
        high_water: int = HIGH_WATER,
        low_water: int = LOW_WATER,
        hwm: int = SOCKET_HWM,
        process: subprocess.Popen[str] | subprocess.Popen[bytes] | None = None,
    ) -> None:
        if not 0 <= low_water < high_water:
            raise ValueError("low_water must be below high_water")
        self.endpoint = endpoint
        self.codec = codec
        self.liveness_timeout_s = liveness_timeout_s
        self.ping_interval_s = ping_interval_s
        self.high_water = high_water
        self.low_water = low_water
        self.process = process
        self.session = secrets.token_hex(8)
        """This frontend's session: the engine forgets an older session's requests."""
        self.engine_session: str | None = None
        """The session of the engine that welcomed this client (None while there is none)."""
        self._hwm = hwm
        self._context: zmq.asyncio.Context | None = None
        self._socket: zmq.asyncio.Socket | None = None
        self._monitor: zmq.asyncio.Socket | None = None
        self._streams: dict[str, EngineStream] = {}
        self._outbox: asyncio.Queue[list[bytes]] = asyncio.Queue()
        self._tasks: list[asyncio.Task[None]] = []
        self._welcomed = asyncio.Event()
        self._refused: hop.HopRefusedError | None = None
        self._last_heard_s = time.monotonic()
        self._ids = itertools.count(1)
        self._stats_waiters: deque[asyncio.Future[hop.Stats]] = deque()
        self.decode_ns = 0
        """Time spent in the hop codec's stream decoders, ns (what the hop costs this side)."""
        self.counters: dict[str, int] = dict.fromkeys(
            (
                "chunks_decoded",
                "frames_decoded",
                "streams_opened",
                "streams_failed",
                "pauses",
                "resumes",
                "engine_lost",
                "protocol_errors",
            ),
            0,
        )

    # -- lifetime --

    async def start(self) -> EngineClient:
        """Connects (ZeroMQ connects in the background and reconnects by itself) and says
        HELLO; does not wait for the engine: :meth:`open_stream` does."""
        self._context = zmq.asyncio.Context()
        socket = self._context.socket(zmq.DEALER)
        configure(socket, hwm=self._hwm)
        # before connect: a connection that fails at once is still seen
        self._monitor = socket.get_monitor_socket(zmq.EVENT_DISCONNECTED)
        socket.connect(self.endpoint)
        self._socket = socket
        self._last_heard_s = time.monotonic()
        self._send(hop.hello(self.session, self.codec.name))
        self._tasks = [
            asyncio.ensure_future(self._sender()),
            asyncio.ensure_future(self._receiver()),
            asyncio.ensure_future(self._pinger()),
            asyncio.ensure_future(self._watcher()),
        ]
        return self

    async def close(self) -> None:
        """Fails the open streams (:class:`EngineGoneError`; the engine drops their requests
        when the connection goes), stops the tasks and closes the socket."""
        for stream in list(self._streams.values()):
            stream._fail(hop.EngineGoneError("the frontend's engine client closed"))
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        self._tasks = []
        if self._socket is not None:
            if self._monitor is not None:
                self._socket.disable_monitor()
                self._monitor.close(linger=0)
                self._monitor = None
            self._socket.close(linger=0)
            self._socket = None
        if self._context is not None:
            self._context.term()
            self._context = None

    async def __aenter__(self) -> EngineClient:
        return await self.start()

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()

    @property
    def ready(self) -> bool:
        """Whether an engine has welcomed this client and has not been lost since (what a
        frontend's health route answers)."""
        return self.engine_session is not None and self._refused is None

    # -- requests --

    async def wait_ready(self, timeout_s: float | None = None) -> None:
        """Until an engine has welcomed this client. Raises :class:`HopRefusedError` if it
        refused it, :class:`EngineGoneError` at once if the engine's process (``process``)
        exited, else after ``timeout_s`` (the liveness timeout by default)."""
        if self._refused is not None:
            raise self._refused
        if self._welcomed.is_set():
            return
        if self.process is not None and self.process.poll() is not None:
            raise hop.EngineGoneError(f"the engine process exited ({self.process.returncode})")
        wait_s = self.liveness_timeout_s if timeout_s is None else timeout_s
        try:
            async with asyncio.timeout(wait_s):
                await self._welcomed.wait()
        except TimeoutError:
            if self._refused is not None:
                raise self._refused from None
            raise hop.EngineGoneError(
                f"no engine answered at {self.endpoint} within {wait_s} s"
            ) from None
        if self._refused is not None:
            raise self._refused

    async def open_stream(self, request: hop.Add) -> EngineStream:
        """Sends ``request`` (its ``rid`` is replaced by a fresh one) and returns its stream,
        once an engine is there (see :meth:`wait_ready`)."""
        await self.wait_ready()
        request = msgspec.structs.replace(request, rid=format(next(self._ids), "x"))
        stream = EngineStream(self, request)
        self._streams[request.rid] = stream
        self.counters["streams_opened"] += 1
        self._send(hop.add(request))
        return stream

    async def engine_stats(self, timeout_s: float = 5.0) -> hop.Stats:
        """The engine's counters (its STATS answer). Raises :class:`EngineGoneError` when it
        does not answer within ``timeout_s``."""
        waiter: asyncio.Future[hop.Stats] = asyncio.get_running_loop().create_future()
        self._stats_waiters.append(waiter)
        self._send(hop.stats_query())
        try:
            async with asyncio.timeout(timeout_s):
                return await waiter
        except TimeoutError:
            raise hop.EngineGoneError(f"the engine did not answer STATS in {timeout_s} s") from None
        finally:
            with contextlib.suppress(ValueError):
                self._stats_waiters.remove(waiter)

    def stats(self) -> dict[str, int]:
        """This side's counters: ``decode_ns`` (hop decode time), ``chunks_decoded``, streams
        opened, failed and open, PAUSE and RESUME sent, times the engine was lost."""
        return {
            "decode_ns": self.decode_ns,
            **self.counters,
            "open_streams": len(self._streams),
        }

    # -- what streams ask --

    def _pause(self, stream: EngineStream) -> None:
        stream.paused = True
        self.counters["pauses"] += 1
        self._send(hop.rid_message(hop.PAUSE, stream.rid))

    def _resume(self, stream: EngineStream) -> None:
        stream.paused = False
        if stream.rid in self._streams:
            self.counters["resumes"] += 1
            self._send(hop.rid_message(hop.RESUME, stream.rid))

    def _abort(self, stream: EngineStream) -> None:
        if self._streams.pop(stream.rid, None) is not None:
            stream._fail(hop.HopError("aborted by the frontend"))
            self._send(hop.rid_message(hop.ABORT, stream.rid))

    # -- the tasks --

    def _send(self, frames: list[bytes]) -> None:
        self._outbox.put_nowait(frames)

    async def _sender(self) -> None:
        assert self._socket is not None
        send = self._socket.send_multipart
        while True:
            frames = await self._outbox.get()
            await send(frames)

    async def _receiver(self) -> None:
        assert self._socket is not None
        receive = self._socket.recv_multipart
        while True:
            frames = await receive()
            self._last_heard_s = time.monotonic()
            try:
                message = hop.parse_from_engine(frames)
            except hop.HopProtocolError as exc:
                # the engine is the only peer: a message lost to garbage may be any stream's
                self.counters["protocol_errors"] += 1
                self._fail_all(
                    hop.StreamFailedError(f"the engine sent an unreadable message: {exc}")
                )
                continue
            self._on_message(message)

    async def _watcher(self) -> None:
        """The socket monitor's EVENT_DISCONNECTED: the engine's end of the connection closed
        (see the module docstring). ZeroMQ reconnects by itself; a new engine is greeted when
        it answers a ping."""
        assert self._monitor is not None
        receive = self._monitor.recv_multipart
        while True:
            event = parse_monitor_message(await receive())
            if event["event"] == zmq.EVENT_DISCONNECTED and (
                self.engine_session is not None or self._streams
            ):
                self._lost("the engine closed its connection")

    async def _pinger(self) -> None:
        while True:
            await asyncio.sleep(self.ping_interval_s)
            if self._outbox.qsize() < _PING_BACKLOG:  # a dead engine reads none of them
                self._send(hop.ping())
            if self.process is not None and self.process.poll() is not None:
                self._lost(f"the engine process exited ({self.process.returncode})")
            elif (
                self.engine_session is not None
                and time.monotonic() - self._last_heard_s > self.liveness_timeout_s
            ):
                self._lost(f"nothing heard from the engine for {self.liveness_timeout_s} s")

    # -- messages from the engine --

    def _on_message(self, message: hop.EngineMessage) -> None:
        if isinstance(message, hop.Outputs):
            for stamps in message.stamps:
                stream = self._streams.get(stamps.rid)
                if stream is not None:
                    stream.stamps = stamps
            self._outputs(message.items)
        elif isinstance(message, hop.Heartbeat):
            if message.session != self.engine_session:
                if self.engine_session is not None:
                    self._lost("the engine restarted")
                self._send(hop.hello(self.session, self.codec.name))
        elif isinstance(message, hop.StageTimes):
            stream = self._streams.pop(message.rid, None)
            if stream is not None:
                stream.stage_times = dict(message.times)
                stream._end()
        elif isinstance(message, hop.Failure):
            self._failure(message)
        elif isinstance(message, hop.Welcome):
            if self.engine_session is not None and message.session != self.engine_session:
                self._lost("the engine restarted")
            self.engine_session = message.session
            self._refused = None
            self._welcomed.set()
        else:
            if self._stats_waiters:
                waiter = self._stats_waiters.popleft()
                if not waiter.done():
                    waiter.set_result(message)

    def _outputs(self, items: list[tuple[str, bytes]]) -> None:
        perf = time.perf_counter_ns
        for rid, frame in items:
            stream = self._streams.get(rid)
            if stream is None:
                continue  # aborted by the frontend while the frame was on its way
            decoder = stream.decoder
            started = perf()
            try:
                chunks = decoder.feed(frame)
                finished = decoder.finished
                if finished:
                    decoder.close()
            except ic.CodecError as exc:
                took = perf() - started
                self.decode_ns += took
                stream.decode_ns += took
                self._streams.pop(rid, None)
                self._send(hop.rid_message(hop.ABORT, rid))
                self.counters["streams_failed"] += 1
                stream._fail(hop.StreamFailedError(f"stream {rid}: {exc}"))
                continue
            took = perf() - started
            self.decode_ns += took
            stream.decode_ns += took
            self.counters["frames_decoded"] += 1
            self.counters["chunks_decoded"] += len(chunks)
            stream._push(chunks)
            if finished and not stream.request.want_stage_times:
                del self._streams[rid]
                stream._end()

    def _failure(self, failure: hop.Failure) -> None:
        if not failure.rid:
            if failure.kind == "refused":
                self._refused = hop.HopRefusedError(failure.message)
                self._welcomed.set()  # wakes the waiters, who raise it
            else:
                self.counters["protocol_errors"] += 1
                _log.warning("the engine answered: %s: %s", failure.kind, failure.message)
            return
        stream = self._streams.pop(failure.rid, None)
        if stream is None:
            return
        error: hop.HopError
        if failure.kind == "overloaded":
            error = hop.EngineOverloadedError(failure.message)
        elif failure.kind == "bad-request":
            error = hop.EngineRequestError(failure.message)
        elif failure.kind == "unknown-frontend":
            error = hop.EngineGoneError(
                f"the engine does not know this frontend: {failure.message}"
            )
            self._welcomed.clear()
            self.engine_session = None
            self._send(hop.hello(self.session, self.codec.name))
        else:
            error = hop.StreamFailedError(f"{failure.kind}: {failure.message}")
        self.counters["streams_failed"] += 1
        stream._fail(error)

    def _lost(self, why: str) -> None:
        """The engine is gone: every open stream fails; a later engine is greeted anew, in a
        new session, so an engine that was only silent (paused, swapping) drops the requests
        of the old one rather than play them to nobody."""
        self.counters["engine_lost"] += 1
        self.engine_session = None
        self.session = secrets.token_hex(8)
        self._welcomed.clear()
        self._fail_all(hop.EngineGoneError(why))

    def _fail_all(self, error: hop.HopError) -> None:
        streams, self._streams = self._streams, {}
        for stream in streams.values():
            self.counters["streams_failed"] += 1
            stream._fail(type(error)(str(error)))  # one exception object per stream
