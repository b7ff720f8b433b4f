"""A FlatBuffers verifier for ``schemas/inferwire.fbs``: nothing is read before it is checked.

The Python FlatBuffers runtime reads wherever an offset points; it has no verifier. This one
follows the C++ runtime's (``include/flatbuffers/verifier.h``): every offset, vtable, vector
length and string a reader could follow is bounds-checked against the buffer, strings must end
in NUL and be UTF-8, a union's value is checked as the table its type names. Anything wrong is a
:class:`VerificationError`.

Work is bounded, as ``max_depth``/``max_tables`` bound it in C++: each table, vector and string
visited counts one item. A buffer of ``n`` bytes holds at most ``n / 4`` offsets, so a tree walk
over it visits at most that many items; past twice that (room for writers that share some
subtables), its offsets must fan out to shared subtrees, and it is refused before the walk
grows. Scalar vectors are checked by their length alone, so verification costs O(fields), not
O(bytes): a large tensor verifies as fast as a small one.
"""

from __future__ import annotations

import struct
from collections.abc import Callable
from dataclasses import dataclass
from enum import Enum
from functools import lru_cache
from typing import Final, NamedTuple, NoReturn

from .errors import VerificationError

__all__ = [
    "DEFAULT_MAX_DEPTH",
    "DEFAULT_MAX_ITEMS",
    "FILE_IDENTIFIER",
    "PAYLOAD_TYPES",
    "SCHEMA",
    "Buffer",
    "Field",
    "Kind",
    "Verified",
    "verify_envelope",
]

Buffer = bytes | bytearray | memoryview
"""A buffer of unsigned bytes (a memoryview must have format ``B``)."""

FILE_IDENTIFIER: Final = b"IWF1"
DEFAULT_MAX_ITEMS: Final = 1_000_000
DEFAULT_MAX_DEPTH: Final = 64  # the C++ verifier's default max_depth
MAX_BUFFER_BYTES: Final = 2**31 - 1  # FLATBUFFERS_MAX_BUFFER_SIZE: offsets are 32-bit signed

_I32: Final = struct.Struct("<i").unpack_from
_U32: Final = struct.Struct("<I").unpack_from
_VTABLE_HEADER: Final = struct.Struct("<HH").unpack_from


@lru_cache(maxsize=32)
def _u16s(count: int) -> Callable[[Buffer, int], tuple[int, ...]]:
    """An unpacker of ``count`` little-endian uint16 (a vtable's field offsets)."""
    return struct.Struct(f"<{count}H").unpack_from


class Kind(Enum):
    SCALAR = "scalar"
    STRING = "string"
    VECTOR = "vector of scalars"
    TABLES = "vector of tables"
    TABLE = "table"
    UNION_TYPE = "union type"
    UNION = "union value"


@dataclass(frozen=True, slots=True)
class Field:
    """One vtable slot: ``size`` is a scalar's width or a vector element's width."""

    name: str
    kind: Kind
    size: int = 4
    table: str = ""

    @property
    def inline_bytes(self) -> int:
        """What the field occupies inside its table: the scalar, or a 4-byte offset."""
        return self.size if self.kind in (Kind.SCALAR, Kind.UNION_TYPE) else 4

    @classmethod
    def parse(cls, spec: str) -> Field:
        """``name:type``; type is a scalar's width, ``str``, ``[width]``, ``[Table]``, ``Table``,
        ``union_type`` or ``union``."""
        name, _, type_ = spec.partition(":")
        element = type_.strip("[]")
        if type_ == "str":
            return cls(name, Kind.STRING, 1)
        if type_ in ("union_type", "union"):
            return cls(name, Kind.UNION_TYPE if type_ == "union_type" else Kind.UNION, 1)
        if type_.isdigit():
            return cls(name, Kind.SCALAR, int(type_))
        if type_.startswith("["):
            if element.isdigit():
                return cls(name, Kind.VECTOR, int(element))
            return cls(name, Kind.TABLES, 4, element)
        return cls(name, Kind.TABLE, 4, type_)


# inferwire.fbs, table by table, slot by slot in declaration order.
_FBS: Final = {
    "Usage": "prompt_tokens:4 completion_tokens:4",
    "TopLogprob": "token:str logprob:8",
    "TokenLogprob": "token:str logprob:8 top:[TopLogprob]",
    "TokenChunk": "id:str model:str created:8 index:4 seq:8 token_ids:[4] text:str "
    "logprobs:[TokenLogprob] finish_reason:str usage:Usage",
    "Tensor": "name:str datatype:str shape:[8] data:[1]",
    "EmbeddingBatch": "model:str batch:4 dim:4 vectors:[4] usage:Usage",
    "InferRequest": "model:str id:str inputs:[Tensor]",
    "InferResponse": "model:str id:str outputs:[Tensor]",
    "Envelope": "payload_type:union_type payload:union",
}
SCHEMA: Final[dict[str, tuple[Field, ...]]] = {
    table: tuple(Field.parse(spec) for spec in fields.split()) for table, fields in _FBS.items()
}

# union Payload: the table each type value names (0 is NONE).
PAYLOAD_TYPES: Final[dict[int, str]] = dict(
    enumerate(("TokenChunk", "EmbeddingBatch", "InferRequest", "InferResponse"), start=1)
)


# Per table, per slot: (kind, inline bytes, element size, nested table, "Table.field"), so
# the walk below does no attribute lookups or formatting.
_Spec = tuple[Kind, int, int, str, str]
_SPECS: Final[dict[str, tuple[_Spec, ...]]] = {
    table: tuple((f.kind, f.inline_bytes, f.size, f.table, f"{table}.{f.name}") for f in fields)
    for table, fields in SCHEMA.items()
}
_SCALAR, _STRING, _VECTOR, _TABLE, _TABLES, _UNION_TYPE = (
    Kind.SCALAR,
    Kind.STRING,
    Kind.VECTOR,
    Kind.TABLE,
    Kind.TABLES,
    Kind.UNION_TYPE,
)


class _Verifier:
    """One walk over one buffer, recording what a reader needs in a :class:`Verified`."""

    __slots__ = ("budget", "buf", "items", "max_depth", "names", "size", "strings", "tables")

    def __init__(self, buf: Buffer, budget: int, max_depth: int) -> None:
        self.buf = buf
        self.size = len(buf)
        self.budget = budget
        self.max_depth = max_depth
        self.items = 0
        self.tables: dict[int, tuple[int, ...]] = {}
        self.strings: dict[int, str] = {}
        self.names: dict[int, str] = {}

    def fail(self, what: str, problem: str) -> VerificationError:
        return VerificationError(f"{what}: {problem} (in a {self.size}-byte buffer)")

    def over_budget(self, what: str) -> VerificationError:
        return self.fail(
            what, f"more than {self.budget} tables, vectors and strings: its offsets fan out"
        )

    def offset(self, at: int, what: str) -> int:
        """Where the uoffset at ``at`` points, checked like the C++ ``VerifyOffset``."""
        if at + 4 > self.size:
            raise self.fail(what, f"offset at {at} overruns the buffer")
        off: int = _U32(self.buf, at)[0]
        # 0 would point at itself; >= 2**31 wraps around in the C++ runtime.
        if off == 0 or off >= 0x8000_0000 or at + off >= self.size:
            raise self.fail(what, f"offset {off:#x} at {at} is zero or points outside the buffer")
        return at + off

    def vector(self, at: int, elem_size: int, what: str) -> int:
        """The element count of the vector at ``at``, whose elements must fit in the buffer."""
        self.items += 1
        if self.items > self.budget:
            raise self.over_budget(what)
        if at + 4 > self.size:
            raise self.fail(what, f"vector length at {at} overruns the buffer")
        length: int = _U32(self.buf, at)[0]
        if length * elem_size > self.size - at - 4:
            raise self.fail(what, f"{length} elements at {at} overrun the buffer")
        return length

    def table(self, at: int, name: str, depth: int) -> None:
        self.items += 1
        if self.items > self.budget:
            raise self.over_budget(name)
        if depth > self.max_depth:
            raise self.fail(name, f"tables nested deeper than {self.max_depth}")
        buf, size = self.buf, self.size
        if at + 4 > size:
            raise self.fail(name, f"table at {at} overruns the buffer")
        # A signed offset back to the vtable (negative: the vtable follows the table).
        vtable = at - _I32(buf, at)[0]
        if vtable < 0 or vtable + 4 > size:
            raise self.fail(name, f"vtable at {vtable} of the table at {at} is outside the buffer")
        vtable_size, inline_size = _VTABLE_HEADER(buf, vtable)
        if vtable_size < 4 or vtable_size % 2 or vtable + vtable_size > size:
            raise self.fail(name, f"bad vtable size {vtable_size} at {vtable}")
        if inline_size < 4 or at + inline_size > size:
            raise self.fail(name, f"table size {inline_size} at {at} overruns the buffer")
        # Offsets may share a table; reading one table as two types would confuse its reader.
        if self.names.setdefault(at, name) != name:
            raise self.fail(name, f"the table at {at} is also a {self.names[at]}")
        specs = _SPECS[name]
        slots = vtable_size // 2 - 2
        if slots >= len(specs):  # later slots: a newer schema's fields, not read
            offsets = _u16s(len(specs))(buf, vtable + 4)
        else:
            offsets = _u16s(slots)(buf, vtable + 4) + (0,) * (len(specs) - slots)
        self.tables[at] = offsets
        union_type = 0
        for (kind, inline_bytes, elem_size, nested, what), field_offset in zip(
            specs, offsets, strict=True
        ):
            if not field_offset:
                continue  # absent: the reader takes the default
            if field_offset < 4 or field_offset + inline_bytes > inline_size:
                raise self.fail(
                    what, f"field at +{field_offset} is outside the table's {inline_size} bytes"
                )
            if kind is _SCALAR:
                continue
            pos = at + field_offset
            if kind is _UNION_TYPE:
                union_type = buf[pos]
                continue
            # Inside the table, so the offset itself is in the buffer.
            off: int = _U32(buf, pos)[0]
            target = pos + off
            if off == 0 or off >= 0x8000_0000 or target >= size:
                raise self.fail(
                    what, f"offset {off:#x} at {pos} is zero or points outside the buffer"
                )
            if kind is _STRING or kind is _VECTOR:  # the common case, inlined
                self.items += 1
                if self.items > self.budget:
                    raise self.over_budget(what)
                if target + 4 > size:
                    raise self.fail(what, f"length at {target} overruns the buffer")
                length: int = _U32(buf, target)[0]
                end = target + 4 + length * elem_size
                if end > size:
                    raise self.fail(what, f"{length} elements at {target} overrun the buffer")
                if kind is _STRING:
                    if end == size or buf[end] != 0:
                        raise self.fail(what, f"string at {target} has no NUL terminator")
                    try:  # checking is decoding: the result is kept for the reader
                        self.strings[pos] = str(buf[target + 4 : end], "utf-8")
                    except UnicodeDecodeError as exc:
                        raise self.fail(
                            what, f"string at {target} is not UTF-8 ({exc.reason})"
                        ) from None
            elif kind is _TABLE:
                self.table(target, nested, depth + 1)
            elif kind is _TABLES:
                for i in range(self.vector(target, 4, what)):
                    self.table(self.offset(target + 4 + 4 * i, what), nested, depth + 1)
            else:  # the union value: its type is the previous slot's (always declared first)
                member = PAYLOAD_TYPES.get(union_type)
                if member is None:
                    raise self.fail(what, f"value of unknown union type {union_type}")
                self.table(target, member, depth + 1)


class Verified(NamedTuple):
    """What a reader of a verified buffer needs, so that it reads nothing twice."""

    payload: int
    """Position of the payload table."""
    tables: dict[int, tuple[int, ...]]
    """Each table's position -> its fields' offsets from it, one per schema slot (0: absent)."""
    strings: dict[int, str]
    """Position of each string field (of its offset) -> the string, decoded."""


def _refuse_header(buf: Buffer, declared: int) -> NoReturn:
    """Say what is wrong with the first 12 bytes: most often, a buffer written without the
    size prefix (``Finish``, not ``FinishSizePrefixed``), whose identifier is at bytes 4-8. Read
    as prefixed, its root offset would be the size and ``IWF1`` the root offset (826 million:
    no buffer of ours has its root that far), so the two layouts cannot be confused."""
    if bytes(buf[4:8]) == FILE_IDENTIFIER:
        raise VerificationError(
            f"no size prefix: file identifier {FILE_IDENTIFIER!r} at bytes 4-8, where a buffer "
            "written without one has it; inferwire's FlatBuffers are size-prefixed (a 4-byte "
            "little-endian size first, as FinishSizePrefixed writes and flatc --size-prefixed "
            "reads)"
        )
    size = len(buf)
    if declared != size - 4:
        raise VerificationError(f"buffer declares {declared} bytes after its size, has {size - 4}")
    raise VerificationError(f"file identifier {bytes(buf[8:12])!r}, not {FILE_IDENTIFIER!r}")


def verify_envelope(
    buf: Buffer,
    payload: str,
    *,
    max_items: int = DEFAULT_MAX_ITEMS,
    max_depth: int = DEFAULT_MAX_DEPTH,
) -> Verified:
    """Verify ``buf`` as a size-prefixed ``Envelope`` carrying a ``payload`` table.

    The layout (``FinishSizePrefixed``): bytes 0-4 the size of the rest, 4-8 the root offset
    (from byte 4), 8-12 the file identifier ``IWF1``. The size must match ``len(buf)``: a
    FlatBuffer may end in padding nothing points to, so without it a truncated buffer could
    pass for a whole one. ``buf`` is bytes, bytearray or a memoryview of format ``B``. Raises
    :class:`VerificationError`.
    """
    size = len(buf)
    if size < 12:
        raise VerificationError(f"{size} bytes: too short for a size, root offset and identifier")
    if size > MAX_BUFFER_BYTES:
        raise VerificationError(f"{size} bytes: over the FlatBuffers limit of 2 GiB")
    (declared,) = _U32(buf, 0)
    if declared != size - 4 or bytes(buf[8:12]) != FILE_IDENTIFIER:
        _refuse_header(buf, declared)
    verifier = _Verifier(buf, min(max_items, size // 2), max_depth)
    root = verifier.offset(4, "root")
    verifier.table(root, "Envelope", 1)
    type_offset, value_offset = verifier.tables[root]
    payload_type = buf[root + type_offset] if type_offset else 0
    found = PAYLOAD_TYPES.get(payload_type, "NONE")
    if found != payload:
        raise VerificationError(f"buffer carries {found}, not {payload}")
    if not value_offset:
        raise VerificationError(f"Envelope has the type {found} but no value")
    at = root + value_offset
    return Verified(at + _U32(buf, at)[0], verifier.tables, verifier.strings)
