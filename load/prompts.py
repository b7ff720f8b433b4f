"""The prompts ``inferwire load`` sends to an endpoint: synthetic, bundled, or a user's file.

``--prompts synthetic`` (the default) makes prompts of ``--input-tokens`` tokens asking for
``--output-tokens`` (distributions: :class:`~.prompt_sets.Lengths`); with ``--tokenizer`` the
lengths are exact for that tokenizer, without it they are word counts (one word of the
project's vocabulary is about one token: approximate, and labelled so in the report).
``--prompts bundled`` is a set of chat-like questions of varied lengths that the project
generates itself (``data/bundled_prompts.jsonl``; regenerate with ``python -m
inferwire.load.prompts write-bundled``). ``--prompts PATH`` reads a JSONL or
ShareGPT-style file (:mod:`.prompt_files`). Nothing is ever downloaded.

``--prefix-tokens N --prefix-groups G`` puts one of G shared prefixes of N tokens before each
prompt of any of them, round-robin (:class:`~.prompt_sets.WithSharedPrefix`), so that a
server's prefix cache serves a known share of the input (:mod:`.prefix_cache`).
"""

from __future__ import annotations

import argparse
import importlib.resources
import json
import random
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, Final

from inferwire._runtime.arguments import CommandError

from .prompt_files import PromptFileError, read_prompts
from .prompt_sets import (
    MAX_DRAW_TOKENS,
    MAX_LENGTH_TOKENS,
    WORDS,
    Lengths,
    LengthsError,
    Prompt,
    PromptSet,
    SyntheticPrompts,
    WithOutputTokens,
    WithSharedPrefix,
)
from .tokenizer import Tokenizer, TokenizerError, load_tokenizer

__all__ = [
    "Lengths",
    "LengthsError",
    "Prompt",
    "PromptFileError",
    "PromptSet",
    "add_prompt_arguments",
    "bundled",
    "from_file",
    "prompt_set_from_args",
    "synthetic",
    "tokenizer_from_args",
]

DEFAULT_INPUT_TOKENS: Final = "256"
BUNDLED_FILE: Final = "bundled_prompts.jsonl"


def synthetic(
    input_tokens: Lengths, output_tokens: Lengths | None, *, tokenizer: Tokenizer | None = None
) -> PromptSet:
    """Prompts of ``input_tokens`` tokens (exactly, for ``tokenizer``; else that many words)
    that ask for ``output_tokens`` (None: the run's ``--max-tokens``)."""
    return SyntheticPrompts(
        input_tokens=input_tokens, output_tokens=output_tokens, tokenizer=tokenizer
    )


def bundled(*, tokenizer: Tokenizer | None = None) -> PromptSet:
    """The project's own prompt set (:func:`bundled_records` wrote it)."""
    resource = importlib.resources.files(__package__) / "data" / BUNDLED_FILE
    with importlib.resources.as_file(resource) as path:
        return read_prompts(path, name="bundled", tokenizer=tokenizer)


def from_file(path: Path, *, tokenizer: Tokenizer | None = None) -> PromptSet:
    """A user's JSONL or ShareGPT-style file; a bad file is a :class:`PromptFileError`."""
    return read_prompts(path, name=f"file:{path}", tokenizer=tokenizer)


# -- command line ---------------------------------------------------------------------------


def lengths(text: str) -> Lengths:
    """``type=`` for a token-length distribution."""
    try:
        return Lengths.parse(text)
    except LengthsError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def add_prompt_arguments(parser: argparse.ArgumentParser | argparse._ArgumentGroup) -> None:
    """``--prompts``, ``--input-tokens``, ``--output-tokens``, ``--tokenizer``,
    ``--prefix-tokens``, ``--prefix-groups``."""
    parser.add_argument(
        "--prompts",
        default="synthetic",
        metavar="{synthetic,bundled,PATH}",
        help="synthetic prompts of --input-tokens tokens; the bundled set of chat-like "
        "questions; or a JSONL / ShareGPT-style JSON file (one {'prompt': ...}, "
        "{'messages': [...]} or {'conversations': [...]} record a line or an item)",
    )
    parser.add_argument(
        "--input-tokens",
        type=lengths,
        default=None,
        metavar="LENGTHS",
        help="synthetic prompts' length in tokens: N, uniform:LOW,HIGH, normal:MEAN,STD or "
        f"lognormal:MEDIAN,SIGMA (default: {DEFAULT_INPUT_TOKENS}); without --tokenizer, in "
        "words, about one token each",
    )
    parser.add_argument(
        "--output-tokens",
        type=lengths,
        default=None,
        metavar="LENGTHS",
        help="output tokens each request asks for, drawn as --input-tokens is (default: "
        "synthetic prompts: --max-tokens; a file: each record's own max_tokens or reply "
        "length); given with a file or the bundled set, it replaces theirs",
    )
    parser.add_argument(
        "--tokenizer",
        type=Path,
        default=None,
        metavar="PATH",
        help="a local tokenizer.json, or the directory of a model holding one, to count "
        "tokens exactly (needs inferwire[tokenizer]; never downloads)",
    )
    parser.add_argument(
        "--prefix-tokens",
        type=prefix_tokens,
        default=None,
        metavar="N",
        help="begin each prompt with one of --prefix-groups shared prefixes of N tokens (words "
        "without --tokenizer), taken round-robin, so that a server's prefix cache serves a "
        "known share of the input: the report gives it beside the server's own hit rate",
    )
    parser.add_argument(
        "--prefix-groups",
        type=prefix_groups,
        default=None,
        metavar="G",
        help="with --prefix-tokens: how many different prefixes (default: 1)",
    )


def prefix_tokens(text: str) -> int:
    """``type=`` for ``--prefix-tokens``: a whole number of tokens."""
    return _whole(text, "tokens", MAX_LENGTH_TOKENS)


def _whole(text: str, noun: str, highest: int) -> int:
    try:
        number = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number of {noun}") from None
    if not 1 <= number <= highest:
        raise argparse.ArgumentTypeError(f"{number} {noun}: give 1 to {highest}")
    return number


def prefix_groups(text: str) -> int:
    """``type=`` for ``--prefix-groups``: 1 or more."""
    return _whole(text, "groups", MAX_DRAW_TOKENS)


def tokenizer_from_args(args: argparse.Namespace) -> Tokenizer | None:
    """The ``--tokenizer`` given, loaded (a bad path is a :class:`CommandError`; a missing
    ``tokenizers`` library, a ``MissingExtraError``), or None."""
    if args.tokenizer is None:
        return None
    try:
        return load_tokenizer(args.tokenizer)
    except TokenizerError as exc:
        raise CommandError(f"--tokenizer: {exc}") from None


def prompt_set_from_args(
    args: argparse.Namespace, *, tokenizer: Tokenizer | None = None
) -> PromptSet:
    """The prompt set the options of :func:`add_prompt_arguments` name; a bad value is a
    :class:`CommandError`. ``tokenizer``: the one :func:`tokenizer_from_args` loaded (the
    run counts output tokens with it too), else it is loaded here."""
    tokenizer = tokenizer or tokenizer_from_args(args)
    found = _base_set(args, tokenizer)
    prefix, groups = getattr(args, "prefix_tokens", None), getattr(args, "prefix_groups", None)
    if prefix is None:
        if groups is not None:
            raise CommandError("--prefix-groups goes with --prefix-tokens")
        return found
    try:
        return WithSharedPrefix(
            base=found, prefix_tokens=prefix, groups=groups or 1, tokenizer=tokenizer
        )
    except LengthsError as exc:
        raise CommandError(f"--prefix-tokens: {exc}") from None


def _base_set(args: argparse.Namespace, tokenizer: Tokenizer | None) -> PromptSet:
    try:
        if args.prompts == "synthetic":
            return synthetic(
                args.input_tokens or Lengths.parse(DEFAULT_INPUT_TOKENS),
                args.output_tokens,
                tokenizer=tokenizer,
            )
        if args.input_tokens is not None:
            raise CommandError(
                "--input-tokens sets synthetic prompts' length; "
                f"--prompts {args.prompts} has lengths of its own"
            )
        if args.prompts == "bundled":
            found = bundled(tokenizer=tokenizer)
        else:
            path = Path(args.prompts)
            if not path.is_file():
                what = "is a directory" if path.is_dir() else "does not exist"
                raise CommandError(
                    f"--prompts: {args.prompts} {what} (synthetic, bundled or a file)"
                )
            found = from_file(path, tokenizer=tokenizer)
    except (PromptFileError, TokenizerError) as exc:
        raise CommandError(f"--prompts: {exc}") from None
    if args.output_tokens is not None:
        return WithOutputTokens(base=found, output_tokens=args.output_tokens)
    return found


# -- the bundled set ------------------------------------------------------------------------

BUNDLED_SEED: Final = 20261201
BUNDLED_COUNT: Final = 320
# Nouns of the project's vocabulary (inferwire.workloads.vocab) that a question can be about.
TOPICS: Final = tuple(
    word
    for word in WORDS
    if word
    in {
        "model", "data", "system", "value", "result", "output", "input", "token", "layer",
        "attention", "request", "latency", "server", "client", "stream", "response", "batch",
        "memory", "compute", "network", "serialization", "throughput", "protocol",
        "inference", "training", "weight", "gradient", "vector", "matrix", "tensor",
        "embedding", "sequence", "context", "function", "string", "integer", "buffer",
        "message", "schema", "field", "version", "people", "world", "city", "water", "school",
        "home", "life", "child", "work",
    }
)  # fmt: skip


class _Choices:
    """Seeded choices that give the same bytes on every Python: they use ``random()`` only,
    the one method whose sequence the random module keeps across versions."""

    def __init__(self, seed: int) -> None:
        self._random = random.Random(seed)

    def below(self, n: int) -> int:
        return int(self._random.random() * n)

    def between(self, low: int, high: int) -> int:
        return low + self.below(high - low + 1)

    def pick(self, options: Sequence[str]) -> str:
        return options[self.below(len(options))]


def _sentence(choose: _Choices) -> str:
    words = [choose.pick(WORDS) for _ in range(choose.between(6, 18))]
    return " ".join(words).capitalize() + choose.pick((".", ".", ".", "?", "!"))


def _notes(choose: _Choices, low_words: int, high_words: int) -> str:
    wanted = choose.between(low_words, high_words)
    sentences: list[str] = []
    while sum(len(s.split()) for s in sentences) < wanted:
        sentences.append(_sentence(choose))
    paragraphs = [" ".join(sentences[i : i + 5]) for i in range(0, len(sentences), 5)]
    return "\n\n".join(paragraphs)


# (how often, the prompt, the max_tokens it asks for): short questions are the most common,
# a few long documents make the tail of input lengths, as in chat traffic.
Template = Callable[[_Choices], tuple[str, int]]
TEMPLATES: Final[tuple[tuple[int, Template], ...]] = (
    (4, lambda c: (f"What is the role of the {c.pick(TOPICS)}?", c.between(32, 256))),
    (
        4,
        lambda c: (
            f"Explain the difference between {c.pick(TOPICS)} and {c.pick(TOPICS)} in "
            f"{(n := c.between(2, 6))} sentences.",
            40 * n,
        ),
    ),
    (
        3,
        lambda c: (
            f"How does the {c.pick(TOPICS)} affect the {c.pick(TOPICS)}? Give "
            f"{(n := c.between(2, 5))} examples.",
            80 * n,
        ),
    ),
    (
        3,
        lambda c: (
            f"List {(n := c.between(3, 10))} ways to reduce {c.pick(TOPICS)} in a "
            f"{c.pick(TOPICS)} system.",
            30 * n,
        ),
    ),
    (
        2,
        lambda c: (
            f"Write a short story about a {c.pick(TOPICS)} and a {c.pick(TOPICS)}, in about "
            f"{(n := 50 * c.between(2, 12))} words.",
            2 * n,
        ),
    ),
    (2, lambda c: (f"Answer yes or no: {_sentence(c)[:-1].lower()}?", 8)),
    (
        3,
        lambda c: (
            "Summarize the following notes in one paragraph.\n\n" + _notes(c, 80, 400),
            c.between(64, 256),
        ),
    ),
    (
        1,
        lambda c: (
            "Read this document and answer the question after it.\n\n"
            + _notes(c, 600, 1800)
            + f"\n\nQuestion: what does the document say about the {c.pick(TOPICS)}?",
            c.between(128, 512),
        ),
    ),
    (2, lambda c: ("Continue this text.\n\n" + _notes(c, 30, 200), c.between(128, 1024))),
)


def bundled_records() -> list[dict[str, Any]]:
    """The bundled set's records, made from the vocabulary and the templates above."""
    choose = _Choices(BUNDLED_SEED)
    weighted = [template for weight, template in TEMPLATES for _ in range(weight)]
    records: dict[str, int] = {}
    while len(records) < BUNDLED_COUNT:
        text, max_tokens = weighted[choose.below(len(weighted))](choose)
        records.setdefault(text, max_tokens)  # each prompt once
    return [{"prompt": text, "max_tokens": n} for text, n in records.items()]


def bundled_bytes() -> bytes:
    lines = (json.dumps(r, ensure_ascii=False) + "\n" for r in bundled_records())
    return "".join(lines).encode()


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m inferwire.load.prompts")
    commands = parser.add_subparsers(dest="command", required=True)
    write = commands.add_parser("write-bundled", help="regenerate the bundled prompt set")
    write.add_argument(
        "--output",
        type=Path,
        default=Path(__file__).parent / "data" / BUNDLED_FILE,
        help="where to write it (default: the package's own copy)",
    )
    args = parser.parse_args(argv)
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_bytes(bundled_bytes())
    print(f"wrote {BUNDLED_COUNT} prompts to {args.output}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
