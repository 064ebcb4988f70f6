"""`yolo-train status` rendering: one glance at progress, speed, deadline, rung and the last incident."""

import json

from supervisor.verbs.status import render


def test_render_shows_progress_speed_slack_rung_and_incident():
    status = {"state": "healthy", "phase": "train", "worker_pid": 42, "pids": [42, 43], "epoch": 3, "epochs": 10,
              "batch": 4, "batches": 8, "progress": 0.25, "it_s": 2.5, "eta_seconds": 600,
              "deadline_slack_seconds": -125, "rung": 1, "rungs": 5, "rung_label": "workers=1", "restarts": 1,
              "restarts_by_reason": {"hang": 1}, "budget_left": 9,
              "last_incident": {"time": 1000.0, "reason": "hang", "phase": "train", "detail": "no progress for 10.0 s"}}
    text = render(status, now=1090.0)
    assert "epoch 3/10 [############------------] batch 4/8" in text
    assert "25%  2.50 it/s  ETA 10m00s  2m05s PAST the deadline" in text
    assert "rung 1/4 (workers=1), restarts 1 (hang 1), budget 9 left" in text
    assert "last incident 1m30s ago: hang in train: no progress for 10.0 s" in text
    assert "heartbeats ignored" not in text
    # beats from a DataLoader worker or a stray writer, which the core does not count as progress, are shown
    assert "heartbeats ignored 3 (sent by processes other than the worker's main one" in render(
        {**status, "heartbeats": {"received": 40, "ignored": 3}}, now=1090.0)


def test_render_before_any_run(tmp_path):
    assert render({"state": "not started", "state_dir": str(tmp_path)}).startswith("not started")


def test_render_shows_the_rungs_speed_against_rung_0_and_the_next_probe():
    status = {"state": "healthy", "rung": 2, "rungs": 6, "rung_label": "workers=2", "rung_speed": 3.0,
              "rung0_speed": 12.0, "probe": {"in_seconds": 3600.0}, "restarts": 2}
    assert "rung 2/5 (workers=2) 3.00 it/s = 0.25x rung 0, probing rung 1 in 1h00m of training" in render(status)


def test_a_stopped_or_dead_supervisor_is_never_shown_healthy_with_live_figures(tmp_path):
    import json
    import os
    import signal
    import subprocess
    import sys
    import time

    from supervisor.config import parse
    from supervisor.verbs.status import gather

    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    state_dir = tmp_path / "state"
    state_dir.mkdir()

    def write(pid, updated):
        (state_dir / "supervisor.json").write_text(json.dumps({"version": 1, "status": {
            "state": "healthy", "supervisor_pid": pid, "updated": updated, "it_s": 7.5, "eta_seconds": 99.0,
            "samples_s": 30.0}}))
        os.utime(state_dir / "supervisor.json", (updated, updated))  # written then, as a supervisor writes it

    config = parse({"train": {"epochs": 1}}, "<test>", state_dir=state_dir)
    try:
        write(sleeper.pid, time.time())
        assert gather(config)["state"] == "healthy"
        os.kill(sleeper.pid, signal.SIGSTOP)
        time.sleep(0.2)
        stopped = gather(config)
        assert stopped["state"] == "supervisor stopped" and stopped["it_s"] is None and stopped["eta_seconds"] is None
        os.kill(sleeper.pid, signal.SIGCONT)
        write(sleeper.pid, time.time() - 60)
        assert gather(config)["state"] == "not responding"
    finally:
        sleeper.kill()
        sleeper.wait()
    dead = gather(config)
    assert dead["state"] == "not running" and dead["it_s"] is None and dead["samples_s"] is None


# status --json's names as they were before the status became a typed record (commit 4746f81): users script them.
CORE_KEYS = [
    "state", "phase", "epoch", "epochs", "batch", "batches", "losses", "lr", "it_s", "samples_s", "eta_seconds",
    "progress", "rung", "rungs", "rung_label", "attempt", "remedies", "restarts", "restarts_by_reason",
    "hangs_by_phase", "budget_left", "recoveries",  # issue 28
    "kernel_events", "reboot_needed", "suspicion", "worker_pid", "resumed_from", "settings", "seconds_since_progress",
    "worker_uptime", "worker_spawned", "startup_seconds",
    "startup_step", "startup_step_bound", "startup_step_progress",  # issue 29
    "startup_step_search",  # issue 40: MIOpen's search, news of the step
    "startup_steps_seen",  # issue 29
    "watchdog",
    "last_restart", "last_incident", "exit", "last_checkpoint",
    "verified_copy_problem",  # why the newest checkpoint has no last.good.pt
    "checkpoint_every", "checkpoint_interval",
    "trained_seconds", "lost_seconds", "lost_batches", "goodput", "run_started", "rung_speed", "rung0_speed",
    "rung_speeds", "node_rank", "ranks", "probe", "ladder"]
AGENT_KEYS = ["supervisor_pid", "config", "state_dir", "updated", "heartbeats", "metrics_bind_failures",
              "standby_pid", "standby_kind", "standby_why",  # issue 48: ready or imported, and why
              # issue 57.4: what a ready one holds, why, and its host memory against what it was allowed
              "standby_holds", "standby_holds_why", "standby_host_mib", "standby_host_allowance_mib",
              "run_dir", "checkpoint"]  # run_dir: several hosts' shared directory (issue 30)
NESTED_KEYS = {
    "watchdog": ["timeout", "fires_in", "tree_idle_seconds",  # tree_idle_seconds: issue 29, the idle floor
                 "waiting", "waiting_kind", "ranks", "hung_rank"],  # issue 38: where the training process says it waits
    "last_checkpoint": ["path", "epoch", "batch", "age_seconds", "seconds"],
    "checkpoint_interval": ["auto", "max", "hold_seconds", "mean_time_between_hangs"],
    "probe": ["in_seconds", "from", "probation", "hangs_by_rung", "target"],
    "ladder": ["stall_cost_seconds", "rungs"],
    "exit": ["code", "text"],
    "startup_step_progress": ["done", "total"],
    "recoveries": ["in_place", "restart"],  # issue 28: by tier
    "heartbeats": ["received", "malformed", "oversized", "dropped", "ignored"],  # ignored: the core's, shown since
}


def test_the_status_json_names_are_todays_and_read_back_into_the_same_record():
    from supervisor.decision import core
    from supervisor.decision.model.actions import Exit
    from supervisor.decision.status_view import (CheckpointView, LadderView, RankStatus, RungView, Status, StepProgress,
                                                Supervisor, snapshot)
    from tests.helpers.driver import healthy

    d = healthy()
    d.t += 40
    d(core.Tick())  # a hang: an incident, a restart
    status = snapshot(d.s, core.Now(d.t, 1_700_000_000 + d.t))
    assert list(status.to_dict()) == CORE_KEYS
    assert list(status.to_dict()["ladder"]["rungs"]["0"]) == ["speed", "seconds", "hangs", "start", "expected_goodput",
                                                               "between_hangs"]
    assert Status.from_dict(json.loads(json.dumps(status.to_dict()))) == status
    full = Status(last_checkpoint=CheckpointView(), exit=Exit(0, "done"), ranks=[RankStatus()],
                  startup_step_progress=StepProgress(),
                  ladder=LadderView(rungs={"0": RungView()}), supervisor=Supervisor()).to_dict()
    assert list(full) == CORE_KEYS + AGENT_KEYS
    assert {key: list(full[key]) for key in NESTED_KEYS} == NESTED_KEYS
    assert list(full["ranks"][0]) == ["rank", "local_rank", "pid", "device", "seconds_since_progress"]


def test_a_stop_before_training_shows_no_epoch_count():
    text = render({"state": "stopped", "phase": "setup", "epoch": 0, "epochs": 0, "batch": 0, "batches": 0})
    assert "epoch 0/0" not in text and "epoch -  (training not reached)" in text


def test_status_of_a_several_hosts_state_dir_without_its_config_shows_the_hosts(tmp_path):
    from supervisor.config import parse
    from supervisor.state import hosts
    from supervisor.verbs.status import gather

    state_dir, run_dir = tmp_path / "state", tmp_path / "shared"
    state_dir.mkdir()
    (state_dir / "supervisor.json").write_text(json.dumps({"version": 1, "status": {
        "state": "failed", "node_rank": 0, "run_dir": str(run_dir)}}))
    hosts.publish(run_dir, 1, {"state": "healthy", "rung": 0, "attempt": 1, "ranks": []})
    demo = parse({"train": {"data": "demo"}}, "<demo>", state_dir=state_dir)  # `status --state-dir` alone
    assert [h["node_rank"] for h in gather(demo)["hosts"]] == [1]


def test_checkpoint_max_below_the_floor_is_one_line_naming_the_key():
    from pathlib import Path

    import pytest

    from supervisor.config import ConfigError, parse

    with pytest.raises(ConfigError, match=r"^c.toml: checkpoint.max: expected at least 5 s .*got '1s'$"):
        parse({"train": {"data": "demo"}, "checkpoint": {"max": "1s"}}, "c.toml", state_dir=Path("/x"))
    assert parse({"train": {"data": "demo"}, "checkpoint": {"max": "5s"}}, "c.toml",
                 state_dir=Path("/x")).checkpoint.max == 5.0


def test_render_shows_the_startup_step_its_scan_and_its_bound():
    status = {"state": "starting", "startup_step": "dataset", "startup_step_bound": 600.0,
              "startup_step_progress": {"done": 12000, "total": 329299}}
    assert "startup   step dataset 12000/329299, bound 10m00s without news" in render(status)
    assert "startup" not in render({"state": "healthy", "startup_step": None})


def test_on_a_full_disk_a_supervisor_whose_loop_runs_is_said_to_run_and_why_its_state_is_old(small_disk):
    """Issue 41: with the disk full the state file stays as it was and `status` said "not responding" while training
    went on. A real full disk: a small tmpfs, filled; the supervisor's StateDir writes (and fails) as its loop does."""
    import os
    import time

    from supervisor.config import parse
    from supervisor.state.state_dir import StateDir
    from supervisor.verbs.status import gather

    mount = small_disk.path
    state = StateDir(mount, "test.toml")
    state.lock()
    live = {"state": "healthy", "supervisor_pid": os.getpid(), "it_s": 7.5, "eta_seconds": 99.0, "epoch": 2}
    state.write_state({"status": {**live, "updated": time.time() - 60}})  # its last write, a minute ago
    small_disk.fill()
    config = parse({"train": {"epochs": 1}}, "<test>", state_dir=mount)
    os.utime(mount / "supervisor.json", (time.time() - 60, time.time() - 60))
    assert gather(config)["state"] == "not responding"  # nothing touched it since: its loop may hang
    state.write_state({"status": {**live, "updated": time.time(), "padding": "x" * 100_000}})  # fails: full
    status = gather(config)
    assert status["state"] == "cannot write state" and status["it_s"] is None and status["epoch"] == 2
    assert f"{mount}: the disk is full" in status["problem"] and "the supervisor runs" in status["problem"]
    assert render(status).startswith("cannot write state: ")
