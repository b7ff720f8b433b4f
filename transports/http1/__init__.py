"""``http1``: HTTP/1.1 on asyncio streams, parsed by ``httptools`` (llhttp) at both ends:
:mod:`.server` serves the routes of :mod:`inferwire.transports.httpapp`; :mod:`.pool` is the
project's one HTTP/1.1 client (keep-alive connections to one origin), which :mod:`.client`
(inferwire's service over it) and the load generator's API targets send through."""

from __future__ import annotations

from .client import Http1Client
from .pool import HttpPool, Origin
from .server import KEEPALIVE_TIMEOUT_S, LINGER_IDLE_S, LINGER_S, MAX_HEADER_BYTES, Http1Server

__all__ = [
    "KEEPALIVE_TIMEOUT_S",
    "LINGER_IDLE_S",
    "LINGER_S",
    "MAX_HEADER_BYTES",
    "Http1Client",
    "Http1Server",
    "HttpPool",
    "Origin",
]
