"""The protobuf codec's TokenChunk marshalling in C (codecs/_protobuf_accel.c); see
protobuf_codec.py."""

from inferwire.codecs.model import TokenChunk

API_VERSION: int

def configure(
    token_chunk: type[object],
    token_logprob: type[object],
    top_logprob: type[object],
    usage: type[object],
    /,
) -> None: ...
def encode_chunk(chunk: object, /) -> bytes | None: ...
def decode_chunk(data: object, max_elements: int, /) -> TokenChunk | None: ...
