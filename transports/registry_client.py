"""A schema resolver that asks a registry served over HTTP (``GET /schemas/ids/{id}``), the
read-only registry routes of the http1/http2 servers.

The delta decoder calls its resolver synchronously and only for an id it has not seen, once
per stream at most; wrap this in :class:`~inferwire.codecs.schema_registry.CachingResolver` (as
:func:`http_resolver` does) so each id crosses the network once and unknown ids are
negatively cached. The lookup is a blocking stdlib request with a short timeout: it happens
once per id per process, which does not justify an async path through the sans-IO decoder.
"""

from __future__ import annotations

import base64
import binascii
import http.client
import urllib.error
import urllib.request

import orjson

import inferwire.codecs as ic
from inferwire.codecs.errors import (
    CorruptRegistryError,
    SchemaError,
    SchemaRegistryUnavailableError,
)
from inferwire.codecs.schema_registry import CachingResolver, Schema


class HttpSchemaResolver:
    """Resolves schema ids at ``base_url`` (e.g. ``http://127.0.0.1:8000``)."""

    def __init__(self, base_url: str, *, timeout_s: float = 5.0, max_bytes: int = 1 << 20) -> None:
        if not base_url.startswith(("http://", "https://")):
            raise ValueError("the registry URL must be http:// or https://")
        self.base_url = base_url.rstrip("/")
        self.timeout_s = timeout_s
        self.max_bytes = max_bytes

    def resolve(self, schema_id: int, /) -> Schema:
        url = f"{self.base_url}/schemas/ids/{int(schema_id)}"
        try:
            with urllib.request.urlopen(url, timeout=self.timeout_s) as answer:
                body = answer.read(self.max_bytes + 1)
        except urllib.error.HTTPError as exc:
            if exc.code == 404:
                raise ic.UnknownSchemaError(schema_id) from None
            raise SchemaRegistryUnavailableError(
                f"registry at {self.base_url} answered {exc.code}"
            ) from exc
        except (urllib.error.URLError, OSError, http.client.HTTPException) as exc:
            raise SchemaRegistryUnavailableError(
                f"registry at {self.base_url} unreachable: {exc}"
            ) from exc
        if len(body) > self.max_bytes:
            raise CorruptRegistryError(f"schema {schema_id} is over {self.max_bytes} bytes")
        try:
            document = orjson.loads(body)
            schema = Schema(base64.b64decode(document["schema"], validate=True))
            schema.parsed()
        except (orjson.JSONDecodeError, KeyError, TypeError, binascii.Error, SchemaError) as exc:
            raise CorruptRegistryError(f"schema {schema_id} from the registry: {exc}") from exc
        return schema


def http_resolver(base_url: str, *, timeout_s: float = 5.0) -> CachingResolver:
    return CachingResolver(HttpSchemaResolver(base_url, timeout_s=timeout_s))
