from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class Usage(_message.Message):
    __slots__ = ("prompt_tokens", "completion_tokens")
    PROMPT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    COMPLETION_TOKENS_FIELD_NUMBER: _ClassVar[int]
    prompt_tokens: int
    completion_tokens: int
    def __init__(self, prompt_tokens: _Optional[int] = ..., completion_tokens: _Optional[int] = ...) -> None: ...

class TopLogprob(_message.Message):
    __slots__ = ("token", "logprob")
    TOKEN_FIELD_NUMBER: _ClassVar[int]
    LOGPROB_FIELD_NUMBER: _ClassVar[int]
    token: str
    logprob: float
    def __init__(self, token: _Optional[str] = ..., logprob: _Optional[float] = ...) -> None: ...

class TokenLogprob(_message.Message):
    __slots__ = ("token", "logprob", "top")
    TOKEN_FIELD_NUMBER: _ClassVar[int]
    LOGPROB_FIELD_NUMBER: _ClassVar[int]
    TOP_FIELD_NUMBER: _ClassVar[int]
    token: str
    logprob: float
    top: _containers.RepeatedCompositeFieldContainer[TopLogprob]
    def __init__(self, token: _Optional[str] = ..., logprob: _Optional[float] = ..., top: _Optional[_Iterable[_Union[TopLogprob, _Mapping]]] = ...) -> None: ...

class Logprobs(_message.Message):
    __slots__ = ("content",)
    CONTENT_FIELD_NUMBER: _ClassVar[int]
    content: _containers.RepeatedCompositeFieldContainer[TokenLogprob]
    def __init__(self, content: _Optional[_Iterable[_Union[TokenLogprob, _Mapping]]] = ...) -> None: ...

class TokenChunk(_message.Message):
    __slots__ = ("id", "model", "created", "index", "seq", "token_ids", "text", "logprobs", "finish_reason", "usage")
    ID_FIELD_NUMBER: _ClassVar[int]
    MODEL_FIELD_NUMBER: _ClassVar[int]
    CREATED_FIELD_NUMBER: _ClassVar[int]
    INDEX_FIELD_NUMBER: _ClassVar[int]
    SEQ_FIELD_NUMBER: _ClassVar[int]
    TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    TEXT_FIELD_NUMBER: _ClassVar[int]
    LOGPROBS_FIELD_NUMBER: _ClassVar[int]
    FINISH_REASON_FIELD_NUMBER: _ClassVar[int]
    USAGE_FIELD_NUMBER: _ClassVar[int]
    id: str
    model: str
    created: int
    index: int
    seq: int
    token_ids: _containers.RepeatedScalarFieldContainer[int]
    text: str
    logprobs: Logprobs
    finish_reason: str
    usage: Usage
    def __init__(self, id: _Optional[str] = ..., model: _Optional[str] = ..., created: _Optional[int] = ..., index: _Optional[int] = ..., seq: _Optional[int] = ..., token_ids: _Optional[_Iterable[int]] = ..., text: _Optional[str] = ..., logprobs: _Optional[_Union[Logprobs, _Mapping]] = ..., finish_reason: _Optional[str] = ..., usage: _Optional[_Union[Usage, _Mapping]] = ...) -> None: ...

class Tensor(_message.Message):
    __slots__ = ("name", "datatype", "shape", "raw_contents")
    NAME_FIELD_NUMBER: _ClassVar[int]
    DATATYPE_FIELD_NUMBER: _ClassVar[int]
    SHAPE_FIELD_NUMBER: _ClassVar[int]
    RAW_CONTENTS_FIELD_NUMBER: _ClassVar[int]
    name: str
    datatype: str
    shape: _containers.RepeatedScalarFieldContainer[int]
    raw_contents: bytes
    def __init__(self, name: _Optional[str] = ..., datatype: _Optional[str] = ..., shape: _Optional[_Iterable[int]] = ..., raw_contents: _Optional[bytes] = ...) -> None: ...

class EmbeddingBatch(_message.Message):
    __slots__ = ("model", "batch", "dim", "vectors", "usage")
    MODEL_FIELD_NUMBER: _ClassVar[int]
    BATCH_FIELD_NUMBER: _ClassVar[int]
    DIM_FIELD_NUMBER: _ClassVar[int]
    VECTORS_FIELD_NUMBER: _ClassVar[int]
    USAGE_FIELD_NUMBER: _ClassVar[int]
    model: str
    batch: int
    dim: int
    vectors: bytes
    usage: Usage
    def __init__(self, model: _Optional[str] = ..., batch: _Optional[int] = ..., dim: _Optional[int] = ..., vectors: _Optional[bytes] = ..., usage: _Optional[_Union[Usage, _Mapping]] = ...) -> None: ...

class InferRequest(_message.Message):
    __slots__ = ("model", "id", "inputs")
    MODEL_FIELD_NUMBER: _ClassVar[int]
    ID_FIELD_NUMBER: _ClassVar[int]
    INPUTS_FIELD_NUMBER: _ClassVar[int]
    model: str
    id: str
    inputs: _containers.RepeatedCompositeFieldContainer[Tensor]
    def __init__(self, model: _Optional[str] = ..., id: _Optional[str] = ..., inputs: _Optional[_Iterable[_Union[Tensor, _Mapping]]] = ...) -> None: ...

class InferResponse(_message.Message):
    __slots__ = ("model", "id", "outputs")
    MODEL_FIELD_NUMBER: _ClassVar[int]
    ID_FIELD_NUMBER: _ClassVar[int]
    OUTPUTS_FIELD_NUMBER: _ClassVar[int]
    model: str
    id: str
    outputs: _containers.RepeatedCompositeFieldContainer[Tensor]
    def __init__(self, model: _Optional[str] = ..., id: _Optional[str] = ..., outputs: _Optional[_Iterable[_Union[Tensor, _Mapping]]] = ...) -> None: ...

class GenerateRequest(_message.Message):
    __slots__ = ("model", "workload", "prompt_tokens", "max_tokens", "seed", "timing")
    MODEL_FIELD_NUMBER: _ClassVar[int]
    WORKLOAD_FIELD_NUMBER: _ClassVar[int]
    PROMPT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    MAX_TOKENS_FIELD_NUMBER: _ClassVar[int]
    SEED_FIELD_NUMBER: _ClassVar[int]
    TIMING_FIELD_NUMBER: _ClassVar[int]
    model: str
    workload: str
    prompt_tokens: int
    max_tokens: int
    seed: int
    timing: bool
    def __init__(self, model: _Optional[str] = ..., workload: _Optional[str] = ..., prompt_tokens: _Optional[int] = ..., max_tokens: _Optional[int] = ..., seed: _Optional[int] = ..., timing: _Optional[bool] = ...) -> None: ...

class StreamEnd(_message.Message):
    __slots__ = ("chunk_count",)
    CHUNK_COUNT_FIELD_NUMBER: _ClassVar[int]
    chunk_count: int
    def __init__(self, chunk_count: _Optional[int] = ...) -> None: ...

class StreamBytes(_message.Message):
    __slots__ = ("data",)
    DATA_FIELD_NUMBER: _ClassVar[int]
    data: bytes
    def __init__(self, data: _Optional[bytes] = ...) -> None: ...

class SessionRequest(_message.Message):
    __slots__ = ("request_id", "infer", "generate")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    INFER_FIELD_NUMBER: _ClassVar[int]
    GENERATE_FIELD_NUMBER: _ClassVar[int]
    request_id: int
    infer: InferRequest
    generate: GenerateRequest
    def __init__(self, request_id: _Optional[int] = ..., infer: _Optional[_Union[InferRequest, _Mapping]] = ..., generate: _Optional[_Union[GenerateRequest, _Mapping]] = ...) -> None: ...

class SessionResponse(_message.Message):
    __slots__ = ("request_id", "infer", "chunk", "end", "error")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    INFER_FIELD_NUMBER: _ClassVar[int]
    CHUNK_FIELD_NUMBER: _ClassVar[int]
    END_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    request_id: int
    infer: InferResponse
    chunk: TokenChunk
    end: StreamEnd
    error: str
    def __init__(self, request_id: _Optional[int] = ..., infer: _Optional[_Union[InferResponse, _Mapping]] = ..., chunk: _Optional[_Union[TokenChunk, _Mapping]] = ..., end: _Optional[_Union[StreamEnd, _Mapping]] = ..., error: _Optional[str] = ...) -> None: ...
