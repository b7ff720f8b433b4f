"""The KV cache as paged blocks, with the bookkeeping of vLLM's block manager and none of the
memory: a request holds ``ceil(tokens / block_tokens)`` blocks of a fixed pool.

- Admission takes the blocks of the tokens to prefill plus the chunk the prefill emits (vLLM's
  ``can_allocate`` for the prompt and the first token).
- Each decode step appends the step's tokens; a request takes a new block when its last one is
  full (vLLM's ``can_append_slots`` / ``append_slots``).
- Freeing returns all of a request's blocks (finished, aborted or preempted).

The scheduler decides what to do when :meth:`KVCache.can_grow` says no (preempt, see
:mod:`inferwire.engine.core`); this class never evicts anything by itself.
"""

from __future__ import annotations


class KVCache:
    """``total_blocks`` blocks of ``block_tokens`` tokens each, held per request id."""

    __slots__ = ("_blocks", "_tokens", "_used", "block_tokens", "total_blocks")

    def __init__(self, total_blocks: int, block_tokens: int) -> None:
        if total_blocks < 1 or block_tokens < 1:
            raise ValueError("the KV cache needs at least one block of at least one token")
        self.total_blocks = total_blocks
        self.block_tokens = block_tokens
        self._tokens: dict[str, int] = {}
        self._blocks: dict[str, int] = {}
        self._used = 0

    def blocks_for(self, tokens: int) -> int:
        """Blocks that hold ``tokens`` tokens."""
        return -(-tokens // self.block_tokens)

    @property
    def used_blocks(self) -> int:
        return self._used

    @property
    def free_blocks(self) -> int:
        return self.total_blocks - self._used

    def holds(self, rid: str) -> bool:
        return rid in self._blocks

    def tokens(self, rid: str) -> int:
        """Tokens ``rid`` holds (0 if it holds none)."""
        return self._tokens.get(rid, 0)

    def blocks(self, rid: str) -> int:
        """Blocks ``rid`` holds (0 if it holds none)."""
        return self._blocks.get(rid, 0)

    def can_allocate(self, tokens: int) -> bool:
        return self.blocks_for(tokens) <= self.free_blocks

    def allocate(self, rid: str, tokens: int) -> None:
        """Give ``rid`` (holding nothing) the blocks of ``tokens`` tokens."""
        if rid in self._blocks:
            raise ValueError(f"{rid!r} already holds KV blocks")
        needed = self.blocks_for(tokens)
        if needed > self.free_blocks:
            raise ValueError(f"{rid!r} needs {needed} blocks, {self.free_blocks} are free")
        self._blocks[rid] = needed
        self._tokens[rid] = tokens
        self._used += needed

    def blocks_to_grow(self, rid: str, new_tokens: int) -> int:
        """New blocks ``rid`` must take to append ``new_tokens`` tokens."""
        return self.blocks_for(self._tokens[rid] + new_tokens) - self._blocks[rid]

    def can_grow(self, rid: str, new_tokens: int) -> bool:
        return self.blocks_to_grow(rid, new_tokens) <= self.free_blocks

    def try_grow(self, rid: str, new_tokens: int) -> bool:
        """:meth:`grow` if the blocks are free; whether it did."""
        tokens = self._tokens[rid] + new_tokens
        extra = -(-tokens // self.block_tokens) - self._blocks[rid]
        if extra > self.total_blocks - self._used:
            return False
        self._blocks[rid] += extra
        self._tokens[rid] = tokens
        self._used += extra
        return True

    def grow(self, rid: str, new_tokens: int) -> None:
        """Append ``new_tokens`` tokens to ``rid``, taking a new block when one fills."""
        extra = self.blocks_to_grow(rid, new_tokens)
        if extra > self.free_blocks:
            raise ValueError(f"{rid!r} needs {extra} more blocks, {self.free_blocks} are free")
        self._blocks[rid] += extra
        self._tokens[rid] += new_tokens
        self._used += extra

    def free(self, rid: str) -> int:
        """Return every block of ``rid`` to the pool; the number freed (0 if it held none)."""
        self._tokens.pop(rid, None)
        freed = self._blocks.pop(rid, 0)
        self._used -= freed
        return freed
