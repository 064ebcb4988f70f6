"""A hang's stacks read ahead of its verdict in a real supervised run (decision/recovery/stacks_ahead.py): a plain loop that
blocks on a lock is found at its phase's bound, its stacks were read before the verdict, and the restart's kill read
none again: its incident's stacks.json, moved into the incident's directory, was written before the verdict."""

import os
import sys

from supervisor.state.paths import StatePaths
from tests.helpers import ROOT
from tests.helpers.supervised import quiet_config, read_incidents, read_state, witnessed_loop, yolo_train

BLOCKS_ON_A_LOCK_ONCE = witnessed_loop(40, 'step == 20 and not os.path.exists("hung-once")', """
open("hung-once", "w").close()
lock = threading.Lock()
lock.acquire()
lock.acquire()  # the training process blocked forever: its tree idle
""")


def test_a_restarts_stacks_were_read_ahead_of_its_verdict_and_its_kill_read_none(write_config, tmp_path):
    """The stall's bound is auto_floor's 4 s, fixed once it began: with the idle floor, a blocked tree's bound counts
    from its idleness, which one busy second of a loaded machine moves on, and the stacks were then read once more
    for the longer bound (a CI run: "read ahead" twice, both right). Read at 2 s, the verdict at 4 s."""
    (tmp_path / "train.py").write_text(BLOCKS_ON_A_LOCK_ONCE)
    config = write_config(f'[worker]\ncommand = ["{sys.executable}", "train.py"]\ncwd = "{tmp_path}"\n',
                          quiet_config(), '\n[watchdog]\nidle_floor = "off"\nauto_floor = 4\n')
    state_dir = tmp_path / "state"
    result = yolo_train("run", "--config", str(config), "--state-dir", str(state_dir), timeout=180)
    assert result.returncode == 0, result.stderr[-3000:]
    assert read_state(state_dir)["status"]["state"] == "succeeded"
    [incident] = read_incidents(state_dir)
    assert (incident["reason"], incident["tier"]) == ("hang", "restart"), incident["detail"]
    assert incident["culprit"].startswith("main (pid"), incident["culprit"]
    # read ahead: the capture ran (and ended) before the verdict, in the agent's one thread
    assert incident["stacks_ahead_seconds"] >= incident["stacks_seconds"] > 0
    assert result.stderr.count("read the stacks of the stall ahead of its verdict") == 1, result.stderr[-3000:]
    assert "its stacks were read" in result.stderr
    # ... into the incident's directory, where `yolo-train incidents` reads them, and nothing read them again at the
    # kill: the file is the one written before the verdict
    stacks = StatePaths(state_dir).stacks(incident["id"])
    assert state_dir / incident["stacks"] == stacks and stacks.exists()
    assert os.stat(stacks).st_mtime <= incident["time"]
    assert [p.name for p in (state_dir / "incidents").iterdir()] == [incident["id"]]  # no ahead-N left


RESUMES_ONCE_ITS_STACKS_ARE_READ = witnessed_loop(30, "step == 15", """
ahead = sys.argv[1]
lock = threading.Lock()
lock.acquire()
def release():  # the stall ends only once its stacks were read ahead: the precondition, not a race
    while not os.path.exists(ahead):
        time.sleep(0.02)
    lock.release()
threading.Thread(target=release, daemon=True).start()
lock.acquire()
""")


def test_stacks_read_ahead_of_a_stall_that_then_ends_are_dropped_and_nothing_restarts(write_config, tmp_path):
    """idle_floor off: the stall's bound is auto_floor's 10 s, its stacks read at 7 s; the loop goes on once they are
    written, long before the verdict."""
    state_dir = tmp_path / "state"
    (tmp_path / "train.py").write_text(RESUMES_ONCE_ITS_STACKS_ARE_READ)
    ahead = StatePaths(state_dir).stacks_ahead_dir(1) / "stacks.json"
    config = write_config(f'[worker]\ncommand = ["{sys.executable}", "train.py", "{ahead}"]\ncwd = "{tmp_path}"\n',
                          quiet_config(), '\n[watchdog]\nidle_floor = "off"\n')
    result = yolo_train("run", "--config", str(config), "--state-dir", str(state_dir), timeout=180)
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stderr.count("read the stacks of the stall ahead of its verdict") == 1, result.stderr[-3000:]
    status = read_state(state_dir)["status"]
    assert status["state"] == "succeeded" and status["attempt"] == 1 and read_incidents(state_dir) == []
    assert not ahead.parent.exists()  # dropped at the progress
