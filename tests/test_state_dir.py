"""The state directory: one supervisor per directory even when it is deleted, torn state files said in one line."""

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from supervisor.outputs.state_dir import StateDir
from tests.conftest import ROOT, sources_for_nobody, worker_launcher, yolo_train

SLEEPING_WORKER = "import time\ntime.sleep(120)\n"


def config_for(directory: Path, launcher: Path) -> Path:
    path = directory / "config.toml"
    path.write_text(f'[train]\ndata = "demo"\n[worker]\npython = "{launcher}"\n[metrics]\nlisten = "off"\n'
                    f'[kernel_log]\nsource = "off"\ngpu_events = "off"\n')
    return path


def wait_for(predicate, timeout=30.0):
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if predicate():
            return True
        time.sleep(0.05)
    return False


def test_deleting_the_state_directory_does_not_let_a_second_supervisor_in(tmp_path):
    config = config_for(tmp_path, worker_launcher(tmp_path, SLEEPING_WORKER))
    state = tmp_path / "state"
    first = subprocess.Popen([sys.executable, "-m", "supervisor", "run", "--config", str(config), "--state-dir",
                              str(state)], cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert wait_for(lambda: (state / "supervisor.json").exists())
        shutil.rmtree(state)  # the lock file goes with it
        second = yolo_train("run", "--config", str(config), "--state-dir", str(state), timeout=60)
        assert second.returncode == 78
        assert f"state_dir {state} is in use by another supervisor" in second.stderr
        # The first one notices at its next state write and puts its lock file back, saying so.
        assert wait_for(lambda: (state / "supervisor.lock").exists() and
                        (state / "supervisor.lock").read_text() == str(first.pid))
    finally:
        first.send_signal(signal.SIGTERM)
        _, err = first.communicate(timeout=60)
    assert "supervisor.lock was removed while this supervisor ran" in err


def test_a_corrupt_state_file_is_moved_aside_with_one_line_and_78(tmp_path):
    config = config_for(tmp_path, worker_launcher(tmp_path, SLEEPING_WORKER))
    state = tmp_path / "state"
    state.mkdir()
    (state / "supervisor.json").write_text("")  # torn by a power cut
    status = yolo_train("status", "--config", str(config), "--state-dir", str(state))
    assert status.returncode == 1 and "Traceback" not in status.stderr
    assert status.stdout.startswith(f"unreadable: {state / 'supervisor.json'}: corrupt state file: empty; "
                                    f"`yolo-train run` moves it aside")
    as_json = yolo_train("status", "--json", "--config", str(config), "--state-dir", str(state))
    assert json.loads(as_json.stdout)["state"] == "unreadable"
    run = yolo_train("run", "--config", str(config), "--state-dir", str(state), timeout=60)
    assert run.returncode == 78
    (aside,) = state.glob("supervisor.json.corrupt-*")
    assert run.stderr.strip().splitlines() == [
        f"yolo-train: {state / 'supervisor.json'}: corrupt state file: empty; moved aside to {aside.name}: run again "
        f"to start the ladder afresh (restart count and rung are lost; checkpoints are kept)"]
    assert not (state / "supervisor.json").exists()


def test_a_read_only_state_directory_is_one_line_and_78():
    # Root may write anywhere: run the CLI as nobody, in a directory nobody can read but not write.
    with tempfile.TemporaryDirectory() as work:
        work = Path(work)
        work.chmod(0o755)
        state = work / "state"
        state.mkdir(mode=0o755)
        config = work / "config.toml"
        config.write_text('[train]\ndata = "demo"\n[metrics]\nlisten = "off"\n')
        config.chmod(0o644)
        sources = sources_for_nobody()
        result = subprocess.run(["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", sys.executable, "-m",
                                 "supervisor", "run", "--config", str(config), "--state-dir", str(state)],
                                cwd=sources, capture_output=True, text=True, timeout=60,
                                env={**os.environ, "HOME": "/", "PYTHONPATH": str(sources)})
    assert result.returncode == 78 and "Traceback" not in result.stderr
    assert result.stderr.strip().splitlines() == [
        f"yolo-train: {config}: state_dir {state}: cannot write supervisor.lock (Permission denied); make the "
        f"directory writable by user nobody or choose another state_dir"]


def test_an_incident_never_joins_a_torn_last_line(tmp_path):
    state = StateDir(tmp_path, "test.toml")
    state.append_incident({"id": 1, "reason": "stall"})
    with open(state.incidents, "a") as f:
        f.write('{"id": 2, "reas')  # a supervisor killed mid-append
    state.append_incident({"id": 3, "reason": "crash"})
    lines = state.incidents.read_text().splitlines()
    assert json.loads(lines[0])["id"] == 1 and lines[1] == '{"id": 2, "reas' and json.loads(lines[2])["id"] == 3
    state.append_incident({"id": 4, "reason": "crash"})
    assert len(state.incidents.read_text().splitlines()) == 4


def test_state_writes_leave_one_complete_file(tmp_path):
    state = StateDir(tmp_path, "test.toml")
    state.lock()
    for i in range(3):
        state.write_state({"restarts": i})
    assert state.read_state()["restarts"] == 2
    assert sorted(p.name for p in tmp_path.iterdir()) == ["supervisor.json", "supervisor.lock"]
