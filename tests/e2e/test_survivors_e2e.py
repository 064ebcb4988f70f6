"""A file-system blip under the real supervisor: a script whose read from a real FUSE mount is held survives SIGKILL
in request_wait_answer; the supervisor waits for it, not for a reboot, and the next attempt runs once it is gone."""

import subprocess
import sys

import pytest

from tests.helpers import ROOT
from tests.helpers.fuse_hold import FuseHold
from tests.helpers.supervised import quiet_config, read_incidents, read_state

SCRIPT = """
import os, sys, time
sys.path.insert(0, {root!r})
from worker.heartbeat import Heartbeat
hb = Heartbeat.from_env()
hb.phase("train")
first = not os.path.exists({marker!r})
open({marker!r}, "a").close()
for step in range(1, 41):
    time.sleep(0.05)
    hb.beat(epoch=1, epochs=1, batch=step, batches=40)
    if first and step == 5:
        os.stat({held!r})  # the dataset's mount blips: this read waits for an answer the daemon holds
"""


def test_a_worker_held_by_a_fuse_request_is_waited_for_and_the_run_goes_on(write_config, tmp_path):
    if not FuseHold.available():
        pytest.skip("needs root and /dev/fuse")
    mountpoint = tmp_path / "mnt"
    script = tmp_path / "train.py"
    script.write_text(SCRIPT.format(root=str(ROOT), marker=str(tmp_path / "attempted"),
                                    held=str(mountpoint / "images" / "0001.jpg")))
    config = write_config(f"""
        [worker]
        command = ["python", "{script}"]
        [watchdog]
        startup_timeout = 30
        stall_timeout = 2
        kill_grace = 0.5
        kill_timeout = 1
        survivor_timeout = 120
    """, quiet_config())
    state_dir = tmp_path / "state"
    with FuseHold(mountpoint) as fuse:
        supervisor = subprocess.Popen([sys.executable, "-m", "supervisor", "run", "--config", str(config),
                                       "--state-dir", str(state_dir)], cwd=ROOT, stderr=subprocess.PIPE, text=True)
        try:
            fuse.wait_for_request(timeout=120)
            seen = []
            for line in supervisor.stderr:  # the kill is over, its survivor waited for: the blip ends now
                seen.append(line)
                if "survived SIGKILL" in line:
                    break
            assert "request_wait_answer" in seen[-1] and "file system" in seen[-1], "".join(seen[-20:])
            fuse.release()
            rest = supervisor.stderr.read()
            assert supervisor.wait(timeout=120) == 0, rest[-3000:]
        finally:
            supervisor.kill()
    said = "".join(seen) + rest
    assert "reboot" not in said and "GPU driver" not in said and "are gone after" in said
    final = read_state(state_dir)["status"]
    assert (final["state"], final["batch"], final["restarts"]) == ("succeeded", 40, 1)
    kill = read_incidents(state_dir)[0]["kill"]
    assert len(kill["survivors"]) == 1 and "in request_wait_answer" in kill["survivors"][0]
