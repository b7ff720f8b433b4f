"""Issue 29: through ``load -> serve --engine -> engine`` at the default (fixed) step model, the
queue, model and outside-the-engine figures that ``inferwire load`` attributes from the
server's reports agree with the frontend's own stamps (``--stamps-file``) within 10% or 1 ms
per stage: per request (each stream's ``metrics`` object, medians) and per point (the means
of the frontend's vLLM histograms, scraped before and after it).

Real processes on loopback (``inferwire engine`` and ``inferwire serve``), a two-second point.
The only bound is the agreement of two accounts of the same run, so a busy machine slows the
run without failing it."""

from __future__ import annotations

from typing import Any

import pytest

from inferwire.bench.measure import attribution_truth as at
from inferwire.bench.measure.engine_runs import SEED, request_shapes
from inferwire.load import openloop

RATE_RPS = 20.0
DURATION_S = 2.0


@pytest.fixture(scope="module")
def figures() -> dict[str, Any]:
    spec = openloop.LoadSpec(duration_s=DURATION_S, seed=SEED)
    tokens = [s.output_tokens for s in request_shapes(int(DURATION_S * RATE_RPS * 2) + 16)]
    with at.TruthStack("msgspec-msgpack", "--policy", "continuous") as stack:
        run = at.run_attributed(stack, spec, RATE_RPS, tokens)
        lines = stack.stamp_lines(at_least=at.WARM_REQUESTS + len(run.records))
    return at.compare(run, lines)


def test_every_stream_is_whole_and_joined_to_its_stamps(figures: dict[str, Any]) -> None:
    assert figures["whole"], figures["errors"]
    join = figures["join"]
    assert join["pairs"] == figures["requests_completed"] > 0
    assert join["records_unjoined"] == 0


@pytest.mark.parametrize("stage", at.STAGES)
def test_per_request_attribution_agrees_with_the_stamps(
    figures: dict[str, Any], stage: str
) -> None:
    found = figures["per_request"][stage]
    assert found["attributed_requests"] == found["requests"], found  # every stream reported
    assert found["within"], found


@pytest.mark.parametrize("stage", at.STAGES)
def test_per_point_means_agree_with_the_stamps(figures: dict[str, Any], stage: str) -> None:
    means = figures["per_point"]
    assert means["state"] == "used", means
    assert means[stage]["within"], means
