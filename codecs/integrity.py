"""Proof that a token stream arrived whole: every chunk once, in order, up to its end marker.

A stream carries what is needed to prove it complete: ``seq`` numbers its chunks from 0, and
the last chunk is an in-band end marker (``finish_reason`` set) whose ``usage`` counts the
tokens sent. :class:`StreamVerifier` checks both as chunks arrive, a few attribute reads and
integer comparisons a chunk, and, given the chunks the stream should hold, their content too.

    verifier = StreamVerifier(expected)
    for chunk in chunks:
        verifier.check(chunk)   # raises at the first chunk out of place
    verifier.finish()           # raises if the stream is not whole

Which error says what (each a :class:`~inferwire.codecs.DecodeError`):

- :class:`SequenceGapError`: chunks are missing (lost);
- :class:`DuplicateFrameError`: a chunk was delivered twice;
- :class:`ReorderedFrameError`: a chunk came ahead of its turn and the skipped one right after;
- :class:`IncompleteStreamError`: no end marker, a chunk after it, or an end marker whose token
  count differs from the tokens delivered (truncated);
- :class:`AlteredStreamError`: the chunks differ from the expected ones (content, or length).

Works on any object with the model's attribute names, such as a FlatBuffers view.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Final

from .errors import (
    AlteredStreamError,
    DuplicateFrameError,
    IncompleteStreamError,
    ReorderedFrameError,
    SequenceGapError,
)
from .model import TokenChunk

__all__ = ["AlteredStreamError", "StreamVerifier"]

_NONE: Final = -1


class StreamVerifier:
    """Checks one stream, chunk by chunk in arrival order; see the module docstring.

    ``expected``: the chunks the stream should carry, compared by ``token_ids`` and ``text``
    at each ``seq`` (``None``: sequence and end marker only).
    """

    __slots__ = ("_ahead", "_expected", "_final_count", "_next_seq", "_skipped", "tokens")

    def __init__(self, expected: Sequence[TokenChunk] | None = None) -> None:
        self._expected = expected
        self._next_seq = 0
        self._ahead = _NONE
        """The seq of a chunk that came ahead of its turn: a gap or a reordering, which the
        next chunk tells apart."""
        self._skipped = _NONE
        self._final_count = _NONE
        """The end marker's token count, once it has arrived."""
        self.tokens = 0
        """Tokens in the chunks delivered in order so far."""

    @property
    def chunks(self) -> int:
        """Chunks delivered in order so far."""
        return self._next_seq

    @property
    def finished(self) -> bool:
        """Whether the end marker has arrived."""
        return self._final_count != _NONE

    def check(self, chunk: TokenChunk) -> int:
        """Check the next chunk to arrive; returns the number of tokens it carries."""
        seq = chunk.seq
        if seq != self._next_seq or self._final_count != _NONE or self._ahead != _NONE:
            self._out_of_turn(seq)
            return 0  # held: the next chunk or finish() decides between a gap and a reordering
        token_ids = chunk.token_ids
        count = len(token_ids)
        expected = self._expected
        if expected is not None:
            if seq >= len(expected):
                raise AlteredStreamError(
                    f"chunk {seq} is past the {len(expected)} chunks expected", seq=seq
                )
            want = expected[seq]
            if token_ids != want.token_ids or chunk.text != want.text:
                raise AlteredStreamError(f"chunk {seq} differs from the one sent", seq=seq)
        self._next_seq = seq + 1
        self.tokens += count
        if chunk.finish_reason is not None:
            usage = chunk.usage
            if usage is None:
                raise IncompleteStreamError(
                    f"the end marker (chunk {seq}) carries no token count: the stream cannot "
                    "be proven complete"
                )
            self._final_count = usage.completion_tokens
        return count

    def _out_of_turn(self, seq: int) -> None:
        if self._ahead != _NONE:
            skipped, ahead = self._skipped, self._ahead
            if seq == skipped:
                raise ReorderedFrameError(
                    f"chunk {skipped} arrived after chunk {ahead}", expected=skipped, received=ahead
                )
            raise SequenceGapError(_missing(skipped, ahead), expected=skipped, received=ahead)
        if seq < self._next_seq:
            raise DuplicateFrameError(
                f"chunk {seq} arrived again", expected=self._next_seq, received=seq
            )
        if self._final_count != _NONE:
            raise IncompleteStreamError(f"chunk {seq} arrived after the end marker")
        self._skipped, self._ahead = self._next_seq, seq

    def finish(self) -> None:
        """The stream has ended: raise unless it was whole, in order, and as counted."""
        if self._ahead != _NONE:
            raise SequenceGapError(
                _missing(self._skipped, self._ahead), expected=self._skipped, received=self._ahead
            )
        if self._final_count == _NONE:
            raise IncompleteStreamError(
                f"the stream ended after {self._next_seq} chunks without its end marker"
            )
        if self.tokens != self._final_count:
            raise IncompleteStreamError(
                f"the end marker counts {self._final_count} tokens, {self.tokens} arrived"
            )
        expected = self._expected
        if expected is not None and self._next_seq != len(expected):
            raise AlteredStreamError(
                f"the stream has {self._next_seq} chunks, {len(expected)} expected",
                seq=self._next_seq,
            )


def _missing(first: int, arrived: int) -> str:
    missing = f"chunk {first} is" if arrived == first + 1 else f"chunks {first}..{arrived - 1} are"
    return f"{missing} missing: chunk {arrived} came instead"
