"""``inferwire load --api API``: the generator against an endpoint of any server (``--url``),
or against a server it spawns, through that server's public API (``--spawn --transport``).

What changes from the mode for inferwire's own transports (``--transport`` alone): each request
carries a prompt (:mod:`.prompts`: synthetic lengths, the bundled set, or a file), its stream is
read as the API defines it and checked as any server can be (:mod:`.api_streams`: the API's
end of stream, a finish reason on every choice, tokens that agree with the server's usage),
with no content check; output tokens are counted from the server's usage, else its token ids,
else the ``--tokenizer`` given, else one per token-carrying chunk, and the report says which.
The client's parse time per event is measured (``client_parse``), so the client's share of
the inter-token latency on the user's own server shows.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any, Final

import orjson

from inferwire._runtime.arguments import CommandError
from inferwire.transports import TransportError

from . import api_events, endpoints, openloop, targets
from .api_streams import TokenCounter
from .endpoints import APIS, ApiTarget, Endpoint
from .metrics import Histogram
from .point_plans import PointPlans
from .prompts import PromptSet, add_prompt_arguments, prompt_set_from_args, tokenizer_from_args
from .traces import Trace

DEFAULT_API_KEY_ENV: Final = "OPENAI_API_KEY"
SCHEMES: Final = {"http1": "http", "grpc": "grpc"}
"""The transports a spawned server serves the public APIs on, and the URL scheme."""


def add_api_arguments(
    load: argparse.ArgumentParser, where: argparse._MutuallyExclusiveGroup
) -> None:
    where.add_argument(
        "--url",
        help="the root URL of any server (http://host:8000, https://..., grpc://host:8001); "
        "needs --api",
    )
    api = load.add_argument_group(
        "any endpoint (--api)", "drive a server through its public API; see --url"
    )
    api.add_argument(
        "--api",
        choices=APIS,
        help="the API to drive, at --url or on the --spawn'ed server (http1 for the HTTP APIs, "
        "grpc for kserve-v2-grpc; openai-responses and openai-embeddings: --url only)",
    )
    api.add_argument("--model", help="the model to ask for (OpenAI default: the first listed)")
    api.add_argument(
        "--header",
        action="append",
        default=[],
        metavar="'NAME: VALUE'",
        help="a request header (repeatable); not written to the report",
    )
    api.add_argument(
        "--api-key-env",
        default=DEFAULT_API_KEY_ENV,
        metavar="NAME",
        help="send the key in this environment variable as 'Authorization: Bearer', when set "
        f"(default: {DEFAULT_API_KEY_ENV})",
    )
    api.add_argument("--ca-cert", type=Path, help="TLS: trust this CA bundle (PEM)")
    api.add_argument(
        "--insecure", action="store_true", help="TLS: do not verify the server's certificate"
    )
    api.add_argument(
        "--extra-body",
        type=_json_object,
        default={},
        metavar="JSON",
        help="fields merged into every request body (KServe: its parameters), e.g. "
        "'{\"ignore_eos\": true}'",
    )
    api.add_argument(
        "--max-connections",
        type=int,
        default=1024,
        help="bound on the HTTP connections open at once (a request finding all busy waits, "
        "and its wait counts in its latency)",
    )
    api.add_argument(
        "--embeddings-batch",
        type=int,
        default=1,
        metavar="N",
        help="openai-embeddings: N prompts as the inputs of each request (default: 1)",
    )
    api.add_argument(
        "--embeddings-format",
        choices=endpoints.EMBEDDINGS_FORMATS,
        default="float",
        help="openai-embeddings: the encoding_format asked (default: float)",
    )
    add_prompt_arguments(api)


def _json_object(text: str) -> dict[str, Any]:
    try:
        value = orjson.loads(text)
    except orjson.JSONDecodeError as exc:
        raise argparse.ArgumentTypeError(f"not JSON: {exc}") from None
    if not isinstance(value, dict):
        raise argparse.ArgumentTypeError("give a JSON object, e.g. '{\"ignore_eos\": true}'")
    return value


def endpoint_of(args: argparse.Namespace, url: str) -> Endpoint:
    try:
        headers = list(endpoints.parse_headers(args.header))
    except ValueError as exc:
        raise CommandError(str(exc)) from None
    key = os.environ.get(args.api_key_env) if args.api_key_env else None
    if key and not any(name == "authorization" for name, _ in headers):
        headers.append(("authorization", f"Bearer {key}"))
    if args.ca_cert is not None and not args.ca_cert.is_file():
        raise CommandError(f"--ca-cert {args.ca_cert}: no such file")
    if args.max_connections < 1:
        raise CommandError("--max-connections must be at least 1")
    model = args.model
    if model is None and args.spawn and args.api.startswith("kserve"):
        model = args.workload  # the spawned server's stream models are its workloads
    try:
        return Endpoint(
            url=url,
            api=args.api,
            model=model,
            headers=tuple(headers),
            ca_cert=str(args.ca_cert) if args.ca_cert else None,
            insecure=args.insecure,
            max_tokens=args.max_tokens,
            extra_body=args.extra_body,
            max_connections=args.max_connections,
            embeddings_batch=args.embeddings_batch,
            embeddings_format=args.embeddings_format,
            accept_encoding=getattr(args, "accept_encoding", None),
        )
    except ValueError as exc:
        raise CommandError(str(exc)) from None


def spawned_url(transport: str, address: str, api: str) -> str:
    scheme = SCHEMES.get(transport)
    if api in endpoints.URL_ONLY_APIS:
        raise CommandError(f"--api {api}: inferwire's own server does not serve it; give --url")
    wanted = "grpc" if api == "kserve-v2-grpc" else "http1"
    if transport != wanted:
        raise CommandError(f"--api {api} with --spawn: the server's transport is {wanted}")
    assert scheme is not None
    return f"{scheme}://{address}"


class ApiSweep:
    """The target, prompts and checks of one ``--api`` run; ``trace``: the trace it replays
    (``--trace-file``, read before anything starts). What each point sends is
    :attr:`plans`' (:mod:`.point_plans`: prompts, conversations or the trace)."""

    def __init__(
        self, args: argparse.Namespace, endpoint: Endpoint, *, trace: Trace | None = None
    ) -> None:
        self.args = args
        self.endpoint = endpoint
        tokenizer = tokenizer_from_args(args)
        self.prompts: PromptSet = prompt_set_from_args(args, tokenizer=tokenizer)
        self.counter: TokenCounter | None = tokenizer
        self.plans = PointPlans(args, self.prompts, tokenizer, trace, self.requests)
        self._drawn: list[Any] = []
        self._target: ApiTarget | None = None
        self.description: dict[str, Any] = {}

    @property
    def target(self) -> ApiTarget:
        assert self._target is not None, "open() first"
        return self._target

    async def open(self) -> ApiTarget:
        """The target, on the running loop (grpc.aio binds a channel to it), and what the
        server says it serves."""
        self._target = targets.open_api_target(self.endpoint)
        try:
            self.description = await self._target.describe()
        except TransportError as exc:
            await self._target.close()
            raise CommandError(f"{self.endpoint.url}: {exc}") from exc
        return self._target

    def requests(self, count: int) -> list[Any]:
        """The prompts of the first ``count`` requests of a point: one draw for the run (with a
        tokenizer, drawing costs about a millisecond a prompt), the same prompts at every
        point, so points differ by rate alone."""
        count = max(count, 1)
        if len(self._drawn) < count and self.plans.trace is not None:  # the trace's, in order
            self._drawn = self.plans.trace_prompts()
        elif len(self._drawn) < count:
            batch = self.endpoint.embeddings_batch  # openai-embeddings: prompts per request
            drawn = self.prompts.draw(count * batch, seed=self.args.seed)
            self._drawn = drawn if batch == 1 else api_events.batches(drawn, batch)
        return self._drawn[:count]

    def check_factory(self) -> openloop.CheckFactory:
        needs_finish = self.target.needs_finish
        counter = self.counter
        check = targets.check_type(self.endpoint.api)

        def make(parse: Histogram) -> Callable[[], openloop.StreamCheck]:
            return lambda: check(parse=parse, counter=counter, needs_finish=needs_finish)

        return make

    def _embeddings_parameters(self) -> dict[str, Any]:
        if self.endpoint.api != "openai-embeddings":
            return {}
        endpoint = self.endpoint
        return {
            "embeddings_batch": endpoint.embeddings_batch,
            "embeddings_format": endpoint.embeddings_format,
        }

    def parameters(self) -> dict[str, Any]:
        return {
            "url": self.endpoint.url,
            "api": self.endpoint.api,
            "model": getattr(self._target, "model", self.endpoint.model),
            "headers": endpoints.redacted(self.endpoint.headers),
            "extra_body": dict(self.endpoint.extra_body),
            "max_tokens": self.endpoint.max_tokens,
            "max_connections": self.endpoint.max_connections,
            **self._embeddings_parameters(),
            **(
                {"accept_encoding": self.endpoint.accept_encoding}
                if self.endpoint.accept_encoding is not None
                else {}
            ),
            "prompts": self.prompts.name,
            "tokenizer": str(self.args.tokenizer) if self.args.tokenizer else None,
            "target": self.description,
            "workload": self.plans.describe(),
        }
