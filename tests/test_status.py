"""`yolo-train status` rendering: one glance at progress, speed, deadline, rung and the last incident."""

from supervisor.outputs.status import render


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
    from supervisor.outputs.status import gather

    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    state_dir = tmp_path / "state"
    state_dir.mkdir()

    def write(pid, updated):
        (state_dir / "supervisor.json").write_text(json.dumps({"version": 1, "status": {
            "state": "healthy", "supervisor_pid": pid, "updated": updated, "it_s": 7.5, "eta_seconds": 99.0,
            "samples_s": 30.0}}))

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


def test_render_shows_the_startup_step_its_scan_and_its_bound():
    status = {"state": "starting", "startup_step": "dataset", "startup_step_bound": 600.0,
              "startup_step_progress": {"done": 12000, "total": 329299}}
    assert "startup   step dataset 12000/329299, bound 10m00s without news" in render(status)
    assert "startup" not in render({"state": "healthy", "startup_step": None})
