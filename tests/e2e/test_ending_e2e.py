"""The end of a training, with real processes: a worker trained through says so (phase ``ending``), and its silence
there (best.pt's load and the final validation's set-up, or the wait for another host's final validation) is bounded
by ``save_timeout``, not by the auto bounds learned from its batches; the same silence mid-epoch is still a hang."""

import pytest

from tests.helpers import ROOT
from tests.helpers.supervised import read_incidents, read_state, worker_launcher, yolo_train

pytestmark = pytest.mark.e2e

SILENCE = 4.0  # seconds: past auto_floor (1 s) and idle_floor (3 s), far within save_timeout (300 s)

# A stand-in worker speaking our heartbeat: 10 batches, then a silence at the point the test names, on the first
# attempt only (a file marks it), then its end.
SILENT_AT = """
import os, sys, time
from pathlib import Path
from worker.heartbeat import Heartbeat
from worker.wire.heartbeat_protocol import ENV_FD

where, mark = {where!r}, Path({mark!r})
hb = Heartbeat(int(os.environ[ENV_FD]))
hb.phase("train", epoch=1, epochs=1, batch=0, batches=10)
for i in range(10):
    hb.beat(epoch=1, epochs=1, batch=i + 1, batches=10, samples=4)
    if where == "train" and i == 4 and not mark.exists():
        mark.touch()
        time.sleep({silence})
    time.sleep(0.05)
hb.phase("ending", epoch=1, epochs=1)
if where == "ending":
    mark.touch()
    time.sleep({silence})
hb.phase("done")
"""


def run_silent_at(write_config, tmp_path, where: str):
    launcher = worker_launcher(tmp_path, SILENT_AT.format(where=where, mark=str(tmp_path / "silenced"),
                                                          silence=SILENCE))
    config = write_config(f"""
        [train]
        epochs = 1
        [worker]
        python = "{launcher}"
        [watchdog]
        auto_floor = 1
        [metrics]
        listen = "off"
    """)
    state_dir = tmp_path / "state"
    result = yolo_train("run", "--config", str(config), "--state-dir", str(state_dir), env={"PYTHONPATH": str(ROOT)})
    assert result.returncode == 0, result.stderr
    assert (tmp_path / "silenced").exists()  # the silence came
    return read_state(state_dir)["status"], read_incidents(state_dir)


def test_a_worker_trained_through_and_silent_in_its_ending_is_not_judged_hung(write_config, tmp_path):
    status, incidents = run_silent_at(write_config, tmp_path, "ending")
    assert incidents == []
    assert (status["state"], status["restarts"], status["attempt"]) == ("succeeded", 0, 1)


def test_the_same_silence_mid_epoch_is_still_a_hang(write_config, tmp_path):
    status, incidents = run_silent_at(write_config, tmp_path, "train")
    assert [(i["reason"], i["phase"]) for i in incidents] == [("hang", "train")]
    assert (status["state"], status["restarts"]) == ("succeeded", 1)
