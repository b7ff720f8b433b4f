"""The share of a point's input a prefix cache should serve, beside the share the server says
it served.

Expected (``expected_hit_rate``): the input tokens a cache that keeps everything would serve,
over the point's input tokens:

- shared prefixes (``--prefix-tokens N --prefix-groups G``): a request whose group's prefix an
  earlier request of the run carried (one of the point's, of an earlier point, or of the
  warm-up) finds its N prefix tokens cached::

      expected = (requests whose group was seen before) * N / input tokens of the requests

  which for the run's first point without a warm-up is ``(R - G) * N / input tokens``: the
  first request of each group misses;
- a trace with hash ids (:mod:`.traces`): each request finds cached its leading blocks that an
  earlier request had, :data:`~inferwire.load.traces.BLOCK_TOKENS` tokens each (the last one
  partial), up to the first block not seen.

It assumes a cache that never evicts, and a group's (block's) first request prefilled before
the next one that shares it arrives (requests sharing a prefix that arrive together all miss);
it counts the shared prefixes only (a prompt sent again whole, when a file's list is gone
through again or at the next point, is served whole by a real cache, beyond this figure); the
input tokens are as the run counts them (a tokenizer's, or words).

Beside it (``server``), the server's own, from its ``/metrics`` before and after the point
(:mod:`.attribution.prometheus`): vLLM's ``prefix_cache_hits`` over ``prefix_cache_queries``
(tokens, counter deltas over the point), or SGLang's ``cache_hit_rate`` gauge at the point's
end (over its own recent window). An engine counts its chat template's tokens too (queried
each time, and a template all requests share is a hit), caches whole blocks only (vLLM's are 16
tokens: a prefix is served to its last whole block), and never serves a prompt's last token
from the cache: its rate differs from the expected one by that much.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Final

from .prompt_sets import Prompt

ASSUMES: Final = (
    "a cache that never evicts; a shared prefix prefilled before the next request that shares"
    " it arrives; only the shared prefixes counted (a prompt repeated whole is not)"
)


@dataclass(frozen=True, slots=True, kw_only=True)
class Expected:
    """What a point should hit."""

    hit_tokens: int
    input_tokens: int
    counted_by: str
    """How the input tokens were counted: ``tokenizer`` or ``words``."""
    how: str
    """Where the shared prefixes come from: ``prefix groups`` or ``trace hash ids``."""

    @property
    def hit_rate(self) -> float | None:
        return self.hit_tokens / self.input_tokens if self.input_tokens else None


def input_tokens(prompt: Prompt) -> int:
    """A prompt's tokens as counted, else its words."""
    return prompt.input_tokens if prompt.input_tokens is not None else len(prompt.text.split())


def group_hits(
    prompts: Sequence[Prompt], *, prefix_tokens: int, groups: int, seen: set[int]
) -> tuple[int, int]:
    """(hit tokens, input tokens) of ``prompts`` sent in order, the i-th of group ``i %
    groups``; ``seen`` (the groups sent before) is updated."""
    hits = total = 0
    for position, prompt in enumerate(prompts):
        group = position % groups
        if group in seen:
            hits += prefix_tokens
        seen.add(group)
        total += input_tokens(prompt)
    return hits, total


def report(expected: Expected | None, point: dict[str, Any]) -> dict[str, Any] | None:
    """The point's ``prefix_cache``: the expected figures beside the server's (from the
    point's Prometheus attribution, when it read any); None when neither exists."""
    prometheus = ((point.get("attribution") or {}).get("sources") or {}).get("prometheus") or {}
    server = prometheus.get("prefix_cache")
    if expected is None and server is None:
        return None
    out: dict[str, Any] = {"server": server}
    if expected is not None:
        out.update(
            expected_hit_rate=expected.hit_rate,
            expected_hit_tokens=expected.hit_tokens,
            input_tokens=expected.input_tokens,
            input_tokens_counted_by=expected.counted_by,
            shared_by=expected.how,
            assumes=ASSUMES,
        )
    return out


def text(found: dict[str, Any]) -> str:
    """One line for the summary."""

    def share(value: float | None) -> str:
        return "-" if value is None else f"{value:.1%}"

    parts = ["prefix cache:"]
    if "expected_hit_rate" in found:
        parts.append(
            f"expected hit rate {share(found['expected_hit_rate'])} of"
            f" {found['input_tokens']} input tokens ({found['shared_by']});"
        )
    server = found.get("server")
    if server is None:
        parts.append("the server publishes no prefix cache figure")
    else:
        parts.append(
            f"the server's ({server['engine']}, {server['source']}) {share(server['hit_rate'])}"
        )
    return " ".join(parts)
