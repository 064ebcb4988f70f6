"""The standby worker under the real supervisor: imported ahead, spared by the kill of a hung tree, launched as the
next attempt; one that dies early only costs a cold start; none outlives the supervisor."""

import re
import signal

import psutil
import pytest

from tests.helpers.supervised import (quiet_config, read_incidents, read_state, start_supervisor, status_of, wait_for,
                                      worker_launcher)

pytestmark = pytest.mark.e2e


def worker_pids(stderr: str) -> dict[int, int]:
    return {int(a): int(p) for a, p in re.findall(r"attempt (\d+): worker pid (\d+) at rung", stderr)}


def test_a_hung_attempt_is_resumed_by_the_standby_its_kill_spared_and_a_dead_one_costs_a_cold_start(demo_config,
                                                                                                    tmp_path):
    config, state_dir = demo_config(), tmp_path / "state"
    # attempt 1 hangs in epoch 3 (batch 20 of 24); attempt 2 resumes from last.pt and hangs at its 5th batch
    proc = start_supervisor(config, state_dir, "--fault", "main_hang,at_batch=20,attempt=1",
                            "--fault", "main_hang,at_batch=5,attempt=2")
    try:
        first = wait_for(lambda: (s := status_of(state_dir)) and s["attempt"] == 1 and s["standby_pid"], 120,
                         "attempt 1's standby")
        assert "--standby" in psutil.Process(first).cmdline()
        psutil.Process(first).send_signal(signal.SIGKILL)  # dead before it is needed
        second = wait_for(lambda: (s := status_of(state_dir)) and s["attempt"] == 2 and s["standby_pid"], 120,
                          "attempt 2's standby")
        _, stderr = proc.communicate(timeout=240)
    finally:
        proc.kill()
    assert proc.returncode == 0, stderr[-3000:]
    pids = worker_pids(stderr)
    assert f"standby worker pid {first} exited (-9) before it was needed; the next attempt starts cold" in stderr
    assert pids[2] != first  # started cold
    assert pids[3] == second and f"standby worker pid {second} takes the attempt" in stderr
    hang = read_incidents(state_dir)[1]
    assert hang["worker_pid"] == pids[2] and second not in [p["pid"] for p in hang["processes"]]  # spared
    assert hang["kill"]["survivors"] == []
    status = read_state(state_dir)["status"]
    assert status["state"] == "succeeded" and status["attempt"] == 3 and status["rung"] == 2
    assert status["resumed_from"].endswith("last.pt") and status["epoch"] == status["epochs"] == 3
    assert "standby launch to first batch" in stderr  # the worker's own clock starts at its launch
    # and its first step's parts, each its own seconds (the optimizer's where that batch steps)
    assert re.search(r"standby launch to first batch .*; first step: warm-up wait \d+\.\d\d, to the device \d+\.\d\d, "
                     r"predict \d+\.\d\d, loss \d+\.\d\d, backward \d+\.\d\d, (optimizer \d+\.\d\d, )?after \d+\.\d\d\n",
                     stderr), stderr[-3000:]
    standbys = {int(p) for p in re.findall(r"standby worker pid (\d+): importing", stderr)}
    assert len(standbys) == 3  # one per attempt that trained
    assert not [p for p in standbys if psutil.pid_exists(p) and psutil.Process(p).status() != psutil.STATUS_ZOMBIE]
    assert status["standby_pid"] is None


def test_a_first_batch_that_never_runs_restarts_from_the_standby_made_while_its_loader_started(demo_config,
                                                                                                 tmp_path):
    """The seeds' most frequent hang: after a resume the first batch is loaded and its step never runs. The standby
    is asked for as the attempt enters its first batch's step, so that attempt's restart does not start cold."""
    config, state_dir = demo_config(), tmp_path / "state"
    proc = start_supervisor(config, state_dir, "--fault", "main_hang,at_batch=5,attempt=1",
                            "--fault", "before_first_batch,attempt=2")
    try:
        _, stderr = proc.communicate(timeout=300)
    finally:
        proc.kill()
    assert proc.returncode == 0, stderr[-3000:]
    hangs = read_incidents(state_dir)
    assert [(i["attempt"], i.get("startup_step")) for i in hangs] == [(1, None), (2, "first_step")]
    pids = worker_pids(stderr)
    standbys = [int(p) for p in re.findall(r"standby worker pid (\d+): importing", stderr)]
    assert pids[2] == standbys[0] and pids[3] == standbys[1]  # the one made during attempt 2's start
    assert f"standby worker pid {pids[3]} takes the attempt" in stderr
    assert "starting cold" not in stderr
    assert read_state(state_dir)["status"]["state"] == "succeeded"


HANG_THEN_FINISH = """
import json, sys, time
from pathlib import Path
from worker.heartbeat import Heartbeat

attempt = json.loads(Path(sys.argv[3]).read_text())["attempt"]
hb = Heartbeat.from_env()
hb.phase("train", epoch=1, epochs=1, batch=0, batches=400)
for i in range(400):
    time.sleep(0.05)
    hb.beat(epoch=1, epochs=1, batch=i + 1, batches=400, samples=4)
    if attempt == 1 and Path(__file__).with_name("hang").exists():
        time.sleep(3600)  # attempt 1 hangs once the test froze the standby
    if attempt > 1 and i == 20:
        break
hb.phase("done")
"""


def test_a_frozen_standby_is_not_given_the_attempt(write_config, tmp_path):
    """A SIGSTOPped standby would take the attempt, never start, and cost a rung: it is started cold instead."""
    launcher = worker_launcher(tmp_path, HANG_THEN_FINISH)
    config = write_config(f"""
        [train]
        epochs = 1
        [worker]
        python = "{launcher}"
        [watchdog]
        auto_floor = 2
        [ladder]
        prior_between_hangs = "off"  # the rung's own hangs alone: the one hang climbs, measured or not
    """, quiet_config())
    state_dir = tmp_path / "state"
    proc = start_supervisor(config, state_dir)
    try:
        standby = wait_for(lambda: (s := status_of(state_dir)) and s["standby_pid"], 60, "the standby")
        psutil.Process(standby).send_signal(signal.SIGSTOP)
        (tmp_path / "hang").touch()
        _, stderr = proc.communicate(timeout=120)
    finally:
        proc.kill()
    assert proc.returncode == 0, stderr[-3000:]
    status = read_state(state_dir)["status"]
    assert (status["state"], status["rung"], status["restarts"]) == ("succeeded", 1, 1)  # one hang, one rung
    assert f"standby worker pid {standby} not used (stopped: frozen by a signal or a debugger): starting cold" in stderr
    assert worker_pids(stderr)[2] != standby
    assert not psutil.pid_exists(standby) or psutil.Process(standby).status() == psutil.STATUS_ZOMBIE


def test_a_standby_serves_a_launch_whatever_it_did_about_a_forkserver_but_no_other_environment():
    from supervisor.attempt.standby_worker import covers, serves
    from worker.wire.contract import ENV_FORKSERVER

    rung_0, rung_1 = {"PATH": "/usr/bin"}, {"PATH": "/usr/bin", ENV_FORKSERVER: "1"}
    assert serves(rung_1, rung_0) and serves(rung_0, rung_1)  # started it ahead, or the launch starts it
    assert not serves(rung_0, {"PATH": "/usr/bin", "HSA_ENABLE_SDMA": "0"})  # read at import: another process
    # Asked for again when the rung a hang moves to changed: kept if it is as good as a new one
    assert covers(rung_1, rung_0) and covers(rung_0, rung_0) and covers(rung_1, rung_1)
    assert not covers(rung_0, rung_1)  # a new one starts the forkserver ahead
    assert not covers(rung_0, {"PATH": "/usr/bin", "HSA_ENABLE_SDMA": "0"})
