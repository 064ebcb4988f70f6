"""Issue 58.4 in a real supervised run: a healthy wait the judge gets wrong is killed at the idle floor in every
attempt, until the restart budget is spent. A join on a thread's 6 s of work was one (the chain of waits judges it
right now: tests/e2e/test_thread_waits_e2e.py); a bare lock that another thread releases after 6 s still is, since
who holds a bare lock cannot be known (a deadlock on one's own lock looks the same). Two verdicts there for that wait
give the point the phase's own bound: the third attempt passes it, and no restart spent the budget
(``max_restarts = 1``)."""

import sys
from pathlib import Path

from tests.helpers import ROOT
from tests.helpers.supervised import quiet_config, read_incidents, read_state, yolo_train

# epoch 1's end, as an on_train_epoch_end callback: still "train", its last batch said; a thread frees the lock after 6 s
LOCK_AT_EPOCH_END = f"""
import sys, threading, time
sys.path.insert(0, {str(ROOT)!r})
from worker.heartbeat import Heartbeat
hb = Heartbeat.from_env(witness=True)
for epoch in (1, 2):
    hb.phase("train", epoch=epoch, epochs=2, batch=0, batches=10)
    for batch in range(1, 11):
        time.sleep(0.05)
        hb.beat(epoch=epoch, epochs=2, batch=batch, batches=10)
    if epoch == 1:
        held = threading.Lock()
        held.acquire()
        threading.Thread(target=lambda: (time.sleep(6.0), held.release()), name="upload").start()
        held.acquire()
    hb.phase("save", epoch=epoch, epochs=2, batch=10, batches=10)
hb.phase("done")
"""


def test_two_verdicts_at_an_epoch_end_for_a_bare_lock_give_the_third_attempt_the_phases_bound(write_config, tmp_path: Path):
    (tmp_path / "train.py").write_text(LOCK_AT_EPOCH_END)
    config = write_config(f'[worker]\ncommand = ["{sys.executable}", "train.py"]\ncwd = "{tmp_path}"\n'
                          f'[restart]\nbackoff_initial = 0.5\nmax_restarts = 1\n', quiet_config())
    result = yolo_train("run", "--config", str(config), "--state-dir", str(tmp_path / "state"), timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    status, incidents = read_state(tmp_path / "state")["status"], read_incidents(tmp_path / "state")
    assert [(i["phase"], i["epoch"], i["batch"]) for i in incidents] == [("train", 1, 10)] * 2
    assert all("waits on a lock (acquire)" in i["witness"] for i in incidents), incidents
    assert "point_bound" not in incidents[0]
    assert incidents[1]["point_bound"].startswith("this point gets the phase's bound after 2 verdicts here (lock at ")
    assert "this point gets the phase's bound after 2 verdicts here" in result.stderr
    assert (status["state"], status["attempt"]) == ("succeeded", 3)
