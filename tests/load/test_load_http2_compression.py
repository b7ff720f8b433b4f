"""``inferwire load --transport http1/http2 --accept-encoding``: the target the load generator
opens asks for the coding and decodes it (the codings and the HTTP/2 client's decoding are
tested in tests/transports/test_http2_compression.py, whose server helper this uses)."""

from __future__ import annotations

from typing import Any

import pytest

import inferwire.transports as it
from inferwire.load.openloop import open_target
from tests.transports.test_compression import STREAM, expected_chunks, run, serving


def test_the_load_generators_http2_target_asks_for_and_decodes_a_coding() -> None:
    async def go() -> None:
        async with serving("http2") as srv:
            coded: Any = open_target("http2", srv.address, "orjson", accept_encoding="zstd")
            plain: Any = open_target("http2", srv.address, "orjson")
            async with coded, plain:
                assert [c async for c in coded.generate(STREAM)] == expected_chunks()
                assert [c async for c in plain.generate(STREAM)] == expected_chunks()
                assert coded.received_bytes < plain.received_bytes / 2

    run(go())


def test_accept_encoding_is_for_the_http_transports_alone() -> None:
    with pytest.raises(ValueError, match="accept-encoding is for http1 and http2, not grpc"):
        open_target("grpc", "127.0.0.1:1", "orjson", accept_encoding="gzip")
    client = open_target("http1", "127.0.0.1:1", "orjson", accept_encoding="gzip")
    assert isinstance(client, it.Client)
    assert getattr(client, "accept_encoding", None) == "gzip"
