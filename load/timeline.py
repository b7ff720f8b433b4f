"""A point's inter-token latency and throughput over time, for the HTML report's ITL-over-time
plot: the point is cut into buckets of time after its start (1 s, or a round width that gives
20 to 200 buckets) and each bucket gets:

    itl_p50_ms, itl_p99_ms   P50/P99 of the inter-token gaps that *ended* in the bucket, per
                             token (a chunk of n tokens after a gap g counts n times g / n, as
                             the report's "ITL per token")
    itl_tokens               how many tokens those percentiles are of
    tokens                   output tokens delivered in the bucket (at their chunk's arrival)
    completed, failed        requests that ended in the bucket, by outcome
    ttft_p50_ms              TTFT P50 of the completed requests *intended* in the bucket

Only completed streams carry tokens and gaps (a failed one is in no latency, as in the rest of
the report), so ``tokens`` sums to the point's ``output_tokens`` and ``completed`` to its
``requests_completed``. Percentiles are exact (nearest rank, from the nanosecond values), None
in a bucket with nothing to take them of.

The recording only appends to typed arrays (about 0.1-0.2 us a token, measured on a busy
2-core machine); the arrival time of each chunk, ``first_token_ns + cumsum(gaps)``, is
computed with numpy when the summary is asked for. The cost is memory, 16 bytes a
token-carrying chunk, for the point's length.
"""

from __future__ import annotations

import math
from array import array
from collections.abc import Sequence
from typing import Any, Final

import numpy as np

BUCKET_S: Final = 1.0
MIN_BUCKETS: Final = 20
MAX_BUCKETS: Final = 200
ROUND_WIDTHS_S: Final = (
    0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0, 2.0, 5.0, 10.0, 15.0, 30.0,
    60.0, 120.0, 300.0, 600.0, 1800.0, 3600.0,
)  # fmt: skip

_FIELDS: Final = (
    "intended_ns",
    "first_token_ns",
    "done_ns",
    "output_tokens",
    "gaps",
    "first_chunk_tokens",
    "measured",
)


def bucket_width_s(span_s: float) -> float:
    """1 s if that gives ``MIN_BUCKETS`` to ``MAX_BUCKETS`` buckets over ``span_s``, else the
    round width nearest to 1 s that does (the narrowest or widest one for extreme spans)."""
    if MIN_BUCKETS <= span_s / BUCKET_S <= MAX_BUCKETS:
        return BUCKET_S
    if span_s / BUCKET_S > MAX_BUCKETS:
        wide = [w for w in ROUND_WIDTHS_S if span_s / w <= MAX_BUCKETS]
        return wide[0] if wide else ROUND_WIDTHS_S[-1]
    narrow = [w for w in ROUND_WIDTHS_S if span_s / w >= MIN_BUCKETS]
    return narrow[-1] if narrow else ROUND_WIDTHS_S[0]


class Timeline:
    """Fed by :class:`~inferwire.load.metrics.Recorder` with every request of a point;
    :meth:`summary` gives the buckets (see the module docstring)."""

    __slots__ = ("_chunk_tokens", "_failed_ns", "_gaps_ns", "_requests")

    def __init__(self) -> None:
        self._requests = array("q")
        """Per completed request, :data:`_FIELDS` in a row (one extend a request, not five)."""
        self._gaps_ns = array("q")
        self._chunk_tokens = array("q")
        self._failed_ns = array("q")

    def completed(
        self,
        *,
        intended_ns: int,
        first_token_ns: int,
        done_ns: int,
        output_tokens: int,
        gaps_ns: Sequence[int],
        chunk_tokens: Sequence[int],
        first_chunk_tokens: int = 1,
        measured: bool = True,
    ) -> None:
        """A completed stream, with the arguments of ``Recorder.completed_stream``;
        ``measured``: in the point's measured window (for :meth:`chunk_token_counts`)."""
        self._requests.extend(
            (
                intended_ns,
                first_token_ns,
                done_ns,
                output_tokens,
                len(gaps_ns),
                first_chunk_tokens,
                measured,
            )
        )
        if gaps_ns:
            # fromlist: half the cost of extend; per request, so no pause to copy a backlog
            self._gaps_ns.fromlist(gaps_ns if isinstance(gaps_ns, list) else list(gaps_ns))
            self._chunk_tokens.fromlist(
                chunk_tokens if isinstance(chunk_tokens, list) else list(chunk_tokens)
            )

    def failed(self, done_ns: int) -> None:
        self._failed_ns.append(done_ns)

    def chunk_token_counts(self, top: int) -> np.ndarray:
        """``counts[n]``: the token-carrying chunks of the measured streams that carried n
        tokens, n up to ``top`` (whose entry counts ``top`` or more); from the arrays kept
        here, so that recording a chunk costs nothing more."""
        requests = np.frombuffer(self._requests, np.int64).reshape(-1, len(_FIELDS))
        measured = requests[:, 6] != 0
        later = np.frombuffer(self._chunk_tokens, np.int64)[np.repeat(measured, requests[:, 4])]
        first = requests[measured, 5]
        tokens = np.concatenate([first[first > 0], later]).clip(0, top)
        return np.bincount(tokens, minlength=top + 1)

    def summary(self, start_ns: int) -> dict[str, Any]:
        """The buckets after ``start_ns`` (the point's first intended send time)."""
        requests = np.frombuffer(self._requests, np.int64).reshape(-1, len(_FIELDS))
        intended = requests[:, 0] - start_ns
        first = requests[:, 1] - start_ns
        done = requests[:, 2] - start_ns
        tokens = requests[:, 3]
        gap_counts = requests[:, 4]
        gaps = np.frombuffer(self._gaps_ns, np.int64)
        chunk_tokens = np.frombuffer(self._chunk_tokens, np.int64)
        failed = np.frombuffer(self._failed_ns, np.int64) - start_ns
        if len(gaps) != len(chunk_tokens) or int(gap_counts.sum()) != len(gaps):
            raise ValueError("every gap needs its chunk's token count")

        # each gap's request, and its chunk's arrival: the first token, then the gaps summed
        owner = np.repeat(np.arange(len(gap_counts)), gap_counts)
        summed = np.cumsum(gaps)
        before = np.concatenate([[0], summed])[np.cumsum(gap_counts) - gap_counts]
        arrived = first[owner] + summed - before[owner]
        first_chunk_tokens = tokens - np.bincount(owner, chunk_tokens, len(tokens)).astype(np.int64)
        streamed = tokens > 0

        end_ns = max(int(done.max(initial=0)), int(failed.max(initial=0)), 1)
        width_s = bucket_width_s(end_ns / 1e9)
        buckets = max(1, math.ceil(end_ns / (width_s * 1e9)))

        def where(times_ns: np.ndarray) -> np.ndarray:
            return (times_ns // round(width_s * 1e9)).clip(0, buckets - 1)

        def count(times_ns: np.ndarray, weights: np.ndarray | None = None) -> list[int]:
            counts = np.bincount(where(times_ns), weights, buckets)
            return [int(c) for c in counts.tolist()]

        token_counts = np.bincount(where(first[streamed]), first_chunk_tokens[streamed], buckets)
        token_counts += np.bincount(where(arrived), chunk_tokens, buckets)
        gap_per_token = gaps // np.maximum(chunk_tokens, 1)
        itl_p50, itl_p99 = _percentiles_ms(
            where(arrived), gap_per_token, chunk_tokens, buckets, (0.50, 0.99)
        )
        ttft = first[streamed] - intended[streamed]
        (ttft_p50,) = _percentiles_ms(
            where(intended[streamed]), ttft, np.ones_like(ttft), buckets, (0.50,)
        )
        return {
            "bucket_s": width_s,
            "buckets": buckets,
            "itl_p50_ms": itl_p50,
            "itl_p99_ms": itl_p99,
            "itl_tokens": count(arrived, chunk_tokens),
            "tokens": [int(c) for c in token_counts.round().tolist()],
            "completed": count(done),
            "failed": count(failed),
            "ttft_p50_ms": ttft_p50,
        }


def _percentiles_ms(
    bucket: np.ndarray,
    values_ns: np.ndarray,
    weights: np.ndarray,
    buckets: int,
    quantiles: Sequence[float],
) -> list[list[float | None]]:
    """Per bucket, the nearest-rank weighted quantiles of ``values_ns``, in ms (None: empty)."""
    order = np.lexsort((values_ns, bucket))
    bucket, values_ns, weights = bucket[order], values_ns[order], weights[order]
    total = np.bincount(bucket, weights, buckets)
    running = np.cumsum(weights)
    before = np.concatenate([[0], np.cumsum(total)])[:-1]
    out: list[list[float | None]] = []
    for quantile in quantiles:
        # the first value whose running weight in its bucket reaches quantile x the bucket's
        rank = before + np.maximum(np.ceil(quantile * total), 1)
        at = np.searchsorted(running, rank).clip(0, max(len(values_ns) - 1, 0))
        picked = values_ns[at] / 1e6 if len(values_ns) else np.zeros(buckets)
        out.append(
            [round(float(v), 4) if t > 0 else None for v, t in zip(picked, total, strict=True)]
        )
    return out
