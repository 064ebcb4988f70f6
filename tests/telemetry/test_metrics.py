"""The exporter: a status rendered into metrics by the metric table, checked by promtool, served over real HTTP, and
the worker's real process tree read with psutil.

The GPUs come from the amdgpu sysfs fixture tree (tests/fixtures/amdgpu_sysfs): a fake only because no AMD
GPU exists here, built from the real file names and formats.
"""

import errno
import os
import signal
import socket
import subprocess
import sys
import textwrap
import time
import urllib.error
import urllib.request
from pathlib import Path

import psutil
import pytest
from prometheus_client import CollectorRegistry, generate_latest

from dashboards.queries import GPU_METRIC_NAMES, METRIC_NAMES
from supervisor.config import Config, ConfigError, parse
from supervisor.decision import core
from supervisor.decision.model.ladder import build_ladder
from supervisor.decision.stall.stack_reading import as_incident_stacks
from supervisor.decision.status_view import Status, snapshot
from supervisor.host.gpu_metrics import AmdgpuSysfsReader
from supervisor.host.stacks import capture_tree
from supervisor.telemetry.metric_table import METRICS
from supervisor.telemetry.metrics import (
    CachedGpuSamples,
    TrainingCollector,
    WorkerCpuCounter,
    parse_deadline,
    sample_worker_tree,
    start_exporter,
)

FIXTURE = Path(__file__).parents[1] / "fixtures" / "amdgpu_sysfs"
DEADLINE = parse_deadline("2030-01-01T00:00:00Z")
NOW = 1_900_000_000.0

# What Agent.status() holds in the middle of a run after one hang in training, as its JSON (Status.to_dict()) says.
STATUS = {
    "state": "healthy", "phase": "train", "epoch": 3, "epochs": 8, "batch": 5, "batches": 8,
    "losses": {"box_loss": 1.25, "cls_loss": 2.5, "dfl_loss": 1.0}, "lr": 0.0025,
    "it_s": 4.0, "samples_s": 16.0, "eta_seconds": 10.25, "progress": 0.328125,
    "rung": 1, "rungs": 5, "rung_label": "workers=1", "attempt": 2, "restarts": 1,
    "restarts_by_reason": {"hang": 1}, "hangs_by_phase": {"train": 1}, "budget_left": 9,
    "recoveries": {"in_place": 2, "restart": 1},
    "kernel_events": {"stall": 2}, "reboot_needed": False, "worker_pid": None,
    "settings": {"workers": 1, "versions": {"ultralytics": "8.3.99", "torch": "2.14.1", "python": "3.11.2"}},
    "seconds_since_progress": 0.5, "worker_uptime": 30.0, "last_restart": NOW - 40,
    "heartbeats": {"malformed": 1, "oversized": 2, "dropped": 3}, "exit": None, "updated": NOW - 1.0,
    "last_incident": {"reason": "hang", "phase": "train", "rung": 0},  # where it hung: see the real path below
    "rung_speeds": {"0": 4.0, "1": 2.5},
    "ranks": [{"rank": 0, "pid": 10, "device": "cuda:0", "seconds_since_progress": 0.25},
              {"rank": 1, "pid": 11, "device": "cuda:1", "seconds_since_progress": 0.5}],
    "lost_seconds": 42.0, "goodput": 0.93, "checkpoint_every": 600.0,
    "last_checkpoint": {"path": "/s/train/weights/last.pt", "epoch": 3, "batch": 4, "age_seconds": 100.0,
                        "seconds": 0.25},
}


def registry_for(status, *, deadline=DEADLINE, readers=(), now=NOW):
    collector = TrainingCollector(deadline, list(readers), clock=lambda: now)
    collector.status = Status.from_dict(status)
    registry = CollectorRegistry(auto_describe=False)
    registry.register(collector)
    return registry


def exported_names(registry):
    return {sample.name for family in registry.collect() for sample in family.samples}


def test_every_dashboard_metric_is_exported_and_nothing_else():
    registry = registry_for(STATUS, readers=[AmdgpuSysfsReader(FIXTURE)])
    assert exported_names(registry) == METRIC_NAMES


def test_values_of_a_status(tmp_path):
    r = registry_for(STATUS)
    v = r.get_sample_value
    assert v("yolo_train_state", {"state": "healthy"}) == 1
    assert v("yolo_train_state", {"state": "starting"}) == 0
    assert v("yolo_train_phase", {"phase": "none"}) == 1  # worker_pid None: no worker runs
    assert v("yolo_train_phase", {"phase": "train"}) == 0
    assert (v("yolo_train_epoch"), v("yolo_train_epochs"), v("yolo_train_batch"),
            v("yolo_train_batches_per_epoch")) == (3, 8, 5, 8)
    assert (v("yolo_train_batches_per_second"), v("yolo_train_samples_per_second")) == (4.0, 16.0)
    assert v("yolo_train_loss", {"name": "cls_loss"}) == 2.5
    assert v("yolo_train_learning_rate") == 0.0025
    assert v("yolo_train_progress_ratio") == 0.328125
    assert v("yolo_train_eta_seconds") == 10.25
    assert v("yolo_train_deadline_timestamp_seconds") == 1893456000.0
    assert v("yolo_train_deadline_slack_seconds") == 1893456000.0 - (NOW + 10.25)
    assert (v("yolo_train_rung"), v("yolo_train_rungs")) == (1, 5)
    assert v("yolo_train_rung_info", {"rung": "1", "label": "workers=1"}) == 1
    assert v("yolo_train_recoveries_total", {"tier": "in_place"}) == 2
    assert v("yolo_train_recoveries_total", {"tier": "restart"}) == 1
    assert v("yolo_train_restarts_total", {"reason": "hang"}) == 1
    for reason in ("crash", "oom", "kernel", "stop"):
        assert v("yolo_train_restarts_total", {"reason": reason}) == 0
    assert v("yolo_train_hangs_total", {"phase": "train"}) == 1
    assert v("yolo_train_hangs_total", {"phase": "startup"}) == 0
    assert v("yolo_train_kernel_events_total", {"kind": "stall"}) == 2
    assert v("yolo_train_kernel_events_total", {"kind": "gpu_lost"}) == 0
    # published a second ago: the age grows with it
    assert v("yolo_train_seconds_since_progress") == 1.5
    assert v("yolo_train_worker_uptime_seconds") == 0  # no worker
    assert v("yolo_train_last_restart_timestamp_seconds") == NOW - 40
    assert v("yolo_train_restart_budget_remaining") == 9
    assert v("yolo_train_reboot_needed") == 0
    assert v("yolo_train_heartbeats_dropped_total") == 3
    assert v("yolo_train_heartbeats_malformed_total") == 3  # malformed + oversized
    assert v("yolo_train_info", {"version": "0.1.0", "python": "3.11.2", "ultralytics": "8.3.99",
                                 "torch": "2.14.1"}) == 1


def test_with_several_hosts_every_hosts_ranks_are_exported_from_their_shared_views(tmp_path):
    """Issue 24: status and metrics show every host's ranks. Each host writes its view to the shared run directory
    (hosts.publish, as the agent does with its state file); the exporter reads them all when scraped."""
    from supervisor.state import hosts

    for node_rank, ranks in ((0, [{"rank": 0, "device": "cpu", "seconds_since_progress": 0.5}]),
                             (1, [{"rank": 1, "device": "cpu", "seconds_since_progress": 7.0}])):
        hosts.publish(tmp_path, node_rank, {"state": "healthy", "ranks": ranks, "updated": NOW - 2})
    collector = TrainingCollector(DEADLINE, [], clock=lambda: NOW, hosts_dir=tmp_path)
    collector.status = Status.from_dict(STATUS)
    registry = CollectorRegistry(auto_describe=False)
    registry.register(collector)
    host = socket.gethostname()
    v = registry.get_sample_value
    assert v("yolo_train_rank_seconds_since_progress", {"rank": "0", "device": "cpu", "node_rank": "0",
                                                         "host": host}) == 2.5  # its view is 2 s old
    assert v("yolo_train_rank_seconds_since_progress", {"rank": "1", "device": "cpu", "node_rank": "1",
                                                         "host": host}) == 9.0
    # one host alone: its own ranks, as before, no host labels
    assert registry_for(STATUS).get_sample_value("yolo_train_rank_seconds_since_progress", {
        "rank": "0", "device": "cuda:0", "node_rank": "", "host": ""}) == 0.25 + 1.0


def test_a_running_worker_has_a_phase_and_an_uptime():
    r = registry_for({**STATUS, "worker_pid": 999_999_999, "seconds_since_progress": None})
    assert r.get_sample_value("yolo_train_phase", {"phase": "train"}) == 1
    assert r.get_sample_value("yolo_train_phase", {"phase": "none"}) == 0
    assert r.get_sample_value("yolo_train_worker_uptime_seconds") == 31.0
    # no progress yet from this worker: as long as it has been up
    assert r.get_sample_value("yolo_train_seconds_since_progress") == 31.0
    # the pid is gone: an empty tree, not an error
    assert r.get_sample_value("yolo_train_worker_processes") == 0


def test_an_empty_status_or_one_with_unknowns_still_scrapes():
    for status in ({}, {"losses": None, "it_s": float("nan"), "settings": {"versions": 3}, "heartbeats": None,
                        "epoch": None}):
        r = registry_for(status, deadline=None)
        names = exported_names(r)
        assert r.get_sample_value("yolo_train_state", {"state": "starting"}) == 1
        assert r.get_sample_value("yolo_train_phase", {"phase": "none"}) == 1
        assert r.get_sample_value("yolo_train_restarts_total", {"reason": "hang"}) == 0
        assert r.get_sample_value("yolo_train_info", {"version": "0.1.0", "python": "unknown",
                                                      "ultralytics": "unknown", "torch": "unknown"}) == 1
        unknown_yet = {"yolo_train_batches_per_second", "yolo_train_samples_per_second", "yolo_train_loss",
                       "yolo_train_learning_rate", "yolo_train_progress_ratio", "yolo_train_eta_seconds",
                       "yolo_train_seconds_since_progress", "yolo_train_last_restart_timestamp_seconds",
                       "yolo_train_restart_budget_remaining", "yolo_train_goodput_ratio",
                       "yolo_train_checkpoint_age_seconds", "yolo_train_checkpoint_duration_seconds",
                       "yolo_train_checkpoint_interval_seconds", "yolo_train_last_incident_info",
                       "yolo_train_rung_batches_per_second", "yolo_train_rank_seconds_since_progress"}
        assert names == METRIC_NAMES - GPU_METRIC_NAMES - unknown_yet - {
            "yolo_train_deadline_timestamp_seconds", "yolo_train_deadline_slack_seconds"}


EXPOSITION = Path(__file__).parents[1] / "fixtures" / "exposition"


@pytest.mark.parametrize("status, deadline, readers, fixture", [
    (STATUS, DEADLINE, [AmdgpuSysfsReader(FIXTURE)], "mid_run.prom"), ({}, None, [], "empty.prom")])
def test_the_exposition_is_the_one_served_before_the_metric_table(status, deadline, readers, fixture):
    """The fixtures are the text the exporter served for these statuses when it was a function of a status dict
    (commit 4746f81; since, yolo_train_recoveries_total, issue 28): the table renders it metric for metric, HELP,
    TYPE, labels and values."""
    text = generate_latest(registry_for(status, deadline=deadline, readers=readers)).decode()
    assert text.splitlines() == (EXPOSITION / fixture).read_text().splitlines()


def test_a_metric_is_one_row_of_the_table():
    assert len({row.name for row in METRICS}) == len(METRICS) == len(METRIC_NAMES)
    assert {row.exported for row in METRICS} == METRIC_NAMES  # the dashboard's checks read the same rows
    assert all(row.help.endswith((".", ")")) and row.name.startswith("yolo_train") for row in METRICS)


def test_promtool_check_metrics_prints_nothing():
    if not Path("/usr/bin/promtool").exists():
        pytest.skip("promtool not installed (Debian package prometheus)")
    exposition = generate_latest(registry_for(STATUS, readers=[AmdgpuSysfsReader(FIXTURE)]))
    result = subprocess.run(["/usr/bin/promtool", "check", "metrics"], input=exposition, capture_output=True)
    assert (result.returncode, result.stdout, result.stderr) == (0, b"", b"")


def test_deadline_forms():
    assert parse_deadline("2025-11-30T00:00:00Z") == 1764460800.0
    assert parse_deadline("2025-11-30T01:00:00+01:00") == 1764460800.0
    assert parse_deadline(None) is None
    with pytest.raises(ConfigError, match=r"^x.toml: deadline: expected an RFC 3339 time.*got 'tomorrow'$"):
        parse_deadline("tomorrow", "x.toml")


def test_gpus_are_read_at_most_once_per_interval():
    clock = [100.0]
    cache = CachedGpuSamples([AmdgpuSysfsReader(FIXTURE)], interval=5.0, clock=lambda: clock[0])
    first = cache.get()
    assert [gpu.pci for gpu in first] == ["0000:03:00.0", "0000:0b:00.0"]
    for step in (1.0, 2.0, 4.9):
        clock[0] = 100.0 + step
        assert cache.get() is first
    clock[0] = 105.0
    assert cache.get() is not first and cache.reads == 2
    assert CachedGpuSamples([]).get() == []  # CPU-only: nothing read, nothing exported


def test_worker_cpu_counter_never_goes_down_across_workers():
    counter = WorkerCpuCounter()
    assert counter.update(10, 5.0) == 5.0
    assert counter.update(10, 7.0) == 7.0
    assert counter.update(None, 0.0) == 7.0  # worker killed: what it used stays counted
    assert counter.update(11, 1.0) == 8.0
    assert counter.update(11, 0.5) == 8.0  # a process of the tree gone since: never backwards


# -- over HTTP --

def config(listen, deadline=None):
    return Config(path=Path("test.toml"), name="t", state_dir=Path("/nonexistent"), train={},
                  metrics_listen=listen, deadline=deadline)


def scrape(port):
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as response:
        return response.read().decode()


def test_served_over_http_on_loopback_and_follows_publish():
    exporter = start_exporter(config("127.0.0.1:0", deadline="2030-01-01T00:00:00Z"), gpu_readers=[])
    port = exporter.port
    try:
        assert exporter.server.server_address[0] == "127.0.0.1"
        before = scrape(port)  # nothing published yet: the exporter serves anyway
        assert 'yolo_train_state{state="starting"} 1.0' in before
        assert "yolo_train_deadline_timestamp_seconds 1.893456e+09" in before
        exporter.publish(Status.from_dict({**STATUS, "state": "backoff"}))
        after = scrape(port)
        assert 'yolo_train_state{state="backoff"} 1.0' in after
        assert 'yolo_train_restarts_total{reason="hang"} 1.0' in after
    finally:
        exporter.close()
    with pytest.raises(urllib.error.URLError):
        scrape(port)


def test_a_port_in_use_is_a_one_line_config_error():
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        with pytest.raises(ConfigError) as raised:
            start_exporter(config(f"127.0.0.1:{port}"), gpu_readers=[])
    assert str(raised.value) == (f"test.toml: [metrics] listen = '127.0.0.1:{port}': cannot listen "
                                 f"({os.strerror(errno.EADDRINUSE)}); pick a free port")


def test_listen_off_serves_nothing():
    exporter = start_exporter(config(None))
    exporter.publish(Status.from_dict(STATUS))
    assert exporter.port is None
    exporter.close()


# -- the worker's process tree, for real --

TREE = textwrap.dedent("""
    import os, sys, time
    def spin(seconds):
        end = time.process_time() + seconds
        while time.process_time() < end:
            pass
    # one child that burns CPU and is reaped: its time must still count
    pid = os.fork()
    if pid == 0:
        spin(0.5)
        os._exit(0)
    os.waitpid(pid, 0)
    # two "DataLoader workers", one with a child of its own; each says it is up on the pipe
    up_r, up_w = os.pipe()
    for depth in (1, 2):
        if os.fork() == 0:
            if depth == 2 and os.fork() == 0:
                os.write(up_w, b"g")
                time.sleep(60)
                os._exit(0)
            os.write(up_w, b"w")
            time.sleep(60)
            os._exit(0)
    seen = b""
    while len(seen) < 3:
        seen += os.read(up_r, 3 - len(seen))
    print("ready", flush=True)
    time.sleep(60)
""")


@pytest.fixture
def worker_tree():
    process = subprocess.Popen([sys.executable, "-c", TREE], stdout=subprocess.PIPE, text=True,
                               start_new_session=True)
    try:
        assert process.stdout.readline().strip() == "ready"
        yield process
    finally:
        os.killpg(process.pid, signal.SIGKILL)
        process.wait()


def test_the_worker_tree_is_read_with_psutil(worker_tree):
    sample = sample_worker_tree(worker_tree.pid)
    assert sample.processes == 4  # main + 2 workers + the grandchild
    assert sample.dataloader_processes == 3
    assert sample.threads >= 4
    assert sample.resident_memory_bytes > 4 * 1024 * 1024
    # The reaped child's CPU time counts, as the kernel accounts it in its parent (tick-based, so not exactly
    # the 0.5 s it spun on a loaded machine): the tree's total is at least that.
    reaped = psutil.Process(worker_tree.pid).cpu_times()
    assert reaped.children_user + reaped.children_system > 0.1
    assert sample.cpu_seconds >= reaped.children_user + reaped.children_system

    r = registry_for({**STATUS, "worker_pid": worker_tree.pid}, readers=[])
    assert r.get_sample_value("yolo_train_worker_processes") == 4
    assert r.get_sample_value("yolo_train_worker_dataloader_processes") == 3
    assert r.get_sample_value("yolo_train_worker_cpu_seconds_total") >= 0.4


def test_a_killed_tree_reads_as_empty(worker_tree):
    os.killpg(worker_tree.pid, signal.SIGKILL)
    worker_tree.wait()
    assert sample_worker_tree(worker_tree.pid).processes == 0
    assert sample_worker_tree(None).processes == 0


HUNG = """
import time
def hang_forever():
    print("hanging", flush=True)
    time.sleep(600)
hang_forever()
"""


def asleep(pid: int, timeout: float = 30.0) -> None:
    """Wait until the process sleeps in the kernel, the precondition of a stack that says "in sleep"."""
    deadline = time.monotonic() + timeout
    while psutil.Process(pid).status() != psutil.STATUS_SLEEPING:
        assert time.monotonic() < deadline, f"pid {pid} never went to sleep"
        time.sleep(0.01)


def test_the_last_incident_info_says_where_a_really_hung_worker_waited(tmp_path):
    """The restart annotation's text through the real path: a hung process's stacks as the agent captures them,
    the core's incident enriched with them, the status it publishes."""
    hung = subprocess.Popen([sys.executable, "-c", HUNG], stdout=subprocess.PIPE, text=True)
    try:
        assert hung.stdout.readline().strip() == "hanging"
        asleep(hung.pid)  # its line is printed before the sleep begins: on a busy machine it may still be running
        config = parse({"train": {"epochs": 1}, "watchdog": {"startup_timeout": 5}}, "<test>", state_dir=tmp_path)
        s = core.Supervision(config, build_ladder(config.ladder, 8))
        core.decide(s, core.Boot(), core.Now(0.0, NOW))
        core.decide(s, core.Spawned(hung.pid, None), core.Now(0.0, NOW))
        core.decide(s, core.Tick(), core.Now(6.0, NOW + 6))  # the verdict's stacks asked first, unanswered:
        _, [*_, kill] = core.decide(s, core.Tick(), core.Now(6.0, NOW + 6))  # the verdict; the kill reads them
        capture = capture_tree(hung.pid, [hung.pid], tmp_path / "incidents" / kill.incident.id)
        core.decide(s, core.IncidentEnriched(kill.incident.id, (), stacks=as_incident_stacks(capture, tmp_path)),
                    core.Now(6.5, NOW + 6.5))
    finally:
        hung.kill()
        hung.wait()
    core.decide(s, core.TreeKilled(killed=1), core.Now(7.0, NOW + 7))
    status = {**STATUS, **snapshot(s, core.Now(7.0, NOW + 7)).to_dict()}
    [sample] = [x for f in registry_for(status).collect() for x in f.samples
                if x.name == "yolo_train_last_incident_info"]
    assert sample.labels["reason"] == "hang"
    assert sample.labels["summary"].startswith(f"hang in startup at rung 0: main (pid {hung.pid}) in sleep")
    assert "hang_forever" in sample.labels["summary"], sample.labels["summary"]
