"""A small Hugging Face tokenizer made offline from inferwire's own vocabulary, for the tools
that insist on one (guidellm needs a "processor" to size its synthetic prompts) on a machine
that downloads no model:

    python -m inferwire.load.local_tokenizer DIR

writes ``DIR/tokenizer.json`` (the :mod:`tokenizers` model), ``DIR/tokenizer_config.json`` and
``DIR/special_tokens_map.json``, which ``transformers.AutoTokenizer.from_pretrained(DIR)``
loads with no network (as ``PreTrainedTokenizerFast``), e.g. guidellm's
``--processor DIR`` under ``HF_HUB_OFFLINE=1``.

The model is a byte-level BPE, as GPT-2's and Llama 3's are: any text encodes (no unknown
token, the 256 bytes are in the alphabet) and decodes back to itself. Its merges are learnt
from the word pieces of :mod:`inferwire.workloads.vocab`, each piece seen in proportion to its
rank's Zipf weight, until every piece is one token (but the two that byte-level pre-tokenizing
splits, ``\u2019s`` and ``°C``: punctuation and letters). The same vocabulary gives the same file:
the trainer's ties are broken by the pair itself, and nothing here draws at random.

Only :mod:`tokenizers` is needed (the ``tokenizer`` extra); not ``transformers``.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any, Final

from inferwire.workloads.vocab import pieces

BOS_TOKEN: Final = "<|begin_of_text|>"
EOS_TOKEN: Final = "<|end_of_text|>"
"""Llama 3's names, the model the seeded workloads name."""
VOCAB_SIZE_LIMIT: Final = 4096
"""Room for every piece's merges (323 pieces of a few bytes each need about 1,500)."""
MODEL_MAX_LENGTH: Final = 131_072
"""Llama 3.1's context: a prompt tool asks the tokenizer how long a prompt may be."""
TOP_COUNT: Final = 1000
"""How often the most frequent piece is seen in training; rank r is seen TOP_COUNT / r."""
FILES: Final = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json")


class TokenizerError(Exception):
    """The tokenizer cannot be made: the extra is missing, or DIR cannot take it."""


def _training_pieces(vocabulary: Sequence[str]) -> Iterator[str]:
    """Each piece apart (a word of its own to the pre-tokenizer), Zipf-weighted by rank."""
    for rank, piece in enumerate(vocabulary, start=1):
        for _ in range(max(1, TOP_COUNT // rank)):
            yield piece


def build_json(vocabulary: Sequence[str] | None = None) -> str:
    """The ``tokenizer.json`` text of the byte-level BPE over ``vocabulary`` (default: the
    workloads' pieces)."""
    try:
        from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    except ImportError as exc:
        raise TokenizerError(
            "building the local tokenizer needs the tokenizers package: "
            "pip install 'inferwire[tokenizer]'"
        ) from exc
    words = list(pieces() if vocabulary is None else vocabulary)
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE_LIMIT,
        min_frequency=1,
        show_progress=False,
        special_tokens=[BOS_TOKEN, EOS_TOKEN],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tokenizer.train_from_iterator(_training_pieces(words), trainer=trainer)
    text: str = tokenizer.to_str(pretty=True)
    return text


def tokenizer_config() -> dict[str, Any]:
    """What ``AutoTokenizer`` reads first: which class to build, and the special tokens."""
    return {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": BOS_TOKEN,
        "eos_token": EOS_TOKEN,
        "model_max_length": MODEL_MAX_LENGTH,
        "clean_up_tokenization_spaces": False,
    }


def write(directory: Path) -> list[Path]:
    """Write the three files into ``directory`` (made if missing); returns their paths."""
    if directory.exists() and not directory.is_dir():
        raise TokenizerError(f"{directory} exists and is not a directory")
    contents = {
        "tokenizer.json": build_json(),
        "tokenizer_config.json": json.dumps(tokenizer_config(), indent=1) + "\n",
        "special_tokens_map.json": json.dumps(
            {"bos_token": BOS_TOKEN, "eos_token": EOS_TOKEN}, indent=1
        )
        + "\n",
    }
    try:
        directory.mkdir(parents=True, exist_ok=True)
        paths = []
        for name in FILES:
            path = directory / name
            path.write_text(contents[name], encoding="utf-8")
            paths.append(path)
    except OSError as exc:
        raise TokenizerError(f"cannot write the tokenizer into {directory}: {exc}") from exc
    return paths


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m inferwire.load.local_tokenizer",
        description="Write a small byte-level BPE tokenizer over inferwire's vocabulary into "
        "DIR, loadable offline by transformers.AutoTokenizer.from_pretrained(DIR).",
    )
    parser.add_argument("directory", type=Path, metavar="DIR")
    args = parser.parse_args(argv)
    try:
        paths = write(args.directory)
    except TokenizerError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print("wrote " + ", ".join(str(p) for p in paths))
    return 0


if __name__ == "__main__":
    sys.exit(main())
