"""h2's checks of received header fields, run by the socket loops with a memory of lists that
passed.

h2 checks every received field list (RFC 9113, sections 8.2 and 8.3: no uppercase or illegal
characters, no connection-specific fields, the pseudo-header rules, :authority against Host)
through a chain of seven generators: a seventh of h2's instructions in a small unary call, and
the same verdict for the same list each time. So both ends run h2 with
``validate_inbound_headers`` and ``normalize_inbound_headers`` off and call h2's own functions
here instead (the same rules, h2's code), remembering the lists that passed. A list that fails
raises h2's ``ProtocolError`` as before; the caller ends the connection with PROTOCOL_ERROR, as
h2 does when its own check fails (h2 treats a malformed field list as a connection error).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Final

from h2.utilities import HeaderValidationFlags, normalize_inbound_headers, validate_headers

REMEMBERED_LISTS: Final = 32
"""Lists kept per connection; past that the memory is cleared (bounded against a peer that
sends a new list each time)."""

Fields = tuple[tuple[bytes, bytes], ...]


class InboundFields:
    """The checks h2 would run on one connection's received field lists, with memory."""

    __slots__ = ("_flags", "_passed")

    def __init__(self, *, client_side: bool) -> None:
        # h2's flags (H2Stream._build_hdr_validation_flags): a client receives responses,
        # informational responses and trailers; a server requests and trailers; no push
        self._flags = {
            trailer: HeaderValidationFlags(
                is_client=client_side,
                is_trailer=trailer,
                is_response_header=client_side and not trailer,
                is_push_promise=False,
            )
            for trailer in (False, True)
        }
        self._passed: dict[tuple[bool, Fields], Fields] = {}

    def check(self, headers: Iterable[tuple[bytes, bytes]] | None, *, trailer: bool) -> Fields:
        """The fields as h2 would hand them over (cookies joined); raises
        ``h2.exceptions.ProtocolError`` for a list h2 would refuse."""
        received = tuple(headers or ())
        key = (trailer, received)
        passed = self._passed.get(key)
        if passed is not None:
            return passed
        flags = self._flags[trailer]
        passed = tuple(validate_headers(normalize_inbound_headers(received, flags), flags))
        if len(self._passed) >= REMEMBERED_LISTS:
            self._passed.clear()
        self._passed[key] = passed
        return passed
