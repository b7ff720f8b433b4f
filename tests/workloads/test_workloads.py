"""The seeded workloads: stable names, deterministic values, realistic shapes."""

from __future__ import annotations

import collections
import hashlib
import inspect
import math
import os
import subprocess
import sys
from typing import Any

import numpy as np
import pytest

import inferwire.codecs as ic
from inferwire import workloads
from inferwire.codecs.model import DATATYPES

STREAMS = workloads.names("stream")
NAMES = [
    "stream-16",
    "stream-256",
    "stream-2048",
    "stream-16-top5",
    "stream-256-top5",
    "stream-2048-top5",
    "stream-256-top5-f32",
    "stream-256-multi",
    "embed-1x384",
    "embed-32x1024",
    "embed-8x4096",
    "image-fp32",
    "image-fp16",
]


def fingerprint(messages: list[Any]) -> str:
    """A digest of every value: reprs for chunks (exact for floats), raw bytes for arrays."""
    digest = hashlib.sha256()
    for message in messages:
        if isinstance(message, ic.TokenChunk):
            digest.update(repr(message).encode())
        elif isinstance(message, ic.EmbeddingBatch):
            digest.update(repr((message.model, message.usage)).encode())
            digest.update(message.vectors.tobytes())
        else:
            digest.update(repr((message.model, message.id)).encode())
            for tensor in message.inputs:
                digest.update(repr((tensor.name, tensor.datatype, tensor.shape)).encode())
                digest.update(tensor.data.tobytes())
    return digest.hexdigest()


def test_names_are_stable() -> None:
    """The tables in results/ are keyed by these names: renaming one breaks every comparison."""
    assert workloads.names() == NAMES


def test_names_by_kind() -> None:
    assert workloads.names("stream") == [n for n in NAMES if n.startswith("stream-")]
    assert workloads.names("embeddings") == ["embed-1x384", "embed-32x1024", "embed-8x4096"]
    assert workloads.names("tensor") == ["image-fp32", "image-fp16"]


def test_unknown_workload() -> None:
    with pytest.raises(KeyError, match="stream-16"):
        workloads.get("stream-17")


@pytest.mark.parametrize("name", NAMES)
def test_each_workload_is_what_its_kind_says(name: str) -> None:
    workload = workloads.get(name)
    assert workload.name == name
    assert workload.description
    messages = workload.messages()
    expected = {
        "stream": ic.TokenChunk,
        "embeddings": ic.EmbeddingBatch,
        "tensor": ic.InferRequest,
    }[workload.kind]
    assert all(type(m) is expected for m in messages)
    assert len(messages) >= 1 if workload.kind == "stream" else len(messages) == 1


@pytest.mark.parametrize("name", NAMES)
def test_same_seed_same_values_other_seed_other_values(name: str) -> None:
    workload = workloads.get(name)
    first, again = workload.build(7), workload.build(7)
    assert first == again
    assert fingerprint(first) == fingerprint(again)
    assert fingerprint(workload.build(8)) != fingerprint(first)
    assert fingerprint(workload.messages()) == fingerprint(workload.build(workloads.DEFAULT_SEED))


def test_values_do_not_depend_on_the_process() -> None:
    """Same values under another hash seed (no set or dict order leaks into a workload)."""
    script = "\n".join(
        [
            "from __future__ import annotations",
            "import hashlib",
            "import inferwire.codecs as ic",
            "from inferwire import workloads",
            inspect.getsource(fingerprint),
            "for name in workloads.names():",
            "    print(name, fingerprint(workloads.get(name).messages()))",
        ]
    )
    result = subprocess.run(
        [sys.executable, "-c", script],
        capture_output=True,
        text=True,
        check=True,
        env={**os.environ, "PYTHONHASHSEED": "12345"},
    )
    there = dict(line.split() for line in result.stdout.splitlines())
    assert there == {name: fingerprint(workloads.get(name).messages()) for name in NAMES}


# -- token streams ---------------------------------------------------------------------------


def _chunks(name: str) -> list[ic.TokenChunk]:
    chunks = workloads.get(name).messages()
    assert all(isinstance(c, ic.TokenChunk) for c in chunks)
    return chunks  # type: ignore[return-value]


@pytest.mark.parametrize("name", STREAMS)
def test_stream_chunks_are_numbered_and_the_last_one_closes_the_response(name: str) -> None:
    chunks = _chunks(name)
    tokens = int(name.split("-")[1])
    assert [c.seq for c in chunks] == list(range(len(chunks)))
    assert len({(c.id, c.model, c.created, c.index) for c in chunks}) == 1
    assert chunks[0].id.startswith("chatcmpl-")
    assert chunks[0].index == 0
    assert sum(len(c.token_ids) for c in chunks) == tokens
    *body, last = chunks
    assert all(c.finish_reason is None and c.usage is None for c in body)
    assert last.finish_reason == "stop"
    assert last.usage is not None
    assert last.usage.completion_tokens == tokens
    assert last.usage.prompt_tokens > 0


@pytest.mark.parametrize("name", STREAMS)
def test_stream_token_ids_are_in_the_llama3_vocabulary(name: str) -> None:
    ids = [t for c in _chunks(name) for t in c.token_ids]
    assert all(type(t) is int and 0 <= t < workloads.VOCAB_SIZE == 128_256 for t in ids)
    assert all(c.text for c in _chunks(name))


def test_stream_ids_are_zipf_like() -> None:
    """A few ids are very frequent, most are rare (a Zipf exponent of 1.1)."""
    ids = [t for c in _chunks("stream-2048") for t in c.token_ids]
    counts = collections.Counter(ids).most_common()
    assert 0.04 < counts[0][1] / len(ids) < 0.25
    assert sum(1 for _, n in counts if n == 1) > len(counts) / 2
    assert len(counts) > 300


def test_stream_text_is_word_pieces_with_some_multi_byte_utf8() -> None:
    chunks = _chunks("stream-2048")
    texts = [c.text for c in chunks]
    multi_byte = [t for t in texts if len(t.encode()) > len(t)]
    assert multi_byte
    assert len(multi_byte) < len(texts) / 4
    assert sum(t.startswith(" ") for t in texts) > len(texts) / 3  # words with leading spaces
    assert any(t in {".", ",", "\n"} for t in texts)


def test_the_multi_token_stream_has_several_tokens_per_chunk() -> None:
    sizes = [len(c.token_ids) for c in _chunks("stream-256-multi")]
    assert max(sizes) > 1
    assert all(2 <= s <= 8 for s in sizes[:-1])
    assert 1 <= sizes[-1] <= 8


@pytest.mark.parametrize("name", [n for n in STREAMS if "-top5" not in n])
def test_streams_without_logprobs(name: str) -> None:
    assert all(c.logprobs is None for c in _chunks(name))


@pytest.mark.parametrize("name", [n for n in STREAMS if n.endswith("-top5")])
def test_streams_with_top5_logprobs(name: str) -> None:
    for chunk in _chunks(name):
        assert chunk.logprobs is not None
        assert len(chunk.logprobs) == len(chunk.token_ids)
        assert "".join(lp.token for lp in chunk.logprobs) == chunk.text
        for lp in chunk.logprobs:
            assert math.isfinite(lp.logprob)
            assert lp.logprob <= 0
            assert float(f"{lp.logprob:.8g}") == lp.logprob  # 8 significant digits, as OpenAI
            assert len(lp.top) == 5
            assert (lp.top[0].token, lp.top[0].logprob) == (lp.token, lp.logprob)
            values = [t.logprob for t in lp.top]
            assert values == sorted(values, reverse=True)


def test_the_float32_stream_sends_full_precision_float32_logprobs() -> None:
    """As engines compute them: float32 values, widened to doubles with every digit."""
    plain = _chunks("stream-256-top5")
    chunks = _chunks("stream-256-top5-f32")
    # the same tokens as stream-256-top5: the two differ in their logprobs' values
    assert [(c.token_ids, c.text) for c in chunks] == [(c.token_ids, c.text) for c in plain]
    values = [t.logprob for c in chunks for lp in c.logprobs or () for t in lp.top]
    assert len(values) == 256 * 5
    assert all(float(np.float32(v)) == v and math.isfinite(v) and v < 0 for v in values)
    # not short decimals: most need the float32's every digit (9 significant or more)
    assert sum(float(f"{v:.8g}") != v for v in values) > 0.9 * len(values)
    for chunk in chunks:
        assert chunk.logprobs is not None
        for lp in chunk.logprobs:
            assert len(lp.top) == 5
            assert (lp.top[0].token, lp.top[0].logprob) == (lp.token, lp.logprob)
            top = [t.logprob for t in lp.top]
            assert top == sorted(top, reverse=True)
            # a log-softmax over the vocabulary: the top 5 hold less than all the mass
            assert math.fsum(math.exp(v) for v in top) < 1


# -- embeddings and images ------------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "shape"),
    [("embed-1x384", (1, 384)), ("embed-32x1024", (32, 1024)), ("embed-8x4096", (8, 4096))],
)
def test_embedding_batches(name: str, shape: tuple[int, int]) -> None:
    (batch,) = workloads.get(name).messages()
    assert isinstance(batch, ic.EmbeddingBatch)
    assert batch.vectors.shape == shape
    assert batch.vectors.dtype == np.float32
    assert not batch.vectors.flags.writeable  # a shared, cached value: nobody may change it
    norms = np.linalg.norm(batch.vectors.astype(np.float64), axis=1)
    np.testing.assert_allclose(norms, 1.0, rtol=1e-5)
    assert batch.usage is not None
    assert batch.usage.completion_tokens == 0


@pytest.mark.parametrize(("name", "datatype"), [("image-fp32", "FP32"), ("image-fp16", "FP16")])
def test_image_tensors(name: str, datatype: str) -> None:
    (request,) = workloads.get(name).messages()
    assert isinstance(request, ic.InferRequest)
    (tensor,) = request.inputs
    assert tensor.datatype == datatype
    assert tensor.shape == tensor.data.shape == (1, 3, 224, 224)
    assert tensor.data.dtype == DATATYPES[datatype]
    assert not tensor.data.flags.writeable
    assert np.isfinite(tensor.data).all()
    # ImageNet-normalized pixels lie within about [-2.2, 2.7]
    assert -2.2 < float(tensor.data.min()) < 0 < float(tensor.data.max()) < 2.7


def test_the_fp16_image_is_the_fp32_image_rounded() -> None:
    (fp32,) = workloads.get("image-fp32").messages()
    (fp16,) = workloads.get("image-fp16").messages()
    assert isinstance(fp32, ic.InferRequest)
    assert isinstance(fp16, ic.InferRequest)
    assert np.array_equal(fp32.inputs[0].data.astype(np.float16), fp16.inputs[0].data)
