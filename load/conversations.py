"""Conversations (``--turns N``, ``--conversations PATH``): requests that follow each other,
each sending the whole history so far.

The open-loop schedule gives each conversation's start: its first turn is sent at its intended
time, as any request. Each later turn is sent once the previous turn's stream has ended, plus a
think time (``--think-time-s``, drawn per turn, seeded), with the whole history: the system
message if the conversation has one, each user message, and each reply *as the server returned
it* (the output text of its stream, :attr:`~inferwire.load.api_streams.ApiChunk.text` joined:
no reasoning). A later turn's latencies are measured from its intended time, the previous end
plus the think time, as every latency of the generator.

Where the turns come from:

- ``--turns N`` over ``--prompts`` (synthetic, bundled or a file): a conversation's N user
  messages are N prompts drawn from the set, seeded (the point's conversation c takes the
  draw's prompts cN to cN + N - 1), each asking for its own output tokens.
- ``--conversations PATH``: a dataset of conversations, JSONL or a ShareGPT-style JSON array
  (read as :mod:`.prompt_files` reads prompts), each record
  ``{"conversations": [{"from": "system"|"human"|"gpt", "value": ...}, ...]}`` or
  ``{"messages": [{"role": "system"|"user"|"assistant", "content": ...}, ...]}`` (or a
  one-turn ``{"prompt": ...}``): its system message, then a turn per user (``human``) message,
  asking for as many tokens as the dataset's reply to it holds (a tokenizer's count, else
  words; no reply: ``--max-tokens``). The dataset's replies are never sent: the server's are.
  ``--turns N`` keeps each conversation's first N turns. Conversations are drawn in a seeded
  shuffle, and again when a point needs more than the file holds.

A turn that fails ends its conversation: the turns after it are not sent, and are counted
(``turns_not_sent``, by reason). So does the drain timeout (``--drain-timeout``, given to the
conversations still under way after the last one started). The cap (``--concurrency``) and
the bound (``--max-in-flight``) count conversations under way, think times included: a
conversation is one user.

The context limit (``--max-context-tokens N``): the history a turn sends (what came before it,
and its own message) must stay within N tokens. It is checked up front, before anything is
sent, wherever each reply's length is bounded (its ``max_tokens``, or ``--max-tokens``): a
conversation whose history could pass N fails the run with a :class:`ContextLimitError` naming
the conversation, the turn and, for a dataset, the line. Where a reply is not bounded, it is
checked as the run goes: a turn whose history (the server's count of the previous turn's prompt
and reply when its usage gives them, else the run's own) passes N fails with a
:class:`ContextLimitError` before it leaves, which ends its conversation. Tokens are counted by
``--tokenizer``, else in words (about a token each).

Per point (``conversations`` in the JSON report): the conversations, the turns planned, sent
and not sent, and by turn index the requests, completions, TTFT and E2E (P50/P99, exact over
the measured turns) and input tokens (the server's usage, else the run's count of the
history). Each record carries ``conversation`` and ``turn``; its ``index`` is
``conversation * stride + turn``, ``stride`` being the most turns a conversation has.
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Final, TypeAlias

import numpy as np

from .alarm import Alarm, now_ns
from .conversation_scripts import MAX_THINK_S as MAX_THINK_S
from .conversation_scripts import ContextLimitError as ContextLimitError
from .conversation_scripts import ConversationError as ConversationError
from .conversation_scripts import ConversationSource as ConversationSource
from .conversation_scripts import DatasetConversations as DatasetConversations
from .conversation_scripts import PromptConversations as PromptConversations
from .conversation_scripts import Script as Script
from .conversation_scripts import ThinkTime as ThinkTime
from .conversation_scripts import ThinkTimeError as ThinkTimeError
from .conversation_scripts import Turn as Turn
from .conversation_scripts import check_context as check_context
from .conversation_scripts import read_conversations as read_conversations
from .metrics import UNFINISHED, Recorder, RecordSink, RequestRecord
from .prompt_sets import Prompt
from .stream_check import StreamCheck

TurnEnded: TypeAlias = Callable[[int, int, int, "str | None", Any], None]
"""``(index, intended_ns, done_ns, error name or None, the stream's check or None)``."""
EARLIER_TURN_FAILED: Final = "an earlier turn failed"
DRAIN_TIMEOUT: Final = "the drain timeout"


# -- one point's conversations, as they go ------------------------------------------------------


class ReplyCheck:
    """A stream's check, that also keeps the reply's text as it arrives (each event's
    :attr:`~inferwire.load.api_streams.ApiChunk.text`: the output, without reasoning) and
    the time of its first token, for the next turn; anything else is the check's own."""

    __slots__ = ("first_ns", "inner", "parts")

    def __init__(self, inner: StreamCheck) -> None:
        self.inner = inner
        self.parts: list[str] = []
        self.first_ns = 0

    def check(self, item: Any, /) -> int:
        count = self.inner.check(item)
        text = item.text
        if text:
            self.parts.append(text)
        if count and not self.first_ns:
            self.first_ns = now_ns()
        return count

    def finish(self, counted: int) -> None:
        self.inner.finish(counted)

    def reply(self) -> str:
        return "".join(self.parts)

    @property
    def output_tokens(self) -> int:
        return self.inner.output_tokens

    @output_tokens.setter
    def output_tokens(self, value: int) -> None:
        self.inner.output_tokens = value

    @property
    def input_tokens(self) -> int | None:
        return self.inner.input_tokens

    @input_tokens.setter
    def input_tokens(self, value: int | None) -> None:
        self.inner.input_tokens = value

    @property
    def source(self) -> str:
        return self.inner.source

    @source.setter
    def source(self, value: str) -> None:
        self.inner.source = value

    def __getattr__(self, name: str) -> Any:
        if name == "inner":  # not yet set: no recursion
            raise AttributeError(name)
        return getattr(self.inner, name)


class TurnClock:
    """Wakes each conversation waiting out a think time at its instant, on one
    :class:`~inferwire.load.alarm.Alarm` (a timerfd: to the microsecond on either loop, one
    descriptor for them all); the loop's own timers would send later turns a millisecond or
    two late."""

    def __init__(self) -> None:
        self._alarm = Alarm()
        self._due: list[tuple[int, int, asyncio.Future[None]]] = []
        self._order = itertools.count()
        self._runner: asyncio.Task[None] | None = None
        self._sleeping: asyncio.Future[None] | None = None

    async def sleep_until(self, when_ns: int) -> None:
        if when_ns <= now_ns():
            return
        loop = asyncio.get_running_loop()
        future: asyncio.Future[None] = loop.create_future()
        heapq.heappush(self._due, (when_ns, next(self._order), future))
        if self._runner is None or self._runner.done():
            self._runner = loop.create_task(self._run())
        elif self._due[0][2] is future and self._sleeping is not None:
            self._sleeping.cancel()  # sooner than the instant the runner waits for
        await future

    async def _run(self) -> None:
        due = self._due
        while due:
            when_ns = due[0][0]
            if when_ns > now_ns():
                self._sleeping = asyncio.ensure_future(self._alarm.sleep_until(when_ns))
                await asyncio.wait((self._sleeping,))
                self._sleeping = None
                continue
            while due and due[0][0] <= now_ns():
                future = heapq.heappop(due)[2]
                if not future.done():  # its conversation may have been cancelled
                    future.set_result(None)

    def close(self) -> None:
        if self._runner is not None:
            self._runner.cancel()
        if self._sleeping is not None:
            self._sleeping.cancel()
        self._alarm.close()


@dataclass(slots=True)
class _State:
    history: list[dict[str, str]] = field(default_factory=list)
    tokens: int = 0
    """The history's length so far, replies included."""
    sent: int = 0
    """Turns sent (a first turn never started: 0)."""
    failed: bool = False
    done_ns: int = 0
    next_intended_ns: int = 0


@dataclass(slots=True)
class _TurnStats:
    requests: int = 0
    completed: int = 0
    ttft_ms: list[float] = field(default_factory=list)
    e2e_ms: list[float] = field(default_factory=list)
    input_tokens: list[int] = field(default_factory=list)

    def to_json(self, turn: int) -> dict[str, Any]:
        return {
            "turn": turn,
            "requests": self.requests,
            "completed": self.completed,
            "failed": self.requests - self.completed,
            "ttft": _percentiles(self.ttft_ms),
            "e2e": _percentiles(self.e2e_ms),
            "input_tokens": {
                "mean": float(np.mean(self.input_tokens)) if self.input_tokens else None,
                "max": max(self.input_tokens) if self.input_tokens else None,
            },
        }


def _percentiles(values: list[float]) -> dict[str, float | None]:
    if not values:
        return {"p50_ms": None, "p99_ms": None}
    found = np.percentile(values, [50, 99], method="inverted_cdf")  # nearest rank: a value seen
    return {"p50_ms": float(found[0]), "p99_ms": float(found[1])}


class ConversationPoint:
    """One point's conversations: the history each turn sends (:meth:`request_for`), what each
    turn's end leaves for the next (:meth:`ended`), when the next is due (:meth:`next_turn`),
    and the point's account (:meth:`summary`). The open loop (:mod:`.openloop`) drives it."""

    def __init__(
        self,
        scripts: Sequence[Script],
        *,
        think: ThinkTime,
        seed: int,
        max_context_tokens: int | None = None,
        path: Path | None = None,
    ) -> None:
        if not scripts or not all(s.turns for s in scripts):
            raise ConversationError("a point needs conversations of one turn or more")
        self.scripts = tuple(scripts)
        self.stride = max(len(s.turns) for s in scripts)
        self.think = think
        self.think_ns = think.draw_ns(np.random.default_rng([seed, 3]), (len(scripts), self.stride))
        self.max_context_tokens = max_context_tokens
        self.path = path
        self.states = [_State() for _ in scripts]
        self.by_turn = [_TurnStats() for _ in range(self.stride)]
        self.later_intended_ns: list[int] = []
        """The intended times of the later turns sent (first turns are the schedule's)."""
        self.measures: Callable[[int], bool] = lambda _: True
        self.clock: TurnClock | None = None

    @property
    def planned(self) -> int:
        return sum(len(s.turns) for s in self.scripts)

    def first_index(self, position: int) -> int:
        return position * self.stride

    def bind(self, recorder: Recorder) -> None:
        """Count turns in ``recorder``'s window; on the running loop."""
        self.measures = recorder.measures
        self.clock = TurnClock()

    def close(self) -> None:
        if self.clock is not None:
            self.clock.close()

    def request_for(self, index: int) -> Prompt:
        """The turn's request: its message after the history; raises
        :class:`ContextLimitError` if the history passes the limit."""
        number, k = divmod(index, self.stride)
        state, script = self.states[number], self.scripts[number]
        turn = script.turns[k]
        if k == 0 and script.system is not None:
            state.history.append({"role": "system", "content": script.system})
            state.tokens = script.system_tokens
        if k:
            self.later_intended_ns.append(state.next_intended_ns)
        state.sent = k + 1
        tokens = state.tokens + turn.tokens
        limit = self.max_context_tokens
        if limit is not None and tokens > limit:
            raise ContextLimitError(
                conversation=number,
                turn=k,
                tokens=tokens,
                limit=limit,
                bounded=False,
                path=self.path,
                line=script.line,
            )
        state.history.append({"role": "user", "content": turn.text})
        state.tokens = tokens
        return Prompt(
            text=turn.text,
            input_tokens=tokens,
            max_tokens=turn.max_tokens,
            messages=tuple(state.history),
        )

    def wrap(self, make: Callable[[], StreamCheck]) -> Callable[[], StreamCheck]:
        """Each stream's check, keeping the reply (:class:`ReplyCheck`)."""
        return lambda: ReplyCheck(make())

    def ended(
        self, index: int, intended_ns: int, done_ns: int, error: str | None, checker: Any
    ) -> None:
        """A turn's end: its reply joins the history; a failure ends the conversation."""
        number, k = divmod(index, self.stride)
        state = self.states[number]
        state.done_ns = done_ns
        measured = self.measures(intended_ns)
        stats = self.by_turn[k]
        stats.requests += measured
        if error is not None or not isinstance(checker, ReplyCheck):
            state.failed = True
            return
        state.history.append({"role": "assistant", "content": checker.reply()})
        counted = checker.input_tokens
        prompt_tokens = counted if counted is not None else state.tokens
        state.tokens = prompt_tokens + checker.output_tokens
        if measured:
            stats.completed += 1
            if checker.first_ns:
                stats.ttft_ms.append((checker.first_ns - intended_ns) / 1e6)
            stats.e2e_ms.append((done_ns - intended_ns) / 1e6)
            stats.input_tokens.append(prompt_tokens)

    def next_turn(self, index: int) -> tuple[int, int] | None:
        """The next turn's index and intended time (the end of this one and a think time), or
        None when the conversation is over."""
        number, k = divmod(index, self.stride)
        state = self.states[number]
        if state.failed or k + 1 >= len(self.scripts[number].turns):
            return None
        state.next_intended_ns = state.done_ns + int(self.think_ns[number, k + 1])
        return index + 1, state.next_intended_ns

    def later_measured(self) -> int:
        """Later turns sent whose intended time is in the window."""
        return sum(map(self.measures, self.later_intended_ns))

    def tagged(self, sink: RecordSink) -> RecordSink:
        """``sink``, each record given its ``conversation`` and ``turn``."""
        stride = self.stride

        def tag(record: RequestRecord) -> object:
            number, k = divmod(record.index, stride)
            return sink(replace(record, conversation=number, turn=k))

        return tag

    def record_unstarted(self, recorder: Recorder, start_ns: int, offsets_ns: np.ndarray) -> None:
        """A record for each conversation whose first turn never left (still waiting for a
        slot at the drain timeout), so that the records count every conversation started."""
        done_ns = now_ns()
        for position, offset_ns in enumerate(offsets_ns.tolist()):
            index = self.first_index(position)
            if index in recorder.recorded:
                continue
            intended_ns = start_ns + offset_ns
            recorder.add_record(
                RequestRecord(
                    index=index,
                    intended_s=offset_ns / 1e9,
                    queue_wait_ms=(done_ns - intended_ns) / 1e6,
                    ok=False,
                    error=UNFINISHED,
                    ttft_ms=None,
                    e2e_ms=(done_ns - intended_ns) / 1e6,
                    output_tokens=0,
                    chunks=0,
                    tpot_ms=None,
                    itl_max_ms=None,
                    input_tokens=None,
                    measured=recorder.measures(intended_ns),
                    conversation=position,
                    turn=0,
                )
            )

    def summary(self) -> dict[str, Any]:
        """The point's ``conversations``."""
        not_sent: Counter[str] = Counter()
        whole = 0
        for state, script in zip(self.states, self.scripts, strict=True):
            left = len(script.turns) - max(state.sent, 1)  # an unstarted first turn: Unfinished
            if state.failed:
                not_sent[EARLIER_TURN_FAILED] += left
            elif left:
                not_sent[DRAIN_TIMEOUT] += left
            else:
                whole += 1
        requests = len(self.scripts) + len(self.later_intended_ns)
        return {
            "conversations": len(self.scripts),
            "conversations_whole": whole,
            "turns_planned": self.planned,
            "turns_sent": requests,
            "turns_not_sent": self.planned - requests,
            "not_sent_because": dict(not_sent),
            "think_time_s": str(self.think),
            "max_context_tokens": self.max_context_tokens,
            "stride": self.stride,
            "by_turn": [stats.to_json(k) for k, stats in enumerate(self.by_turn)],
        }


def summary_text(conversations: dict[str, Any]) -> str:
    """One line for the summary: conversations, turns, and by turn TTFT and input tokens."""

    def ms(value: float | None) -> str:
        return "-" if value is None else f"{value:.1f}"

    turns = conversations["by_turn"]
    parts = [
        f"conversations: {conversations['conversations_whole']}/"
        f"{conversations['conversations']} whole,",
        f"{conversations['turns_sent']}/{conversations['turns_planned']} turns sent",
    ]
    reasons = conversations["not_sent_because"]
    if reasons:
        parts.append("(" + ", ".join(f"{n} not sent: {why}" for why, n in reasons.items()) + ")")
    parts[-1] += ";"
    parts.append(
        "by turn TTFT p50 "
        + " ".join(f"t{t['turn']} {ms(t['ttft']['p50_ms'])}" for t in turns)
        + " ms;"
    )
    mean_tokens = [t["input_tokens"]["mean"] for t in turns]
    parts.append(
        "input tokens mean "
        + " ".join(f"t{k} {'-' if m is None else round(m)}" for k, m in enumerate(mean_tokens))
    )
    return " ".join(parts)
