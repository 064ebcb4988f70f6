"""`yolo-train status` rendering: one glance at progress, speed, deadline, rung and the last incident."""

from supervisor.status import render


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
