"""Every dashboard panel and every alert reads live series: a real Prometheus scrapes a real supervised run.

A Prometheus server (Debian package ``prometheus``) on loopback scrapes ``yolo-train run`` every second,
with the alert rules loaded, while the demo trains, hangs (an injected ``main_hang``), is killed, resumes
one rung safer and finishes. Then every panel query of the dashboard and every metric of every alert
expression goes through Prometheus' HTTP API over the run: a query that returns nothing is a broken panel.
GPU panels are the exception on a machine without a GPU (there is nothing to read there).
"""

import json
import shutil
import socket
import subprocess
import sys
import time
import urllib.parse
import urllib.request
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest

from dashboards.queries import GPU_METRIC_NAMES, RANK_METRIC_NAMES, alert_expressions, dashboard_queries, metric_names
from supervisor.host.gpu_metrics import discover_gpu_readers, sample_all
from tests.helpers import ROOT
from tests.helpers.supervised import demo_train, read_incidents, read_state

pytestmark = pytest.mark.e2e

PROMETHEUS = Path("/usr/bin/prometheus")
DASHBOARD = ROOT / "dashboards" / "yolo-train.json"
ALERTS = ROOT / "dashboards" / "alerts.yml"

RUN_CONFIG = """
name = "prometheus-e2e"
deadline = "{deadline}"
{train}[metrics]
listen = "127.0.0.1:{port}"
[ladder]
prior_between_hangs = "off"
"""

PROMETHEUS_CONFIG = """
global:
  scrape_interval: 1s
  scrape_timeout: 1s
  evaluation_interval: 1s
rule_files: [{alerts}]
scrape_configs:
  - job_name: yolo-train
    static_configs:
      - targets: ["127.0.0.1:{port}"]
"""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def api(base: str, path: str, **params) -> list:
    url = f"{base}/api/v1/{path}?{urllib.parse.urlencode(params)}"
    with urllib.request.urlopen(url, timeout=30) as response:
        body = json.load(response)
    assert body["status"] == "success", body
    return body["data"]["result"]


def wait_until(what: str, ready, timeout: float, process: subprocess.Popen | None = None) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if ready():
            return
        if process is not None and process.poll() is not None:
            break
        time.sleep(0.2)
    raise AssertionError(f"{what} not within {timeout:.0f} s")


def answers(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=2):
            return True
    except OSError:
        return False


@pytest.fixture
def prometheus(tmp_path):
    if not PROMETHEUS.exists():
        pytest.skip("prometheus is not installed (Debian package prometheus; `make` installs it as root)")
    exporter_port, web_port = free_port(), free_port()
    config = tmp_path / "prometheus.yml"
    config.write_text(PROMETHEUS_CONFIG.format(alerts=json.dumps(str(ALERTS)), port=exporter_port))
    log = open(tmp_path / "prometheus.log", "wb")
    process = subprocess.Popen([str(PROMETHEUS), f"--config.file={config}",
                                f"--storage.tsdb.path={tmp_path / 'tsdb'}",
                                f"--web.listen-address=127.0.0.1:{web_port}", "--log.level=warn"],
                               stdout=log, stderr=subprocess.STDOUT, cwd=tmp_path)
    base = f"http://127.0.0.1:{web_port}"
    try:
        wait_until("prometheus ready", lambda: answers(f"{base}/-/ready"), 30, process)
        yield base, exporter_port
    finally:
        process.terminate()
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
        log.close()
        shutil.rmtree(tmp_path / "tsdb", ignore_errors=True)


def test_dashboard_and_alerts_read_live_series_through_a_hang_and_recovery(prometheus, tmp_path):
    base, exporter_port = prometheus
    deadline = (datetime.now(timezone.utc) + timedelta(days=1)).strftime("%Y-%m-%dT%H:%M:%SZ")
    run_config = tmp_path / "run.toml"
    run_config.write_text(RUN_CONFIG.format(deadline=deadline, port=exporter_port, train=demo_train(epochs=2)))
    state_dir = tmp_path / "state"
    started = time.time()
    run = subprocess.run([sys.executable, "-m", "supervisor", "run", "--config", str(run_config),
                          "--state-dir", str(state_dir), "--fault", "main_hang,at_batch=10,attempt=1"],
                         cwd=ROOT, capture_output=True, text=True, timeout=240)
    finished = time.time()
    assert run.returncode == 0, run.stderr[-3000:]
    assert [(i["reason"], i["phase"]) for i in read_incidents(state_dir)] == [("hang", "train")]
    assert read_state(state_dir)["status"]["state"] == "succeeded"

    def over_the_run(expr: str) -> list:
        return api(base, "query_range", query=expr, start=f"{started:.3f}", end=f"{finished + 2:.3f}", step="1")

    def largest(expr: str) -> float:
        series = over_the_run(expr)
        return max(float(v) for s in series for _, v in s["values"]) if series else float("nan")

    ups = [float(v) for s in over_the_run('up{job="yolo-train"}') for _, v in s["values"]]
    assert ups.count(1.0) >= 10, f"the exporter was hardly ever scraped (is start_exporter wired into " \
                                 f"supervisor/agent.py?): up = {ups}"
    first, last = ups.index(1.0), len(ups) - 1 - ups[::-1].index(1.0)
    assert set(ups[first:last + 1]) == {1.0}, f"the exporter stopped answering during the run: up = {ups}"

    # the hang and the recovery, as Prometheus saw them
    assert largest('yolo_train_hangs_total{phase="train"}') == 1
    assert largest('yolo_train_restarts_total{reason="hang"}') == 1
    assert largest("yolo_train_rung") == 1
    assert largest("yolo_train_worker_dataloader_processes") >= 2  # rung 0: workers = 2
    assert largest('yolo_train_state{state="healthy"}') == 1
    # the restart annotation's text says where it hung: the stacks reach the status, not only incidents.jsonl
    summaries = {s["metric"]["summary"] for s in over_the_run("yolo_train_last_incident_info")}
    assert summaries and all("hang_forever" in text for text in summaries), summaries

    has_gpu = bool(sample_all(discover_gpu_readers()))
    empty = []
    for title, expr in dashboard_queries(DASHBOARD):
        if metric_names(expr) & GPU_METRIC_NAMES and not has_gpu:
            continue  # nothing to read on a machine without a GPU
        if metric_names(expr) <= RANK_METRIC_NAMES:
            continue  # one process has no ranks (test_metrics renders them, test_ddp checks their status)
        if not over_the_run(expr):
            empty.append(f"panel {title!r}: {expr}")
    for alert, expr in alert_expressions(ALERTS):
        for name in sorted(metric_names(expr)):
            if name in GPU_METRIC_NAMES and not has_gpu:
                continue
            if not over_the_run(name):
                empty.append(f"alert {alert}: {name}")
    assert empty == [], "queries that returned no data:\n" + "\n".join(empty)

    # the rules loaded and were evaluated against these series
    with urllib.request.urlopen(f"{base}/api/v1/rules", timeout=10) as response:
        groups = json.load(response)["data"]["groups"]
    rules = {rule["name"]: rule for group in groups for rule in group["rules"]}
    assert set(rules) >= {alert for alert, _ in alert_expressions(ALERTS)}
    assert all(rule["health"] == "ok" for rule in rules.values()), {n: r.get("lastError") for n, r in rules.items()}
