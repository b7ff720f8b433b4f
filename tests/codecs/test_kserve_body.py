"""KServe v2 inference bodies (``inferwire.codecs.kserve``): the protocol's JSON, flat and nested
tensor data, the binary tensor data extension, and every malformed body refused with a
:class:`DecodeError` that names the field, never another exception."""

from __future__ import annotations

import contextlib
import struct
from typing import Any

import numpy as np
import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import inferwire.codecs as ic
from inferwire.codecs import kserve
from inferwire.codecs.errors import DepthLimitError, ElementBudgetError
from inferwire.codecs.model import DATATYPES
from inferwire.codecs.tensor_codec import MAGIC
from tests.codecs.test_codecs import tensors


def _body(obj: Any, *raw: bytes) -> tuple[bytes, int | None]:
    """A request body and the JSON's length (None when no binary data follows)."""
    text = orjson.dumps(obj)
    return text + b"".join(raw), (len(text) if raw else None)


def _decode(obj: Any, *raw: bytes, model: str = "m") -> kserve.KServeRequest:
    body, json_length = _body(obj, *raw)
    return kserve.decode_request(body, model=model, json_length=json_length)


def _input(data: Any, shape: list[Any], datatype: str = "INT32", **more: Any) -> dict[str, Any]:
    return {"name": "x", "shape": shape, "datatype": datatype, "data": data, **more}


# -- what the spec allows ---------------------------------------------------------------------


def test_a_request_as_the_spec_writes_it_needs_no_model_name_nor_id() -> None:
    parsed = _decode({"inputs": [_input([1, 2, 3, 4], [2, 2], "UINT32")]})
    assert parsed.id is None
    assert parsed.outputs is None
    assert parsed.binary_output is False
    assert parsed.parameters == {}
    expected = np.array([[1, 2], [3, 4]], dtype="<u4")
    assert parsed.request == ic.InferRequest(
        model="m",
        id="",
        inputs=(ic.Tensor(name="x", datatype="UINT32", shape=(2, 2), data=expected),),
    )


@pytest.mark.parametrize(
    ("datatype", "flat", "nested", "shape"),
    [
        ("FP32", [1.5, 2, -0.0, 4], [[1.5, 2], [-0.0, 4]], [2, 2]),
        ("INT64", [1, 2, 3, 4, 5, 6], [[[1, 2, 3]], [[4, 5, 6]]], [2, 1, 3]),
        ("BOOL", [True, False, True, True], [[True, False], [True, True]], [2, 2]),
        ("BYTES", ["a", "", "\u00e9", "d"], [["a", ""], ["\u00e9", "d"]], [2, 2]),
        ("FP16", [0.5, 65504.0], [[0.5, 65504.0]], [1, 2]),
        ("UINT8", [], [[], []], [2, 0]),
    ],
)
def test_nested_data_in_the_tensors_shape_is_the_same_as_flat(
    datatype: str, flat: list[Any], nested: list[Any], shape: list[int]
) -> None:
    from_flat = _decode({"inputs": [_input(flat, shape, datatype)]}).request.inputs[0]
    from_nested = _decode({"inputs": [_input(nested, shape, datatype)]}).request.inputs[0]
    assert from_flat == from_nested
    assert from_flat.shape == tuple(shape)
    assert from_flat.data.dtype == DATATYPES[datatype]


def test_id_parameters_and_requested_outputs_are_read() -> None:
    parsed = _decode(
        {
            "id": "42",
            "model_name": "m",
            "parameters": {"binary_data_output": True, "priority": 1, "note": "x", "t": 0.5},
            "inputs": [_input([1], [1])],
            "outputs": [
                {"name": "a"},
                {"name": "b", "parameters": {"binary_data": False}},
            ],
        }
    )
    assert parsed.id == "42"
    assert parsed.request.id == "42"
    assert parsed.binary_output is True
    assert parsed.parameters["priority"] == 1
    assert parsed.outputs == (
        kserve.RequestedOutput(name="a"),
        kserve.RequestedOutput(name="b", binary=False, parameters={"binary_data": False}),
    )


def test_the_binary_extension_example_of_the_spec() -> None:
    """Triton's extension_binary_data.md: a UINT32 [2, 2] and a BOOL [3] as 16 + 3 bytes after
    the JSON, the output asked for as binary."""
    header = {
        "model_name": "m",
        "inputs": [
            {
                "name": "input0",
                "shape": [2, 2],
                "datatype": "UINT32",
                "parameters": {"binary_data_size": 16},
            },
            {
                "name": "input1",
                "shape": [3],
                "datatype": "BOOL",
                "parameters": {"binary_data_size": 3},
            },
        ],
        "outputs": [{"name": "output0", "parameters": {"binary_data": True}}],
    }
    parsed = _decode(header, struct.pack("<4I", 1, 2, 3, 4), b"\x01\x00\x01")
    first, second = parsed.request.inputs
    assert first.data.tolist() == [[1, 2], [3, 4]]
    assert second.data.tolist() == [True, False, True]
    assert parsed.outputs == (
        kserve.RequestedOutput(name="output0", binary=True, parameters={"binary_data": True}),
    )


def test_binary_and_json_inputs_mix_and_bytes_are_length_prefixed() -> None:
    raw = struct.pack("<I", 2) + b"\xff\x00" + struct.pack("<I", 0)
    header = {
        "inputs": [
            _input([7, 8], [2]),
            {
                "name": "s",
                "shape": [2],
                "datatype": "BYTES",
                "parameters": {"binary_data_size": 10},
            },
        ]
    }
    numbers, text = _decode(header, raw).request.inputs
    assert numbers.data.tolist() == [7, 8]
    assert text.data.tolist() == [b"\xff\x00", b""]


@settings(max_examples=60)
@given(st.lists(tensors(), max_size=3, unique_by=lambda t: t.name).map(tuple))
def test_the_tensor_codec_is_an_extension_body_behind_its_prefix(
    inputs: tuple[ic.Tensor, ...],
) -> None:
    """``tensor`` codec bytes past the 8-byte prefix, with the prefix's header length as the
    JSON's length, are a request the protocol reads as the same tensors."""
    request = ic.InferRequest(model="m", id="r", inputs=inputs)
    data = ic.get("tensor").encode(request)
    assert data[:4] == MAGIC
    (json_length,) = struct.unpack_from("<I", data, 4)
    parsed = kserve.decode_request(data[8:], model="m", json_length=json_length)
    assert parsed.request == request
    assert parsed.id == "r"


# -- responses --------------------------------------------------------------------------------


def _tensor(data: Any, datatype: str, name: str = "output_0") -> ic.Tensor:
    array = np.array(data, dtype=DATATYPES[datatype])
    return ic.Tensor(name=name, datatype=datatype, shape=array.shape, data=array)


def test_a_json_response_echoes_id_and_model_version() -> None:
    out = _tensor([[1, 2], [3, 4]], "INT16")
    response = ic.InferResponse(model="m", id="7", outputs=(out,))
    parts, json_length = kserve.encode_response(response, [(out, False)], id="7", model_version="1")
    assert json_length is None
    assert orjson.loads(b"".join(parts)) == {
        "model_name": "m",
        "model_version": "1",
        "id": "7",
        "outputs": [
            {"name": "output_0", "shape": [2, 2], "datatype": "INT16", "data": [1, 2, 3, 4]}
        ],
    }
    parts, _ = kserve.encode_response(response, [(out, False)], id=None)
    assert "id" not in orjson.loads(b"".join(parts))


def test_a_binary_response_puts_each_binary_output_after_the_json_in_order() -> None:
    first = _tensor([1.0, -2.0], "FP32", "a")
    second = _tensor([5], "INT8", "b")
    third = ic.Tensor(name="c", datatype="BYTES", shape=(1,), data=np.array([b"hi"], dtype=object))
    response = ic.InferResponse(model="m", id="", outputs=(first, second, third))
    parts, json_length = kserve.encode_response(
        response, [(first, True), (second, False), (third, True)], id=None
    )
    body = b"".join(parts)
    assert json_length is not None
    header = orjson.loads(body[:json_length])
    assert [o.get("parameters") for o in header["outputs"]] == [
        {"binary_data_size": 8},
        None,
        {"binary_data_size": 6},
    ]
    assert header["outputs"][1]["data"] == [5]
    assert body[json_length:] == struct.pack("<2f", 1.0, -2.0) + struct.pack("<I", 2) + b"hi"


@pytest.mark.parametrize(
    ("tensor", "words"),
    [
        (_tensor([float("nan")], "FP32"), "non-finite"),
        (
            ic.Tensor(
                name="output_0",
                datatype="BYTES",
                shape=(1,),
                data=np.array([b"\xff"], dtype=object),
            ),
            "UTF-8",
        ),
    ],
)
def test_what_json_cannot_carry_is_an_encode_error_that_points_to_binary(
    tensor: ic.Tensor, words: str
) -> None:
    response = ic.InferResponse(model="m", id="", outputs=(tensor,))
    with pytest.raises(ic.EncodeError, match=words) as caught:
        kserve.encode_response(response, [(tensor, False)], id=None)
    assert "binary data" in str(caught.value)
    _, json_length = kserve.encode_response(response, [(tensor, True)], id=None)
    assert json_length is not None


# -- what is refused --------------------------------------------------------------------------

_BINARY_INPUT = {
    "name": "b",
    "shape": [2],
    "datatype": "INT16",
    "parameters": {"binary_data_size": 4},
}

REFUSED: list[Any] = [
    pytest.param(b"{not json", None, "invalid JSON", id="not-json"),
    pytest.param(b"[1, 2]", None, "must be an object", id="not-an-object"),
    pytest.param({"id": "1"}, None, "has no 'inputs'", id="no-inputs"),
    pytest.param({"inputs": {}}, None, "inputs must be an array", id="inputs-not-an-array"),
    pytest.param({"inputs": [1]}, None, r"inputs\[0\] must be an object", id="input-not-an-object"),
    pytest.param(
        {"inputs": [{"shape": [1], "datatype": "INT32", "data": [1]}]},
        None,
        "has no 'name'",
        id="no-name",
    ),
    pytest.param(
        {"inputs": [_input([1], [1], "INT3")]}, None, "unknown datatype", id="unknown-datatype"
    ),
    pytest.param(
        {"inputs": [_input([1], [-1])]}, None, "negative|non-negative", id="negative-dimension"
    ),
    pytest.param(
        {"inputs": [_input([1], [1.0])]}, None, "non-negative integers", id="float-dimension"
    ),
    pytest.param({"inputs": [_input([1], [1] * 65)]}, None, "at most 64", id="rank-65"),
    pytest.param(
        {"inputs": [_input([1, 2, 3], [2, 2])]}, None, "has 3 elements; shape", id="count"
    ),
    pytest.param(
        {"inputs": [_input([[1, 2, 3, 4]], [4])]}, None, "nests 2 deep", id="nested-not-in-shape"
    ),
    pytest.param(
        {"inputs": [_input([[1, 2], [3, 4], [5, 6]], [2, 3])]},
        None,
        "nested as",
        id="nested-transposed",
    ),
    pytest.param({"inputs": [_input([[1, 2], [3]], [2, 2])]}, None, "unequal", id="ragged"),
    pytest.param({"inputs": [_input([1, "2"], [2])]}, None, "expected", id="string-in-numbers"),
    pytest.param(
        {"inputs": [_input([1, 2], [2], "BOOL")]}, None, "expected booleans", id="numbers-as-bool"
    ),
    pytest.param(
        {"inputs": [_input([300], [1], "UINT8")]}, None, "out of range", id="out-of-range"
    ),
    pytest.param(
        {"inputs": [_input([1e39], [1], "FP32")]}, None, "out of range", id="float-overflow"
    ),
    pytest.param(
        {"inputs": [_input(["a", 1], [2], "BYTES")]}, None, "must be a string", id="bytes-not-text"
    ),
    pytest.param({"inputs": [_input(5, [1])]}, None, "data must be an array", id="scalar-data"),
    pytest.param(
        {"inputs": [{"name": "x", "shape": [1], "datatype": "INT32"}]},
        None,
        "has no 'data'",
        id="no-data",
    ),
    pytest.param(
        {"inputs": [_input([1], [1]), _input([2], [1])]},
        None,
        "'x' more than once",
        id="duplicate-input",
    ),
    pytest.param(
        {"model_name": "other", "inputs": []}, None, "names model 'other'", id="other-model"
    ),
    pytest.param({"id": 42, "inputs": []}, None, "id must be a string", id="id-not-a-string"),
    pytest.param(
        {"parameters": [], "inputs": []},
        None,
        "parameters must be an object",
        id="parameters-not-an-object",
    ),
    pytest.param(
        {"parameters": {"p": {"a": 1}}, "inputs": []},
        None,
        "string, number or boolean",
        id="parameter-an-object",
    ),
    pytest.param(
        {"parameters": {"p": None}, "inputs": []},
        None,
        "string, number or boolean",
        id="parameter-null",
    ),
    pytest.param(
        {"parameters": {"binary_data_output": 1}, "inputs": []},
        None,
        "true or false",
        id="binary-output-not-a-bool",
    ),
    pytest.param(
        {"inputs": [], "outputs": "all"},
        None,
        "outputs must be an array",
        id="outputs-not-an-array",
    ),
    pytest.param({"inputs": [], "outputs": [{}]}, None, "has no 'name'", id="output-without-name"),
    pytest.param(
        {"inputs": [], "outputs": [{"name": "a"}, {"name": "a"}]},
        None,
        "'a' more than once",
        id="duplicate-output",
    ),
    pytest.param(
        {"inputs": [], "outputs": [{"name": "a", "parameters": {"binary_data": "yes"}}]},
        None,
        "true or false",
        id="binary-data-not-a-bool",
    ),
    pytest.param(
        {"inputs": [_BINARY_INPUT]}, None, "no length for its JSON", id="binary-without-json-length"
    ),
    pytest.param(
        {"inputs": [_BINARY_INPUT]}, b"\x00\x00", "runs past the body", id="binary-past-the-body"
    ),
    pytest.param(
        {"inputs": [_BINARY_INPUT]}, b"\x00" * 6, "2 bytes follow", id="bytes-after-the-tensors"
    ),
    pytest.param({"inputs": []}, b"\x00", "1 bytes follow", id="bytes-after-no-tensor"),
    pytest.param(
        {"inputs": [{**_BINARY_INPUT, "parameters": {"binary_data_size": 6}}]},
        b"\x00" * 6,
        "is 4 bytes",
        id="binary-size-not-the-shapes",
    ),
    pytest.param(
        {"inputs": [{**_BINARY_INPUT, "parameters": {"binary_data_size": -4}}]},
        b"",
        "byte count",
        id="negative-binary-size",
    ),
    pytest.param(
        {"inputs": [{**_BINARY_INPUT, "parameters": {"binary_data_size": 2**64 - 1}}]},
        b"",
        "byte count|runs past",
        id="huge-binary-size",
    ),
    pytest.param(
        {"inputs": [{**_BINARY_INPUT, "data": [1, 2]}]},
        b"\x00" * 4,
        "both data and binary_data_size",
        id="data-and-binary",
    ),
    pytest.param(
        {
            "inputs": [
                {
                    "name": "b",
                    "shape": [2],
                    "datatype": "BOOL",
                    "parameters": {"binary_data_size": 2},
                }
            ]
        },
        b"\x01\x02",
        "0 or 1",
        id="bool-byte-2",
    ),
    pytest.param(
        {
            "inputs": [
                {
                    "name": "s",
                    "shape": [3],
                    "datatype": "BYTES",
                    "parameters": {"binary_data_size": 4},
                }
            ]
        },
        struct.pack("<I", 9),
        "cannot fit|overruns",
        id="bytes-elements-past-the-data",
    ),
    pytest.param(
        {
            "inputs": [
                {
                    "name": "s",
                    "shape": [2**40],
                    "datatype": "BYTES",
                    "parameters": {"binary_data_size": 4},
                }
            ]
        },
        struct.pack("<I", 0),
        "cannot fit",
        id="bytes-count-huge",
    ),
]


@pytest.mark.parametrize(("obj", "raw", "words"), REFUSED)
def test_a_malformed_request_is_a_decode_error_that_names_the_problem(
    obj: Any, raw: bytes | None, words: str
) -> None:
    if isinstance(obj, bytes):
        body, json_length = obj, None
    else:
        body, json_length = _body(obj, *([raw] if raw is not None else []))
        if raw is not None and json_length is None:  # an empty binary section
            json_length = len(body)
    with pytest.raises(ic.DecodeError, match=words):
        kserve.decode_request(body, model="m", json_length=json_length)


@pytest.mark.parametrize("json_length", [-1, 10_000])
def test_a_json_length_outside_the_body_is_refused(json_length: int) -> None:
    with pytest.raises(ic.DecodeError, match="past the body"):
        kserve.decode_request(b'{"inputs": []}', model="m", json_length=json_length)


def test_the_json_is_held_to_the_decode_limits() -> None:
    deep = b'{"inputs": [], "zz": ' + b"[" * 600 + b"]" * 600 + b"}"
    with pytest.raises(DepthLimitError):
        kserve.decode_request(deep, model="m")
    many = orjson.dumps({"inputs": [_input(list(range(300_000)), [300_000])]})
    with pytest.raises(ElementBudgetError):
        kserve.decode_request(many, model="m")
    assert kserve.decode_request(many, model="m", max_elements=400_000).request.inputs


def _valid_binary_body() -> tuple[bytes, int]:
    header = {
        "id": "r",
        "inputs": [
            {"name": "f", "shape": [2], "datatype": "FP32", "parameters": {"binary_data_size": 8}},
            {"name": "s", "shape": [1], "datatype": "BYTES", "parameters": {"binary_data_size": 7}},
            _input([[1, 2]], [1, 2]),
        ],
        "outputs": [{"name": "output_0", "parameters": {"binary_data": True}}],
    }
    body, json_length = _body(header, struct.pack("<2f", 1, 2), struct.pack("<I", 3) + b"abc")
    assert json_length is not None
    return body, json_length


@settings(max_examples=300)
@given(st.data())
def test_any_damaged_body_decodes_or_is_a_decode_error(data: st.DataObject) -> None:
    """Cut, flipped or resized anywhere, with any JSON length: a request or a DecodeError."""
    body, json_length = _valid_binary_body()
    cut = data.draw(st.integers(0, len(body)))
    damaged = bytearray(body[:cut])
    for _ in range(data.draw(st.integers(0, 3))):
        if damaged:
            damaged[data.draw(st.integers(0, len(damaged) - 1))] = data.draw(st.integers(0, 255))
    length = data.draw(st.one_of(st.none(), st.just(json_length), st.integers(-2, len(body) + 2)))
    with contextlib.suppress(ic.DecodeError):
        kserve.decode_request(bytes(damaged), model="m", json_length=length)
