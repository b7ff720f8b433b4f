"""The delta codec's per-frame work in C (codecs/_delta_accel.c); see delta_codec.py."""

from inferwire.codecs.model import TokenChunk

API_VERSION: int

def configure(
    token_chunk: type[object],
    token_logprob: type[object],
    top_logprob: type[object],
    usage: type[object],
    max_entries: int,
    max_chars: int,
    /,
) -> None: ...
def encode_frame(
    chunk: object,
    base: tuple[str, str, int, int],
    next_seq: int,
    offset: int,
    index: dict[str, int],
    strings: list[str],
    carries_usage: bool,
    float32: bool,
    /,
) -> bytes | None: ...
def decode_frames(
    data: bytes,
    pos: int,
    header: tuple[str, str, int, int, int],
    strings: list[str],
    count: int,
    usage_known: bool,
    float32: bool,
    max_frame_bytes: int,
    out: list[TokenChunk],
    /,
) -> int: ...
def decimal(value: float, /) -> tuple[int, int] | None: ...
