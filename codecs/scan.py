"""Depth and element limits, checked on the bytes before a parser builds a single object.

JSON and MessagePack parsers build everything they read before the caller sees any of it: a
megabyte of MessagePack empty maps (``0x80``) becomes some 70 MB of dicts, and a megabyte of
``[`` recurses as deep as the parser lets it. :func:`check_json` and :func:`check_msgpack` scan
the bytes first, allocate nothing, and raise at the first limit exceeded:

Depth
    A container (JSON object or array, MessagePack map or array) opened at nesting level d has
    depth d; the top-level one has depth 1 and scalars add nothing: ``[]`` is 1, ``[[]]`` 2,
    ``{"a":[1]}`` 2. Deeper than ``max_depth``: :class:`DepthLimitError`.
Elements
    Every value counts 1, container or scalar, and so does every key: ``[]`` is 1, ``[1,2]``
    3, ``{"a":1}`` 3. A MessagePack map or array is charged the children its header declares
    when the header is read, so ``dd ff ff ff ff`` (an array of 2**32 - 1) is refused from
    those five bytes. More than ``max_elements``: :class:`ElementBudgetError`.

Where one container exceeds both, depth is reported. Neither function is a validator: invalid
or truncated bytes return None (or raise one of the two errors), and the parser that runs next
rejects them. For valid input the answers are exact. Any C-contiguous buffer is accepted; the
arguments are positional.

JSON is lexed by byte class (RFC 8259 section 2): whitespace, ``,`` and ``:`` are skipped; a
string (to its first quote not escaped by an odd run of backslashes), a ``[`` or ``{``, and a
run of any other bytes (a number, ``true``, ``false``, ``null``) each count one element. The
whole buffer is scanned, unless a string does not end: that stops the scan.

MessagePack is walked object by object, with a stack of the children each open container still
owes, to the end of the first top-level object (what follows is the parser's). str, bin and
ext payloads are skipped by their declared lengths; one past the end stops the scan, and so
does the never-used format byte ``0xc1``.

The scan runs in a small C extension, :mod:`inferwire.codecs._scan`, when it is built: under
half a nanosecond per byte of a JSON number array on x86-64 (SSE2). The pure-Python scanner
here is the reference and the fallback, with the same answers on any bytes.
``INFERWIRE_PURE_PYTHON=1`` in the environment, read at import, leaves the extension unused.
"""

from __future__ import annotations

import dataclasses
import operator
import re
from collections.abc import Callable
from typing import Final, Protocol

from . import extensions
from .errors import DepthLimitError, ElementBudgetError
from .framing import BytesLike

_Check = Callable[[BytesLike, int, int], None]


def _limit(value: int, minimum: int, name: str) -> int:
    limit = operator.index(value)
    if limit < minimum:
        raise ValueError(f"{name} must be at least {minimum}")
    return limit


def _byte_view(data: BytesLike) -> memoryview:
    """``data`` as flat unsigned bytes, without a copy (what PyBUF_SIMPLE gives the C scan)."""
    with memoryview(data) as view:
        if not view.c_contiguous:
            raise BufferError("the data must be a C-contiguous buffer")
        return view.cast("B")


# ---- JSON ----------------------------------------------------------------------------------

_OPEN: Final = 1
_CLOSE: Final = 2
_UNTERMINATED: Final = 4
_END: Final = 5

# One token per match, after any whitespace, commas and colons; the groups name its kind (no
# group: a scalar). Possessive quantifiers keep an unterminated string linear, and the end of
# the input is a token of its own: without it, a trailing run of whitespace matched nothing,
# and finditer tried again from each of its bytes (quadratic).
_JSON_TOKEN: Final = re.compile(
    rb"""[ \t\n\r,:]*+
    (?:
        ([\[{])                     # 1: open
      | ([\]}])                     # 2: close
      | ("(?:[^"\\]++|\\.)*+")      # 3: string
      | (")                         # 4: a string that does not end
      | [^ \t\n\r,:\[\]{}"]++       # a scalar: a run of any other bytes
      | (\Z)                        # 5: the end
    )""",
    re.DOTALL | re.VERBOSE,
)


def _check_json_py(data: BytesLike, max_depth: int, max_elements: int, /) -> None:
    """Raise if the JSON text nests deeper than ``max_depth`` or holds over ``max_elements``."""
    depth_limit = _limit(max_depth, 1, "max_depth")
    budget = _limit(max_elements, 0, "max_elements")
    with _byte_view(data) as raw:
        depth = elements = 0
        for token in _JSON_TOKEN.finditer(raw):
            kind = token.lastindex
            if kind == _CLOSE:
                depth -= depth > 0  # a stray close: the parser's to report
                continue
            if kind in (_UNTERMINATED, _END):
                return
            if kind == _OPEN:
                depth += 1
                if depth > depth_limit:
                    raise DepthLimitError(max_depth)
            elements += 1
            if elements > budget:
                raise ElementBudgetError(max_elements)


# ---- MessagePack ---------------------------------------------------------------------------

_FIXED: Final = 0
_BYTES: Final = 1
_EXT: Final = 2
_ARRAY: Final = 3
_MAP: Final = 4
_NEVER: Final = 5

# What follows a format byte of 0xc0..0xdf (the MessagePack spec's "Overview" table): for
# _FIXED the payload's size, for the others the size of the length or count field.
_FORMATS: Final[tuple[tuple[int, int], ...]] = (
    *((_FIXED, 0), (_NEVER, 0), (_FIXED, 0), (_FIXED, 0)),  # nil, (never used), false, true
    *((_BYTES, 1), (_BYTES, 2), (_BYTES, 4)),  # bin 8/16/32
    *((_EXT, 1), (_EXT, 2), (_EXT, 4)),  # ext 8/16/32
    *((_FIXED, 4), (_FIXED, 8)),  # float 32/64
    *((_FIXED, 1), (_FIXED, 2), (_FIXED, 4), (_FIXED, 8)),  # uint 8..64
    *((_FIXED, 1), (_FIXED, 2), (_FIXED, 4), (_FIXED, 8)),  # int 8..64
    *((_FIXED, 2), (_FIXED, 3), (_FIXED, 5), (_FIXED, 9), (_FIXED, 17)),  # fixext: type + data
    *((_BYTES, 1), (_BYTES, 2), (_BYTES, 4)),  # str 8/16/32
    *((_ARRAY, 2), (_ARRAY, 4), (_MAP, 2), (_MAP, 4)),  # array 16/32, map 16/32
)


def _check_msgpack_py(data: BytesLike, max_depth: int, max_elements: int, /) -> None:
    """Raise if the first MessagePack object breaks ``max_depth`` or ``max_elements``."""
    depth_limit = _limit(max_depth, 1, "max_depth")
    budget = _limit(max_elements, 0, "max_elements")
    with _byte_view(data) as raw:
        size = len(raw)
        if not size:
            return
        if budget < 1:
            raise ElementBudgetError(max_elements)  # the top-level object
        elements = 1
        owed: list[int] = []  # per open container, outermost first: children not yet read
        pos = 0
        while pos < size:
            byte = raw[pos]
            pos += 1
            skip = 0
            children = -1  # >= 0: a container
            if byte < 0x80 or byte >= 0xE0:
                pass  # positive or negative fixint
            elif byte < 0x90:
                children = 2 * (byte & 0x0F)  # fixmap
            elif byte < 0xA0:
                children = byte & 0x0F  # fixarray
            elif byte < 0xC0:
                skip = byte & 0x1F  # fixstr
            else:
                kind, field = _FORMATS[byte - 0xC0]
                if kind == _NEVER:
                    return
                if kind == _FIXED:
                    skip = field
                else:
                    if field > size - pos:
                        return
                    length = int.from_bytes(raw[pos : pos + field], "big")
                    pos += field
                    if kind == _BYTES:
                        skip = length
                    elif kind == _EXT:
                        skip = length + 1  # the type byte, then the data
                    elif kind == _ARRAY:
                        children = length
                    else:
                        children = 2 * length
            if children >= 0:
                if len(owed) + 1 > depth_limit:
                    raise DepthLimitError(max_depth)
                elements += children
                if elements > budget:
                    raise ElementBudgetError(max_elements)
                if children:
                    owed.append(children)
                    continue  # its first child is next
            elif skip > size - pos:
                return  # a payload past the end
            else:
                pos += skip
            # a value is complete: it pays one child of its parent, which may complete it too
            while owed:
                owed[-1] -= 1
                if owed[-1]:
                    break
                owed.pop()
            else:
                return  # the top-level object; what follows is the parser's


# ---- the implementation in use -------------------------------------------------------------


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class _Impl:
    check_json: _Check
    check_msgpack: _Check


class _Accelerator(Protocol):
    """What the C extension provides (codecs/_scan.c; its stub has the details)."""

    API_VERSION: int

    def configure(
        self, depth_error: type[DepthLimitError], budget_error: type[ElementBudgetError], /
    ) -> None: ...
    def check_json(self, data: BytesLike, max_depth: int, max_elements: int, /) -> None: ...
    def check_msgpack(self, data: BytesLike, max_depth: int, max_elements: int, /) -> None: ...


_ACCEL_API_VERSION: Final = 1


def _load_accelerator() -> _Accelerator | None:
    """The C extension, bound to the error classes; None when absent, stale or turned off."""
    accel: _Accelerator | None = extensions.load(
        "_scan",
        _ACCEL_API_VERSION,
        lambda module: module.configure(DepthLimitError, ElementBudgetError),
        "using the pure-Python scan",
    )
    return accel


_py_impl: Final = _Impl(check_json=_check_json_py, check_msgpack=_check_msgpack_py)
_accel = _load_accelerator()
_c_impl: Final = (
    None
    if _accel is None
    else _Impl(check_json=_accel.check_json, check_msgpack=_accel.check_msgpack)
)
_impl: Final = _py_impl if _c_impl is None else _c_impl

ACCELERATED: Final = _c_impl is not None
"""Whether :func:`check_json` and :func:`check_msgpack` run in the C extension."""

# The functions themselves, not wrappers: a call costs what the C function costs.
check_json: Final = _impl.check_json
check_msgpack: Final = _impl.check_msgpack
