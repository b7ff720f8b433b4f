"""The FlatBuffers codec's encoder in C (codecs/_flatbuffers_accel.c); see flatbuffers_codec.py."""

API_VERSION: int

def configure(
    token_chunk: type[object],
    token_logprob: type[object],
    top_logprob: type[object],
    usage: type[object],
    embedding_batch: type[object],
    tensor: type[object],
    infer_request: type[object],
    infer_response: type[object],
    ndarray: type[object],
    /,
) -> None: ...
def encode(message: object, /) -> bytes | None: ...
