"""What conversations say, before they are had (:mod:`.conversations` has them): the user turns
of each, drawn from a prompt set (``--turns``) or read from a dataset (``--conversations``),
the think times between turns (``--think-time-s``), and the check of their histories against
``--max-context-tokens`` before the run."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Final, Literal, Protocol, TypeAlias

import numpy as np

from .prompt_files import (
    HUMAN,
    MAX_KEPT_CHARS,
    NOT_A_REPLY,
    PromptFileError,
    file_records,
    read_errors,
    string_field,
)
from .prompt_sets import Prompt, PromptSet
from .tokenizer import Tokenizer

MAX_THINK_S: Final = 3600.0
"""Longest think time a distribution may give."""
ThinkKind: TypeAlias = Literal["fixed", "uniform", "normal", "lognormal"]


class ConversationError(ValueError):
    """Conversations that cannot be had as asked."""


class ContextLimitError(ConversationError):
    """A conversation's history passes ``--max-context-tokens``."""

    def __init__(
        self,
        *,
        conversation: int,
        turn: int,
        tokens: int,
        limit: int,
        bounded: bool,
        path: Path | None = None,
        line: int = 0,
    ) -> None:
        where = f"{path}:{line}: " if path is not None and line else ""
        reaches = "may reach" if bounded else "reaches"
        super().__init__(
            f"{where}conversation {conversation}, turn {turn}: its history {reaches} {tokens}"
            f" tokens, past --max-context-tokens {limit}"
        )
        self.conversation = conversation
        self.turn = turn
        self.path = path
        self.line = line


# -- think times --------------------------------------------------------------------------------


class ThinkTimeError(ValueError):
    """A think-time distribution that cannot be parsed."""


@dataclass(frozen=True, slots=True, kw_only=True)
class ThinkTime:
    """A distribution of seconds, drawn as floats of at least 0: ``S`` (fixed),
    ``uniform:LOW,HIGH``, ``normal:MEAN,STD`` or ``lognormal:MEDIAN,SIGMA`` (as
    :class:`~inferwire.load.prompt_sets.Lengths`, in seconds); draws are clipped to 0 to
    :data:`MAX_THINK_S`."""

    kind: ThinkKind = "fixed"
    first: float = 0.0
    second: float = 0.0

    @classmethod
    def parse(cls, text: str) -> ThinkTime:
        kind, colon, rest = text.strip().partition(":")
        if not colon:
            return cls(kind="fixed", first=_seconds(text, text))
        if kind not in ("uniform", "normal", "lognormal"):
            raise ThinkTimeError(
                f"{text!r}: unknown distribution {kind!r} "
                "(S, uniform:LOW,HIGH, normal:MEAN,STD or lognormal:MEDIAN,SIGMA)"
            )
        numbers = rest.split(",")
        if len(numbers) != 2:
            raise ThinkTimeError(f"{text!r}: {kind} takes two numbers, {kind}:A,B")
        first, second = _seconds(numbers[0], text), _seconds(numbers[1], text)
        if kind == "uniform" and first > second:
            raise ThinkTimeError(f"{text!r}: LOW is above HIGH")
        if kind == "lognormal" and first <= 0:
            raise ThinkTimeError(f"{text!r}: a lognormal's median must be above 0")
        shape: ThinkKind = (
            "uniform" if kind == "uniform" else "normal" if kind == "normal" else "lognormal"
        )
        return cls(kind=shape, first=first, second=second)

    def __str__(self) -> str:
        if self.kind == "fixed":
            return f"{self.first:g}"
        return f"{self.kind}:{self.first:g},{self.second:g}"

    def draw_ns(self, rng: np.random.Generator, shape: tuple[int, int]) -> np.ndarray:
        """Think times in nanoseconds, as int64."""
        if self.kind == "fixed":
            seconds = np.full(shape, self.first)
        elif self.kind == "uniform":
            seconds = rng.uniform(self.first, self.second, size=shape)
        elif self.kind == "normal":
            seconds = rng.normal(self.first, self.second, size=shape)
        else:
            seconds = rng.lognormal(math.log(self.first), self.second, size=shape)
        drawn: np.ndarray = np.round(np.clip(seconds, 0.0, MAX_THINK_S) * 1e9).astype(np.int64)
        return drawn


def _seconds(text: str, spec: str) -> float:
    try:
        number = float(text)
    except ValueError:
        raise ThinkTimeError(f"{spec!r}: {text.strip()!r} is not a number of seconds") from None
    if not (math.isfinite(number) and 0 <= number <= MAX_THINK_S):
        raise ThinkTimeError(f"{spec!r}: {text.strip()!r} is not 0 to {MAX_THINK_S:g} seconds")
    return number


# -- what a conversation says -------------------------------------------------------------------


@dataclass(frozen=True, slots=True, kw_only=True)
class Turn:
    """A user message, and the output tokens its turn asks for."""

    text: str
    tokens: int
    """Its length: a tokenizer's count, else words."""
    max_tokens: int | None


@dataclass(frozen=True, slots=True, kw_only=True)
class Script:
    """A conversation to have: its system message and its user turns."""

    turns: tuple[Turn, ...]
    system: str | None = None
    system_tokens: int = 0
    line: int = 0
    """The dataset's line it was read from; 0 for prompts drawn from a set."""


class ConversationSource(Protocol):
    """Where a run's conversations come from."""

    @property
    def name(self) -> str: ...

    @property
    def path(self) -> Path | None:
        """The dataset's file, for the errors that name a line; None for drawn prompts."""
        ...

    def draw(self, count: int, *, seed: int) -> list[Script]:
        """``count`` conversations, the same ones for the same seed."""
        ...


def _counted(prompt: Prompt) -> int:
    return prompt.input_tokens if prompt.input_tokens is not None else len(prompt.text.split())


@dataclass(frozen=True, slots=True, kw_only=True)
class PromptConversations:
    """Conversations of ``turns`` user messages, each a prompt drawn from ``prompts``."""

    prompts: PromptSet
    turns: int

    @property
    def name(self) -> str:
        return f"{self.turns} turns of {self.prompts.name}"

    @property
    def path(self) -> Path | None:
        return None

    def draw(self, count: int, *, seed: int) -> list[Script]:
        drawn = self.prompts.draw(count * self.turns, seed=seed)
        turns = [Turn(text=p.text, tokens=_counted(p), max_tokens=p.max_tokens) for p in drawn]
        size = self.turns
        return [Script(turns=tuple(turns[c * size : (c + 1) * size])) for c in range(count)]


@dataclass(frozen=True, slots=True, kw_only=True)
class DatasetConversations:
    """The conversations of a file (:func:`read_conversations`), drawn in a seeded shuffle."""

    name: str
    path: Path | None
    scripts: tuple[Script, ...]
    skipped: int = 0
    """Records that held no user message."""

    def draw(self, count: int, *, seed: int) -> list[Script]:
        rng = np.random.default_rng([seed, 5])
        size = len(self.scripts)
        passes = -(-count // size)
        order = rng.permuted(np.tile(np.arange(size), (passes, 1)), axis=1)
        return [self.scripts[i] for i in order.ravel()[:count].tolist()]


def read_conversations(
    path: Path, *, tokenizer: Tokenizer | None = None, turns: int | None = None
) -> DatasetConversations:
    """The conversations of the JSONL or JSON-array file at ``path`` (the module docstring
    says which records), each cut to its first ``turns`` turns when given. A malformed record
    is a :class:`~inferwire.load.prompt_files.PromptFileError` naming its line."""
    try:
        file = path.open(encoding="utf-8-sig", newline="")
    except OSError as exc:
        raise PromptFileError(path, 0, exc.strerror or str(exc)) from None
    scripts: list[Script] = []
    skipped = kept_chars = 0
    with file, read_errors(path):
        for line, item in file_records(file, path):
            system, texts, replies, max_tokens = _conversation(item, path, line)
            if turns is not None:
                texts, replies = texts[:turns], replies[:turns]
            if not texts:
                skipped += 1
                continue
            kept_chars += sum(map(len, texts)) + len(system or "")
            if kept_chars > MAX_KEPT_CHARS:
                raise PromptFileError(
                    path, line, f"the conversations pass {MAX_KEPT_CHARS} characters"
                )
            scripts.append(_script(system, texts, replies, max_tokens, line, tokenizer))
    if not scripts:
        raise PromptFileError(path, 0, f"no conversations ({skipped} records skipped)")
    return DatasetConversations(
        name=f"conversations:{path}", path=path, scripts=tuple(scripts), skipped=skipped
    )


def _script(
    system: str | None,
    texts: list[str],
    replies: list[str | None],
    max_tokens: int | None,
    line: int,
    tokenizer: Tokenizer | None,
) -> Script:
    known = [r for r in replies if r is not None]
    if tokenizer is None:
        counts = [len(t.split()) for t in texts]
        reply_counts = [len(r.split()) for r in known]
        system_tokens = len(system.split()) if system else 0
    else:
        found = tokenizer.count_batch([*texts, *known, *([system] if system else [])])
        counts, reply_counts = found[: len(texts)], found[len(texts) : len(texts) + len(known)]
        system_tokens = found[-1] if system else 0
    lengths = iter(reply_counts)
    asked = [(next(lengths) or None) if r is not None else max_tokens for r in replies]
    turns = tuple(
        Turn(text=t, tokens=n, max_tokens=out)
        for t, n, out in zip(texts, counts, asked, strict=True)
    )
    return Script(turns=turns, system=system, system_tokens=system_tokens, line=line)


def _content(value: object, path: Path, line: int) -> str:
    if isinstance(value, list):
        parts = []
        for part in value:
            if not isinstance(part, dict) or part.get("type") != "text":
                raise PromptFileError(path, line, "a content part that is not {'type': 'text'}")
            parts.append(string_field(part.get("text"), "a text part's 'text'", path, line))
        return "\n".join(parts)
    return string_field(value, "a message's content", path, line)


def _conversation(
    item: object, path: Path, line: int
) -> tuple[str | None, list[str], list[str | None], int | None]:
    """A record's system message, user messages, the reply to each (None: none), and its
    ``max_tokens``."""
    if not isinstance(item, dict):
        raise PromptFileError(path, line, "a record that is not a JSON object")
    forms = [key for key in ("prompt", "messages", "conversations") if key in item]
    if len(forms) != 1:
        raise PromptFileError(
            path, line, "a record needs exactly one of 'prompt', 'messages', 'conversations'"
        )
    max_tokens = item.get("max_tokens")
    if max_tokens is not None and (
        isinstance(max_tokens, bool) or not isinstance(max_tokens, int) or max_tokens < 1
    ):
        raise PromptFileError(path, line, f"'max_tokens' is {max_tokens!r}, not a positive integer")
    if forms == ["prompt"]:
        return None, [string_field(item["prompt"], "'prompt'", path, line)], [None], max_tokens
    key, who, what = (
        ("messages", "role", "content")
        if forms == ["messages"]
        else ("conversations", "from", "value")
    )
    entries = item[key]
    if not isinstance(entries, list):
        raise PromptFileError(path, line, f"{key!r} is not a list")
    speakers: list[str] = []
    values: list[str] = []
    for entry in entries:
        if not isinstance(entry, dict):
            raise PromptFileError(path, line, f"an item of {key!r} that is not an object")
        speakers.append(string_field(entry.get(who), f"an item's {who!r}", path, line))
        values.append(_content(entry.get(what), path, line))
    system = values[0] if speakers and speakers[0] == "system" else None
    texts: list[str] = []
    replies: list[str | None] = []
    for i, speaker in enumerate(speakers):
        if speaker not in HUMAN or not values[i].strip():
            continue
        texts.append(values[i])
        after = speakers[i + 1] if i + 1 < len(speakers) else None
        replies.append(values[i + 1] if after is not None and after not in NOT_A_REPLY else None)
    return system, texts, replies, max_tokens


def check_context(
    scripts: Sequence[Script],
    limit: int,
    default_max_tokens: int | None,
    *,
    path: Path | None = None,
) -> None:
    """Raise :class:`ContextLimitError` for the first conversation whose history could pass
    ``limit`` tokens, each reply at most its turn's ``max_tokens`` (else
    ``default_max_tokens``); a conversation with a reply of unbounded length is checked only
    up to it (the run checks the rest as it goes)."""
    for number, script in enumerate(scripts):
        tokens = script.system_tokens
        for k, turn in enumerate(script.turns):
            tokens += turn.tokens
            if tokens > limit:
                raise ContextLimitError(
                    conversation=number,
                    turn=k,
                    tokens=tokens,
                    limit=limit,
                    bounded=k > 0,
                    path=path,
                    line=script.line,
                )
            reply = turn.max_tokens or default_max_tokens
            if reply is None:
                break
            tokens += reply
