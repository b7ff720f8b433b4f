"""Bad input and faults, for the report: every fault scenario of
:mod:`inferwire.load.faults` on every transport (the generator at 40 requests/s
against a server that is killed and restarted, whose connections are dropped, or that is
stopped past the clients' timeout), and the bad-input table of
:mod:`inferwire.load.bad_inputs`. The timed value is a run's wall time, fixed by its
schedule: the figures are in ``extra_info``.

A run fails if a request is not accounted for (counted twice, or neither a success nor an
error), or if any stream was lost, repeated, reordered or altered. Under ``--benchmark-disable``
one short scenario runs (kill-restart on tcp) and the bad-input table is fed a few inputs.
"""

from __future__ import annotations

from typing import Any, Final

import pytest

from inferwire.load import bad_inputs, fault_plan, faults, metrics

DISABLED_DURATION_S: Final = 3.5
DISABLED_PLAN: Final = ("kill-restart", "tcp")
HOSTILE_PER_CODEC: Final = 2000
DISABLED_HOSTILE_PER_CODEC: Final = 20


@pytest.mark.parametrize(
    ("scenario", "transport"), fault_plan.plan(), ids=[f"{s}-{t}" for s, t in fault_plan.plan()]
)
def bench_fault(benchmark: Any, scenario: str, transport: str) -> None:
    if benchmark.disabled and (scenario, transport) != DISABLED_PLAN:
        pytest.skip("untimed run: one scenario checks the benchmark's body")
    benchmark.group = "faults under load"
    duration_s = DISABLED_DURATION_S if benchmark.disabled else fault_plan.DURATION_S
    row = benchmark.pedantic(
        faults.run_scenario,
        args=(scenario, transport),
        kwargs={"duration_s": duration_s},
        rounds=1,
        iterations=1,
    )
    integrity = row["integrity"]
    unnoticed = integrity["lost"] + integrity["duplicated"] + integrity["reordered"]
    correct = (
        row["accounted"]
        and row["ended_not_whole"] == 0
        and unnoticed + integrity["altered"] == 0
        and integrity["verified"] == row["completed"]
    )
    benchmark.extra_info.update(
        op="fault",
        versions=metrics.versions(),
        machine=metrics.machine(),  # the other work on the cores stretches every timeout
        correct=correct,
        **row,
    )
    assert correct, row


def bench_hostile_inputs(benchmark: Any) -> None:
    benchmark.group = "bad input"
    per_codec = DISABLED_HOSTILE_PER_CODEC if benchmark.disabled else HOSTILE_PER_CODEC
    rows = benchmark.pedantic(
        bad_inputs.codec_inputs_report, kwargs={"per_codec": per_codec}, rounds=1, iterations=1
    )
    benchmark.extra_info.update(op="hostile-inputs", per_codec=per_codec, rows=rows)
