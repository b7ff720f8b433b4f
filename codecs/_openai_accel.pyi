"""The OpenAI chunk mapping in C (codecs/_openai_accel.c); see openai.py."""

from collections.abc import Callable
from typing import Any

from inferwire.codecs.model import TokenChunk

API_VERSION: int

def configure(
    token_chunk: type[object],
    token_logprob: type[object],
    top_logprob: type[object],
    usage: type[object],
    chunk_to_obj_reference: Callable[..., dict[str, Any]],
    chunk_from_obj_reference: Callable[..., TokenChunk],
    read_number: Callable[[Any], float],
    /,
) -> None: ...
def chunk_to_obj(
    chunk: TokenChunk, *, binary: bool = False, extensions: bool = True
) -> dict[str, Any]: ...
def chunk_from_obj(
    obj: dict[str, Any], number: Callable[[Any], float] = ..., *, position: int | None = None
) -> TokenChunk: ...
