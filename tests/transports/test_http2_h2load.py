"""The HTTP/2 server under h2load (nghttp2's load client), at the stream limit it advertises.

h2load keeps ``-m`` streams open on each connection, opening a new one as soon as one closes,
so it finds any stream the server counts after it has closed (RFC 9113, 5.1.2): every such
stream is refused and counted failed. Each test starts the server on 127.0.0.1 in this
process, runs h2load as a subprocess against it and reads its summary line.

h2load is in Debian's ``nghttp2-client`` package; ``.ci/run`` installs it.
"""

from __future__ import annotations

import asyncio
import re
import shutil
from dataclasses import dataclass
from pathlib import Path

import orjson
import pytest

from inferwire.transports import http2
from tests.helpers.faults import MESSAGES, serving

H2LOAD = shutil.which("h2load")
REQUESTS = 5_000
"""Fifty times the streams open at once in either case: every stream slot is reused many times
over (more requests only lengthened the test: 20,000 took 18 s a case)."""
RUN_BOUND_S = 600.0
"""Bound on one h2load run: a bound that fires is a hang (a busy 2-core machine takes ~40 s)."""

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(
        H2LOAD is None, reason="h2load not installed: apt-get install nghttp2-client (.ci/run does)"
    ),
]

_SUMMARY = re.compile(
    r"^requests: (\d+) total, (\d+) started, (\d+) done, (\d+) succeeded, (\d+) failed, "
    r"(\d+) errored",
    re.MULTILINE,
)


@dataclass(frozen=True, slots=True)
class Summary:
    """h2load's ``requests:`` line."""

    total: int
    started: int
    done: int
    succeeded: int
    failed: int
    errored: int


def parse_summary(output: str) -> Summary:
    match = _SUMMARY.search(output)
    assert match is not None, f"no summary line in h2load's output:\n{output}"
    return Summary(*map(int, match.groups()))


def test_parse_summary_reads_h2load_1_52() -> None:
    output = (
        "finished in 8.39s, 945.68 req/s, 3.94MB/s\n"
        "requests: 20000 total, 9399 started, 9276 done, 7934 succeeded, 12066 failed, "
        "12066 errored, 0 timeout\n"
        "status codes: 7934 2xx, 0 3xx, 0 4xx, 0 5xx\n"
    )
    assert parse_summary(output) == Summary(
        total=20000, started=9399, done=9276, succeeded=7934, failed=12066, errored=12066
    )


@pytest.mark.parametrize(
    ("clients", "streams_each"),
    [(1, http2.MAX_CONCURRENT_STREAMS), (4, 100)],
    ids=["1 connection at the advertised limit", "4 connections x 100 streams"],
)
def test_h2load_token_streams_at_the_stream_limit_all_succeed(
    clients: int, streams_each: int, tmp_path: Path
) -> None:
    """``h2load -c C -m M -n 5000`` of streamed chat completions: none fails."""
    assert H2LOAD is not None
    body = tmp_path / "body.json"
    body.write_bytes(orjson.dumps({"workload": "stream-16", "messages": MESSAGES, "stream": True}))

    async def run() -> str:
        async with serving("http2") as srv:
            process = await asyncio.create_subprocess_exec(
                H2LOAD,
                *("-n", str(REQUESTS), "-c", str(clients), "-m", str(streams_each)),
                *("-d", str(body), "-H", "content-type: application/json"),
                f"http://{srv.address}/v1/chat/completions",
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.STDOUT,
            )
            try:
                async with asyncio.timeout(RUN_BOUND_S):
                    output, _ = await process.communicate()
            finally:
                if process.returncode is None:
                    process.kill()
                    await process.wait()
            assert process.returncode == 0, output.decode(errors="replace")
            return output.decode(errors="replace")

    output = asyncio.run(run())
    summary = parse_summary(output)
    assert summary == Summary(
        total=REQUESTS,
        started=REQUESTS,
        done=REQUESTS,
        succeeded=REQUESTS,
        failed=0,
        errored=0,
    ), output
    assert f"status codes: {REQUESTS} 2xx" in output, output
