"""The bad-input table of the report: every codec fed the seeded bad inputs of
:mod:`inferwire.workloads.hostile`, nothing escapes, and each input past a limit is refused."""

from __future__ import annotations

import inferwire.codecs as ic
from inferwire.bench.report import bad_inputs as bad_inputs_report
from inferwire.load import bad_inputs
from inferwire.workloads.hostile import KINDS


def test_the_hostile_inputs_report_finds_no_escape() -> None:
    rows = bad_inputs.codec_inputs_report(seed=1, per_codec=60)
    assert {row["codec"] for row in rows} == set(ic.names())
    assert {row["kind"] for row in rows} == set(KINDS)
    for row in rows:
        assert row["tried"] > 0, row
        assert row["decoded"] + row["decode_error"] + row["other"] == row["tried"], row
        assert row["other"] == 0, row
        if row["kind"] in ("too-deep", "too-many", "fan-out"):  # each past a limit
            assert row["decode_error"] == row["tried"], row
    table = bad_inputs_report.render(rows)
    assert table.startswith("|")
    assert all(name in table for name in ic.names())
