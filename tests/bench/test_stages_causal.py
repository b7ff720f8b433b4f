"""No stage of ``bench_stages`` is below zero: its own measurement, briefly, against a real
server on loopback for every transport x codec it has. Each stage is a difference of two
stamps taken in causal order on the host's one monotonic clock (every network stage from before
the sender's write call to after the receiver's read returned), so not one sample may be below
zero, and the request's stages add up to its whole."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest

import inferwire.transports as it
from inferwire.bench import bench_stages
from inferwire.transports import server_process
from inferwire.transports.timing import REQUEST_STAGES

REQUESTS = 12
"""Short requests a cell: enough for a median, about 0.2 s."""


@pytest.mark.parametrize("codec", bench_stages.STAGE_CODECS)
@pytest.mark.parametrize("transport", it.TRANSPORTS)
def test_no_stage_median_is_below_zero(transport: str, codec: str) -> None:
    serve = ("--decode-ms", str(bench_stages.DECODE_MS))
    with server_process.serve(transport, codec, *serve) as process:
        measured = asyncio.run(
            bench_stages.measure(
                transport,
                process.address,
                codec,
                workload="stream-16",
                streams=1,
                requests=REQUESTS,
                warmup_requests=1,
            )
        )
    assert all(measured.outputs)
    chunks, requests = bench_stages.pooled_ns(measured)
    assert len(requests["network to server"]) == REQUESTS  # every request had every stamp
    medians = {name: float(np.median(v)) for name, v in {**chunks, **requests}.items()}
    assert {name: m for name, m in medians.items() if m < 0} == {}
    # stronger, and what the definitions promise: not one sample below zero
    assert bench_stages.negative_stages(chunks) == {}
    assert bench_stages.negative_stages(requests) == {}
    # the stages add up: a chunk's to its produced-to-decoded, a request's to its whole
    parts = chunks["serialize"] + chunks["network"] + chunks["parse"]
    assert np.array_equal(parts, chunks["end_to_end"])
    for timing in measured.requests:
        stages = timing.request_stages_ns()
        assert list(stages) == list(REQUEST_STAGES)
        assert sum(stages.values()) == timing.decoded_ns[0] - timing.request_start_ns
