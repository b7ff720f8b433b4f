"""The verdicts of the engine claims (C8, C13, and the per-stage split of C4, C9, C10), as pure
functions of the figures a run of ``bench/bench_engine.py`` recorded: each takes numbers and
returns the verdict text, so a test can hold every rule to its threshold.

Verdict texts carry no figures (the reproducibility section compares them repeat by repeat as
text); the figures go in the *measured* cell beside them.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Final

C8_CONTINUOUS_P50_MS: Final = 32.0
C8_STATIC_P50_MS: Final = 78.0
C8_PUBLISHED_RATIO: Final = C8_STATIC_P50_MS / C8_CONTINUOUS_P50_MS
"""78 / 32: static's P50 about 2.4x continuous's."""
C8_RATIO_BAND: Final = (2.0, 3.0)
"""A measured static/continuous ratio in this band reproduces the published 2.4x."""
C8_DIRECTION: Final = 1.1
"""Below this ratio the two policies are the same within a run's noise."""

C13_THROUGHPUT_GAIN: Final = 2.4
C13_P99_BEFORE_MS: Final = 230.0
C13_P99_AFTER_MS: Final = 180.0
C13_GAIN_HOLDS: Final = 2.0
"""A throughput gain of at least this much reproduces the published 2.4x (within its noise)."""
C13_SAME: Final = 0.05
"""Within 5% two throughputs or P99s are the same."""

C4_BAND: Final = (0.10, 0.25)
C9_BAND: Final = (0.35, 0.48)
C10_COMPUTE: Final = 0.40
C10_NETWORK_SERIALIZATION: Final = 0.55
C10_TOLERANCE: Final = 0.10
"""A C10 share within 10 points of its published value reproduces it."""
_EPSILON: Final = 1e-9
"""Shares at a band's edge count as inside it (float sums land a hair either side)."""


def c8_verdict(continuous_p50_ms: float, static_p50_ms: float) -> str:
    """C8 from the two policies' P50 TTFT at one rate: the published figure is a 2.4x gap
    (78 / 32 ms), so the verdict reads the ratio static / continuous; the absolute
    milliseconds follow the step model and are shown, not judged."""
    if continuous_p50_ms <= 0:
        return "not measured: no continuous-batching latency"
    ratio = static_p50_ms / continuous_p50_ms
    low, high = C8_RATIO_BAND
    if low <= ratio <= high:
        return "holds: static batching's P50 is 2-3x continuous's, as published"
    if ratio > high:
        return "holds, and the gap is larger here than published"
    if ratio >= C8_DIRECTION:
        return "holds only in direction: continuous is faster, by less than published"
    return "does not hold: static batching is as fast or faster at this rate"


@dataclass(frozen=True, slots=True, kw_only=True)
class BatchFigures:
    """One scheduler configuration's figures on one trace."""

    label: str
    throughput: float
    """Output tokens per second (any unit, the same for every configuration compared)."""
    p99_ms: float


def c13_verdict(adaptive: BatchFigures, fixed: Sequence[BatchFigures]) -> str:
    """C13 from the adaptive configuration and the fixed ones on one trace. The strongest
    fixed size (the highest throughput, then the lowest P99) is the fair baseline; a gain
    over only a poorly chosen size is said as such."""
    if not fixed:
        return "not measured: no fixed batch size to compare with"
    best = max(fixed, key=lambda f: (f.throughput, -f.p99_ms))
    worst = min(fixed, key=lambda f: (f.throughput, -f.p99_ms))
    gain_best = adaptive.throughput / best.throughput if best.throughput else 0.0
    gain_worst = adaptive.throughput / worst.throughput if worst.throughput else 0.0
    lower_p99 = adaptive.p99_ms < best.p99_ms * (1 - C13_SAME)
    if gain_best >= C13_GAIN_HOLDS and lower_p99:
        return "holds: against the best fixed batch size too"
    if gain_worst >= C13_GAIN_HOLDS:
        return (
            "holds only against a poorly chosen fixed batch size; against the best fixed size "
            "the gain is smaller"
        )
    if gain_best >= 1 - C13_SAME and lower_p99:
        return "does not hold as a throughput gain; adaptive cuts P99 at the same throughput"
    if gain_best >= 1 - C13_SAME and adaptive.p99_ms <= best.p99_ms * (1 + C13_SAME):
        return "does not hold: adaptive matches the best fixed batch size"
    return "does not hold: a fixed batch size does better"


@dataclass(frozen=True, slots=True, kw_only=True)
class Split:
    """A request's time through client -> frontend -> engine, as shares of its end-to-end
    time (they add up to 1)."""

    compute: float
    scheduling: float
    """Queueing before admission, and waiting in the batch while others' work runs."""
    serialization: float
    """Engine encode + frontend hop decode + frontend response encode + client decode."""
    network: float
    """The rest: the hop's and the client connection's transport, event-loop waits."""
    engine_loop: float = 0.0
    """The engine process's own time beyond its modelled steps and its encode (its Python
    loop: scheduling bookkeeping, receiving, sending); 0 in runs from before it was split out
    of ``network``."""

    @classmethod
    def of(cls, shares: Mapping[str, float]) -> Split:
        return cls(
            compute=float(shares["compute"]),
            scheduling=float(shares["scheduling"]),
            serialization=float(shares["serialization"]),
            network=float(shares["network"]),
            engine_loop=float(shares.get("engine_loop", 0.0)),
        )


def _within(value: float, band: tuple[float, float]) -> bool:
    return band[0] - _EPSILON <= value <= band[1] + _EPSILON


def _band(published: float) -> tuple[float, float]:
    return (published - C10_TOLERANCE, published + C10_TOLERANCE)


def c4_verdict(split: Split) -> str:
    """Serialization + deserialization at 10-25% of a request's time."""
    if _within(split.serialization, C4_BAND):
        return "holds at this rate"
    if split.serialization < C4_BAND[0] - _EPSILON:
        return "does not hold: below the range beside compute and queueing"
    return "does not hold: above the range"


def c4_cpu_verdict(shares: Mapping[str, float]) -> str:
    """C4 read as the frontend's CPU share in serialization, per hop codec: which codecs' share
    falls in 10-25%, above or below."""
    groups: dict[str, list[str]] = {"in the range": [], "above it": [], "below it": []}
    for codec, share in shares.items():
        if _within(share, C4_BAND):
            groups["in the range"].append(f"`{codec}`")
        elif share > C4_BAND[1]:
            groups["above it"].append(f"`{codec}`")
        else:
            groups["below it"].append(f"`{codec}`")
    parts = [f"{where} with {', '.join(codecs)}" for where, codecs in groups.items() if codecs]
    return "; ".join(parts) if parts else "not measured"


def c9_verdict(split: Split) -> str:
    """Preprocessing + network I/O at 35-48%: read as serialization + network (the request's
    parse and encode are its preprocessing here; no tokenizer is modelled)."""
    share = split.serialization + split.network
    if _within(share, C9_BAND):
        return "holds, reading serialization + network as preprocessing + network"
    if share < C9_BAND[0] - _EPSILON:
        return "does not hold: serialization + network are below the range"
    return "does not hold: serialization + network are above the range"


def c10_verdict(split: Split) -> str:
    """Compute 40%, network + serialization 55%, scheduling the rest (5%). The engine loop's
    own time counts as scheduling: it is the scheduler's process running, not the model and not
    the wire."""
    network_serialization = split.network + split.serialization
    scheduling = split.scheduling + split.engine_loop
    compute_ok = _within(split.compute, _band(C10_COMPUTE))
    transfer_ok = _within(network_serialization, _band(C10_NETWORK_SERIALIZATION))
    scheduling_ok = _within(scheduling, _band(1 - C10_COMPUTE - C10_NETWORK_SERIALIZATION))
    if compute_ok and transfer_ok and scheduling_ok:
        return "holds"
    largest = max(
        ("compute", split.compute),
        ("scheduling", scheduling),
        ("network + serialization", network_serialization),
        key=lambda item: item[1],
    )[0]
    return f"does not hold: {largest} is the largest stage here"
