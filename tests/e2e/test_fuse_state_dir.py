"""Issue 41's "not yet tried": a state directory on a real, writable FUSE file system (sshfs, gcsfuse, a cluster's
FUSE mount), here tests/helpers/fuse_passthrough.py over libfuse 3. One cheap supervised run (the stand-in worker
tests/fixtures/loader_loop.py, one loader hang recovered in place) writes the whole state directory through it: the
state file and its lock, history.db in WAL mode (its -shm is mmapped shared), incidents.jsonl, the worker's
checkpoints under train/; then `status --json`, the incident and the history are read back through the mount."""

import json
import sqlite3
from pathlib import Path

import pytest

from supervisor.state import history
from tests.e2e.test_loader_hangs import assert_each_sample_once, assert_in_place, run_loop
from tests.helpers.fuse_passthrough import FusePassthrough, skip_without_fuse
from tests.helpers.supervised import yolo_train


def mount_type(path: Path) -> str | None:
    for line in Path("/proc/self/mounts").read_text().splitlines():
        _, point, kind, *_ = line.split()
        if point == str(path):
            return kind
    return None


@pytest.fixture
def fuse_dir(tmp_path):
    skip_without_fuse()
    with FusePassthrough(tmp_path / "beneath", tmp_path / "fuse") as mount:
        assert mount_type(mount.mountpoint) == "fuse"  # the kernel's FUSE, not the directory beneath
        yield mount


def test_a_run_with_its_state_dir_on_a_writable_fuse_mount_writes_and_reads_it_all(tmp_path, fuse_dir):
    state_dir = fuse_dir.mountpoint / "state"
    status, incidents, _, fed = run_loop(tmp_path, {"hang": "blocked", "epoch": 1, "batch": 6}, state_dir=state_dir)
    assert_in_place(status, incidents)
    assert_each_sample_once(fed)
    assert status["last_checkpoint"]["epoch"] == 3  # the worker's checkpoint after its last epoch, on the mount
    assert (state_dir / "train" / "weights" / "last.pt").exists()

    config = tmp_path / "config.toml"
    shown = yolo_train("status", "--json", "--config", str(config), "--state-dir", str(state_dir), timeout=60)
    assert shown.returncode == 0, shown.stderr
    as_json = json.loads(shown.stdout)
    assert (as_json["state"], as_json["recoveries"]) == ("succeeded", {"in_place": 1, "restart": 0}), as_json
    listed = yolo_train("incidents", "--json", "--config", str(config), "--state-dir", str(state_dir), timeout=60)
    assert listed.returncode == 0, listed.stderr
    read_back = json.loads(listed.stdout)
    assert (read_back["count"], read_back["newest"]["tier"]) == (1, "in_place"), read_back

    rows, problem = history.read(state_dir)
    assert problem is None and rows, problem
    assert rows[-1]["state"] == "succeeded"
    db = sqlite3.connect(f"file:{state_dir / 'history.db'}?mode=ro", uri=True)
    try:
        assert db.execute("PRAGMA journal_mode").fetchone() == ("wal",)
        assert db.execute("SELECT COUNT(*) FROM samples").fetchone() == (len(rows),)
    finally:
        db.close()
    # Everything went through the daemon to the directory beneath it.
    beneath = {p.name for p in (tmp_path / "beneath" / "state").iterdir()}
    assert {"history.db", "incidents.jsonl", "supervisor.json", "train"} <= beneath, beneath
