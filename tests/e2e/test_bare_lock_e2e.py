"""Issue 58.5 in a real supervised run: a deadlock on a bare lock (``threading.Lock().acquire()`` twice), taken on a
line no file holds (code compiled from a string, as a notebook's callback), no threading.py frame. It was "no known
wait (native)" and weighed the device runtime's rungs, 15 of 15, though the stacks said futex wait: a lock of the
process's own, which no rung changes."""

import sys
from pathlib import Path

from tests.helpers.supervised import quiet_config, read_incidents, read_state, witnessed_loop, yolo_train

# the first attempt only: at step 20 a callback compiled from a string takes a fresh lock twice
BARE_LOCK = witnessed_loop(40, "step == 20 and not os.path.exists('hung')", """
open("hung", "w").close()
scope = {}
exec(compile("def callback(lock):\\n    lock.acquire()\\n    lock.acquire()\\n", "<callback>", "exec"), scope)
scope["callback"](threading.Lock())
""")


def test_a_deadlock_on_a_bare_lock_is_a_lock_weighing_no_rung(write_config, tmp_path: Path):
    (tmp_path / "train.py").write_text(BARE_LOCK)
    config = write_config(f'[worker]\ncommand = ["{sys.executable}", "train.py"]\ncwd = "{tmp_path}"\n'
                          f'[restart]\nbackoff_initial = 0.5\n[ladder]\nprior_between_hangs = "off"\n',
                          quiet_config())
    result = yolo_train("run", "--config", str(config), "--state-dir", str(tmp_path / "state"), timeout=180)
    assert result.returncode == 0, result.stderr[-3000:]
    [incident] = read_incidents(tmp_path / "state")
    assert incident["witness"] == "waits on a lock (acquire) at <callback>:3 in callback", incident["witness"]
    # the real stacks (py-spy, /proc) agree: the training process in a futex wait, inside CPython's lock
    assert "futex wait" in incident["culprit"] and "callback" in incident["culprit"], incident["culprit"]
    assert "on a lock (acquire) at <callback>:3 in callback: no rung changes it" in result.stderr
    status = read_state(tmp_path / "state")["status"]
    assert (status["state"], status["rung"], status["attempt"]) == ("succeeded", 0, 2)
