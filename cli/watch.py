"""``inferwire watch``: its options; what it writes is :mod:`inferwire.observe.watch`'s."""

from __future__ import annotations

import argparse
from pathlib import Path

from inferwire._runtime.arguments import Commands, connect_address, positive
from inferwire.observe.watch import command, dashboard, prometheus_config, rules


def _rules(args: argparse.Namespace) -> int:
    settings = command.alert_settings(
        threshold_ms=args.threshold_ms,
        window=args.window,
        hold=args.hold,
        quantile=args.quantile,
        evaluation_interval=args.evaluation_interval,
    )
    return command.write_rules(settings, args.out)


def _config(args: argparse.Namespace) -> int:
    return command.write_config(
        servers=args.server,
        loads=args.load,
        scrape_interval=args.scrape_interval,
        rule_files=args.rules,
        out=args.out,
    )


def _dashboard(args: argparse.Namespace) -> int:
    return command.write_dashboard(args.threshold_ms, args.out)


def _all(args: argparse.Namespace) -> int:
    return command.write_all(args.out_dir)


def _add_rule_settings(parser: argparse.ArgumentParser) -> None:
    defaults = rules.AlertSettings()
    parser.add_argument(
        "--threshold-ms",
        type=positive,
        default=defaults.threshold_s * 1000,
        help="alert when the quantile is above this, ms",
    )
    parser.add_argument(
        "--window", default=defaults.window, help="rate window of the quantile (1m, 30s, ...)"
    )
    parser.add_argument(
        "--for",
        dest="hold",
        default=defaults.hold,
        help="how long above the threshold before the alert fires (0s: at once)",
    )
    parser.add_argument(
        "--quantile", type=float, default=defaults.quantile, help="the quantile, in (0, 1)"
    )
    parser.add_argument(
        "--evaluation-interval",
        default=defaults.evaluation_interval,
        help="how often Prometheus evaluates the group",
    )


def add_commands(commands: Commands) -> None:
    """``watch`` and its four kinds of file."""
    doc = command.__doc__
    watch = commands.add_parser(
        "watch",
        help="write the Prometheus rules and configuration, and the Grafana dashboard",
        description=doc.split("\n\n")[0].replace("\n", " ") if doc else None,
    )
    kinds = watch.add_subparsers(dest="kind", required=True, metavar="WHAT")

    rule = kinds.add_parser(
        "rules",
        help="alert rules: P99 end-to-end latency and TTFT above a threshold",
        description=rules.__doc__,
    )
    _add_rule_settings(rule)
    rule.add_argument("--out", type=Path, help="file to write (default: stdout)")
    rule.set_defaults(run=_rules)

    cfg = kinds.add_parser(
        "prometheus-config",
        help="a Prometheus configuration scraping servers and load generators",
        description=prometheus_config.__doc__,
    )
    cfg.add_argument(
        "--server",
        action="append",
        type=connect_address,
        help="HOST:PORT of a server's metrics (repeat for more; default, with no --load "
        "either: 127.0.0.1:8000)",
    )
    cfg.add_argument(
        "--load",
        action="append",
        type=connect_address,
        help="HOST:PORT of a load generator's --metrics-port (repeat for more; default, with "
        "no --server either: 127.0.0.1:9465)",
    )
    cfg.add_argument("--scrape-interval", default="1s", help="how often to scrape")
    cfg.add_argument(
        "--rules",
        action="append",
        default=None,
        help="rule file path as Prometheus reads it (default: alerts.yml beside the config)",
    )
    cfg.add_argument("--out", type=Path, help="file to write (default: stdout)")
    cfg.set_defaults(run=_config)

    dash = kinds.add_parser(
        "dashboard",
        help="the Grafana dashboard (JSON, provisionable); needs the 'watch' extra",
        description=dashboard.__doc__,
    )
    dash.add_argument(
        "--threshold-ms",
        type=positive,
        default=500.0,
        help="the alert threshold drawn on the latency panels, ms",
    )
    dash.add_argument("--out", type=Path, help="file to write (default: stdout)")
    dash.set_defaults(run=_dashboard)

    every = kinds.add_parser(
        "all",
        help="every default file, as observe/ ships them",
        description=command.write_all.__doc__,
    )
    every.add_argument(
        "--out-dir", type=Path, default=Path("observe"), help="the folder to write them under"
    )
    every.set_defaults(run=_all)
