"""KServe v2 (Open Inference Protocol) inference bodies, sans-IO: the REST API's JSON objects
and the binary tensor data extension.

- The JSON (https://kserve.github.io/website/latest/modelserving/data_plane/v2_protocol/,
  "Inference Request JSON Object" and "Tensor Data"): ``id`` and ``parameters`` are optional,
  each input's ``data`` is a JSON array, flat or nested in the tensor's own shape (row-major),
  and ``outputs`` is optional (absent: every output, with default settings).
- The binary tensor data extension (Triton's ``docs/protocol/extension_binary_data.md``, which
  KServe adopts): a tensor whose ``parameters.binary_data_size`` is given carries no ``data``;
  its raw little-endian bytes follow the JSON object, in the order of the JSON's tensors
  (BOOL: one byte, 0 or 1; BYTES: each element a 4-byte little-endian length, then its bytes).
  The JSON's own length travels beside the body (over HTTP, ``Inference-Header-Content-Length``),
  so here it is an argument. An output asks for binary data with its ``binary_data`` parameter;
  the request's ``binary_data_output`` asks it for every output.

The ``tensor`` codec lays out each tensor the same way (:func:`binary_tensor_entry`,
:func:`read_binary_tensor`) behind a prefix of its own. Every malformed body is a
:class:`DecodeError` that says which field is wrong; no other exception escapes.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final

import numpy as np
import orjson

from .base import DEFAULT_MAX_DEPTH, DEFAULT_MAX_ELEMENTS, limit_scan, nbytes
from .errors import CodecError, DecodeError, EncodeError
from .framing import BytesLike
from .model import InferRequest, InferResponse, Tensor
from .openai import numbers_to_array, tensor_to_obj
from .tensors import bytes_elements_from_raw, bytes_elements_to_raw, checked_dtype, checked_layout

Parameter = str | int | float | bool
"""A parameter's value: the spec's ``$string | $number | $boolean``."""

MAX_RANK: Final = 64
"""Most dimensions a shape may have: numpy's own limit (``NPY_MAXDIMS``)."""

_JSON_KINDS: Final = {
    type(None): "null",
    bool: "a boolean",
    int: "a number",
    float: "a number",
    str: "a string",
    list: "an array",
    dict: "an object",
}


@dataclass(frozen=True, slots=True, kw_only=True)
class RequestedOutput:
    """One entry of a request's ``outputs``."""

    name: str
    binary: bool | None = None
    """Its ``binary_data`` parameter; None when not given (the request's default holds)."""
    parameters: Mapping[str, Parameter] = field(default_factory=dict)


@dataclass(frozen=True, slots=True, kw_only=True)
class KServeRequest:
    """An inference request as the protocol states it: the model's :class:`InferRequest` and
    what the answer must look like."""

    request: InferRequest
    """The inputs, the model named by the caller, and ``id`` ("" when the request has none)."""
    id: str | None = None
    """The request's ``id``, to be echoed; None when it gave none."""
    parameters: Mapping[str, Parameter] = field(default_factory=dict)
    outputs: tuple[RequestedOutput, ...] | None = None
    """The outputs asked for, in order; None: every output."""
    binary_output: bool = False
    """``parameters.binary_data_output``: outputs come as binary data unless they say not."""


def _kind(value: Any) -> str:
    return _JSON_KINDS.get(type(value), type(value).__name__)


def _text(value: Any, where: str) -> str:
    if type(value) is not str:
        raise DecodeError(f"{where} must be a string, not {_kind(value)}")
    return value


def _object(value: Any, where: str) -> dict[str, Any]:
    if type(value) is not dict:
        raise DecodeError(f"{where} must be an object, not {_kind(value)}")
    return value


def _array(value: Any, where: str) -> list[Any]:
    if type(value) is not list:
        raise DecodeError(f"{where} must be an array, not {_kind(value)}")
    return value


def _field(obj: dict[str, Any], key: str, where: str) -> Any:
    try:
        return obj[key]
    except KeyError:
        raise DecodeError(f"{where} has no {key!r}") from None


def _parameters(obj: dict[str, Any], where: str) -> dict[str, Parameter]:
    if "parameters" not in obj:
        return {}
    parameters = _object(obj["parameters"], f"{where}.parameters")
    for key, value in parameters.items():
        if type(value) not in (str, int, float, bool):
            raise DecodeError(
                f"{where}.parameters.{key} must be a string, number or boolean, not {_kind(value)}"
            )
    return parameters


def _flag(parameters: Mapping[str, Parameter], key: str, where: str) -> bool | None:
    value = parameters.get(key)
    if value is None or isinstance(value, bool):
        return value
    raise DecodeError(f"{where}.parameters.{key} must be true or false")


def _shape(value: Any, where: str) -> tuple[int, ...]:
    dims = _array(value, where)
    if len(dims) > MAX_RANK:
        raise DecodeError(f"{where} has {len(dims)} dimensions; at most {MAX_RANK} are served")
    # The spec: "Each dimension must be an integer representable as an unsigned 64-bit
    # integer"; numpy indexes with a signed one, so the top half is refused too.
    if not all(type(d) is int and 0 <= d < 1 << 63 for d in dims):
        raise DecodeError(f"{where} must be non-negative integers, got {dims!r}"[:300])
    return tuple(dims)


def load_json(data: BytesLike, max_depth: int, max_elements: int) -> Any:
    """Parse JSON held to the decode limits (see ``base.limit_scan``) before anything is built."""
    check, scan_above = limit_scan(False, max_depth, max_elements)
    if nbytes(data) > scan_above:
        check(data, max_depth, max_elements)
    try:
        return orjson.loads(data)
    except orjson.JSONDecodeError as exc:
        raise DecodeError(f"invalid JSON: {exc}") from exc


def binary_tensor_entry(tensor: Tensor) -> tuple[dict[str, Any], BytesLike]:
    """A tensor as the extension sends it: its JSON entry, and its raw bytes (a view of the
    array's memory unless it is BYTES or not contiguous)."""
    checked_dtype(tensor)
    raw: BytesLike
    if tensor.datatype == "BYTES":
        raw = bytes_elements_to_raw(tensor.data)
    else:
        # As uint8 rather than memoryview.cast("B"), which refuses zero-size shapes.
        raw = memoryview(np.ascontiguousarray(tensor.data).reshape(-1).view(np.uint8))  # type: ignore[arg-type]
    entry = {
        "name": tensor.name,
        "datatype": tensor.datatype,
        "shape": list(tensor.shape),
        "parameters": {"binary_data_size": len(raw)},
    }
    return entry, raw


@dataclass(frozen=True, slots=True)
class _Head:
    """The fields every tensor entry has, checked."""

    where: str
    name: str
    datatype: str
    shape: tuple[int, ...]
    dtype: np.dtype[Any]
    count: int
    parameters: dict[str, Parameter]

    @classmethod
    def of(cls, entry: Any, where: str) -> _Head:
        obj = _object(entry, where)
        name = _text(_field(obj, "name", where), f"{where}.name")
        datatype = _text(_field(obj, "datatype", where), f"{where}.datatype")
        shape = _shape(_field(obj, "shape", where), f"{where}.shape")
        try:
            dtype, count = checked_layout(datatype, shape)
        except DecodeError as exc:
            raise DecodeError(f"{where}: {exc}") from None
        return cls(where, name, datatype, shape, dtype, count, _parameters(obj, where))

    def binary_size(self) -> int | None:
        size = self.parameters.get("binary_data_size")
        if size is not None and (type(size) is not int or size < 0):
            raise DecodeError(f"{self.where}.parameters.binary_data_size must be a byte count")
        return size

    def tensor(self, array: np.ndarray[Any, Any]) -> Tensor:
        return Tensor(
            name=self.name, datatype=self.datatype, shape=self.shape, data=array.reshape(self.shape)
        )


def _binary(head: _Head, size: int, data: memoryview, pos: int) -> tuple[Tensor, int]:
    if size > len(data) - pos:
        raise DecodeError(
            f"{head.where}: binary_data_size {size} runs past the body "
            f"({len(data) - pos} bytes are left)"
        )
    if head.datatype == "BYTES":
        try:
            array = bytes_elements_from_raw(data[pos : pos + size], head.count)
        except DecodeError as exc:
            raise DecodeError(f"{head.where}: {exc}") from None
    else:
        if size != head.count * head.dtype.itemsize:
            raise DecodeError(
                f"{head.where}: {head.datatype}{list(head.shape)} is "
                f"{head.count * head.dtype.itemsize} bytes, binary_data_size says {size}"
            )
        array = np.frombuffer(data, dtype=head.dtype, count=head.count, offset=pos)
        if head.datatype == "BOOL" and array.view(np.uint8).max(initial=0) > 1:
            raise DecodeError(f"{head.where}: a BOOL element is a byte 0 or 1")
    return head.tensor(array), pos + size


def read_binary_tensor(entry: Any, data: memoryview, pos: int, where: str) -> tuple[Tensor, int]:
    """The tensor an extension entry declares, its bytes read from ``data`` at ``pos`` (no
    copy: a read-only view, BYTES aside); and the position after them."""
    head = _Head.of(entry, where)
    size = head.binary_size()
    if size is None:
        raise DecodeError(f"{where} has no parameters.binary_data_size")
    return _binary(head, size, data, pos)


def _nesting(values: list[Any]) -> int:
    depth = 1
    while values and type(values[0]) is list:
        values = values[0]
        depth += 1
    return depth


def _from_json(head: _Head, values: Any) -> Tensor:
    where = f"{head.where}.data"
    values = _array(values, where)
    depth = _nesting(values)
    if depth > 1 and depth != len(head.shape):
        raise DecodeError(
            f"{where} nests {depth} deep; give it flat or in its shape {list(head.shape)}"
        )
    if head.datatype == "BYTES":
        nested = np.array(values, dtype=object)  # nested rows become dimensions
        elements = np.empty(nested.size, dtype=object)
        for i, element in enumerate(nested.flat):
            elements[i] = _text(element, f"{where} element").encode()
        array = elements.reshape(nested.shape)
    else:
        try:
            array = numbers_to_array(values, head.dtype)
        except DecodeError as exc:
            raise DecodeError(f"{where}: {exc}") from None
    if array.ndim > 1 and array.shape != head.shape:
        raise DecodeError(
            f"{where} is nested as {list(array.shape)}; give it flat or in its shape "
            f"{list(head.shape)}"
        )
    if array.size != head.count:
        raise DecodeError(
            f"{where} has {array.size} elements; shape {list(head.shape)} holds {head.count}"
        )
    return head.tensor(array)


def _requested(entry: Any, where: str) -> RequestedOutput:
    obj = _object(entry, where)
    name = _text(_field(obj, "name", where), f"{where}.name")
    parameters = _parameters(obj, where)
    binary = _flag(parameters, "binary_data", where)
    return RequestedOutput(name=name, binary=binary, parameters=parameters)


def _unique(names: Sequence[str], where: str) -> None:
    if len(set(names)) != len(names):
        twice = sorted({n for n in names if names.count(n) > 1})
        raise DecodeError(f"{where} names {twice[0]!r} more than once")


def decode_request(
    body: BytesLike,
    *,
    model: str,
    json_length: int | None = None,
    max_depth: int = DEFAULT_MAX_DEPTH,
    max_elements: int = DEFAULT_MAX_ELEMENTS,
) -> KServeRequest:
    """The request in ``body`` for ``model`` (the one the path names; a ``model_name`` in the
    body must agree). ``json_length``: the length of the JSON object when binary tensor data
    follows it (the ``Inference-Header-Content-Length``); None: the body is JSON alone. Raises
    :class:`DecodeError`."""
    try:
        return _decode_request(body, model, json_length, max_depth, max_elements)
    except CodecError:
        raise
    except (KeyError, TypeError, ValueError, IndexError, OverflowError) as exc:
        raise DecodeError(f"KServe request: {type(exc).__name__}: {exc}") from exc


def _decode_request(
    body: BytesLike, model: str, json_length: int | None, max_depth: int, max_elements: int
) -> KServeRequest:
    view = memoryview(body).cast("B")
    end = len(view) if json_length is None else json_length
    if not 0 <= end <= len(view):
        raise DecodeError(f"the JSON's length, {end}, is past the body's {len(view)} bytes")
    obj = _object(load_json(view[:end], max_depth, max_elements), "the request")
    if "model_name" in obj and _text(obj["model_name"], "model_name") != model:
        raise DecodeError(f"the body names model {obj['model_name']!r}, the path {model!r}")
    request_id = None if "id" not in obj else _text(obj["id"], "id")
    parameters = _parameters(obj, "the request")
    binary_output = _flag(parameters, "binary_data_output", "the request") or False
    inputs = []
    pos = end
    for i, entry in enumerate(_array(_field(obj, "inputs", "the request"), "inputs")):
        head = _Head.of(entry, f"inputs[{i}]")
        size = head.binary_size()
        if size is None:
            inputs.append(_from_json(head, _field(entry, "data", head.where)))
            continue
        if "data" in entry:
            raise DecodeError(f"{head.where} has both data and binary_data_size")
        if json_length is None:
            raise DecodeError(
                f"{head.where} has binary_data_size, but the request gives no length for its "
                "JSON (Inference-Header-Content-Length)"
            )
        tensor, pos = _binary(head, size, view, pos)
        inputs.append(tensor)
    if pos != len(view):
        raise DecodeError(f"{len(view) - pos} bytes follow the last tensor's binary data")
    _unique([t.name for t in inputs], "inputs")
    outputs = None
    if "outputs" in obj:
        entries = _array(obj["outputs"], "outputs")
        outputs = tuple(_requested(e, f"outputs[{i}]") for i, e in enumerate(entries))
        _unique([o.name for o in outputs], "outputs")
    return KServeRequest(
        request=InferRequest(model=model, id=request_id or "", inputs=tuple(inputs)),
        id=request_id,
        parameters=parameters,
        outputs=outputs,
        binary_output=binary_output,
    )


def encode_response(
    response: InferResponse,
    outputs: Sequence[tuple[Tensor, bool]],
    *,
    id: str | None,
    model_version: str | None = None,
) -> tuple[list[BytesLike], int | None]:
    """The body of an inference response carrying ``outputs`` (each with whether it goes as
    binary data), as buffers to send in order; and the JSON object's length when binary data
    follows it (None: the body is JSON alone). Raises :class:`EncodeError` for an output JSON
    cannot carry (a non-finite float, BYTES that are not UTF-8): it can go as binary data."""
    obj: dict[str, Any] = {"model_name": response.model}
    if model_version is not None:
        obj["model_version"] = model_version
    if id is not None:
        obj["id"] = id
    entries = []
    raws: list[BytesLike] = []
    for tensor, binary in outputs:
        try:
            if binary:
                entry, raw = binary_tensor_entry(tensor)
                raws.append(raw)
            else:
                entry = tensor_to_obj(tensor, binary=False)
        except EncodeError as exc:
            raise EncodeError(f"output {tensor.name!r}: {exc}; ask for it as binary data") from exc
        entries.append(entry)
    obj["outputs"] = entries
    try:
        text = orjson.dumps(obj)
    except orjson.JSONEncodeError as exc:
        raise EncodeError(f"KServe response: {exc}") from exc
    binary_outputs = any(binary for _, binary in outputs)
    return [text, *raws], len(text) if binary_outputs else None
