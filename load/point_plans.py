"""What each point of an ``--api`` run sends (:class:`PointPlans`): the prompts drawn for its
schedule; or conversations, whose starts its schedule gives (:mod:`.conversations`); or a
trace's requests at the trace's times (:mod:`.traces`). With shared prefixes
(``--prefix-tokens``) or a trace's hash ids, the plan also holds the share of the point's
input a prefix cache should serve (:mod:`.prefix_cache`), counted after what the run sent
before it (the warm-up's and the earlier points' requests)."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from inferwire._runtime.arguments import CommandError

from . import conversations, prefix_cache, traces
from .conversations import ConversationPoint, ConversationSource, Script, ThinkTime
from .prompt_files import PromptFileError
from .prompt_sets import Prompt, PromptSet, WithSharedPrefix
from .tokenizer import Tokenizer


@dataclass(frozen=True, slots=True, kw_only=True)
class Plan:
    """What one point sends."""

    request_for: Callable[[int], Any]
    schedule_ns: np.ndarray | None = None
    """A trace's intended send times; None: the schedule drawn at the point's rate."""
    conversations: ConversationPoint | None = None
    expected: prefix_cache.Expected | None = None
    """The prefix cache's expected hits, for shared prefixes or a trace's hash ids."""


class PointPlans:
    """The plans of one run's points; ``draw(count)`` gives the run's first ``count`` prompts
    (:meth:`~.api_mode.ApiSweep.requests`: one draw, the same at every point)."""

    def __init__(
        self,
        args: argparse.Namespace,
        prompts: PromptSet,
        tokenizer: Tokenizer | None,
        trace: traces.Trace | None,
        draw: Callable[[int], list[Any]],
    ) -> None:
        self.args = args
        self.prompts = prompts
        self.tokenizer = tokenizer
        self.trace = trace
        self.draw = draw
        self.conversations = conversation_source(args, prompts, tokenizer)
        self._scripts: list[Script] = []
        self._seen: set[int] = set()
        """Prefix groups (a trace's hash ids) the run has sent."""

    def trace_prompts(self) -> list[Prompt]:
        """The trace's prompts, in its order."""
        assert self.trace is not None
        try:
            return self.trace.prompts(seed=self.args.seed, tokenizer=self.tokenizer)
        except traces.TraceFileError as exc:
            raise CommandError(f"--trace-file: {exc}") from None

    def prepare(self, count: int) -> None:
        """Draw what the run's largest point, of ``count`` entries, sends, before anything
        starts: a history that could pass ``--max-context-tokens`` fails the run now."""
        if self.conversations is None:
            self.draw(count)
        else:
            self._draw_conversations(count)

    def _draw_conversations(self, count: int) -> list[Script]:
        assert self.conversations is not None
        if len(self._scripts) < count:
            self._scripts = self.conversations.draw(count, seed=self.args.seed)
            limit = self.args.max_context_tokens
            if limit is not None:
                try:
                    conversations.check_context(
                        self._scripts, limit, self.args.max_tokens, path=self.conversations.path
                    )
                except conversations.ContextLimitError as exc:
                    raise CommandError(str(exc)) from None
        return self._scripts[:count]

    def warmup_request(self) -> Any:
        """What the warm-up sends: the first request (a conversation's first turn)."""
        if self.conversations is None:
            return self.draw(1)[0]
        first = self._draw_conversations(1)[0].turns[0]
        return Prompt(text=first.text, input_tokens=first.tokens, max_tokens=first.max_tokens)

    def warmed(self, requests: int) -> None:
        """The warm-up sent the first request ``requests`` times: its prefix is cached."""
        if requests and self.conversations is None:
            self._expected(self.draw(1), 1)

    def plan(self, count: int) -> Plan:
        """What a point of ``count`` entries in its schedule sends (a trace: the trace)."""
        if self.trace is not None:
            offsets_ns = self.trace.offsets_ns(self.args.trace_speed)
            drawn = self.draw(len(offsets_ns))
            expected = self._expected(drawn, len(drawn))
            return Plan(request_for=drawn.__getitem__, schedule_ns=offsets_ns, expected=expected)
        if self.conversations is None:
            drawn = self.draw(count)
            return Plan(request_for=drawn.__getitem__, expected=self._expected(drawn, count))
        point = ConversationPoint(
            self._draw_conversations(count),
            think=self.args.think_time_s or ThinkTime(),
            seed=self.args.seed,
            max_context_tokens=self.args.max_context_tokens,
            path=self.conversations.path,
        )
        return Plan(request_for=point.request_for, conversations=point)

    def _expected(self, drawn: list[Any], count: int) -> prefix_cache.Expected | None:
        """The expected hits of the first ``count`` of ``drawn``, sent after what the run sent
        before; the groups (blocks) they carry are then seen too."""
        if self.trace is not None:
            if not any(r.hash_ids for r in self.trace.requests):
                return None
            hits, inputs = traces.expected_block_hits(self.trace.requests[:count], self._seen)
            return prefix_cache.Expected(
                hit_tokens=hits, input_tokens=inputs, counted_by="trace", how="trace hash ids"
            )
        shared = self.prompts
        if not isinstance(shared, WithSharedPrefix):
            return None
        hits, inputs = prefix_cache.group_hits(
            drawn[:count], prefix_tokens=shared.prefix_tokens, groups=shared.groups, seen=self._seen
        )
        return prefix_cache.Expected(
            hit_tokens=hits,
            input_tokens=inputs,
            counted_by="tokenizer" if self.tokenizer is not None else "words",
            how="prefix groups",
        )

    def describe(self) -> dict[str, Any]:
        """For the report: what the requests are beyond their prompts."""
        args = self.args
        out: dict[str, Any] = {}
        if self.conversations is not None:
            out["conversations"] = {
                "source": self.conversations.name,
                "turns": args.turns,
                "think_time_s": str(args.think_time_s or ThinkTime()),
                "max_context_tokens": args.max_context_tokens,
            }
        if self.trace is not None:
            out["trace"] = self.trace.describe(args.trace_speed)
        if isinstance(self.prompts, WithSharedPrefix):
            out["shared_prefix"] = {
                "prefix_tokens": self.prompts.prefix_tokens,
                "groups": self.prompts.groups,
                "assigned": "round-robin in schedule order",
            }
        return out


def conversation_source(
    args: argparse.Namespace, prompts: PromptSet, tokenizer: Tokenizer | None
) -> ConversationSource | None:
    """``--conversations PATH`` (cut to ``--turns``), or ``--turns N`` over the prompts; None
    without either. A bad dataset, or one whose history could pass ``--max-context-tokens``,
    is a :class:`CommandError` naming the line."""
    path: Path | None = getattr(args, "conversations", None)
    turns: int | None = getattr(args, "turns", None)
    if path is None:
        if turns is None:
            return None
        return conversations.PromptConversations(prompts=prompts, turns=turns)
    try:
        found = conversations.read_conversations(path, tokenizer=tokenizer, turns=turns)
        if args.max_context_tokens is not None:
            conversations.check_context(
                found.scripts, args.max_context_tokens, args.max_tokens, path=path
            )
    except (PromptFileError, conversations.ContextLimitError) as exc:
        raise CommandError(f"--conversations: {exc}") from None
    return found
