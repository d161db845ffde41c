"""The alert rules, the Grafana dashboard and docs/observability.md name only metrics the code exports,
and the documentation lists every one of them.

The exported names come from the code itself: the families a worker's registry and a real
exporter's collector (on a real database) yield, turned into the sample names Prometheus stores
(``_total`` for counters, ``_bucket``/``_sum``/``_count`` for histograms). Expressions are read
from the files (YAML and JSON parsed), never copied into the test.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import yaml

from pgflow_cli import db as pgdb
from pgflow_cli.operations import exporter as exporter_op
from pgflow_cli.worker.metrics import PrometheusObserver

DOCS = Path(__file__).resolve().parents[2] / "docs"
ALERTS = DOCS / "observability" / "alerts.yml"
DASHBOARD = DOCS / "observability" / "grafana-dashboard.json"
GUIDE = DOCS / "observability.md"

METRIC = re.compile(r"\bpgflow_(?:worker|route|flow|fences?|migrations?|exporter)_[a-z0-9_]+\b")
"""A metric's name: every family starts with one of these prefixes (``pgflow_cli`` is no metric)."""
QUOTED = re.compile(r'"(?:[^"\\]|\\.)*"')
SUFFIXES = {"counter": ("_total",), "histogram": ("_bucket", "_sum", "_count"), "gauge": ("",)}


def sample_names(families) -> dict[str, str]:
    """``{sample name: family name}`` for the families' types."""
    names = {}
    for family in families:
        for suffix in SUFFIXES[family.type]:
            names[family.name + suffix] = family.name
    return names


@pytest.fixture
def exported(db) -> dict[str, str]:
    observer = PrometheusObserver(flow_slug="docs", step_slug=None, queue_name="docs", host="127.0.0.1", port=0,
                                  health_window=10)
    try:
        names = sample_names(observer.registry.collect())
    finally:
        observer.close()
    target = pgdb.Target(db.conninfo, "test")
    served = exporter_op.Exporter(lambda: pgdb.connect(target), host="127.0.0.1", port=0)
    try:
        families = list(served.collector.collect())
        assert any(f.name == "pgflow_exporter_up" and f.samples[0].value == 1 for f in families)
        names.update(sample_names(families))
    finally:
        served.close()
    return names


def expressions_of_alerts() -> dict[str, str]:
    rules = [rule for group in yaml.safe_load(ALERTS.read_text())["groups"] for rule in group["rules"]]
    return {rule["alert"]: rule["expr"] for rule in rules}


def expressions_of_dashboard() -> dict[str, str]:
    found: dict[str, str] = {}

    def walk(node, where: str) -> None:
        if isinstance(node, dict):
            if isinstance(node.get("expr"), str):
                found[f"{where} {node.get('refId', '')}"] = node["expr"]
            for key, value in node.items():
                walk(value, node.get("title", where) if key == "targets" else where)
        elif isinstance(node, list):
            for item in node:
                walk(item, where)

    walk(json.loads(DASHBOARD.read_text()), "dashboard")
    return found


def named(expression: str) -> set[str]:
    return set(METRIC.findall(QUOTED.sub('""', expression)))


@pytest.mark.parametrize("source", [expressions_of_alerts, expressions_of_dashboard], ids=["alerts", "dashboard"])
def test_every_expression_names_exported_metrics(exported, source):
    expressions = source()
    assert expressions, f"no expressions found by {source.__name__}"
    unknown = {where: sorted(named(expr) - set(exported)) for where, expr in expressions.items()}
    assert {where: names for where, names in unknown.items() if names} == {}
    assert all(named(expr) for expr in expressions.values()), "an expression names no pgflow metric"


def test_the_guide_lists_every_metric_and_names_no_other(exported):
    text = GUIDE.read_text()
    families = set(exported.values())
    missing = sorted(name for name in families if f"`{name}" not in text)
    assert missing == []
    mentioned = {name for name in METRIC.findall(text)}
    assert sorted(mentioned - set(exported) - families) == []
