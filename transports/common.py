"""What every transport shares: limits, codec lookup, error bodies, and the one place where
socket-level exceptions become :class:`TransportError`."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import ssl
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass
from types import TracebackType
from typing import Any, Final

import orjson

import inferwire.codecs as ic

from .errors import (
    ConnectError,
    ProtocolError,
    ServiceUnavailableError,
    TransportError,
    TransportTimeoutError,
)

DEFAULT_MAX_MESSAGE_BYTES: Final = 64 * 1024 * 1024
"""Largest request or response body any transport accepts unless told otherwise (the codecs'
frame limit, and gRPC's receive limit raised from its 4 MiB default to fit the image tensors)."""

BACKLOG: Final = 1024
"""Listen backlog: asyncio's default of 100 drops connections when 100 clients connect at
once (the connection-setup benchmark does)."""

DEFAULT_TIMEOUT_S: Final = 30.0
"""Per read and per connect: generous, because a loaded 2-core machine can stall for seconds."""

DEFAULT_HEADER_TIMEOUT_S: Final = 10.0
"""A whole HTTP/1.1 request head, from its first byte: a total, not per read, so a client that
sends a byte a second (slowloris) is cut off (Apache's mod_reqtimeout allows 20-40 s, nginx's
client_header_timeout 60 s per read; ours is shorter because a head is a few hundred bytes)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Limits:
    max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES
    timeout_s: float = DEFAULT_TIMEOUT_S
    header_timeout_s: float = DEFAULT_HEADER_TIMEOUT_S


DEFAULT_LIMITS: Final = Limits()


def log_failure(log: logging.Logger, what: str, exc: BaseException) -> None:
    """A server's answer failed mid-way with ``exc`` (it goes on serving): one line when the
    service could not finish it (:class:`ServiceUnavailableError`: the engine's failure, already
    told to the client by the failed stream; an engine killed under load is hundreds of them),
    a traceback for anything else, which is this server's own fault."""
    if isinstance(exc, ServiceUnavailableError):
        log.warning("%s: %s", what, exc)
    else:
        log.error("%s", what, exc_info=exc)


def resolve_codec(codec: str | ic.Codec) -> ic.Codec:
    """The codec a transport's server or client speaks: ``codec``, or the one registered by
    that name with inferwire's extensions, the stream its clients check (seq, token ids)."""
    return ic.get(codec, extensions=True) if isinstance(codec, str) else codec


def error_detail(body: bytes) -> str:
    """The message of an :func:`~inferwire.serving.error_body` or of the Open Inference
    Protocol's error object (``{"error": "..."}``), or the body itself if it is neither."""
    try:
        obj = orjson.loads(body)
        error = obj["error"]
        return error if isinstance(error, str) else str(error["message"])
    except (orjson.JSONDecodeError, KeyError, TypeError):
        return body[:200].decode(errors="replace")


ErrorMap = Mapping[type[BaseException], type[TransportError]]
"""A transport's own foreign exceptions (its library's) and what each becomes."""


def translate(exc: Exception, what: str, errors: ErrorMap | None = None) -> Exception:
    """The package's own exception for a foreign one: ``errors`` (the transport's library)
    first, then what every transport meets (timeouts, TLS, a lost connection, bytes a codec
    refuses). An exception that is already ours, or that nothing maps, comes back as it is."""
    if isinstance(exc, TransportError):
        return exc
    for foreign, ours in (errors or {}).items():
        if isinstance(exc, foreign):
            return ours(f"{what}: {exc}")
    if isinstance(exc, TimeoutError):
        return TransportTimeoutError(f"{what}: timed out")
    if isinstance(exc, ssl.SSLError):
        return ConnectError(f"{what}: TLS: {exc}")
    if isinstance(exc, (ConnectionError, OSError, asyncio.IncompleteReadError, EOFError)):
        return ProtocolError(f"{what}: connection lost: {exc!r}")
    if isinstance(exc, ic.CodecError):
        return ProtocolError(f"{what}: {exc}")
    return exc


class map_exceptions:  # noqa: N801 (used as a function: ``with map_exceptions(...)``)
    """The one boundary where a transport's foreign exceptions become
    :class:`TransportError` (``raise ... from`` the original), as httpcore's
    ``map_exceptions``: ``errors`` names the transport library's own, :func:`translate` adds
    the socket's and the codec's. Anything else (a cancellation, a bug) passes unchanged.

    A class rather than a ``contextlib.contextmanager`` generator: it sits on every read of
    every client, where a generator's set-up costs about five times as much."""

    __slots__ = ("errors", "what")

    def __init__(self, what: str, errors: ErrorMap | None = None) -> None:
        self.what = what
        self.errors = errors

    def __enter__(self) -> None:
        return None

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if isinstance(exc, Exception):
            ours = translate(exc, self.what, self.errors)
            if ours is not exc:
                raise ours from exc


async def connect_tcp(
    host: str, port: int, *, ssl_context: ssl.SSLContext | None, timeout_s: float, **kw: Any
) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    try:
        return await asyncio.wait_for(
            asyncio.open_connection(
                host,
                port,
                ssl=ssl_context,
                server_hostname=host if ssl_context else None,
                **kw,
            ),
            timeout_s,
        )
    except OSError as exc:  # TLS and timeouts included: before a connection, all are ConnectError's
        if isinstance(exc, TimeoutError):
            raise TransportTimeoutError(f"connect to {host}:{port}: timed out") from exc
        raise ConnectError(f"connect to {host}:{port}: {exc}") from exc


async def aclose_quietly(writer: asyncio.StreamWriter) -> None:
    with contextlib.suppress(Exception):
        writer.close()
        await asyncio.wait_for(writer.wait_closed(), 2.0)


async def aiter_close(iterator: AsyncIterator[Any]) -> None:
    aclose = getattr(iterator, "aclose", None)
    if aclose is not None:
        with contextlib.suppress(Exception):
            await aclose()
