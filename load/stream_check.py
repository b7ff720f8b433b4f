"""The protocol every per-stream check of the open loop keeps (:mod:`.openloop` drives it,
:mod:`.conversations` wraps it): apart from both, so that neither imports the other for it."""

from __future__ import annotations

from typing import Any, Protocol


class StreamCheck(Protocol):
    """Checks one stream as it arrives: :meth:`check` takes each item and returns the tokens
    it carries; :meth:`finish`, after the last, raises if the stream is not whole and sets
    ``output_tokens`` (which may differ from the sum of the counts: a server's usage) and
    ``input_tokens``, and ``source`` says how the tokens were counted."""

    output_tokens: int
    input_tokens: int | None
    source: str

    def check(self, item: Any, /) -> int: ...

    def finish(self, counted: int) -> None: ...
