"""``http2``: HTTP/2 with ``h2`` on both ends, h2c (prior knowledge) or TLS with ALPN ``h2``.

h2 is sans-IO; :mod:`.server` and :mod:`.client` are the socket loops around it, and
:mod:`.flow` the flow control both use, real in both directions (RFC 9113, section 5.2). The
routes are those of HTTP/1.1 (:mod:`inferwire.transports.httpapp`).
"""

from __future__ import annotations

from .client import Http2Client
from .flow import WINDOW_BYTES
from .server import (
    CLOSE_GRACE_S,
    CONTROL_BYTES_CAP,
    MAX_CONCURRENT_STREAMS,
    MAX_HANDLERS,
    MAX_HEADER_BLOCK_BYTES,
    MAX_HEADER_LIST_BYTES,
    MAX_IDLE_FRAMES,
    RESET_BURST,
    RESET_RATE_PER_S,
    Http2Server,
)

__all__ = [
    "CLOSE_GRACE_S",
    "CONTROL_BYTES_CAP",
    "MAX_CONCURRENT_STREAMS",
    "MAX_HANDLERS",
    "MAX_HEADER_BLOCK_BYTES",
    "MAX_HEADER_LIST_BYTES",
    "MAX_IDLE_FRAMES",
    "RESET_BURST",
    "RESET_RATE_PER_S",
    "WINDOW_BYTES",
    "Http2Client",
    "Http2Server",
]
