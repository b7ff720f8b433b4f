"""The shipped Prometheus and Grafana files (observe/): regenerated equal, checked by promtool,
the rules' unit test run, and the dashboard well formed. The live test (a real Prometheus
scraping a server and the load generator) is tests/observe/test_watch_live.py."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path
from typing import Final

import pytest

from inferwire.cli import main as cli
from inferwire.observe.watch import command, dashboard, queries, rules

ROOT: Final = Path(__file__).resolve().parents[2]
OBSERVE: Final = ROOT / "observe"
PROMTOOL: Final = shutil.which("promtool")
needs_promtool = pytest.mark.skipif(
    PROMTOOL is None, reason="promtool not installed (Debian's prometheus; make sysdeps)"
)


def _promtool(*args: str | Path) -> subprocess.CompletedProcess[str]:
    assert PROMTOOL is not None
    return subprocess.run(
        [PROMTOOL, *map(str, args)], capture_output=True, text=True, timeout=60, check=False
    )


def test_shipped_files_are_the_generators_output(tmp_path: Path) -> None:
    assert cli.main(["watch", "all", "--out-dir", str(tmp_path)]) == 0
    for name in (command.RULES_FILE, command.CONFIG_FILE, command.DASHBOARD_FILE):
        assert (OBSERVE / name).read_text() == (tmp_path / name).read_text(), (
            f"observe/{name} is stale: run `inferwire watch all`"
        )


@needs_promtool
def test_promtool_accepts_the_shipped_rules_and_config() -> None:
    checked = _promtool("check", "rules", OBSERVE / command.RULES_FILE)
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert f"SUCCESS: {len(rules.ALERTS)} rules found" in checked.stdout
    checked = _promtool("check", "config", OBSERVE / command.CONFIG_FILE)
    assert checked.returncode == 0, checked.stdout + checked.stderr


@needs_promtool
def test_the_rules_unit_test_passes() -> None:
    tested = _promtool("test", "rules", OBSERVE / "prometheus" / "alerts_test.yml")
    assert tested.returncode == 0, tested.stdout + tested.stderr
    assert "SUCCESS" in tested.stdout


@needs_promtool
def test_the_rules_unit_test_fails_on_other_rules(tmp_path: Path) -> None:
    """The unit test pins the shipped threshold: a rule file with a 3 s threshold fails it."""
    shutil.copy(OBSERVE / "prometheus" / "alerts_test.yml", tmp_path)
    (tmp_path / "alerts.yml").write_text(rules.rules(rules.AlertSettings(threshold_s=3.0)))
    tested = _promtool("test", "rules", tmp_path / "alerts_test.yml")
    assert tested.returncode != 0
    assert "InferwireClientE2ELatencyHigh" in tested.stdout + tested.stderr


@needs_promtool
@pytest.mark.parametrize(
    "settings",
    [
        rules.AlertSettings(threshold_s=0.25, window="30s", hold="10s"),
        rules.AlertSettings(threshold_s=2.0, window="5m", hold="0s", quantile=0.9),
        rules.AlertSettings(window="1m30s", evaluation_interval="1s"),
    ],
)
def test_other_settings_make_valid_rules(settings: rules.AlertSettings, tmp_path: Path) -> None:
    path = tmp_path / "alerts.yml"
    path.write_text(rules.rules(settings))
    checked = _promtool("check", "rules", path)
    assert checked.returncode == 0, checked.stdout + checked.stderr
    text = path.read_text()
    assert f"[{settings.window}]" in text
    assert f"> {settings.threshold_s:g}" in text


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("threshold_s", 0.0),
        ("threshold_s", -1.0),
        ("quantile", 1.0),
        ("window", "1 minute"),
        ("window", "60"),
        ("hold", "soon"),
        ("evaluation_interval", ""),
    ],
)
def test_bad_settings_are_refused(field: str, value: object) -> None:
    with pytest.raises(ValueError, match=field.split("_")[0]):
        rules.AlertSettings(**{field: value})  # type: ignore[arg-type]


def test_the_command_refuses_a_bad_window(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["watch", "rules", "--window", "5x"]) == 2
    assert "'5x' is not a Prometheus duration" in capsys.readouterr().err


def test_every_alert_reads_a_histogram_with_the_threshold_as_a_bucket_bound() -> None:
    """The quantile is exact at the threshold only if the threshold is a bucket bound."""
    from inferwire.transports.metrics_core import LATENCY_BUCKETS_S

    assert rules.AlertSettings().threshold_s in LATENCY_BUCKETS_S
    text = rules.rules()
    for alert in rules.ALERTS:
        assert f"rate({alert.histogram}_bucket[1m])" in text


def test_the_dashboard_is_well_formed() -> None:
    model = json.loads((OBSERVE / command.DASHBOARD_FILE).read_text())
    assert model["uid"] == dashboard.UID
    panels = model["panels"]
    ids = [p["id"] for p in panels]
    assert len(set(ids)) == len(ids)
    graphs = [p for p in panels if p["type"] == "timeseries"]
    rows = [p["title"] for p in panels if p["type"] == "row"]
    assert rows == ["Traffic", "Latency", "Errors", "Wire"]
    titles = {p["title"] for p in graphs}
    # the panels the issue names
    assert {
        "Request rate",
        "Time to first token",
        "Inter-token latency",
        "End-to-end latency",
        "Errors",
        "In flight",
        "Response bytes per second",
        "Encode time per chunk",
    } <= titles
    for panel in graphs:
        assert panel["datasource"] == {"type": "prometheus", "uid": "${datasource}"}
        assert panel["targets"], panel["title"]
        ref_ids = [t["refId"] for t in panel["targets"]]
        assert len(set(ref_ids)) == len(ref_ids)
    exprs = [t["expr"] for p in graphs for t in p["targets"]]
    assert exprs == dashboard.every_query()
    assert [v["name"] for v in model["templating"]["list"]] == ["datasource"]


def test_the_dashboard_reads_only_the_exported_metrics() -> None:
    """Every metric a dashboard query names is one the servers or the load generator export
    (a renamed metric breaks this, not the dashboard silently)."""
    import re

    from inferwire.load.live_metrics import LiveMetrics
    from inferwire.transports.metrics import ServerMetrics

    exported = set()
    for registry in (ServerMetrics("http1", "orjson").registry, LiveMetrics().metric_set.registry):
        for family in registry.collect():
            exported.add(family.name + ("_total" if family.type == "counter" else ""))
    assert "inferwire_requests_total" in exported
    assert "inferwire_load_send_lag_seconds" in exported
    for expr in dashboard.every_query():
        for name in re.findall(r"\b(inferwire_[a-z0-9_]+)", expr):
            base = re.sub(r"_(bucket|sum|count)$", "", name)
            assert name in exported or base in exported, (name, expr)
    assert queries.LOAD.startswith(queries.SERVER)
