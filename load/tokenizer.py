"""A tokenizer the user names from a local path, to count prompt and output tokens.

The file is a Hugging Face ``tokenizer.json`` (what every model repository on the hub ships
beside its weights), read with the ``tokenizers`` library (``pip install
'inferwire[tokenizer]'``). Only a local path is accepted: a hub name is never resolved and
nothing is downloaded, so a run is the same offline as online.

Counts are of the text alone, without special tokens (BOS, a chat template's role markers):
what the model generates or what the prompt adds, as vLLM's benchmark counts them.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Final

from inferwire._runtime.extras import needs_extras

if TYPE_CHECKING:
    import tokenizers

TOKENIZER_FILE: Final = "tokenizer.json"
MAX_TOKENIZER_BYTES: Final = 256 * 1024 * 1024
"""Largest tokenizer.json read: real ones are 2-20 MB (Llama 3's is 9 MB)."""


class TokenizerError(ValueError):
    """The path holds no tokenizer the library can read; the message says which path and why."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Tokenizer:
    """A loaded tokenizer: ``count``, ``encode`` and ``decode`` without special tokens."""

    path: Path
    backend: tokenizers.Tokenizer
    vocab_size: int
    special_ids: frozenset[int]
    """Ids of the added tokens (BOS, EOS, role markers): never drawn for a synthetic prompt."""

    def count(self, text: str) -> int:
        return len(self.encode(text))

    def encode(self, text: str) -> list[int]:
        return list(self.backend.encode(text, add_special_tokens=False).ids)

    def decode(self, ids: Sequence[int]) -> str:
        return str(self.backend.decode(list(ids), skip_special_tokens=True))

    def ordinary_ids(self) -> list[int]:
        """Ids of the vocabulary's tokens, without the added (special) ones, in order."""
        ordinary = self.backend.get_vocab(with_added_tokens=False).values()
        return sorted(set(ordinary) - self.special_ids)

    def count_batch(self, texts: Sequence[str]) -> list[int]:
        """``count`` of each text, in one call (the library spreads it over its threads)."""
        encodings = self.backend.encode_batch(list(texts), add_special_tokens=False)
        return [len(encoding.ids) for encoding in encodings]

    def encode_batch(self, texts: Sequence[str]) -> list[list[int]]:
        encodings = self.backend.encode_batch(list(texts), add_special_tokens=False)
        return [list(encoding.ids) for encoding in encodings]

    def decode_batch(self, ids: Sequence[Sequence[int]]) -> list[str]:
        decoded = self.backend.decode_batch([list(i) for i in ids], skip_special_tokens=True)
        return [str(text) for text in decoded]


def load_tokenizer(path: Path | str) -> Tokenizer:
    """The tokenizer in ``path``: a ``tokenizer.json`` file, or a directory holding one (a
    model's local snapshot). Anything else is a :class:`TokenizerError`; without the library,
    a :class:`~inferwire._runtime.extras.MissingExtraError` naming the extra."""
    with needs_extras("counting tokens with --tokenizer"):
        import tokenizers

    path = Path(path)
    file = path / TOKENIZER_FILE if path.is_dir() else path
    if not file.is_file():
        if path.is_dir():
            raise TokenizerError(f"{path} is a directory without a {TOKENIZER_FILE}")
        raise TokenizerError(
            f"{path} does not exist (give a local {TOKENIZER_FILE} or the directory holding "
            "it; tokenizers are never downloaded)"
        )
    size_bytes = file.stat().st_size
    if size_bytes > MAX_TOKENIZER_BYTES:
        raise TokenizerError(
            f"{file} is {size_bytes} bytes, more than the {MAX_TOKENIZER_BYTES} a tokenizer "
            "file can be"
        )
    try:
        backend = tokenizers.Tokenizer.from_file(str(file))
    except Exception as exc:
        # the library raises a bare Exception with serde's message for a malformed file
        raise TokenizerError(
            f"{file} is not a tokenizer the tokenizers library reads: {exc}"
        ) from exc
    special_ids = frozenset(backend.get_added_tokens_decoder())
    vocab_size = backend.get_vocab_size(with_added_tokens=True)
    if vocab_size <= len(special_ids):
        raise TokenizerError(f"{file} has no tokens besides its special ones")
    return Tokenizer(path=file, backend=backend, vocab_size=vocab_size, special_ids=special_ids)
