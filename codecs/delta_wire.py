"""The delta codec's wire format: the bytes, and what both directions share to write and read them.

A stream of :class:`TokenChunk` repeats its id, model, created time and choice index in every
message; this codec sends them once. Byte by byte:

Header (first bytes of a stream)::

    0x00                 magic byte (the Confluent wire convention)
    4 bytes              schema id, big-endian: the registry resolves it to the writer's
                         schema (``schemas/delta_v*.proto``)
    varint N, N bytes    a ``Header`` message: id, model, created, index, base_seq

Each chunk::

    varint L + 1         frame length plus one (0 is the end marker)
    L bytes              a ``Frame`` message, protobuf wire format:
      08 <varint>          seq - base_seq: absolute, so a duplicated frame cannot pass as the
                           next one (a delta from the previous frame could)
      12 <len> <varints>   token ids, packed
      18 <varint>          text ref: k > 0 is entry k - 1 of the stream's string table
      22 <len> <utf-8>     text, when sent literally (it then joins the table)
      28 01                has_logprobs (absent: no logprobs; present with none: empty)
      32 <len> <Logprob>   per token: token ref or literal, logprob (double, exact), whether
                           top[0] repeats the token, then the other top refs/literals and
                           their logprobs (packed doubles)
      3a <len> <utf-8>     finish reason, on the last frame
      42 <len> <Usage>     usage (schema version 2), on the last frame

End::

    00 <varint>          end marker and the number of chunks sent, which the decoder checks

The string table: a literal of 1 to 32 characters joins the table (up to 4,096 entries per
stream) in the order the frame lists strings: the text, then per logprob its token and its top
alternatives. Word pieces repeat (Zipf), so most strings after the first few frames cost one
or two bytes.

Unary ``encode``/``decode`` carry one chunk as a header and one frame.

Logprobs travel as decimals where one is exact (``mantissa / 10**scale``, mantissa zigzag), else
as doubles: :func:`to_decimal` and :func:`from_decimal` are the two directions of that rule.
"""

from __future__ import annotations

import struct
from importlib import resources
from typing import Final

from .errors import DecodeError
from .schema_registry import Schema, SchemaRegistry

__all__ = [
    "DELTA_V1",
    "DELTA_V2",
    "MAGIC",
    "MAX_EXACT",
    "MAX_INTERNED_CHARS",
    "MAX_SCALE",
    "MAX_TABLE_ENTRIES",
    "SCHEMA_ID",
    "SUBJECT",
    "UINT32",
    "StringTable",
    "default_registry",
    "from_decimal",
    "to_decimal",
]

MAGIC: Final = 0
SUBJECT: Final = "inferwire.delta"
MAX_TABLE_ENTRIES: Final = 4096
MAX_INTERNED_CHARS: Final = 32
SCHEMA_ID: Final = struct.Struct(">I")
"""The header's schema id, after the magic byte."""
UINT32: Final = 1 << 32
"""One past the largest token id, index and usage count the schema's uint32 fields carry."""


def _schema_file(name: str) -> Schema:
    return Schema(resources.files("inferwire.schemas").joinpath(name).read_bytes())


DELTA_V1: Final = _schema_file("delta_v1.binpb")
DELTA_V2: Final = _schema_file("delta_v2.binpb")


def default_registry() -> SchemaRegistry:
    """A registry holding both delta schema versions under ``inferwire.delta`` (ids 1, 2)."""
    registry = SchemaRegistry()
    registry.register(SUBJECT, DELTA_V1)
    registry.register(SUBJECT, DELTA_V2)
    return registry


class StringTable:
    """The per-stream string table; both ends apply the same rule, in the same order."""

    __slots__ = ("index", "strings")

    def __init__(self) -> None:
        self.strings: list[str] = []
        self.index: dict[str, int] = {}

    def ref(self, text: str) -> int:
        """The ref of ``text`` (0: send it literally, and it joins the table if it may)."""
        found = self.index.get(text)
        if found is not None:
            return found + 1
        if 0 < len(text) <= MAX_INTERNED_CHARS and len(self.strings) < MAX_TABLE_ENTRIES:
            self.index[text] = len(self.strings)
            self.strings.append(text)
        return 0

    def add(self, text: str) -> None:
        if 0 < len(text) <= MAX_INTERNED_CHARS and len(self.strings) < MAX_TABLE_ENTRIES:
            self.strings.append(text)

    def resolve(self, ref: int, literal: str | None) -> str:
        """A field's string: table entry ``ref`` if nonzero, else its literal, which joins
        the table (absent literal: the empty string)."""
        if ref:
            return self.get(ref)
        if literal is None:
            return ""
        self.add(literal)
        return literal

    def get(self, ref: int) -> str:
        if ref > len(self.strings):
            raise DecodeError(f"string ref {ref} past the table's {len(self.strings)} entries")
        return self.strings[ref - 1]


MAX_EXACT: Final = 1 << 53
MAX_SCALE: Final = 22
_POW10: Final = tuple(10.0**k for k in range(MAX_SCALE + 1))  # all exact doubles


def to_decimal(value: float) -> tuple[int, int] | None:
    """``value`` as (mantissa, scale) with value == mantissa / 10**scale exactly, or None.

    ``repr`` gives the shortest decimal that reads back to the same double; dividing its digits
    by a power of ten, both exact doubles, rounds correctly to that same double.
    """
    text = repr(value)
    whole, dot, fraction = text.partition(".")
    if not dot or "e" in fraction or len(fraction) > MAX_SCALE:
        return None  # nan, inf, exponent notation, or too many places
    if fraction == "0":
        fraction = ""
    mantissa = int(whole + fraction)
    if mantissa == 0 or abs(mantissa) >= MAX_EXACT:
        return None  # zero keeps its sign only as a double
    return mantissa, len(fraction)


def from_decimal(mantissa: int, scale: int) -> float:
    if scale > MAX_SCALE or abs(mantissa) >= MAX_EXACT:
        raise DecodeError(f"decimal {mantissa}e-{scale} is outside the exact range")
    return mantissa / _POW10[scale]
