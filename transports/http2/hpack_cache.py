"""HPACK with a memory of header blocks that leave the dynamic table as it was.

h2 encodes every HEADERS frame's field list and decodes every one it receives in pure Python
(hpack), once per request on each end: the largest single cost of a small unary call after
frame handling (a third of h2's instructions per call). A unary client sends the same fields
with every request, and a server answers most of them with the same fields, so after the first
exchange both ends keep encoding and decoding the same blocks.

Whether a block may be reused follows from RFC 7541: only a literal with incremental indexing
(section 6.2.1) and a dynamic table size update (6.3) change the dynamic table; an indexed field
(6.1) and a literal without indexing or never indexed (6.2.2, 6.2.3) leave it as it was. A
block made of those three alone is *table-neutral*: it decodes to the same list, and the same
list encodes to it, for as long as the table does not change. The table changes only through
the encoder or decoder that holds it, so each subclass below keeps the blocks it has seen that
were neutral, and forgets them all whenever a block that was not neutral passes through it, or
the table's size or the list size limit is set (h2 does so on SETTINGS; a pending size update
is then emitted by hpack itself, at the start of the next block, as section 4.2 requires).

Everything else goes to hpack unchanged: the first blocks of a connection (literals that fill
the table), any block a peer made differently, malformed blocks (hpack raises as before, and
h2 turns that into COMPRESSION_ERROR), and the header list size limit (a block is kept only
after hpack decoded it within the limit, and forgotten when the limit changes).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, Final

import hpack

DEFAULT_MAX_HEADER_LIST_BYTES: Final = 2**16
"""hpack's own default (``hpack.hpack.DEFAULT_MAX_HEADER_LIST_SIZE``); h2 sets its own."""
CACHED_BLOCKS: Final = 32
"""Blocks each end keeps: a few distinct requests or answers per connection. Past that the
memory is cleared, so a peer sending ever-new blocks costs a bounded dictionary."""
CACHED_BLOCK_BYTES: Final = 512
"""Longest block kept (the fields of a small unary call are under 100 bytes once indexed); a
longer one is neither scanned nor kept."""


MAX_INTEGER_BYTES: Final = 4
"""Continuation bytes of an integer read here: 28 bits, past any length a kept block holds."""


def _integer(block: bytes, at: int, prefix_bits: int) -> tuple[int, int]:
    """The integer that starts at ``at`` with an N-bit prefix (RFC 7541, 5.1) and the offset
    after it; (-1, -1) if the block ends inside it or it is longer than a kept block needs."""
    mask = (1 << prefix_bits) - 1
    value = block[at] & mask
    at += 1
    if value != mask:
        return value, at
    for shift in range(0, 7 * MAX_INTEGER_BYTES, 7):
        if at >= len(block):
            break
        byte = block[at]
        at += 1
        value += (byte & 0x7F) << shift
        if not byte & 0x80:
            return value, at
    return -1, -1


def _string_end(block: bytes, at: int) -> int:
    """The offset after the string literal that starts at ``at`` (5.2), or -1."""
    if at >= len(block):
        return -1
    length, at = _integer(block, at, 7)
    if at < 0 or at + length > len(block):
        return -1
    return at + length


def table_neutral(block: bytes) -> bool:
    """Whether ``block`` is made only of representations that leave the dynamic table as it
    was (6.1, 6.2.2, 6.2.3) and parses to its end; False for anything else, malformed
    blocks included (hpack judges those)."""
    at = 0
    size = len(block)
    while at < size:
        first = block[at]
        if first & 0x80:  # 6.1 indexed header field
            at = _integer(block, at, 7)[1]
        elif first & 0xE0 == 0:  # 6.2.2 without indexing (0000xxxx), 6.2.3 never (0001xxxx)
            name_index, at = _integer(block, at, 4)
            if at >= 0 and name_index == 0:  # a literal name, then the value
                at = _string_end(block, at)
            if at >= 0:
                at = _string_end(block, at)
        else:  # 6.2.1 incremental indexing (01xxxxxx) or 6.3 size update (001xxxxx)
            return False
        if at < 0:
            return False
    return True


_PLAIN: Final = {tuple}


class CachingEncoder(hpack.Encoder):
    """hpack's encoder; a field list it encoded into a table-neutral block is answered from
    memory until the table changes. Only lists of plain tuples are remembered: a
    ``NeverIndexedHeaderTuple`` compares equal to a plain tuple but must not be indexed (a
    plain 3-tuple ``(name, value, sensitive)`` is its own key)."""

    def __init__(self) -> None:
        self._blocks: dict[tuple[Any, ...], bytes] = {}
        super().__init__()

    @property
    def header_table_size(self) -> int:
        return self.header_table.maxsize

    @header_table_size.setter
    def header_table_size(self, value: int) -> None:
        self._blocks.clear()  # hpack owes the peer a size update: its next block says so
        hpack.Encoder.header_table_size.fset(self, value)  # type: ignore[attr-defined]

    def encode(self, headers: Any, huffman: bool = True) -> bytes:
        key: tuple[Any, ...] | None = None
        if type(headers) is list and set(map(type, headers)) == _PLAIN:
            key = (huffman, *headers)
            block = self._blocks.get(key)
            if block is not None:
                return block
        block = super().encode(headers, huffman)
        if not table_neutral(block):
            self._blocks.clear()  # the table changed: what was remembered may not hold
        elif key is not None and len(block) <= CACHED_BLOCK_BYTES:
            if len(self._blocks) >= CACHED_BLOCKS:
                self._blocks.clear()
            self._blocks[key] = block
        return block


class CachingDecoder(hpack.Decoder):
    """hpack's decoder; a table-neutral block it decoded is answered from memory (a new list
    of the same fields) until the table or a limit changes."""

    def __init__(self, max_header_list_size: int = DEFAULT_MAX_HEADER_LIST_BYTES) -> None:
        self._lists: dict[tuple[bool, bytes], tuple[hpack.HeaderTuple, ...]] = {}
        self._max_header_list_size = max_header_list_size
        self._max_allowed_table_size = 0
        super().__init__(max_header_list_size)

    @property
    def max_header_list_size(self) -> int:
        return self._max_header_list_size

    @max_header_list_size.setter
    def max_header_list_size(self, value: int) -> None:
        self._lists.clear()
        self._max_header_list_size = value

    @property
    def max_allowed_table_size(self) -> int:
        return self._max_allowed_table_size

    @max_allowed_table_size.setter
    def max_allowed_table_size(self, value: int) -> None:
        self._lists.clear()
        self._max_allowed_table_size = value

    @property
    def header_table_size(self) -> int:
        return self.header_table.maxsize

    @header_table_size.setter
    def header_table_size(self, value: int) -> None:
        self._lists.clear()
        self.header_table.maxsize = value

    def decode(self, data: bytes, raw: bool = False) -> Iterable[hpack.HeaderTuple]:
        block = bytes(data)
        key = (raw, block)
        known = self._lists.get(key)
        if known is not None:
            return list(known)
        neutral = len(block) <= CACHED_BLOCK_BYTES and table_neutral(block)
        if not neutral:
            self._lists.clear()  # before hpack: a block that fails half-way may change the table
        headers = list(super().decode(block, raw))
        if neutral:
            if len(self._lists) >= CACHED_BLOCKS:
                self._lists.clear()
            self._lists[key] = tuple(headers)
        return headers
