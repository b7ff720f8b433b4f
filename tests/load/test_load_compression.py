"""The load generator's side of compressed responses (``--accept-encoding``): the value is
checked, and a target that asks for a coding decodes it (the codings themselves are tested in
tests/transports/test_compression.py, whose server helper this uses)."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from inferwire.load import endpoints
from inferwire.load.api_streams import DONE
from tests.transports.test_compression import run, serving


@pytest.mark.parametrize(
    ("value", "ok"),
    [
        ("gzip, br, zstd", True),
        ("deflate;q=0.5, *;q=0.1, identity", True),
        ("compress", False),
        ("gzip;q=7", False),
        ("gzip\r\nx-evil: 1", False),
        ("", False),
    ],
)
def test_the_load_generators_accept_encoding_is_checked(value: str, ok: bool) -> None:
    if ok:
        endpoints.Endpoint(url="http://h:1", api="openai-chat", accept_encoding=value)
    else:
        with pytest.raises(ValueError, match="accept-encoding"):
            endpoints.Endpoint(url="http://h:1", api="openai-chat", accept_encoding=value)


@dataclass(frozen=True)
class Prompt:
    text: str = "Generate."
    max_tokens: int | None = 8


def test_the_load_generators_target_asks_for_and_decodes_a_coding() -> None:
    async def go() -> None:
        async with serving("http1") as srv:
            endpoint = endpoints.Endpoint(
                url=f"http://{srv.address}", api="openai-chat", accept_encoding="br"
            )
            target = endpoints.OpenAITarget(endpoint)
            try:
                await target.describe()
                events = [e async for e in target.generate(Prompt())]
                assert events[-1] is DONE
                assert target.pool.wire_bytes > 0
                raw = endpoints.OpenAITarget(
                    endpoints.Endpoint(url=f"http://{srv.address}", api="openai-chat")
                )
                try:
                    assert len([e async for e in raw.generate(Prompt())]) == len(events)
                    assert target.pool.wire_bytes < raw.pool.wire_bytes / 2
                finally:
                    await raw.close()
            finally:
                await target.close()

    run(go())
