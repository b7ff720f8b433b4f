"""inferwire.workloads: seeded, deterministic, named payloads that every test, benchmark and
table uses.

``names()`` lists them and ``get(name).messages()`` builds one: a token stream is its list of
chunks; an embedding or tensor workload is a one-message list. The same name and seed give the
same values on every machine (numpy's PCG64 and the standard library only).
:func:`token_stream_source` is what the simulated service of :mod:`inferwire.transports` plays
(and the engine of :mod:`inferwire.engine`), :func:`cut_stream` a stream cut to ``max_tokens``,
and :mod:`inferwire.workloads.hostile` makes the bad inputs a peer should never send.

Token streams follow Llama 3: a 128,256-token vocabulary with Zipf-distributed ids (exponent
1.1, ranks mapped onto ids by a seeded permutation) and word-piece text from
:mod:`inferwire.workloads.vocab`; logprobs, when asked for, carry 8 significant digits as OpenAI
sends them.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Final, Literal

import numpy as np

from inferwire.codecs import (
    EmbeddingBatch,
    InferRequest,
    Message,
    Tensor,
    TokenChunk,
    TokenLogprob,
    TopLogprob,
    Usage,
)

from .vocab import pieces

DEFAULT_SEED: Final = 20241130
VOCAB_SIZE: Final = 128_256
ZIPF_EXPONENT: Final = 1.1
MODEL: Final = "meta-llama/Llama-3.1-70B-Instruct"
EMBEDDING_MODEL: Final = "BAAI/bge-m3"
IMAGE_MODEL: Final = "resnet50"
CREATED: Final = 1_732_924_800  # 2024-11-30T00:00:00Z

Kind = Literal["stream", "embeddings", "tensor"]


@dataclass(frozen=True, slots=True, kw_only=True)
class Workload:
    name: str
    kind: Kind
    description: str
    build: Callable[[int], list[Message]]

    def messages(self, seed: int = DEFAULT_SEED) -> list[Message]:
        """The payload: a stream's chunks in order, or a single message in a list."""
        return _built(self.name, seed)


def _sig8(value: float) -> float:
    return float(f"{value:.8g}")


class _Tokens:
    """Draws Zipf-distributed token ids and the text of each id."""

    def __init__(self, rng: np.random.Generator) -> None:
        self._rng = rng
        self._vocab = pieces()
        # rank 1 is the most frequent piece; a permutation spreads ranks over the id space
        self._id_of_rank = rng.permutation(VOCAB_SIZE)
        self._rank_of_id = np.argsort(self._id_of_rank)

    def draw(self, count: int) -> list[int]:
        ranks = self._rng.zipf(ZIPF_EXPONENT, size=count * 2)
        ranks = ranks[ranks <= VOCAB_SIZE][:count]
        while len(ranks) < count:  # the tail past the vocabulary was cut: draw more
            more = self._rng.zipf(ZIPF_EXPONENT, size=count)
            ranks = np.concatenate([ranks, more[more <= VOCAB_SIZE]])[:count]
        return [int(self._id_of_rank[r - 1]) for r in ranks]

    def text(self, token_id: int) -> str:
        # the text follows the rank, so frequent ids are frequent pieces (" the", ".", ...)
        return self._vocab[int(self._rank_of_id[token_id]) % len(self._vocab)]

    def logprob(self, token_id: int, top_k: int) -> TokenLogprob:
        # the chosen token first, then alternatives with falling log-probabilities
        steps = np.cumsum(self._rng.exponential(1.5, size=top_k + 1))
        chosen = _sig8(-float(self._rng.exponential(0.4)))
        alternatives = self.draw(top_k) if top_k else []
        top = [TopLogprob(token=self.text(token_id), logprob=chosen)]
        top += [
            TopLogprob(token=self.text(alt), logprob=_sig8(chosen - float(step)))
            for alt, step in zip(alternatives[: top_k - 1], steps, strict=False)
        ]
        return TokenLogprob(token=self.text(token_id), logprob=chosen, top=tuple(top[:top_k]))

    def logprob_f32(self, token_id: int, top_k: int) -> TokenLogprob:
        """As an engine reports them: the log-softmax of float32 logits, computed in float32
        and sent at full precision (every digit of the float32, widened to a double)."""
        # the chosen token's logit and its alternatives' below it, over a tail that holds
        # the rest of the mass (the log-sum-exp of the vocabulary's other logits)
        gaps = self._rng.exponential(1.5, size=top_k).astype(np.float32)
        chosen = np.float32(self._rng.normal(18.0, 3.0))
        logits = np.concatenate([[chosen], chosen - np.cumsum(gaps, dtype=np.float32)])
        tail = np.float32(chosen - np.float32(self._rng.exponential(1.0) + 1.0))
        peak = logits.max()
        total = np.exp(logits - peak, dtype=np.float32).sum(dtype=np.float32) + np.exp(
            tail - peak, dtype=np.float32
        )
        logprobs = (logits - (peak + np.log(total, dtype=np.float32))).astype(np.float32)
        alternatives = self.draw(top_k) if top_k else []
        values = [float(v) for v in logprobs]
        top = [TopLogprob(token=self.text(token_id), logprob=values[0])]
        top += [
            TopLogprob(token=self.text(alt), logprob=value)
            for alt, value in zip(alternatives[: top_k - 1], values[1:], strict=False)
        ]
        return TokenLogprob(token=self.text(token_id), logprob=values[0], top=tuple(top[:top_k]))


def token_stream(
    seed: int,
    *,
    tokens: int,
    top_logprobs: int | None,
    tokens_per_chunk: tuple[int, int],
    float32_logprobs: bool = False,
) -> list[Message]:
    """``tokens`` tokens in chunks of ``tokens_per_chunk`` (inclusive range) tokens; logprobs
    as 8-digit decimals, or with ``float32_logprobs`` as full-precision float32 values."""
    rng = np.random.default_rng(seed)
    vocab = _Tokens(rng)
    logprob = vocab.logprob_f32 if float32_logprobs else vocab.logprob
    response_id = "chatcmpl-" + rng.bytes(12).hex()
    prompt_tokens = int(rng.integers(64, 2048))
    ids = vocab.draw(tokens)
    chunks: list[Message] = []
    pos = 0
    low, high = tokens_per_chunk
    while pos < tokens:
        step = min(int(rng.integers(low, high + 1)), tokens - pos)
        step_ids = ids[pos : pos + step]
        pos += step
        last = pos == tokens
        chunks.append(
            TokenChunk(
                id=response_id,
                model=MODEL,
                created=CREATED,
                index=0,
                seq=len(chunks),
                token_ids=tuple(step_ids),
                text="".join(vocab.text(i) for i in step_ids),
                logprobs=None
                if top_logprobs is None
                else tuple(logprob(i, top_logprobs) for i in step_ids),
                # the response ended by itself; "length" is for a cut one (the service's
                # max_tokens), as OpenAI and vLLM report them
                finish_reason="stop" if last else None,
                usage=Usage(prompt_tokens=prompt_tokens, completion_tokens=tokens)
                if last
                else None,
            )
        )
    return chunks


def embeddings(seed: int, *, batch: int, dim: int) -> list[Message]:
    rng = np.random.default_rng(seed)
    vectors = rng.standard_normal((batch, dim), dtype=np.float32)
    vectors /= np.linalg.norm(vectors, axis=1, keepdims=True)  # as embedding models return
    vectors.flags.writeable = False
    prompt_tokens = int(rng.integers(8, 512)) * batch
    return [
        EmbeddingBatch(
            model=EMBEDDING_MODEL,
            vectors=vectors,
            usage=Usage(prompt_tokens=prompt_tokens, completion_tokens=0),
        )
    ]


def image(seed: int, *, datatype: Literal["FP32", "FP16"]) -> list[Message]:
    rng = np.random.default_rng(seed)
    pixels = rng.integers(0, 256, size=(1, 3, 224, 224), dtype=np.uint8)
    # ImageNet normalization, as a preprocessing step in front of resnet50 does
    mean = np.array([0.485, 0.456, 0.406], dtype=np.float32).reshape(1, 3, 1, 1)
    std = np.array([0.229, 0.224, 0.225], dtype=np.float32).reshape(1, 3, 1, 1)
    data = ((pixels.astype(np.float32) / 255.0 - mean) / std).astype(
        np.float32 if datatype == "FP32" else np.float16
    )
    data.flags.writeable = False
    tensor = Tensor(name="input", datatype=datatype, shape=data.shape, data=data)
    return [InferRequest(model=IMAGE_MODEL, id="req-" + rng.bytes(4).hex(), inputs=(tensor,))]


def _stream(
    tokens: int, top: int | None, per_chunk: tuple[int, int] = (1, 1), *, f32: bool = False
) -> Callable[[int], list[Message]]:
    return functools.partial(
        token_stream,
        tokens=tokens,
        top_logprobs=top,
        tokens_per_chunk=per_chunk,
        float32_logprobs=f32,
    )


_WORKLOADS: Final[tuple[Workload, ...]] = (
    *(
        Workload(
            name=f"stream-{n}",
            kind="stream",
            build=_stream(n, None),
            description=f"{n}-token stream, one token per chunk, no logprobs",
        )
        for n in (16, 256, 2048)
    ),
    *(
        Workload(
            name=f"stream-{n}-top5",
            kind="stream",
            build=_stream(n, 5),
            description=f"{n}-token stream, one token per chunk, logprobs with top 5",
        )
        for n in (16, 256, 2048)
    ),
    Workload(
        name="stream-256-top5-f32",
        kind="stream",
        build=_stream(256, 5, f32=True),
        description="256-token stream, one token per chunk, top 5 logprobs as full-precision "
        "float32 values (the log-softmax of float32 logits, as engines compute them)",
    ),
    Workload(
        name="stream-256-multi",
        kind="stream",
        build=_stream(256, None, (2, 8)),
        description="256-token stream, 2-8 tokens per chunk (speculative decoding)",
    ),
    *(
        Workload(
            name=f"embed-{b}x{d}",
            kind="embeddings",
            build=functools.partial(embeddings, batch=b, dim=d),
            description=f"{b} float32 embeddings of {d} dims",
        )
        for b, d in ((1, 384), (32, 1024), (8, 4096))
    ),
    Workload(
        name="image-fp32",
        kind="tensor",
        build=functools.partial(image, datatype="FP32"),
        description="1x3x224x224 FP32 image tensor (ImageNet-normalized)",
    ),
    Workload(
        name="image-fp16",
        kind="tensor",
        build=functools.partial(image, datatype="FP16"),
        description="1x3x224x224 FP16 image tensor (ImageNet-normalized)",
    ),
)
_BY_NAME: Final = {w.name: w for w in _WORKLOADS}


def names(kind: Kind | None = None) -> list[str]:
    """Workload names in table order, optionally of one kind."""
    return [w.name for w in _WORKLOADS if kind is None or w.kind == kind]


def get(name: str) -> Workload:
    try:
        return _BY_NAME[name]
    except KeyError:
        raise KeyError(f"unknown workload {name!r}; known: {', '.join(_BY_NAME)}") from None


@functools.lru_cache(maxsize=64)
def _built(name: str, seed: int) -> list[Message]:
    return get(name).build(seed)


def token_stream_source(name: str, seed: int) -> Sequence[TokenChunk]:
    """The chunks of a token-stream workload: the simulated service's source."""
    try:
        workload = get(name)
    except (KeyError, ValueError) as exc:
        raise KeyError(name) from exc
    return [m for m in workload.messages(seed) if isinstance(m, TokenChunk)]


def cut_stream(chunks: Sequence[TokenChunk], max_tokens: int) -> list[TokenChunk]:
    """The chunks up to the one that reaches ``max_tokens`` (kept whole). The last one kept
    becomes the stream's end marker, as the original's last chunk was: ``finish_reason``
    "length" and ``usage`` counting the tokens kept, so a cut stream still proves itself whole
    (see :mod:`inferwire.codecs.integrity`)."""
    out: list[TokenChunk] = []
    tokens = 0
    for chunk in chunks:
        if tokens >= max_tokens:
            break
        out.append(chunk)
        tokens += len(chunk.token_ids)
    if len(out) < len(chunks):
        prompt_tokens = next(
            (c.usage.prompt_tokens for c in reversed(chunks) if c.usage is not None), 0
        )
        out[-1] = replace(
            out[-1],
            finish_reason="length",
            usage=Usage(prompt_tokens=prompt_tokens, completion_tokens=tokens),
        )
    return out
