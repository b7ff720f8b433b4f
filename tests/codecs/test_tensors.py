"""Tensor headers that claim far more elements than their bytes could hold."""

from __future__ import annotations

import numpy as np
import pytest

import inferwire.codecs as ic
from inferwire.codecs.tensors import bytes_elements_from_raw, bytes_elements_to_raw
from inferwire.schemas import inferwire_pb2 as pb
from tests.codecs.accel_helpers import peak_memory

HUGE = 10**12


@pytest.mark.parametrize("raw", [b"", b"\x00\x00\x00\x00", b"\x01\x00\x00\x00a"])
def test_a_bytes_tensor_claiming_more_elements_than_fit_is_refused(raw: bytes) -> None:
    with peak_memory(1 << 20), pytest.raises(ic.DecodeError, match="cannot fit"):
        bytes_elements_from_raw(raw, HUGE)


def test_a_protobuf_bytes_tensor_with_a_lying_shape_is_refused_without_allocating() -> None:
    data = pb.InferRequest(
        model="m", id="1", inputs=[pb.Tensor(name="t", datatype="BYTES", shape=[HUGE])]
    ).SerializeToString()
    with peak_memory(1 << 20), pytest.raises(ic.DecodeError):
        ic.get("protobuf").decode(data, ic.InferRequest)


@pytest.mark.parametrize("elements", [[], [b""], [b"a", b"", b"\xff\x00"], [bytes(range(256))] * 3])
def test_bytes_elements_round_trip(elements: list[bytes]) -> None:
    array = np.empty(len(elements), dtype=object)
    array[:] = elements
    decoded = bytes_elements_from_raw(bytes_elements_to_raw(array), len(elements))
    assert list(decoded) == elements


@pytest.mark.parametrize("cut", [1, 3, 5])
def test_a_truncated_bytes_tensor_is_a_decode_error(cut: int) -> None:
    array = np.empty(2, dtype=object)
    array[:] = [b"ab", b"cd"]
    raw = bytes_elements_to_raw(array)
    with pytest.raises(ic.DecodeError):
        bytes_elements_from_raw(raw[:-cut], 2)
