"""vLLM's chat completion chunk models, mirrored for the serving benchmark: what vLLM's OpenAI
server builds for every streamed chunk before ``model_dump_json(exclude_unset=True)``.

From vllm-project/vllm, ``vllm/entrypoints/openai/engine/protocol.py`` (``OpenAIBaseModel``,
``DeltaMessage``, ``UsageInfo``) and ``chat_completion/protocol.py``
(``ChatCompletionResponseStreamChoice``, ``ChatCompletionStreamResponse``): the same fields,
defaults and model configuration (``extra="allow"``, and the wrap validator that caches the
field names to find extra fields), so a chunk costs what it costs there. The fields a text
stream never sets (tool calls' own models, reasoning, prompt details, metrics) are kept with
their defaults as plain types: ``exclude_unset`` leaves them out of the bytes either way.
Only the chunk path is mirrored: the request model is not (each request is parsed once; its
chunks are the per-token cost compared).
"""

from __future__ import annotations

import logging
import time
import uuid
from typing import Any, ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

logger = logging.getLogger(__name__)


def random_uuid() -> str:
    """vLLM's ``vllm.utils.random_uuid``: 32 hex digits."""
    return uuid.uuid4().hex


class OpenAIBaseModel(BaseModel):
    # OpenAI API does allow extra fields
    model_config = ConfigDict(extra="allow")

    # Cache class field names
    field_names: ClassVar[set[str] | None] = None

    @model_validator(mode="wrap")
    @classmethod
    def __log_extra_fields__(cls, data: Any, handler: Any) -> Any:
        result = handler(data)
        if not isinstance(data, dict):
            return result
        field_names = cls.field_names
        if field_names is None:
            field_names = set()
            for field_name, field in cls.model_fields.items():
                field_names.add(field_name)
                if alias := getattr(field, "alias", None):
                    field_names.add(alias)
            cls.field_names = field_names
        extra_fields = data.keys() - field_names
        if extra_fields:  # a chunk the server builds has none
            logger.warning("The following fields were present but ignored: %s", extra_fields)
        return result


class UsageInfo(OpenAIBaseModel):
    prompt_tokens: int = 0
    total_tokens: int = 0
    completion_tokens: int | None = 0
    prompt_tokens_details: dict[str, Any] | None = None


class DeltaMessage(OpenAIBaseModel):
    role: str | None = None
    content: str | None = None
    reasoning: str | None = None
    tool_calls: list[dict[str, Any]] = Field(default_factory=list)


class ChatCompletionLogProbs(OpenAIBaseModel):
    content: list[dict[str, Any]] | None = None


class ChatCompletionResponseStreamChoice(OpenAIBaseModel):
    index: int
    delta: DeltaMessage
    logprobs: ChatCompletionLogProbs | None = None
    finish_reason: str | None = None
    stop_reason: int | str | None = None
    # not part of the OpenAI spec but for tracing the tokens
    token_ids: list[int] | None = None


class ChatCompletionStreamResponse(OpenAIBaseModel):
    id: str = Field(default_factory=lambda: f"chatcmpl-{random_uuid()}")
    object: Literal["chat.completion.chunk"] = "chat.completion.chunk"
    created: int = Field(default_factory=lambda: int(time.time()))
    model: str
    choices: list[ChatCompletionResponseStreamChoice]
    usage: UsageInfo | None = Field(default=None)
    system_fingerprint: str | None = None
    prompt_token_ids: list[int] | None = None
    prompt_text: str | None = None
