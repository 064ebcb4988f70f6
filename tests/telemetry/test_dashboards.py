"""The Grafana dashboard and the Prometheus alert rules: real promtool where it is installed, and the
dashboard JSON checked for what makes it importable and correct (every query on the exported names,
filtered by the instance variable, through the data source input)."""

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
from dashboards.queries import (  # noqa: E402
    METRIC_NAMES,
    alert_expressions,
    dashboard_queries,
    metric_names,
    selectors,
    substitute,
)

DASHBOARDS = ROOT / "dashboards"
DASHBOARD = DASHBOARDS / "yolo-train.json"
ALERTS = DASHBOARDS / "alerts.yml"
ALERTS_TEST = DASHBOARDS / "alerts_test.yml"
DATASOURCE_UID = "${DS_PROMETHEUS}"
INSTANCE_FILTER = 'instance=~"$instance"'
PROMTOOL = shutil.which("promtool") or ("/usr/bin/promtool" if Path("/usr/bin/promtool").exists() else None)
needs_promtool = pytest.mark.skipif(
    PROMTOOL is None, reason="promtool not installed (Debian package prometheus; `make deb` installs it)")


def promtool(*args, cwd=DASHBOARDS):
    return subprocess.run([PROMTOOL, *args], cwd=cwd, capture_output=True, text=True, timeout=60)


@pytest.fixture(scope="module")
def model():
    return json.loads(DASHBOARD.read_text())


def query_panels(model):
    return [p for p in model["panels"] if p["type"] != "row"]


@needs_promtool
def test_promtool_check_rules():
    result = promtool("check", "rules", str(ALERTS))
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"SUCCESS: {len(alert_expressions(ALERTS))} rules found" in result.stdout


@needs_promtool
def test_promtool_unit_tests_pass():
    result = promtool("test", "rules", str(ALERTS_TEST))
    assert result.returncode == 0, result.stdout + result.stderr


@needs_promtool
def test_promtool_unit_tests_catch_a_broken_rule(tmp_path):
    # The unit tests must be able to fail: loosen the hang-rate threshold and they do.
    broken = ALERTS.read_text().replace("increase(yolo_train_hangs_total[1h])) > 2", "increase(yolo_train_hangs_total[1h])) > 1")
    assert broken != ALERTS.read_text()
    (tmp_path / "alerts.yml").write_text(broken)
    shutil.copy(ALERTS_TEST, tmp_path / "alerts_test.yml")
    result = promtool("test", "rules", "alerts_test.yml", cwd=tmp_path)
    assert result.returncode != 0
    assert "YoloTrainHangRate" in result.stdout + result.stderr


def test_every_alert_is_unit_tested_firing_and_quiet():
    tested = yaml.safe_load(ALERTS_TEST.read_text())
    cases: dict[str, set[bool]] = {}
    for test in tested["tests"]:
        for case in test["alert_rule_test"]:
            cases.setdefault(case["alertname"], set()).add(bool(case.get("exp_alerts")))
    alerts = {name for name, _ in alert_expressions(ALERTS)}
    assert alerts == {"YoloTrainNoProgress", "YoloTrainHangRate", "YoloTrainLadderExhausted",
                      "YoloTrainRestartBudgetSpent", "YoloTrainRebootNeeded", "YoloTrainEtaPastDeadline",
                      "YoloTrainGpuTooHot", "YoloTrainCheckpointStale"}
    assert {name: cases.get(name) for name in alerts} == {name: {True, False} for name in alerts}


def test_alerts_use_only_exported_metrics():
    for name, expr in alert_expressions(ALERTS):
        assert metric_names(expr), name
        assert metric_names(expr) <= METRIC_NAMES, (name, metric_names(expr) - METRIC_NAMES)


@needs_promtool
def test_every_dashboard_query_is_valid_promql(tmp_path):
    # promtool parses a rule's expr with Prometheus' own parser: each query becomes a recording rule.
    rules = {"groups": [{"name": "dashboard", "rules": [
        {"record": f"dashboard:query_{i}", "expr": expr} for i, (_, expr) in enumerate(dashboard_queries(DASHBOARD))]}]}
    (tmp_path / "queries.yml").write_text(yaml.safe_dump(rules))
    result = promtool("check", "rules", str(tmp_path / "queries.yml"))
    assert result.returncode == 0, result.stdout + result.stderr


def test_dashboard_is_importable_with_a_datasource_input(model):
    assert {"name": "DS_PROMETHEUS", "type": "datasource", "pluginId": "prometheus"}.items() <= model["__inputs"][0].items()
    assert model["uid"] and model["title"]
    variables = {v["name"]: v for v in model["templating"]["list"]}
    instance = variables["instance"]
    assert instance["type"] == "query" and instance["datasource"]["uid"] == DATASOURCE_UID
    assert metric_names(instance["query"]) <= METRIC_NAMES and "instance" in instance["query"]
    assert instance["multi"] and instance["includeAll"]


def test_every_panel_queries_prometheus_through_the_input(model):
    panels = query_panels(model)
    assert len(panels) >= 20
    for panel in panels:
        assert panel["datasource"]["uid"] == DATASOURCE_UID, panel["title"]
        assert panel["targets"], panel["title"]
        for target in panel["targets"]:
            assert target["expr"].strip(), panel["title"]
            assert target["datasource"]["uid"] == DATASOURCE_UID, panel["title"]
        ref_ids = [t["refId"] for t in panel["targets"]]
        assert all(ref_ids) and len(set(ref_ids)) == len(ref_ids), panel["title"]
    assert len({p["id"] for p in model["panels"]}) == len(model["panels"])


def test_every_query_uses_exported_names_filtered_by_instance(model):
    for title, expr in dashboard_queries(DASHBOARD, variables={}):
        found = selectors(expr)
        assert found, title
        for name, matchers in found:
            assert name in METRIC_NAMES, (title, name)
            assert INSTANCE_FILTER in matchers, (title, name, matchers)


def test_dashboard_shows_every_exported_metric():
    shown = set().union(*(metric_names(expr) for _, expr in dashboard_queries(DASHBOARD)))
    assert METRIC_NAMES - shown == set()


def test_panels_named_in_the_issue_are_there(model):
    titles = {p["title"] for p in model["panels"]}
    assert {"Iterations per second", "Run progress", "ETA and slack to the deadline", "Losses", "State", "Rung",
            "Hangs by phase", "Kernel events", "GPU utilisation", "VRAM", "GPU temperature", "GPU power",
            "Worker CPU", "Worker memory (RSS)"} <= titles
    timelines = {p["title"] for p in model["panels"] if p["type"] == "state-timeline"}
    assert {"State", "Rung"} <= timelines


def test_restarts_are_annotations_with_their_reason_and_where_it_hung(model):
    annotation = next(a for a in model["annotations"]["list"] if a.get("name") == "Restarts")
    assert annotation["datasource"]["uid"] == DATASOURCE_UID and annotation["enable"]
    assert metric_names(annotation["expr"]) == {"yolo_train_restarts_total", "yolo_train_last_incident_info"}
    assert "{{summary}}" in annotation["textFormat"]
    assert INSTANCE_FILTER in annotation["expr"] and "reason" in annotation["expr"]
    assert "{{reason}}" in annotation["titleFormat"] + annotation["textFormat"]
    assert "reason" in annotation["tagKeys"]


def test_panels_fit_the_grid_without_overlap(model):
    cells = {}
    for panel in model["panels"]:
        g = panel["gridPos"]
        assert 0 <= g["x"] and g["x"] + g["w"] <= 24, panel["title"]
        for x in range(g["x"], g["x"] + g["w"]):
            for y in range(g["y"], g["y"] + g["h"]):
                assert (x, y) not in cells, (panel["title"], cells.get((x, y)))
                cells[(x, y)] = panel["title"]


def test_substitution_fills_grafana_variables_only():
    expr = 'rate(yolo_train_worker_cpu_seconds_total{instance=~"$instance"}[$__rate_interval]) and ${unknown}'
    assert substitute(expr, {"instance": ".+", "__rate_interval": "1m"}) == \
        'rate(yolo_train_worker_cpu_seconds_total{instance=~".+"}[1m]) and ${unknown}'


def test_committed_json_is_what_build_py_writes(tmp_path, monkeypatch):
    pytest.importorskip("grafana_foundation_sdk", reason="grafana-foundation-sdk not installed: cannot rebuild")
    from dashboards import build

    monkeypatch.setattr(build, "OUTPUT", tmp_path / "yolo-train.json")
    build.main()
    assert json.loads((tmp_path / "yolo-train.json").read_text()) == json.loads(DASHBOARD.read_text()), \
        "dashboards/yolo-train.json is stale: run `.venv/bin/python dashboards/build.py` and commit it"
