"""The target for an endpoint's API: the HTTP ones from :mod:`.endpoints`, KServe v2 over gRPC
from :mod:`.kserve_grpc_target` (which builds on :mod:`.endpoints`, so the choice lives here, above
both, and grpcio is imported only when that API is asked for)."""

from __future__ import annotations

from .api_events import EmbeddingsCheck
from .api_streams import ApiStreamCheck
from .endpoints import (
    ApiTarget,
    EmbeddingsTarget,
    Endpoint,
    GenerateTarget,
    OpenAITarget,
    ResponsesTarget,
)


def open_api_target(endpoint: Endpoint) -> ApiTarget:
    if endpoint.api == "openai-responses":
        return ResponsesTarget(endpoint)
    if endpoint.api == "openai-embeddings":
        return EmbeddingsTarget(endpoint)
    if endpoint.api.startswith("openai"):
        return OpenAITarget(endpoint)
    if endpoint.api == "kserve-v2-http":
        return GenerateTarget(endpoint)
    from .kserve_grpc_target import KServeGrpcTarget

    return KServeGrpcTarget(endpoint)


def check_type(api: str) -> type[ApiStreamCheck]:
    """The per-request check of ``api``'s streams: the embeddings' also counts its inputs."""
    return EmbeddingsCheck if api == "openai-embeddings" else ApiStreamCheck
