"""How long one engine iteration takes: a prefill of some prompts, or one decode step of a batch.

The form is the usual roofline reading of a decoder-only transformer:

- **prefill** (compute-bound): ``prefill_fixed_s + prefill_per_token_s * tokens`` for one
  forward pass over ``tokens`` prompt tokens (of one request or of several prefilled together);
- **decode** (memory-bound): ``decode_base_s + decode_per_seq_s * batch +
  decode_per_kv_token_s * kv_tokens``: reading the weights once per step (the base), a small
  per-sequence cost (sampling, the per-sequence part of the matmuls), and reading every KV-cache
  token the batch attends to.

Defaults: fitted to NVIDIA's published TensorRT-LLM figures for **LLaMA 7B (Llama 2 7B
architecture: 32 layers, hidden 4096, 32 heads), FP8 weights and FP8 KV cache, one H100 80GB
HBM3** (github.com/NVIDIA/TensorRT-LLM, ``docs/source/performance.md`` at commit 138f96d4:
its "Peak Throughput" table updated for v0.6.1 and "Low Latency" table from v0.5; runs of
``gptSessionBenchmark``, which batches statically: the whole batch is prefilled, then decoded
for the output length):

- first-token latency at batch 1: 7 ms for 128 input tokens, 36 ms for 2048; the two points
  give ``prefill_per_token_s`` = 29 ms / 1920 tokens = 15.1 us and ``prefill_fixed_s`` = 5.07 ms;
- output throughput (tokens/s/GPU) for batch x input x output: 768 x 128 x 128: 19,694;
  112 x 128 x 2048: 6,818; 80 x 2048 x 128: 2,244; 48 x 2048 x 2048: 2,740. Each run's total
  time (batch x output / throughput) minus its modelled prefill, spread over its decode steps,
  gives a measured mean step time at a known batch and KV size; a least-squares fit of the
  three decode parameters to the four runs gives ``decode_base_s`` = 5.13 ms,
  ``decode_per_seq_s`` = 14.5 us, ``decode_per_kv_token_s`` = 74.3 ns. With them the model
  gives the published throughput within 1% for three runs and 6% low for 80 x 2048 x 128,
  whose time is mostly prefill (its decode steps come out 15% slow).

The fitted KV term agrees with one derived from memory bandwidth rather than measured: an FP8 KV
token of this model is 2 x 32 layers x 4096 = 256 KiB, read at the H100 SXM's 3.35 TB/s in
78 ns. Neither figure models chunked prefill, CUDA graphs or speculative decoding.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass, fields, replace


@dataclass(frozen=True, slots=True, kw_only=True)
class StepModel:
    """Iteration times in seconds; see the module docstring for the form and the source of the
    defaults. Every parameter is settable; :meth:`scaled` multiplies them all."""

    prefill_fixed_s: float = 5.07e-3
    prefill_per_token_s: float = 15.1e-6
    decode_base_s: float = 5.13e-3
    decode_per_seq_s: float = 14.5e-6
    decode_per_kv_token_s: float = 74.3e-9

    def __post_init__(self) -> None:
        for field in fields(self):
            value = getattr(self, field.name)
            if not isinstance(value, int | float) or not math.isfinite(value) or value < 0:
                raise ValueError(f"{field.name} must be a finite, non-negative number of seconds")

    def prefill_s(self, prompt_tokens: int) -> float:
        """One request's prefill of ``prompt_tokens`` tokens (a prefill batch of one)."""
        if prompt_tokens < 0:
            raise ValueError("prompt_tokens cannot be negative")
        return self.prefill_fixed_s + self.prefill_per_token_s * prompt_tokens

    def prefill_batch_s(self, prompt_tokens: Iterable[int]) -> float:
        """One prefill iteration over several requests' prompts: one forward pass, so the fixed
        cost is paid once and the per-token cost on the sum (prefill is compute-bound)."""
        return self.prefill_s(sum(prompt_tokens))

    def decode_step_s(self, batch: int, kv_tokens: int) -> float:
        """One decode iteration of ``batch`` requests that hold ``kv_tokens`` KV tokens in total."""
        if batch < 1:
            raise ValueError("a decode step needs at least one request")
        if kv_tokens < 0:
            raise ValueError("kv_tokens cannot be negative")
        return (
            self.decode_base_s
            + self.decode_per_seq_s * batch
            + self.decode_per_kv_token_s * kv_tokens
        )

    def scaled(self, factor: float) -> StepModel:
        """Every time multiplied by ``factor`` (e.g. 0.01 for a fast test engine on the real
        clock, 2 for a GPU half as fast)."""
        if not math.isfinite(factor) or factor < 0:
            raise ValueError("factor must be a finite, non-negative number")
        return replace(
            self, **{field.name: getattr(self, field.name) * factor for field in fields(self)}
        )
