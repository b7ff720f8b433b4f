"""A client of any server the serving helpers answer (``examples/openai_server.py``): one chat
completion streamed in the codec asked for, printed as it arrives, then its usage.

    python examples/openai_client.py http://127.0.0.1:8000 --codec delta "Say hello."

The server chooses the codec from ``Accept``; the helper reads whatever the response's content
type says. A server that offers none of the codecs asked for answers 406, raised here as a
``ResponseError`` that lists what it offers.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

import httpx

import inferwire.codecs as ic
import inferwire.serving as iws
from inferwire.serving import httpx as iws_httpx


def chat(
    url: str, prompt: str, codec: str, *, max_tokens: int | None = None
) -> list[ic.TokenChunk]:
    """The chunks of one streamed chat completion, echoed to stdout as they arrive."""
    request = iws.ChatCompletionRequest(
        messages=[iws.ChatMessage(role="user", content=prompt)],
        stream=True,
        stream_options=iws.StreamOptions(include_usage=True),
        max_tokens=max_tokens,
    )
    chunks = []
    with (
        httpx.Client(base_url=url, timeout=30) as client,
        client.stream(
            "POST",
            "/v1/chat/completions",
            content=request.to_json(),
            headers={"content-type": "application/json", "accept": iws_httpx.accept(codec)},
        ) as response,
    ):
        for chunk in iws_httpx.iter_chunks(response, codec):
            sys.stdout.write(chunk.text)
            sys.stdout.flush()
            chunks.append(chunk)
    return chunks


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("url", help="the server's base URL, e.g. http://127.0.0.1:8000")
    parser.add_argument("prompt", nargs="?", default="Say hello.")
    parser.add_argument("--codec", default="orjson", choices=ic.names())
    parser.add_argument("--max-tokens", type=int, default=None)
    args = parser.parse_args(argv)
    try:
        chunks = chat(args.url, args.prompt, args.codec, max_tokens=args.max_tokens)
    except iws.ResponseError as exc:
        print(f"\nrefused: {exc}", file=sys.stderr)
        return 1
    finish = next(c.finish_reason for c in reversed(chunks) if c.finish_reason)
    print(f"\n[{len(chunks)} chunks, finish_reason={finish}, usage={chunks[-1].usage}]")
    return 0


if __name__ == "__main__":
    sys.exit(main())
