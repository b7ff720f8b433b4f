"""``http2``: HTTP/2 with ``h2`` on both ends, h2c (prior knowledge) or TLS with ALPN ``h2``.

h2 is sans-IO; :mod:`.server` and :mod:`.client` are the socket loops around it, and
:mod:`.flow` the flow control both use, real in both directions (RFC 9113, section 5.2). The
routes are those of HTTP/1.1 (:mod:`inferwire.transports.httpapp`).

What bounds a small unary call (issue 15; cProfile of both ends and callgrind counts of one
call, both ends, against ``tcp``'s): h2 is pure Python, and a call costs each end one HEADERS
and one DATA frame out and in. Before, 1.87 M instructions a call on uvloop against 0.34 M for
``tcp`` (5.5x): HPACK encode and decode and h2's field checks were a third of h2's part, done
again on the same fields every call. Those are now remembered (:mod:`.hpack_cache`,
:mod:`.fields`): 1.28 M (3.8x; 3.1x on asyncio). h2 also formatted every frame it received for
its trace log, whatever the logger (:class:`.flow.Connection` skips it): 1.23 M (3.6x), and 5%
of the call's CPU time. The rest is h2's frame and stream machinery
(hyperframe frame objects, the stream state machine, flow-control windows, per-frame
serialization: h2 and hyperframe are about 55% of both ends' time), not the socket: one write
a call at each end, as ``tcp``.
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
