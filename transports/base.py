"""One client interface for every transport, and the server side's common shape."""

from __future__ import annotations

import asyncio
import ssl
from abc import ABC, abstractmethod
from collections.abc import AsyncIterator, Awaitable, Callable
from types import TracebackType
from typing import TYPE_CHECKING, ClassVar

from inferwire.codecs import Codec, InferRequest, InferResponse, TokenChunk

from .common import BACKLOG, DEFAULT_LIMITS, Limits
from .service import GenerateRequest, SimulatedService
from .timing import StreamTiming
from .tls import ClientTls, ServerTls

if TYPE_CHECKING:
    from .metrics import ServerMetrics
    from .tracing import Tracer


class Client(ABC):
    """A connection (or pool) to one server, speaking one codec.

    ``generate`` yields the chunks of one stream in order and returns only after the stream's
    end marker; anything less raises a :class:`~inferwire.transports.TransportError`
    (:class:`StreamTruncatedError` when the connection ended mid-stream). Breaking out of the
    iteration early cancels the stream on the server.
    """

    transport: ClassVar[str]

    def __init__(
        self,
        host: str,
        port: int,
        codec: Codec,
        *,
        tls: ClientTls | None = None,
        limits: Limits = DEFAULT_LIMITS,
    ) -> None:
        self.host = host
        self.port = port
        self.codec = codec
        self.tls = tls
        self.ssl_context: ssl.SSLContext | None = tls.ssl_context() if tls else None
        self.limits = limits

    @abstractmethod
    async def infer(self, request: InferRequest) -> InferResponse: ...

    @abstractmethod
    def generate(
        self, request: GenerateRequest, *, timing: StreamTiming | None = None
    ) -> AsyncIterator[TokenChunk]:
        """The chunks of one stream; with ``timing``, also fill it with per-chunk stamps."""

    @abstractmethod
    async def close(self) -> None: ...

    async def __aenter__(self) -> Client:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()


class Server(ABC):
    """One transport's server for the simulated service. ``start`` binds (port 0: any free
    port; ``address`` then says which), ``serve_forever`` runs until cancelled. With
    ``metrics``, it records what it serves there (:mod:`inferwire.transports.metrics`)."""

    transport: ClassVar[str]

    def __init__(
        self,
        service: SimulatedService,
        codec: Codec,
        *,
        host: str = "127.0.0.1",
        port: int = 0,
        tls: ServerTls | None = None,
        limits: Limits = DEFAULT_LIMITS,
        metrics: ServerMetrics | None = None,
        tracer: Tracer | None = None,
    ) -> None:
        self.service = service
        self.tracer = tracer
        """Spans of each stream's stages (``--trace``, :mod:`.tracing`); None: untraced."""
        self.codec = codec
        self.metrics = metrics
        if metrics is not None:
            metrics.serve_models(service.models)
        self.host = host
        self.port = port
        self.tls = tls
        self.ssl_context: ssl.SSLContext | None = tls.ssl_context() if tls else None
        self.limits = limits
        self.address: tuple[str, int] | None = None
        self._server: asyncio.Server | None = None
        self._connections: set[asyncio.Task[None]] = set()

    @abstractmethod
    async def start(self) -> tuple[str, int]: ...

    async def serve_forever(self) -> None:
        if self._server is None:
            await self.start()
        assert self._server is not None
        await self._server.serve_forever()

    async def stop(self) -> None:
        """Stop listening and end every open connection (Python 3.11's ``Server.close``
        leaves them open)."""
        if self._server is not None:
            self._server.close()
        for task in list(self._connections):
            task.cancel()
        if self._connections:
            await asyncio.wait(list(self._connections), timeout=5.0)
        if self._server is not None:
            await self._server.wait_closed()

    def _track(self) -> None:
        """Called first by each connection's handler, so :meth:`stop` can end it."""
        task = asyncio.current_task()
        if task is not None:
            self._connections.add(task)
            task.add_done_callback(self._connections.discard)

    async def _serve_streams(
        self,
        handle: Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]],
        read_bytes: int,
    ) -> tuple[str, int]:
        """Listen with asyncio streams (``read_bytes``: the reader's buffer limit) and bind."""
        server = await asyncio.start_server(
            handle,
            self.host,
            self.port,
            ssl=self.ssl_context,
            limit=read_bytes,
            backlog=BACKLOG,
        )
        return self._bound(server)

    def _bound(self, server: asyncio.Server) -> tuple[str, int]:
        self._server = server
        sockname = server.sockets[0].getsockname()
        self.address = (sockname[0], sockname[1])
        return self.address
