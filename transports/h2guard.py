"""Limits on what an HTTP/2 peer may send, checked on the frame headers before h2 sees them.

h2 leaves these to the application:

* h2 buffers a whole frame before it compares its length with SETTINGS_MAX_FRAME_SIZE, so a
  header declaring 16 MiB would cost 16 MiB of buffer; here it is refused at its 9 bytes
  (RFC 9113, section 4.2: FRAME_SIZE_ERROR);
* h2 keeps up to 64 CONTINUATION frames of a header block (1 MiB of compressed headers) before
  it decodes any; here a block whose compressed size passes the limit is refused as it grows;
* frames that cost the server work but move no request forward (PING, SETTINGS, PRIORITY,
  empty DATA and CONTINUATION) are counted, and too many in a row end the connection
  (CVE-2019-9512 ping flood, CVE-2019-9518 empty frames flood; the limit is the shape of
  Envoy's ``max_consecutive_inbound_frames_with_empty_payload``).

Sans-IO: :meth:`FrameGuard.feed` takes the bytes as they arrive and raises a
:class:`~inferwire.transports.errors.PeerLimitError` that carries the GOAWAY code to send.
"""

from __future__ import annotations

import struct
from typing import Final

from .errors import HeaderBlockTooLargeError, IdleFloodError, PeerFrameTooLargeError

PREFACE: Final = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
FRAME_HEADER_BYTES: Final = 9

_DATA: Final = 0x0
_HEADERS: Final = 0x1
_PRIORITY: Final = 0x2
_SETTINGS: Final = 0x4
_PING: Final = 0x6
_CONTINUATION: Final = 0x9
_END_STREAM: Final = 0x1
_END_HEADERS: Final = 0x4
_HEADER: Final = struct.Struct(">HBBBL")  # 24-bit length as 16 + 8 bits, type, flags, stream


class FrameGuard:
    """Follows the frame boundaries of one connection's inbound bytes (server side: the
    client's preface first) and checks each frame header."""

    def __init__(
        self, *, max_frame_bytes: int, max_header_block_bytes: int, max_idle_frames: int
    ) -> None:
        self.max_frame_bytes = max_frame_bytes
        self.max_header_block_bytes = max_header_block_bytes
        self.max_idle_frames = max_idle_frames
        self.idle_frames = 0
        """Frames in a row that moved no request forward."""
        self.header_block_bytes = 0
        """Compressed bytes of the header block being received (HEADERS + CONTINUATION)."""
        self._preface_left = len(PREFACE)
        self._header = bytearray()
        self._payload_left = 0

    def feed(self, data: bytes) -> None:
        view = memoryview(data)
        if self._preface_left:  # h2 checks the preface's bytes; we only step over them
            skipped = min(self._preface_left, len(view))
            self._preface_left -= skipped
            view = view[skipped:]
        while view:
            if self._payload_left:
                skipped = min(self._payload_left, len(view))
                self._payload_left -= skipped
                view = view[skipped:]
                continue
            wanted = FRAME_HEADER_BYTES - len(self._header)
            self._header += view[:wanted]
            view = view[wanted:]
            if len(self._header) == FRAME_HEADER_BYTES:
                self._frame(bytes(self._header))
                self._header.clear()

    def _frame(self, header: bytes) -> None:
        length_high, length_low, frame_type, flags, _stream_id = _HEADER.unpack(header)
        length = length_high << 8 | length_low
        if length > self.max_frame_bytes:
            raise PeerFrameTooLargeError(
                f"a frame of {length} bytes, over SETTINGS_MAX_FRAME_SIZE {self.max_frame_bytes}"
            )
        self._payload_left = length
        if frame_type == _HEADERS:
            self.header_block_bytes = length
        elif frame_type == _CONTINUATION:
            self.header_block_bytes += length
        if self.header_block_bytes > self.max_header_block_bytes:
            raise HeaderBlockTooLargeError(
                f"a header block of over {self.max_header_block_bytes} compressed bytes"
            )
        if frame_type in (_PING, _SETTINGS, _PRIORITY):
            idle = True
        elif frame_type == _DATA:
            idle = length == 0 and not flags & _END_STREAM
        elif frame_type == _CONTINUATION:
            idle = length == 0 and not flags & _END_HEADERS
        elif frame_type == _HEADERS:
            idle = False
        else:  # RST_STREAM (the server counts those), WINDOW_UPDATE, GOAWAY: neither
            return
        if not idle:
            self.idle_frames = 0
            return
        self.idle_frames += 1
        if self.idle_frames > self.max_idle_frames:
            raise IdleFloodError(
                f"{self.idle_frames} frames in a row (PING, SETTINGS, PRIORITY, empty DATA) "
                "that moved no request forward"
            )
