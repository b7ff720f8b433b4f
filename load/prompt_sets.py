"""The prompts a load run sends to an endpoint, and how a run draws them.

A :class:`PromptSet` draws a run's prompts up front, seeded, so a run can be repeated: the
synthetic set makes them to given token lengths (:class:`Lengths`), the listed set (the
bundled prompts, a user's file) samples from a fixed list. :mod:`.prompts` builds them from
the command line.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import Final, Literal, Protocol, TypeAlias

import numpy as np

from inferwire.workloads import vocab

from .tokenizer import Tokenizer, TokenizerError

MAX_LENGTH_TOKENS: Final = 1 << 20
"""Largest length a distribution may give: past any context window served today."""
MAX_DRAW_TOKENS: Final = 1 << 28
"""Most tokens one synthetic draw makes (about 2 GB of text): 100,000 prompts of 2,048."""
ADJUST_ROUNDS: Final = 8
"""Decode/re-encode rounds that bring a synthetic prompt to its length with a tokenizer."""

Kind: TypeAlias = Literal["fixed", "uniform", "normal", "lognormal"]


class LengthsError(ValueError):
    """A token-length distribution that cannot be parsed or drawn from."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Prompt:
    """One request's prompt."""

    text: str
    input_tokens: int | None
    """Length of ``text`` in tokens when known (a tokenizer, a synthetic prompt's making)."""
    max_tokens: int | None
    """Output tokens to ask for; None: the run's ``--max-tokens``, else the server's default."""
    input_tokens_exact: bool = False
    """True when a tokenizer counted ``input_tokens``; False when it is a word count."""
    messages: tuple[dict[str, str], ...] | None = None
    """The chat messages to send, a conversation's history ending with ``text`` as the last
    user message (:mod:`.conversations`); None: one user message of ``text``."""


class PromptSet(Protocol):
    """Where a run's prompts come from."""

    @property
    def name(self) -> str:
        """What the set is, for the report: ``synthetic(input=256; output=128)``, ``bundled``,
        ``file:PATH``."""
        ...

    @property
    def input_tokens_counted_by(self) -> str:
        """How :attr:`Prompt.input_tokens` was counted: ``"tokenizer"``, ``"words"``
        (approximate) or ``"none"``."""
        ...

    def draw(self, count: int, *, seed: int) -> list[Prompt]:
        """``count`` prompts, the same ones for the same seed."""
        ...


@dataclass(frozen=True, slots=True, kw_only=True)
class Lengths:
    """A distribution of token lengths, always drawn as integers of at least 1.

    Written ``N`` (fixed), ``uniform:LOW,HIGH`` (both included), ``normal:MEAN,STD`` or
    ``lognormal:MEDIAN,SIGMA`` (sigma of the length's logarithm, as numpy's); normal and
    lognormal draws are rounded and clipped to 1..MAX_LENGTH_TOKENS.
    """

    kind: Kind
    first: float
    second: float = 0.0

    @classmethod
    def parse(cls, text: str) -> Lengths:
        kind, colon, rest = text.strip().partition(":")
        if not colon:
            return cls(kind="fixed", first=_integer(text, text))
        if kind not in ("uniform", "normal", "lognormal"):
            raise LengthsError(
                f"{text!r}: unknown distribution {kind!r} "
                "(N, uniform:LOW,HIGH, normal:MEAN,STD or lognormal:MEDIAN,SIGMA)"
            )
        numbers = rest.split(",")
        if len(numbers) != 2:
            raise LengthsError(f"{text!r}: {kind} takes two numbers, {kind}:A,B")
        if kind == "uniform":
            low, high = _integer(numbers[0], text), _integer(numbers[1], text)
            if low > high:
                raise LengthsError(f"{text!r}: LOW is above HIGH")
            return cls(kind="uniform", first=low, second=high)
        centre, spread = _number(numbers[0], text), _number(numbers[1], text)
        if not 1 <= centre <= MAX_LENGTH_TOKENS:
            raise LengthsError(f"{text!r}: {centre:g} is not 1 to {MAX_LENGTH_TOKENS}")
        if spread < 0:
            raise LengthsError(f"{text!r}: {spread:g} is negative")
        shape: Kind = "normal" if kind == "normal" else "lognormal"
        return cls(kind=shape, first=centre, second=spread)

    def __str__(self) -> str:
        if self.kind == "fixed":
            return _shown(self.first)
        return f"{self.kind}:{_shown(self.first)},{_shown(self.second)}"

    def draw(self, rng: np.random.Generator, count: int) -> np.ndarray:
        """``count`` lengths, as int64."""
        if self.kind == "fixed":
            return np.full(count, int(self.first), dtype=np.int64)
        if self.kind == "uniform":
            return rng.integers(int(self.first), int(self.second), endpoint=True, size=count)
        if self.kind == "normal":
            values = rng.normal(self.first, self.second, size=count)
        else:
            values = rng.lognormal(math.log(self.first), self.second, size=count)
        return np.clip(np.rint(values), 1, MAX_LENGTH_TOKENS).astype(np.int64)


def _shown(number: float) -> str:
    # as written, so that str() parses back to the same Lengths
    return str(int(number)) if float(number).is_integer() else repr(float(number))


def _number(text: str, spec: str) -> float:
    try:
        number = float(text)
    except ValueError:
        raise LengthsError(f"{spec!r}: {text.strip()!r} is not a number") from None
    if not math.isfinite(number):
        raise LengthsError(f"{spec!r}: {text.strip()!r} is not a finite number")
    return number


def _integer(text: str, spec: str) -> int:
    try:
        number = int(text.strip())
    except ValueError:
        raise LengthsError(f"{spec!r}: {text.strip()!r} is not a whole number of tokens") from None
    if not 1 <= number <= MAX_LENGTH_TOKENS:
        raise LengthsError(f"{spec!r}: {number} is not 1 to {MAX_LENGTH_TOKENS} tokens")
    return number


# One word of these is one token in the BPE vocabularies of current models (GPT-4's cl100k,
# Llama 3's) for the short common ones, two or three for the longer technical ones: a word
# count is an approximation of a token count, labelled so. ASCII only, so byte-level BPE
# never splits a character.
WORDS: Final = tuple(
    piece[1:]
    for piece in vocab.pieces()
    if piece.startswith(" ") and piece[1:].isascii() and piece[1:].isalpha()
)


@dataclass(frozen=True, slots=True, kw_only=True)
class SyntheticPrompts:
    """Prompts of drawn lengths made of random words, or of random tokens of a tokenizer.

    Each prompt's words (tokens) are drawn independently from its first one, so consecutive
    prompts differ at the start and a server's prefix cache cannot serve one from another's
    blocks (vLLM's random dataset starts each prompt at a random offset for the same reason).
    """

    input_tokens: Lengths
    output_tokens: Lengths | None
    tokenizer: Tokenizer | None = None
    _token_ids: np.ndarray | None = field(init=False, repr=False, compare=False)
    """The tokenizer's ids that a prompt is made of (found once: it decodes the vocabulary)."""

    def __post_init__(self) -> None:
        ids = drawable_ids(self.tokenizer) if self.tokenizer else None
        object.__setattr__(self, "_token_ids", ids)

    @property
    def name(self) -> str:
        output = "none" if self.output_tokens is None else str(self.output_tokens)
        made = f"; tokenizer={self.tokenizer.path}" if self.tokenizer else ""
        return f"synthetic(input={self.input_tokens}; output={output}{made})"

    @property
    def input_tokens_counted_by(self) -> str:
        return "tokenizer" if self.tokenizer else "words"

    def draw(self, count: int, *, seed: int) -> list[Prompt]:
        _check_count(count)
        rng = np.random.default_rng(seed)
        lengths = self.input_tokens.draw(rng, count)
        if lengths.sum() > MAX_DRAW_TOKENS:
            raise ValueError(
                f"{count} prompts of {self.input_tokens} tokens make {lengths.sum()} tokens, "
                f"more than the {MAX_DRAW_TOKENS} one draw may hold: draw fewer at a time"
            )
        outputs: list[int | None] = (
            [None] * count
            if self.output_tokens is None
            else self.output_tokens.draw(rng, count).tolist()
        )
        if self.tokenizer is None or self._token_ids is None:
            texts = _word_texts(rng, lengths)
            counts = lengths.tolist()
        else:
            texts, counts = _token_texts(rng, self.tokenizer, self._token_ids, lengths)
        exact = self.tokenizer is not None
        return [
            Prompt(text=text, input_tokens=n, max_tokens=out, input_tokens_exact=exact)
            for text, n, out in zip(texts, counts, outputs, strict=True)
        ]


def _word_texts(rng: np.random.Generator, lengths: np.ndarray) -> list[str]:
    words = np.asarray(WORDS, dtype=object)[rng.integers(0, len(WORDS), int(lengths.sum()))]
    ends = np.cumsum(lengths).tolist()
    starts = [0, *ends][: len(ends)]
    return [" ".join(words[start:end]) for start, end in zip(starts, ends, strict=True)]


def drawable_ids(tokenizer: Tokenizer) -> np.ndarray:
    """Ids of ordinary tokens that decode alone to printable text: not a special token, not a
    byte-level BPE's lone byte of a multi-byte character (which decodes to U+FFFD), not a
    control character. Drawing from these keeps the re-encoded length close to the drawn one."""
    ids = tokenizer.ordinary_ids()
    texts = tokenizer.decode_batch([[i] for i in ids])
    kept = [
        i
        for i, text in zip(ids, texts, strict=True)
        if text.strip() and "\ufffd" not in text and text.replace(" ", "").isprintable()
    ]
    if not kept:
        raise TokenizerError(f"{tokenizer.path}: no token decodes to printable text")
    return np.asarray(kept, dtype=np.int64)


def _token_texts(
    rng: np.random.Generator, tokenizer: Tokenizer, pool: np.ndarray, lengths: np.ndarray
) -> tuple[list[str], list[int]]:
    """Texts of the given lengths in tokens, as vLLM's random dataset makes them: draw token
    ids, decode, re-encode, and truncate or extend the re-encoded ids until the text
    re-encodes to its length (decoding then encoding merges or splits tokens at the joins).
    A text that has not converged after ADJUST_ROUNDS keeps the length it measures."""
    targets = lengths.tolist()
    draws = pool[rng.integers(0, len(pool), int(lengths.sum()))].tolist()
    ends = np.cumsum(lengths).tolist()
    starts = [0, *ends][: len(ends)]
    ids = [draws[start:end] for start, end in zip(starts, ends, strict=True)]
    texts = [""] * len(targets)
    counts = [0] * len(targets)
    pending = list(range(len(targets)))
    for _ in range(ADJUST_ROUNDS):
        decoded = tokenizer.decode_batch([ids[i] for i in pending])
        encoded = tokenizer.encode_batch(decoded)
        still: list[int] = []
        for i, text, got in zip(pending, decoded, encoded, strict=True):
            texts[i], counts[i] = text, len(got)
            short = targets[i] - len(got)
            if short == 0:
                continue
            still.append(i)
            extra = pool[rng.integers(0, len(pool), short)].tolist() if short > 0 else []
            ids[i] = got[: targets[i]] + extra
        pending = still
        if not pending:
            break
    return texts, counts


@dataclass(frozen=True, slots=True, kw_only=True)
class ListedPrompts:
    """A fixed list of prompts (the bundled set, a user's file), drawn in a seeded shuffle;
    a run longer than the list goes through it again in a new shuffle, so it repeats prompts
    (which a server's prefix cache may then serve)."""

    name: str
    prompts: tuple[Prompt, ...]
    input_tokens_counted_by: str
    skipped: int = 0
    """Records of the file that held no prompt (a conversation without a human turn, an
    empty prompt)."""

    def __post_init__(self) -> None:
        if not self.prompts:
            raise ValueError(f"{self.name}: no prompts")

    def draw(self, count: int, *, seed: int) -> list[Prompt]:
        _check_count(count)
        rng = np.random.default_rng(seed)
        size = len(self.prompts)
        passes = -(-count // size)
        # one shuffle of the list per pass over it, all drawn at once
        order = rng.permuted(np.tile(np.arange(size), (passes, 1)), axis=1)
        return [self.prompts[i] for i in order.ravel()[:count].tolist()]


@dataclass(frozen=True, slots=True, kw_only=True)
class WithOutputTokens:
    """Another set's prompts, each asking for a drawn number of output tokens instead of the
    one it came with (``--output-tokens`` over a file)."""

    base: PromptSet
    output_tokens: Lengths

    @property
    def name(self) -> str:
        return f"{self.base.name}; output={self.output_tokens}"

    @property
    def input_tokens_counted_by(self) -> str:
        return self.base.input_tokens_counted_by

    def draw(self, count: int, *, seed: int) -> list[Prompt]:
        prompts = self.base.draw(count, seed=seed)
        # a stream of its own, so the prompts drawn are the base set's for the same seed
        outputs = self.output_tokens.draw(np.random.default_rng([seed, 1]), count).tolist()
        return [replace(p, max_tokens=n) for p, n in zip(prompts, outputs, strict=True)]


def _check_count(count: int) -> None:
    if count < 0:
        raise ValueError(f"cannot draw {count} prompts")


PREFIX_SEPARATOR: Final = "\n\n"
"""Between a shared prefix and a prompt's own text: whitespace, so that a word count is the sum
of the two, and a paragraph break, which BPE vocabularies keep apart from the word after it."""


@dataclass(frozen=True, slots=True, kw_only=True)
class WithSharedPrefix:
    """Another set's prompts, each after one of ``groups`` shared prefixes of ``prefix_tokens``
    tokens (``--prefix-tokens``, ``--prefix-groups``), so that a server's prefix cache serves a
    known share of the input (:mod:`.prefix_cache` gives it).

    The i-th prompt drawn takes prefix ``i % groups``: round-robin in schedule order, so that
    each group's requests are spread over the point. The prefixes are made as synthetic prompts
    are (words, or a tokenizer's tokens), from a seeded stream of their own, so the prompts
    drawn are the base set's for the same seed. With a tokenizer, each prompt's length is
    counted again whole (the join may merge tokens); without, it is the sum of the word counts.
    """

    base: PromptSet
    prefix_tokens: int
    groups: int = 1
    tokenizer: Tokenizer | None = None
    _token_ids: np.ndarray | None = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if not 1 <= self.prefix_tokens <= MAX_LENGTH_TOKENS:
            raise LengthsError(
                f"a prefix of {self.prefix_tokens} tokens: give 1 to {MAX_LENGTH_TOKENS}"
            )
        if self.groups < 1:
            raise LengthsError(f"{self.groups} prefix groups: give at least 1")
        if self.groups * self.prefix_tokens > MAX_DRAW_TOKENS:
            raise LengthsError(
                f"{self.groups} prefixes of {self.prefix_tokens} tokens pass the {MAX_DRAW_TOKENS}"
                " tokens one draw may hold"
            )
        ids = drawable_ids(self.tokenizer) if self.tokenizer else None
        object.__setattr__(self, "_token_ids", ids)

    @property
    def name(self) -> str:
        return f"{self.base.name}; prefix={self.prefix_tokens}x{self.groups}"

    @property
    def input_tokens_counted_by(self) -> str:
        return "tokenizer" if self.tokenizer else self.base.input_tokens_counted_by

    def prefixes(self, *, seed: int) -> list[str]:
        """The groups' prefixes for ``seed``, group 0 first."""
        return self._prefixes(seed)[0]

    def _prefixes(self, seed: int) -> tuple[list[str], list[int]]:
        rng = np.random.default_rng([seed, 2])
        lengths = np.full(self.groups, self.prefix_tokens, dtype=np.int64)
        if self.tokenizer is None or self._token_ids is None:
            return _word_texts(rng, lengths), lengths.tolist()
        return _token_texts(rng, self.tokenizer, self._token_ids, lengths)

    def draw(self, count: int, *, seed: int) -> list[Prompt]:
        prompts = self.base.draw(count, seed=seed)
        texts, counts = self._prefixes(seed)
        groups = self.groups
        joined = [texts[i % groups] + PREFIX_SEPARATOR + p.text for i, p in enumerate(prompts)]
        if self.tokenizer is not None:
            exact = self.tokenizer.count_batch(joined)
            return [
                replace(p, text=text, input_tokens=n, input_tokens_exact=True)
                for p, text, n in zip(prompts, joined, exact, strict=True)
            ]
        return [
            replace(
                p,
                text=text,
                input_tokens=None
                if p.input_tokens is None
                else counts[i % groups] + p.input_tokens,
            )
            for i, (p, text) in enumerate(zip(prompts, joined, strict=True))
        ]
