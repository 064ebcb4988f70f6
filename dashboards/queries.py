"""The PromQL in the dashboard and the alert rules, for tests that run it against a real Prometheus.

    dashboard_queries(Path("dashboards/yolo-train.json"))  -> [(panel title, expr), ...]
    alert_expressions(Path("dashboards/alerts.yml"))        -> [(alert name, expr), ...]

Grafana's template variables are filled in (``$instance`` -> ``.+``, ``$__rate_interval`` -> ``1m``) so an
expression can go straight to Prometheus' HTTP API; pass ``variables={}`` to get them as written.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import yaml

from supervisor.telemetry import metric_table

# The metric families the exporter serves (its table's rows); nothing else may appear in a panel or an alert.
METRIC_NAMES = metric_table.METRIC_NAMES
# Only present while a distributed (multi-rank) worker trains.
RANK_METRIC_NAMES = frozenset(row.exported for row in metric_table.METRICS if row.only_with == "ranks")
# Only present on a machine with a GPU: panels on these stay empty on a CPU-only box.
GPU_METRIC_NAMES = frozenset(row.exported for row in metric_table.METRICS if row.only_with == "gpu")

DEFAULT_VARIABLES = {"instance": ".+", "__rate_interval": "1m", "__interval": "1m", "__range": "1h"}

SELECTOR = re.compile(r"\b(yolo_train_[a-zA-Z0-9_]+)(\{[^}]*\})?")
VARIABLE = re.compile(r"\$\{?(\w+)\}?")


def substitute(expr: str, variables: dict[str, str]) -> str:
    """Fills in Grafana's ``$name`` / ``${name}`` where ``name`` is in ``variables``."""
    return VARIABLE.sub(lambda m: variables.get(m.group(1), m.group(0)), expr)


def selectors(expr: str) -> list[tuple[str, str]]:
    """Every ``yolo_train_*`` selector in ``expr``: (metric name, its ``{...}`` matchers or "")."""
    return [(m.group(1), m.group(2) or "") for m in SELECTOR.finditer(expr)]


def metric_names(expr: str) -> set[str]:
    return {name for name, _ in selectors(expr)}


def dashboard_queries(path: Path, variables: dict[str, str] | None = None) -> list[tuple[str, str]]:
    """(panel title, expr) for every query of every panel, then ("annotation: NAME", expr) for the
    Prometheus annotations (restarts). Annotations return data only around a restart: query them over a
    range that holds one."""
    variables = DEFAULT_VARIABLES if variables is None else variables
    model = json.loads(Path(path).read_text())
    found = []
    for panel in model["panels"]:
        for target in panel.get("targets", []):
            found.append((panel["title"], substitute(target["expr"], variables)))
    for annotation in model.get("annotations", {}).get("list", []):
        if "expr" in annotation:
            found.append((f"annotation: {annotation['name']}", substitute(annotation["expr"], variables)))
    return found


def alert_expressions(path: Path) -> list[tuple[str, str]]:
    """(alert name, expr) for every alerting rule. An alert's expression returns data only while the
    alert's condition holds; to test that it reads live series, query each of ``metric_names(expr)``."""
    rules = yaml.safe_load(Path(path).read_text())
    return [(rule["alert"], rule["expr"].strip())
            for group in rules["groups"] for rule in group["rules"] if "alert" in rule]
