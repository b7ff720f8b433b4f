"""What every codec checks of a tensor, and KServe's raw form of BYTES tensors.

Shared so that each codec refuses the same things with the same words: a datatype that is not
KServe's, data that does not match its declared datatype and shape, a negative dimension, a
BYTES payload whose lengths run past its end.
"""

from __future__ import annotations

import math
import struct
from typing import Any, Final

import numpy as np

from .errors import DecodeError, EncodeError
from .model import DATATYPES, Tensor

_LENGTH: Final = struct.Struct("<I")


def checked_dtype(tensor: Tensor) -> np.dtype[Any]:
    """The numpy dtype of ``tensor``'s datatype, once its data is shown to match it."""
    dtype = DATATYPES.get(tensor.datatype)
    if dtype is None:
        raise EncodeError(f"unknown datatype {tensor.datatype!r}")
    data = tensor.data
    if not isinstance(data, np.ndarray) or data.dtype != dtype or data.shape != tuple(tensor.shape):
        found = f"{data.dtype}{data.shape}" if isinstance(data, np.ndarray) else type(data)
        raise EncodeError(
            f"tensor {tensor.name!r}: data {found} does not match "
            f"{tensor.datatype}{tuple(tensor.shape)}"
        )
    return dtype


def checked_layout(datatype: str, shape: tuple[int, ...]) -> tuple[np.dtype[Any], int]:
    """The dtype and element count a decoded tensor header declares."""
    dtype = DATATYPES.get(datatype)
    if dtype is None:
        raise DecodeError(f"unknown datatype {datatype!r}")
    if any(d < 0 for d in shape):
        raise DecodeError(f"negative dimension in shape {shape}")
    return dtype, math.prod(shape)


def bytes_elements_to_raw(data: np.ndarray[Any, Any]) -> bytes:
    """KServe's raw form of a BYTES tensor: each element as a 4-byte LE length, then its bytes."""
    parts = []
    for element in data.flat:
        if not isinstance(element, bytes):
            raise EncodeError("BYTES tensor elements must be bytes")
        parts.append(_LENGTH.pack(len(element)))
        parts.append(element)
    return b"".join(parts)


def bytes_elements_from_raw(raw: Any, count: int) -> np.ndarray[Any, Any]:
    """The inverse of :func:`bytes_elements_to_raw`; every length is checked against the end."""
    view = memoryview(raw)
    # Each element takes at least its 4-byte length: a header claiming more elements than
    # that is refused before an array of that many objects is allocated.
    if count * 4 > len(view):
        raise DecodeError(f"BYTES tensor of {count} elements cannot fit in {len(view)} bytes")
    out = np.empty(count, dtype=object)
    pos = 0
    for i in range(count):
        (length,) = _LENGTH.unpack_from(view, pos)
        pos += 4
        if pos + length > len(view):
            raise DecodeError("BYTES tensor element overruns the data")
        out[i] = bytes(view[pos : pos + length])
        pos += length
        if i + 1 < count and pos + 4 > len(view):
            raise DecodeError("BYTES tensor truncated in an element length")
    if pos != len(view):
        raise DecodeError("BYTES tensor has bytes after its last element")
    return out
