"""Triton's generate extension of the KServe v2 HTTP protocol, over the simulated service.

The extension: Triton's ``docs/protocol/extension_generate.md`` (provisional). A request
``{"id"?, "text_input", "parameters"?}`` to ``POST /v2/models/{m}[/versions/{v}]/generate``
answers with one JSON object, to ``.../generate_stream`` with server-sent events, one
``data:`` object per chunk; the stream ends when the body does (the extension has no end
marker of its own). Each object is Triton's ``$generate_response``: ``id`` (if given),
``model_name``, ``model_version``, ``text_output``, and the decoupled model's other outputs
as Triton writes tensors of one element, by name: ``token_ids`` (a list), ``seq`` and
``finish_reason`` (``""`` until the last chunk), as :mod:`.kserve_grpc` sends them.

**The models** are the token-stream workloads (``stream-256``, ...), as on gRPC. The prompt
(``text_input``) is read but does not change the tokens; ``parameters`` (and, as the extension
allows, the request's other top-level properties) ``max_tokens``, ``seed`` and
``prompt_tokens`` choose the stream as :class:`~inferwire.transports.GenerateRequest` does;
other parameters (``temperature``, ``stream``, ...) are accepted and have no effect on a
simulated model. **Errors** are the extension's ``{"error": "<message>"}``: 400 for a request
the model refuses, before the stream starts.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator, Mapping
from typing import TYPE_CHECKING, Any, Final

import orjson

import inferwire.codecs as ic

from .errors import BadRequestError
from .http_response import Response
from .service import GenerateRequest, SimulatedService, TokenStream
from .timing import now_ns

if TYPE_CHECKING:
    from .metrics import RequestMeter, ServerMetrics

SSE: Final = "text/event-stream; charset=utf-8"
JSON: Final = "application/json"
_PARAMETERS: Final = ("max_tokens", "seed", "prompt_tokens")
_RESERVED: Final = frozenset({"id", "text_input", "parameters"})
_MAX_ID_CHARS: Final = 256


def kserve_error(status: int, message: str) -> Response:
    return Response(status, JSON, orjson.dumps({"error": message}))


def _request(model: str, body: bytes) -> tuple[GenerateRequest, str | None]:
    try:
        obj = orjson.loads(body)
    except orjson.JSONDecodeError as exc:
        raise BadRequestError(f"the body is not JSON: {exc}") from None
    if not isinstance(obj, dict):
        raise BadRequestError("the generate request must be a JSON object")
    text = obj.get("text_input")
    if not isinstance(text, str):
        raise BadRequestError("text_input must be a string")
    request_id = obj.get("id")
    if request_id is not None and (
        not isinstance(request_id, str) or len(request_id) > _MAX_ID_CHARS
    ):
        raise BadRequestError(f"id must be a string of at most {_MAX_ID_CHARS} characters")
    parameters = obj.get("parameters", {})
    if not isinstance(parameters, dict):
        raise BadRequestError("parameters must be an object")
    # "Any additional properties in the request object are passed either as parameters or
    # tensors": a top-level max_tokens counts as the parameter
    merged: dict[str, Any] = {k: v for k, v in obj.items() if k not in _RESERVED}
    merged.update(parameters)
    for name, value in merged.items():
        if not isinstance(value, str | int | float | bool) or value is None:
            raise BadRequestError(f"parameter {name[:64]!r} must be a string, number or boolean")
    chosen = {name: merged[name] for name in _PARAMETERS if name in merged}
    return GenerateRequest(workload=model, **chosen), request_id


def _response_obj(
    chunk: ic.TokenChunk, model: str, version: str, request_id: str | None
) -> dict[str, Any]:
    obj: dict[str, Any] = {} if request_id is None else {"id": request_id}
    obj["model_name"] = model
    obj["model_version"] = version
    obj["text_output"] = chunk.text
    obj["token_ids"] = list(chunk.token_ids)
    obj["seq"] = chunk.seq
    obj["finish_reason"] = chunk.finish_reason or ""
    return obj


async def _events(
    service: SimulatedService,
    stream: TokenStream,
    model: str,
    version: str,
    rid: str | None,
    meter: RequestMeter | None = None,
) -> AsyncGenerator[bytes, None]:
    async for batch in service.batches(stream):
        started = now_ns() if meter is not None else 0
        events = b"".join(
            b"data: " + orjson.dumps(_response_obj(chunk, model, version, rid)) + b"\n\n"
            for chunk in batch
        )
        if meter is not None:
            meter.encoded(len(batch), now_ns() - started)
        yield events


async def _whole(
    service: SimulatedService, stream: TokenStream, model: str, version: str, rid: str | None
) -> AsyncGenerator[bytes, None]:
    chunks = [chunk async for batch in service.batches(stream) for chunk in batch]
    obj = _response_obj(chunks[-1], model, version, rid)
    obj["text_output"] = "".join(chunk.text for chunk in chunks)
    obj["token_ids"] = [t for chunk in chunks for t in chunk.token_ids]
    yield orjson.dumps(obj)


def generate(
    service: SimulatedService,
    model: str,
    version: str,
    headers: Mapping[str, str],
    body: bytes,
    *,
    stream: bool,
    metrics: ServerMetrics | None = None,
    received_ns: int = 0,
) -> Response:
    """The answer to ``generate`` (``stream`` false) or ``generate_stream``; with ``metrics``,
    a stream's answer carries its meter (received whole at ``received_ns``)."""
    del headers  # the extension reads JSON whatever the content type says, as Triton does
    try:
        request, request_id = _request(model, body)
        opened = service.open(request)
    except BadRequestError as exc:
        return kserve_error(400, str(exc))
    if stream:
        meter = None if metrics is None else metrics.start("stream", received_ns, "orjson")
        events = _events(service, opened, model, version, request_id, meter)
        return Response(200, SSE, stream=events, meter=meter)
    return Response(200, JSON, stream=_whole(service, opened, model, version, request_id))
