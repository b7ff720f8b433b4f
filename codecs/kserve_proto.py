"""Tensors in the KServe v2 / Open Inference Protocol's gRPC messages
(``schemas/kserve/inference.proto``), sans-IO: a ``ModelInferRequest``'s inputs as
:class:`Tensor` values, and :class:`Tensor` values as a ``ModelInferResponse``'s outputs.

An input's data comes either in the request's ``raw_input_contents`` (one entry per input, in
order: elements little-endian and row-major, a BYTES element as a 4-byte little-endian length
and its bytes) or in its typed ``contents``, the member that matches its datatype; never both.
Outputs are written as raw contents, as Triton writes them. Every count, length and range is
checked before an array is made, so a request cannot claim more than it carries.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, Final

import numpy as np

from inferwire.schemas.kserve import inference_pb2 as kpb

from .errors import DecodeError
from .model import Tensor
from .tensors import bytes_elements_from_raw, bytes_elements_to_raw, checked_dtype, checked_layout

__all__ = ["read_inputs", "write_outputs"]

CONTENTS_MEMBER: Final = {
    "BOOL": "bool_contents",
    "INT8": "int_contents",
    "INT16": "int_contents",
    "INT32": "int_contents",
    "INT64": "int64_contents",
    "UINT8": "uint_contents",
    "UINT16": "uint_contents",
    "UINT32": "uint_contents",
    "UINT64": "uint64_contents",
    "FP32": "fp32_contents",
    "FP64": "fp64_contents",
    "BYTES": "bytes_contents",
}
"""The member of ``InferTensorContents`` that carries each datatype; FP16 has none (raw only)."""


def _from_raw(raw: bytes, datatype: str, dtype: np.dtype[Any], count: int) -> np.ndarray[Any, Any]:
    if datatype == "BYTES":
        return bytes_elements_from_raw(raw, count)
    if len(raw) != count * dtype.itemsize:
        raise DecodeError(
            f"{len(raw)} bytes of raw contents for {count} {datatype} elements "
            f"({count * dtype.itemsize} bytes)"
        )
    return np.frombuffer(raw, dtype=dtype)


def _from_contents(
    contents: kpb.InferTensorContents, datatype: str, dtype: np.dtype[Any], count: int
) -> np.ndarray[Any, Any]:
    member = CONTENTS_MEMBER.get(datatype)
    if member is None:
        raise DecodeError(f"{datatype} data travels only in raw_input_contents")
    others = [field.name for field, _ in contents.ListFields() if field.name != member]
    if others:
        raise DecodeError(f"{datatype} data goes in {member}, not in {others[0]}")
    values = getattr(contents, member)
    if len(values) != count:
        raise DecodeError(f"{len(values)} values in {member} for {count} elements")
    if datatype == "BYTES":
        out = np.empty(count, dtype=object)
        out[:] = list(values)
        return out
    if dtype.kind in "iu" and dtype.itemsize < 4:
        # int_contents and uint_contents are 32-bit: a value past a narrower datatype is
        # refused, never wrapped.
        wide = np.array(values, dtype=np.int64)
        info = np.iinfo(dtype)
        if count and (wide.min() < info.min or wide.max() > info.max):
            raise DecodeError(f"a value in {member} is out of range for {datatype}")
        return wide.astype(dtype)
    return np.array(values, dtype=dtype)


def read_inputs(request: kpb.ModelInferRequest) -> tuple[Tensor, ...]:
    """The request's inputs, from its raw contents or each input's typed contents. Raises
    :class:`DecodeError` naming the input at fault."""
    raw = request.raw_input_contents
    if raw and len(raw) != len(request.inputs):
        raise DecodeError(
            f"{len(raw)} raw_input_contents for {len(request.inputs)} inputs: one per input"
        )
    names = [tensor.name for tensor in request.inputs]
    if len(set(names)) != len(names):
        raise DecodeError("two inputs have the same name")
    tensors = []
    for i, tensor in enumerate(request.inputs):
        shape = tuple(tensor.shape)
        try:
            dtype, count = checked_layout(tensor.datatype, shape)
            if not raw:
                data = _from_contents(tensor.contents, tensor.datatype, dtype, count)
            elif tensor.HasField("contents"):
                raise DecodeError("typed contents beside raw_input_contents")
            else:
                data = _from_raw(raw[i], tensor.datatype, dtype, count)
        except DecodeError as exc:
            raise DecodeError(f"input {tensor.name!r}: {exc}") from exc
        tensors.append(
            Tensor(
                name=tensor.name, datatype=tensor.datatype, shape=shape, data=data.reshape(shape)
            )
        )
    return tuple(tensors)


def _raw(tensor: Tensor) -> bytes:
    checked_dtype(tensor)
    if tensor.datatype == "BYTES":
        return bytes_elements_to_raw(tensor.data)
    return np.ascontiguousarray(tensor.data).tobytes()  # the model's dtypes are little-endian


def write_outputs(response: kpb.ModelInferResponse, outputs: Iterable[Tensor]) -> None:
    """Append ``outputs`` to ``response``, their data in ``raw_output_contents``. Raises
    :class:`~inferwire.codecs.EncodeError` for a tensor whose data is not its datatype's."""
    for tensor in outputs:
        response.outputs.add(name=tensor.name, datatype=tensor.datatype, shape=tensor.shape)
        response.raw_output_contents.append(_raw(tensor))
