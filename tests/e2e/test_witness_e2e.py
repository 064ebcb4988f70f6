"""The witness in real supervised runs: a training that waits seconds on a socket is not killed as a hang, and a
loader worker frozen from outside is recovered in place where py-spy is nowhere to be found (the training process's
own word decides)."""

import os
import shutil
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import psutil
import pytest

from tests.helpers import ROOT
from tests.helpers.supervised import (demo_train, freeze_a_loader_worker, python_without_py_spy, quiet_config,
                                      read_incidents, read_state, slow_server, witnessed_loop, yolo_train)
from worker.training.trainer import RECORD_FED_ENV

# a checkpoint's upload, a FUSE blip: seconds on something outside the tree, nothing runs
WAITS_ON_A_SOCKET = witnessed_loop(80, "step == 40", """
with socket.create_connection(("127.0.0.1", int(sys.argv[1]))) as s:
    s.sendall(b"upload")
    assert s.recv(16) == b"stored"
""", imports="os, socket, sys, time", done=False)


def test_seven_seconds_on_a_socket_after_fast_batches_is_no_hang(write_config, tmp_path):
    """The idle floor's false kill of issue 38: the tree does nothing for 7 s (over idle_floor's 3 s), but the
    witness says the training waits on I/O outside its processes: the phase's own bound (10 s) holds."""
    port, answered = slow_server(7.0)
    (tmp_path / "train.py").write_text(WAITS_ON_A_SOCKET)
    config = write_config(f'[worker]\ncommand = ["{sys.executable}", "train.py", "{port}"]\ncwd = "{tmp_path}"\n',
                          quiet_config())
    result = yolo_train("run", "--config", str(config), "--state-dir", str(tmp_path / "state"), timeout=180)
    assert result.returncode == 0, result.stderr[-3000:]
    assert answered.is_set()  # the wait happened, whole
    assert read_incidents(tmp_path / "state") == []
    status = read_state(tmp_path / "state")["status"]
    assert status["state"] == "succeeded" and status["attempt"] == 1 and status["restarts"] == 0


# every step 4.5 s of work in one function: the witness puts each stall at one place for all of it
SLOW_STEPS_AT_ONE_PLACE = f"""
import sys, time
sys.path.insert(0, {str(ROOT)!r})
from worker.heartbeat import Heartbeat
hb = Heartbeat.from_env(witness=True)
hb.phase("train")
def step(seconds):
    until = time.monotonic() + seconds
    while time.monotonic() < until:
        pass
for batch in range(1, 4):
    step(4.5)
    hb.beat(epoch=1, epochs=1, batch=batch, batches=3)
hb.phase("done")
"""


@pytest.mark.e2e
def test_slow_steps_held_at_one_place_are_no_hang_in_an_attempts_first_interval(write_config, tmp_path):
    """A big model on a CPU: each step 4.5 s in one function. The second batch's stall, with no interval seen yet,
    was judged "held at one place" at idle_floor (3 s) in every attempt; the auto_floor holds until a rhythm is seen,
    and that rhythm (4.5 s) bounds the rest."""
    (tmp_path / "train.py").write_text(SLOW_STEPS_AT_ONE_PLACE)
    config = write_config(f'[worker]\ncommand = ["{sys.executable}", "train.py"]\ncwd = "{tmp_path}"\n',
                          quiet_config())
    result = yolo_train("run", "--config", str(config), "--state-dir", str(tmp_path / "state"), timeout=180)
    assert result.returncode == 0, result.stderr[-3000:]
    assert read_incidents(tmp_path / "state") == []
    status = read_state(tmp_path / "state")["status"]
    assert status["state"] == "succeeded" and status["attempt"] == 1 and status["restarts"] == 0


@pytest.mark.e2e
def test_without_py_spy_a_frozen_loader_worker_is_replaced_in_place_on_the_witness_word(write_config, tmp_path):
    python = python_without_py_spy(tmp_path)
    env = {**os.environ, "PATH": "/usr/bin:/bin", RECORD_FED_ENV: str(tmp_path / "fed.txt")}
    probe = subprocess.run([str(python), "-c", "from supervisor.host.stacks import find_py_spy; "
                            "import worker.witness; print(find_py_spy())"], cwd=ROOT, env=env, capture_output=True,
                           text=True)
    assert probe.stdout.strip() == "None", probe.stderr  # the precondition: nothing to read the stacks with
    config = write_config('name = "no-py-spy"\n' + demo_train(epochs=2) + quiet_config() +
                          '[watchdog]\nstartup_timeout = 90\n')
    state_dir, fed = tmp_path / "state", tmp_path / "fed.txt"
    supervisor = subprocess.Popen([str(python), "-m", "supervisor", "run", "--config", str(config), "--state-dir",
                                   str(state_dir)], cwd=ROOT, env=env, stdout=subprocess.DEVNULL,
                                  stderr=subprocess.PIPE, text=True)
    _, frozen, stderr = freeze_a_loader_worker(supervisor, fed)
    assert supervisor.returncode == 0, stderr[-3000:]
    status = read_state(state_dir)["status"]
    assert status["state"] == "succeeded" and status["attempt"] == 1
    assert status["recoveries"] == {"in_place": 1, "restart": 0}
    [incident] = read_incidents(state_dir)
    assert incident["tier"] == "in_place" and "escalation" not in incident
    assert "waits for a batch from train loader worker" in incident["witness"], incident["witness"]
    assert "stacks" not in incident  # nothing read them: the word decided
    assert incident["tier_cost"]["batches_lost"] == 0
    assert not psutil.pid_exists(frozen.pid)
