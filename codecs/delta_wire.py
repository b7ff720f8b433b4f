"""The delta codec's wire format: the bytes, and what both directions share to write and read them.

A stream of :class:`TokenChunk` repeats its id, model, created time and choice index in every
message; this codec sends them once. Byte by byte:

Header (first bytes of a stream)::

    0x00 or 0x01         magic byte: the wire format (Confluent's convention puts the format
                         version here; 0 is theirs). Format 1 may send logprobs as float32
                         (schema version 3), which a format-0 reader would skip and read as
                         0.0: such a reader stops here instead (BadMagicError).
    4 bytes              schema id, big-endian: the registry resolves it to the writer's
                         schema (``schemas/delta_v*.proto``)
    varint N, N bytes    a ``Header`` message: id, model, created, index, base_seq

Each chunk::

    varint L + 1         frame length plus one (0 is the end marker)
    L bytes              a ``Frame`` message, protobuf wire format:
      08 <varint>          seq - base_seq: absolute, so a duplicated frame cannot pass as the
                           next one (a delta from the previous frame could)
      12 <len> <varints>   token ids, packed (format 1: ``10 <varint>`` for a single id)
      18 <varint>          text ref: k > 0 is entry k - 1 of the stream's string table
      22 <len> <utf-8>     text, when sent literally (it then joins the table)
      28 01                has_logprobs (absent: no logprobs, unless a Logprob follows; format 1
                           sends it only for an empty list)
      32 <len> <Logprob>   per token: token ref or literal, logprob, whether top[0] repeats the
                           token, then the other top refs/literals and their logprobs
      3a <len> <utf-8>     finish reason, on the last frame
      42 <len> <Usage>     usage (schema version 2), on the last frame

End::

    00 <varint>          end marker and the number of chunks sent, which the decoder checks

The string table: a literal of 1 to 32 characters joins the table (up to 4,096 entries per
stream) in the order the frame lists strings: the text, then per logprob its token and its top
alternatives. Word pieces repeat (Zipf), so most strings after the first few frames cost one
or two bytes.

Unary ``encode``/``decode`` carry one chunk as a header and one frame.

Logprob values, all lossless. Format 0 sends a decimal where one is exact (``mantissa /
10**scale``, mantissa zigzag), else a double: :func:`to_decimal` and :func:`from_decimal` are
the two directions of that rule; the alternatives share one scale or are all doubles. Format 1
adds float32 (:func:`to_float32`), the precision engines compute logprobs in, and sends each
logprob (and the alternatives, as one group) in the shortest of decimal, float32 and double
that holds it exactly, a tie going to the first: short decimals keep their encoding.
"""

from __future__ import annotations

import struct
from importlib import resources
from typing import Final

from .errors import DecodeError
from .pbwire import varint as _varint
from .pbwire import zigzag as _zigzag
from .schema_registry import Schema, SchemaRegistry

__all__ = [
    "DELTA_V1",
    "DELTA_V2",
    "DELTA_V3",
    "FLOAT32",
    "MAGIC",
    "MAGIC_FLOAT32",
    "MAX_EXACT",
    "MAX_INTERNED_CHARS",
    "MAX_SCALE",
    "MAX_TABLE_ENTRIES",
    "SCHEMA_ID",
    "SUBJECT",
    "UINT32",
    "StringTable",
    "decimal_size",
    "default_registry",
    "from_decimal",
    "to_decimal",
    "to_float32",
]

MAGIC: Final = 0
MAGIC_FLOAT32: Final = 1
"""The magic byte of a stream whose frames may carry float32 logprobs (wire format 1)."""
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
DELTA_V3: Final = _schema_file("delta_v3.binpb")


def default_registry() -> SchemaRegistry:
    """A registry holding every delta schema version under ``inferwire.delta`` (ids 1-3)."""
    registry = SchemaRegistry()
    for schema in (DELTA_V1, DELTA_V2, DELTA_V3):
        registry.register(SUBJECT, schema)
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


def decimal_size(mantissa: int, scale: int) -> int:
    """The bytes of a logprob sent as a decimal: ``40 <zigzag varint> 48 <scale>``."""
    return 3 + len(_varint(_zigzag(mantissa)))


FLOAT32: Final = struct.Struct("<f")


def to_float32(value: float) -> bytes | None:
    """The 4 bytes of ``value`` as a float32 when one holds it exactly, else None.

    Exactly: the float32 widens back to the same double (so -0.0, infinities and float32
    subnormals qualify). NaN never does: its payload is kept only as a double.
    """
    if value != value:
        return None
    try:
        packed = FLOAT32.pack(value)  # round to nearest, as C's (float) cast
    except OverflowError:
        return None  # past the largest float32
    return packed if FLOAT32.unpack(packed)[0] == value else None
