"""Recovery in place (supervisor/decision/in_place.py, worker/loader_recovery.py): a hung DataLoader worker is
replaced without restarting training, and nothing is lost; whatever else happens escalates to the restart."""

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from supervisor.decision import core
from supervisor.decision.incident import Stacks
from tests.conftest import ROOT, demo_train, read_incidents, read_state
from tests.test_core import PID, Driver, kinds, make
from worker.exact_resume import EpochOrderSampler
from worker.trainer import RECORD_FED_ENV

LOADERS = (5001, 5002)
STACKS = Stacks("DataLoader worker stopped", ("DataLoader worker 0 (pid 5001) stopped",), None, 0.1, None)


def loading(**sections) -> Driver:
    """Healthy at 0.5 s a batch, its loader workers reported."""
    d = Driver(make(**sections))
    d.boot_and_spawn()
    d.beat("train", kind="phase")
    d.beat("train", kind="loader", pids=list(LOADERS), seconds=0.4, loader="train")
    while d.t + 0.5 <= 1010:
        d.t += 0.5
        d.beat(epoch=1, epochs=3, batch=3, batches=10, samples=4)
    return d


def stall(d: Driver) -> core.InspectStall:
    actions = d.at(d.t + 10.01)(core.Tick())
    assert kinds(actions) == ["Log", "InspectStall"] and d.s.state == core.State.HEALTHY
    return actions[1]


def test_a_stuck_loader_worker_is_replaced_in_place_and_its_cost_recorded():
    d = loading()
    inspect = stall(d)
    assert inspect.loader_pids == {5001: None, 5002: None}
    actions = d(core.StallInspected(inspect.incident.id, True, (5001,), "waits for a batch", None, STACKS))
    assert kinds(actions) == ["Log", "ReplaceLoaderWorkers"] and actions[1].pids == (5001,)
    assert kinds(d.at(d.t + 0.5)(core.LoaderWorkersKilled((5001,), (), 0.05))) == ["Log"]
    assert d.at(d.t + 9.9)(core.Tick()) == []  # the bound: 10 s floor (the loader started in 0.4 s)
    d.beat("train", kind="loader", pids=[5003], seconds=0.9, loader="train")
    actions = d.beat(epoch=1, epochs=3, batch=4, batches=10, samples=4)
    assert "RecordIncident" in kinds(actions)
    incident = d.s.incidents[-1].to_dict()
    assert incident["tier"] == "in_place" and incident["where"] == STACKS.where
    assert incident["in_place"]["batches_lost"] == 0 and incident["in_place"]["stall"] == pytest.approx(10.01)
    assert incident["in_place"]["action"] == pytest.approx(0.5) and incident["in_place"]["to_next_batch"] > 9
    assert d.s.recoveries == {"in_place": 1} and d.s.attempt == 1 and d.s.state == core.State.HEALTHY
    assert d.s.current.loaders == {5003: (None, "train")}  # a new iterator: all its workers new
    assert d.s.rung_in_place_seconds["0"] > 20  # the rung choice counts this cost, not a restart's
    assert d.s.rung_facts()[0].hangs == 0


def escalated(d: Driver, actions: list, why: str, incidents: int = 1) -> dict:
    assert "KillTree" in kinds(actions) and d.s.state == core.State.STOPPING
    incident = [a for a in actions if isinstance(a, core.KillTree)][0].incident.to_dict()
    assert incident["tier"] == "restart" and why in incident["escalation"], incident["escalation"]
    assert len(d.s.incidents) == incidents  # one hang, one incident
    d(core.TreeKilled(killed=3))
    assert d.s.recoveries.get("restart") == 1 and d.s.attempt == 2
    return incident


def test_a_hang_that_is_not_the_loaders_restarts_with_its_stacks_kept():
    d = loading()
    inspect = stall(d)
    actions = d(core.StallInspected(inspect.incident.id, False, (), "no loader worker process is stuck", None, STACKS))
    assert escalated(d, actions, "no loader worker")["where"] == STACKS.where


def test_a_loader_worker_that_survives_sigkill_restarts():
    d = loading()
    inspect = stall(d)
    d(core.StallInspected(inspect.incident.id, True, (5001,), "waits", None, STACKS))
    actions = d(core.LoaderWorkersKilled((5001,), ("pid 5001 (python, disk-sleep)",), 10.0))
    escalated(d, actions, "survived SIGKILL")


def test_no_batch_within_the_bound_restarts():
    d = loading()
    inspect = stall(d)
    d(core.StallInspected(inspect.incident.id, True, (5001,), "waits", None, STACKS))
    d(core.LoaderWorkersKilled((5001,), (), 0.1))
    escalated(d, d.at(d.t + 10.01)(core.Tick()), "no batch within 10 s")


def test_a_worker_that_exits_during_the_recovery_restarts():
    d = loading()
    inspect = stall(d)
    d(core.StallInspected(inspect.incident.id, True, (5001,), "waits", None, STACKS))
    d(core.LoaderWorkersKilled((5001,), (), 0.1))
    escalated(d, d(core.WorkerExited(1)), "exited with status 1 during the in-place recovery")


def test_more_than_in_place_max_in_the_window_restarts_and_off_is_todays_restart():
    d = loading(recovery={"in_place_max": 1})
    inspect = stall(d)
    d(core.StallInspected(inspect.incident.id, True, (5001,), "waits", None, STACKS))
    d(core.LoaderWorkersKilled((5001,), (), 0.1))
    d.beat(epoch=1, epochs=3, batch=4, batches=10, samples=4)
    escalated(d, d.at(d.t + 10.01)(core.Tick()), "more than in_place_max (1)", incidents=2)
    off = loading(recovery={"in_place": False})
    assert kinds(off.at(off.t + 10.01)(core.Tick())) == ["Log", "KillTree"]


def test_no_loader_reported_means_no_in_place_tier():
    """The threads rung, workers = 0 and a [worker] command report no loader worker processes: a restart."""
    d = Driver(make())
    d.boot_and_spawn()
    d.beat("train", kind="phase")
    d.train_until(1010, 0.5)
    assert kinds(d.at(d.t + 10.01)(core.Tick())) == ["Log", "KillTree"]


def expected_order(fed: list[tuple[int, int, str]], disturbed: int, undisturbed: int) -> list[str]:
    """The images of epoch ``disturbed`` in an undisturbed run: the order is a pure function of (seed, epoch), and
    the undisturbed epoch's record says which image each dataset index is."""
    names = [n for e, _, n in fed if e == undisturbed]
    sampler = EpochOrderSampler(len(names), seed=0)
    image = dict(zip(sampler.order(undisturbed), names))
    return [image[i] for i in sampler.order(disturbed)]


@pytest.mark.e2e
def test_a_loader_worker_frozen_from_outside_is_replaced_and_training_goes_on_losing_nothing(write_config, tmp_path):
    config = write_config('name = "in-place"\n' + demo_train(epochs=2) + '[metrics]\nlisten = "off"\n'
                          '[kernel_log]\nsource = "off"\ngpu_events = "off"\n[watchdog]\nstartup_timeout = 90\n')
    state_dir, fed_path = tmp_path / "state", tmp_path / "fed.txt"
    supervisor = subprocess.Popen([sys.executable, "-m", "supervisor", "run", "--config", str(config), "--state-dir",
                                   str(state_dir)], cwd=ROOT, env={**os.environ, RECORD_FED_ENV: str(fed_path)},
                                  stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 120
        while not (fed_path.exists() and fed_path.read_text().strip()):  # the first batch is trained
            assert time.monotonic() < deadline and supervisor.poll() is None, "no batch trained"
            time.sleep(0.02)
        [trainer] = [p for p in psutil.Process(supervisor.pid).children() if "--standby" not in p.cmdline()]
        frozen = trainer.children()[0]
        frozen.send_signal(signal.SIGSTOP)  # mid-epoch, no fault flag: the main process waits for its batch
        _, stderr = supervisor.communicate(timeout=240)
    finally:
        if supervisor.poll() is None:
            supervisor.kill()
    assert supervisor.returncode == 0, stderr[-3000:]
    status = read_state(state_dir)["status"]
    assert status["state"] == "succeeded" and status["attempt"] == 1  # the same training process throughout
    assert status["recoveries"] == {"in_place": 1, "restart": 0}
    [incident] = read_incidents(state_dir)
    assert incident["tier"] == "in_place" and incident["worker_pid"] == trainer.pid
    assert incident["in_place"]["batches_lost"] == 0 and "escalation" not in incident
    assert incident["culprit"].startswith(f"DataLoader worker") or str(frozen.pid) in incident["detail"] + \
        " ".join(incident["summary"])
    fed = [(int(e), int(b), n) for e, b, n in (line.split() for line in fed_path.read_text().splitlines())]
    epoch = incident["epoch"] - 1
    assert [n for e, _, n in fed if e == epoch] == expected_order(fed, epoch, 1 - epoch)  # none lost, none twice
    assert [b for e, b, _ in fed if e == epoch][::4] == list(range(8))
    assert not psutil.pid_exists(frozen.pid) and not psutil.pid_exists(trainer.pid)
