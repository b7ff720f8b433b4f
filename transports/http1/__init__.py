"""``http1``: HTTP/1.1 on asyncio streams, parsed by ``httptools`` (llhttp) at both ends:
:mod:`.server` serves the routes of :mod:`inferwire.transports.httpapp`, :mod:`.client` is a
keep-alive pool (or one connection per request)."""

from __future__ import annotations

from .client import Http1Client
from .server import KEEPALIVE_TIMEOUT_S, LINGER_IDLE_S, LINGER_S, MAX_HEADER_BYTES, Http1Server

__all__ = [
    "KEEPALIVE_TIMEOUT_S",
    "LINGER_IDLE_S",
    "LINGER_S",
    "MAX_HEADER_BYTES",
    "Http1Client",
    "Http1Server",
]
