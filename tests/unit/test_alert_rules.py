"""The shipped alert rules, read without Prometheus or Grafana: deploy/prometheus/ (rules on the
``django_jobs_alerts_firing`` metric) and grafana/provisioning/alerting/ (SQL on the
``django_jobs_alerts`` view). Each file is YAML that parses, has one rule per kind of alert, and
names only the metric, labels, view and data source that docs/operations.md documents.
(promtool, which would check the PromQL itself, is not a dependency of the tests.)"""

from __future__ import annotations

import re
from pathlib import Path

import yaml

from django_jobs.alerts import KINDS, SEVERITIES
from tests.unit.helpers import prometheus_rules, selectors

ROOT = Path(__file__).resolve().parents[2]
PROMETHEUS = ROOT / "deploy" / "prometheus" / "django-jobs-alerts.yaml"
GRAFANA = ROOT / "grafana" / "provisioning" / "alerting" / "django-jobs-alerts.yaml"
DATASOURCE = ROOT / "grafana" / "provisioning" / "datasources" / "django-jobs.yaml"
OPERATIONS = ROOT / "docs" / "operations.md"

#: The metrics the rules may name, and the labels of each, as docs/operations.md documents them.
METRICS = {"django_jobs_alerts_firing": {"kind", "subject", "severity"}}


def test_prometheus_rules_parse_and_cover_each_kind_once() -> None:
    rules = prometheus_rules()
    assert sorted(rule["labels"]["kind"] for rule in rules) == sorted(KINDS)
    for rule in rules:
        assert re.fullmatch(r"DjangoJobs[A-Z]\w+", rule["alert"]), rule
        assert set(rule["annotations"]) == {"summary", "description"}, rule
        for text in rule["annotations"].values():
            assert set(re.findall(r"\$labels\.(\w+)", text)) <= METRICS["django_jobs_alerts_firing"]


def test_prometheus_rules_name_only_the_documented_metric_and_labels() -> None:
    for rule in prometheus_rules():
        found = selectors(rule["expr"])
        assert found, rule["expr"]
        for name, labels in found:
            assert name in METRICS, f"{rule['alert']}: {name} is not a documented metric"
            assert set(labels) <= METRICS[name], rule["expr"]
            assert labels.get("kind") == rule["labels"]["kind"], rule["expr"]
        grouped = re.findall(r"\bby\s*\(([^)]*)\)", rule["expr"])
        for group in grouped:
            names = {label.strip() for label in group.split(",")}
            assert names <= METRICS["django_jobs_alerts_firing"], rule["expr"]
            assert "severity" in names, "the rule must keep the alert's severity"


def test_the_selector_reader_sees_metrics_and_skips_functions() -> None:
    assert selectors('max by (subject) (rate(foo_total{kind="x", a="b"}[5m])) > bar') == [
        ("foo_total", {"kind": "x", "a": "b"}),
        ("bar", {}),
    ]


def test_the_metric_and_its_labels_are_documented() -> None:
    text = OPERATIONS.read_text()
    for name, labels in METRICS.items():
        assert name in text
        for label in labels:
            assert f"`{label}`" in text.split(name, 1)[1], label
    for severity in SEVERITIES:
        assert f"`{severity}`" in text


def test_grafana_alert_rules_query_the_view_for_each_kind() -> None:
    document = yaml.safe_load(GRAFANA.read_text())
    (datasource,) = yaml.safe_load(DATASOURCE.read_text())["datasources"]
    assert document["apiVersion"] == 1
    rules = [rule for group in document["groups"] for rule in group["rules"]]
    assert sorted(rule["labels"]["kind"] for rule in rules) == sorted(KINDS)
    assert len({rule["uid"] for rule in rules}) == len(rules)
    for rule in rules:
        queries = {query["refId"]: query for query in rule["data"]}
        assert rule["condition"] in queries
        sql = queries["A"]["model"]["rawSql"]
        assert queries["A"]["datasourceUid"] == datasource["uid"]
        assert queries["A"]["model"]["format"] == "table"
        assert re.fullmatch(
            r"SELECT subject, severity, 1 AS firing FROM django_jobs_alerts\s+"
            rf"WHERE kind = '{rule['labels']['kind']}'",
            sql.strip(),
        ), sql
        condition = queries[rule["condition"]]
        assert condition["datasourceUid"] == "__expr__"
        assert condition["model"]["expression"] == "A"
        assert rule["noDataState"] == "OK"  # no row: nothing fires


def test_every_kind_is_one_the_view_makes() -> None:
    view = (ROOT / "django_jobs" / "migrations" / "0022_alerts.py").read_text()
    made = set(re.findall(r"SELECT '(\w+)'", view))
    assert made == set(KINDS)
