"""The message model: immutable values, and equality that compares arrays bit for bit."""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

import inferwire.codecs as ic
from inferwire.codecs.model import DATATYPES, arrays_equal, datatype_of, dtype_of

MODEL_CLASSES = [
    ic.Usage,
    ic.TopLogprob,
    ic.TokenLogprob,
    ic.TokenChunk,
    ic.EmbeddingBatch,
    ic.Tensor,
    ic.InferRequest,
    ic.InferResponse,
]


def _tensor(data: Any, datatype: str = "FP32", name: str = "t") -> ic.Tensor:
    array = np.asarray(data, dtype=DATATYPES[datatype])
    return ic.Tensor(name=name, datatype=datatype, shape=array.shape, data=array)


def _example(cls: type[Any]) -> Any:
    usage = ic.Usage(prompt_tokens=1, completion_tokens=2)
    return {
        ic.Usage: usage,
        ic.TopLogprob: ic.TopLogprob(token="a", logprob=-1.0),
        ic.TokenLogprob: ic.TokenLogprob(token="a", logprob=-1.0),
        ic.TokenChunk: ic.TokenChunk(
            id="c", model="m", created=1, index=0, seq=0, token_ids=(1,), text="a"
        ),
        ic.EmbeddingBatch: ic.EmbeddingBatch(model="m", vectors=np.zeros((1, 2), np.float32)),
        ic.Tensor: _tensor([1.0]),
        ic.InferRequest: ic.InferRequest(model="m", id="r", inputs=(_tensor([1.0]),)),
        ic.InferResponse: ic.InferResponse(model="m", id="r", outputs=(_tensor([1.0]),)),
    }[cls]


@pytest.mark.parametrize("cls", MODEL_CLASSES)
def test_model_classes_are_frozen_slotted_keyword_only(cls: type[Any]) -> None:
    params = cls.__dataclass_params__
    assert params.frozen
    assert "__slots__" in vars(cls)
    assert all(f.kw_only for f in dataclasses.fields(cls))
    value = _example(cls)
    assert not hasattr(value, "__dict__")
    first = dataclasses.fields(cls)[0].name
    with pytest.raises(dataclasses.FrozenInstanceError):
        setattr(value, first, getattr(value, first))
    with pytest.raises(TypeError):
        cls(*[getattr(value, f.name) for f in dataclasses.fields(cls)])


@pytest.mark.parametrize("cls", [ic.EmbeddingBatch, ic.Tensor])
def test_array_holders_are_unhashable(cls: type[Any]) -> None:
    with pytest.raises(TypeError):
        hash(_example(cls))


def test_defaults() -> None:
    chunk = _example(ic.TokenChunk)
    assert (chunk.logprobs, chunk.finish_reason, chunk.usage) == (None, None, None)
    assert ic.TokenLogprob(token="a", logprob=0.0).top == ()
    assert _example(ic.EmbeddingBatch).usage is None


def test_datatypes_are_the_kserve_names_in_little_endian() -> None:
    assert set(DATATYPES) == {
        "BOOL", "UINT8", "UINT16", "UINT32", "UINT64", "INT8", "INT16", "INT32", "INT64",
        "FP16", "FP32", "FP64", "BYTES",
    }  # fmt: skip
    for name, dtype in DATATYPES.items():
        assert dtype_of(name) == dtype
        assert datatype_of(np.zeros(1, dtype)) == name
        assert dtype.byteorder in "<|="
        if name != "BYTES":
            assert datatype_of(np.zeros(1, dtype.newbyteorder(">"))) == name
    with pytest.raises(KeyError):
        dtype_of("FP8")
    with pytest.raises(KeyError):
        datatype_of(np.zeros(1, np.complex64))


# (a, b, equal): arrays compare dtype, shape and bits, never values after a cast.
ARRAY_CASES = [
    pytest.param([1.0, 2.0], "FP32", [1.0, 2.0], "FP32", True, id="same"),
    pytest.param([np.nan], "FP32", [np.nan], "FP32", True, id="nan-equals-nan"),
    pytest.param([0.0], "FP32", [-0.0], "FP32", False, id="signed-zero"),
    pytest.param([1.0, 2.0], "FP32", [1.0, 2.0], "FP64", False, id="fp32-vs-fp64"),
    pytest.param([1, 2], "INT32", [1, 2], "INT64", False, id="int32-vs-int64"),
    pytest.param([1, 0], "UINT8", [1, 0], "BOOL", False, id="uint8-vs-bool"),
    pytest.param([1.0, 2.0], "FP32", [2.0, 1.0], "FP32", False, id="values"),
    pytest.param([[1.0, 2.0]], "FP32", [1.0, 2.0], "FP32", False, id="shape"),
    pytest.param([b"a", b""], "BYTES", [b"a", b""], "BYTES", True, id="bytes"),
    pytest.param([b"a", b""], "BYTES", [b"a", b"b"], "BYTES", False, id="bytes-values"),
]


@pytest.mark.parametrize(("a", "a_type", "b", "b_type", "equal"), ARRAY_CASES)
def test_tensor_equality(a: Any, a_type: str, b: Any, b_type: str, equal: bool) -> None:
    left = _tensor(a, a_type)
    right = ic.Tensor(name="t", datatype=a_type, shape=left.shape, data=_tensor(b, b_type).data)
    assert (left == right) is equal
    assert (left != right) is not equal
    assert arrays_equal(left.data, right.data) is equal


@pytest.mark.parametrize(("a", "a_type", "b", "b_type", "equal"), ARRAY_CASES)
def test_embedding_and_request_equality(
    a: Any, a_type: str, b: Any, b_type: str, equal: bool
) -> None:
    left, right = _tensor(a, a_type), _tensor(b, b_type)
    if a_type == "FP32" and b_type == "FP32" and left.data.ndim == right.data.ndim == 1:
        batch = ic.EmbeddingBatch(model="m", vectors=left.data.reshape(1, -1))
        other = ic.EmbeddingBatch(model="m", vectors=right.data.reshape(1, -1))
        assert (batch == other) is equal
    request = ic.InferRequest(model="m", id="r", inputs=(left,))
    assert (request == ic.InferRequest(model="m", id="r", inputs=(right,))) is (
        equal and left.shape == right.shape
    )


def test_other_fields_take_part_in_equality() -> None:
    vectors = np.ones((1, 2), np.float32)
    batch = ic.EmbeddingBatch(model="m", vectors=vectors)
    assert batch == ic.EmbeddingBatch(model="m", vectors=vectors.copy())
    assert batch != ic.EmbeddingBatch(model="n", vectors=vectors)
    usage = ic.Usage(prompt_tokens=1, completion_tokens=0)
    assert batch != ic.EmbeddingBatch(model="m", vectors=vectors, usage=usage)
    tensor = _tensor([1.0])
    assert tensor != dataclasses.replace(tensor, name="u")
    assert tensor != dataclasses.replace(tensor, datatype="FP64")
    assert tensor != dataclasses.replace(tensor, shape=(1, 1))
    assert tensor != "not a tensor"
    assert batch != tensor


def test_layout_does_not_take_part_in_equality() -> None:
    data = np.arange(6, dtype=np.float32).reshape(2, 3)
    transposed = np.ascontiguousarray(data.T).T  # same values, Fortran order
    assert not transposed.flags.c_contiguous
    assert _tensor(data) == ic.Tensor(name="t", datatype="FP32", shape=(2, 3), data=transposed)
    readonly = data.copy()
    readonly.flags.writeable = False
    assert _tensor(data) == _tensor(readonly)


@given(
    hnp.arrays(
        dtype=st.sampled_from([d for n, d in DATATYPES.items() if n != "BYTES"]),
        shape=hnp.array_shapes(min_dims=0, max_dims=3, min_side=0, max_side=4),
    )
)
def test_equality_is_bitwise(data: np.ndarray[Any, Any]) -> None:
    tensor = ic.Tensor(name="t", datatype=datatype_of(data), shape=data.shape, data=data)
    copy = ic.Tensor(name="t", datatype=tensor.datatype, shape=data.shape, data=data.copy())
    assert tensor == copy
    if data.size:
        flipped = data.copy()
        flipped.reshape(-1).view(np.uint8)[0] ^= 1
        changed = ic.Tensor(name="t", datatype=tensor.datatype, shape=data.shape, data=flipped)
        assert tensor != changed
