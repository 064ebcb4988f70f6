"""Issue 38's matrix of hangs, in real processes under a real supervisor, made from outside the project (no fault
flag): a loader worker whose sample blocks on a lock, spins or stops; the training process spinning or blocked; a
sample that waits seconds on a loopback server that answers slowly. The worker is tests/fixtures/loader_loop.py, a
plain loop over Ultralytics' InfiniteDataLoader with the worker's own loader patches (far cheaper than training the
demo, the same supervisor path and the same in-place rebuild); py-spy is hidden, so the training process's witness
alone decides. Each asserts the tier, the cost fields and the fed-images record (no batch skipped, none twice)."""

import json
import os
import signal
import subprocess
import sys
from collections import Counter
from pathlib import Path

import psutil
import pytest

from tests.helpers import ROOT
from tests.helpers.supervised import (demo_train, python_without_py_spy, quiet_config, read_incidents, read_state,
                                      slow_server, status_of, wait_for, worker_launcher)
from worker.training.trainer import RECORD_FED_ENV

LOOP = ROOT / "tests" / "fixtures" / "loader_loop.py"
EPOCHS, TRAIN, VAL = 2, 20, 12  # the loop's epochs and samples (loader_loop.py)


def start_loop(tmp_path: Path, plan: dict | list[dict], extra: str = "", py_spy: bool = False,
               state_dir: Path | None = None) -> tuple[subprocess.Popen, Path, Path]:
    """The loop under `yolo-train run` with ``plan`` (loader_loop.py's LOADER_LOOP), left running: the supervisor,
    its state directory (tmp_path/state unless given) and the fed-images record."""
    marks = tmp_path / "marks"
    marks.mkdir()
    launcher = worker_launcher(tmp_path, f"import runpy, sys\nsys.path.insert(0, {str(ROOT)!r})\n"
                                         f"runpy.run_path({str(LOOP)!r}, run_name='__main__')\n")
    config = tmp_path / "config.toml"
    config.write_text(f'name = "loader-loop"\n{demo_train(epochs=EPOCHS)}{quiet_config()}'
                      f'[worker]\npython = "{launcher}"\n'
                      f"env = {{ LOADER_LOOP = '{json.dumps(plan)}', LOADER_LOOP_MARKS = '{marks}' }}\n{extra}")
    state_dir, fed = state_dir or tmp_path / "state", tmp_path / "fed.txt"
    python = sys.executable if py_spy else str(python_without_py_spy(tmp_path))
    env = {**os.environ, RECORD_FED_ENV: str(fed)}
    if not py_spy:
        env["PATH"] = "/usr/bin:/bin"
    return subprocess.Popen([python, "-m", "supervisor", "run", "--config", str(config), "--state-dir",
                             str(state_dir)], cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True), state_dir, fed


def finish_loop(supervisor: subprocess.Popen, state_dir: Path, fed: Path) -> tuple[dict, list[dict], str, list]:
    """The loop's run to its end: its final status, its incidents, the supervisor's stderr and the fed-images
    record, after checking that the run succeeded."""
    try:
        _, stderr = supervisor.communicate(timeout=150)
    finally:
        if supervisor.poll() is None:
            supervisor.kill()
            supervisor.wait()
    assert supervisor.returncode == 0, stderr[-3000:]
    status = read_state(state_dir)["status"]
    assert status["state"] == "succeeded", status
    return status, read_incidents(state_dir), stderr, fed_record(fed)


def run_loop(tmp_path: Path, plan: dict | list[dict], extra: str = "", py_spy: bool = False,
             state_dir: Path | None = None) -> tuple[dict, list[dict], str, list]:
    """The loop under `yolo-train run` with ``plan`` to its end (``start_loop``, ``finish_loop``); each sample's
    record is the caller's to check."""
    return finish_loop(*start_loop(tmp_path, plan, extra, py_spy, state_dir))


def fed_record(path: Path) -> list[tuple[int, str, int]]:
    return [(int(e), b, int(i)) for e, b, i in (line.split() for line in path.read_text().splitlines())]


def assert_each_sample_once(fed: list[tuple[int, str, int]], epochs: tuple[int, ...] = (1, 2)) -> None:
    """Each of ``epochs`` fed each training and validation sample exactly once, in order, each batch once."""
    for epoch in epochs:
        train = [i for e, b, i in fed if e == epoch and not b.startswith("val")]
        val = [i for e, b, i in fed if e == epoch and b.startswith("val")]
        assert train == list(range(TRAIN)), (epoch, train)
        assert val == list(range(VAL)), (epoch, val)
        batches = Counter(b for e, b, _ in fed if e == epoch)
        assert set(batches.values()) == {2}, batches  # none fed twice, none split


def assert_in_place(status: dict, incidents: list[dict], loader: str = "train") -> dict:
    assert status["attempt"] == 1 and status["recoveries"] == {"in_place": 1, "restart": 0}, status
    [incident] = incidents
    assert incident["tier"] == "in_place" and "escalation" not in incident, incident
    assert f"waits for a batch from {loader} loader worker" in incident["witness"], incident["witness"]
    assert "stacks" not in incident  # py-spy hidden, and nothing needed them: the witness decided
    cost = incident["tier_cost"]
    assert cost["batches_lost"] == 0 and cost["to_next_batch"] > 0 and cost["stall"] > 0, cost
    return incident


@pytest.mark.parametrize("hang", ["blocked", "spinning", "stopped"])
def test_a_hung_loader_worker_is_replaced_in_place_losing_nothing(tmp_path, hang):
    """A sample that blocks on a lock, spins at 100% CPU or stops its loader worker: the training process says it
    waits for that worker's batch; the worker's loader is rebuilt at the batch it waited for."""
    status, incidents, _, fed = run_loop(tmp_path, {"hang": hang, "epoch": 1, "batch": 6})
    assert_in_place(status, incidents)
    assert_each_sample_once(fed)


def test_a_validation_loaders_spinning_worker_is_replaced_in_place(tmp_path):
    status, incidents, _, fed = run_loop(tmp_path, {"hang": "spinning", "loader": "val", "epoch": 2, "batch": 5})
    assert incidents[0]["phase"] == "val"
    assert_in_place(status, incidents, loader="val")
    assert_each_sample_once(fed)


def test_per_pass_workers_that_hang_before_the_epochs_first_batch_are_replaced_in_place(tmp_path):
    """``persistent_workers = false``: epoch 2's new workers hang on its very first batch; they were reported when
    made, so the batch they owe names them."""
    status, incidents, _, fed = run_loop(tmp_path, {"hang": "blocked", "epoch": 2, "batch": 0, "persistent": False})
    incident = assert_in_place(status, incidents)
    assert incident["epoch"] == 2
    assert_each_sample_once(fed)


def test_a_resumed_attempts_loader_hang_is_recovered_in_place_after_the_training_process_blocked(tmp_path):
    """Attempt 1's training process blocks on a lock (not the loader's: the restart, from the checkpoint at batch
    4); the resumed attempt's loader worker spins inside the resumed epoch: in place, at the batch it waited for."""
    status, incidents, _, fed = run_loop(tmp_path, [{"hang": "main_blocked", "epoch": 1, "batch": 5},
                                                    {"hang": "spinning", "attempt": 2, "epoch": 1, "batch": 9}])
    assert status["attempt"] == 2 and status["recoveries"] == {"in_place": 1, "restart": 1}, status
    restart, in_place = incidents
    assert restart["tier"] == "restart" and "the hang is not the loader's" in restart["escalation"], restart
    assert "on a lock" in restart["witness"], restart["witness"]
    assert (in_place["attempt"], in_place["epoch"]) == (2, 1)
    assert_in_place({**status, "attempt": 1, "recoveries": {"in_place": 1, "restart": 0}}, [in_place])
    resumed = [f for f in fed if f[0] == 1][-TRAIN - VAL + 8:]  # attempt 2 resumed epoch 1 at batch 4 (sample 8)
    assert [i for _, b, i in resumed if not b.startswith("val")] == list(range(8, TRAIN))
    assert_each_sample_once(fed, epochs=(2,))


def test_a_training_process_spinning_in_python_is_restarted_not_taken_for_the_loaders(tmp_path):
    """The training process itself spins (its forward, a callback): the witness puts the wait in its own code, so
    the in-place tier declines at once and the restart resumes from the checkpoint at batch 4. Held at one place
    for the whole stall, its busy tree is bounded by the one-place stalls seen (none: idle_floor), not auto_floor."""
    status, incidents, _, fed = run_loop(tmp_path, {"hang": "main_spinning", "epoch": 1, "batch": 5})
    assert status["attempt"] == 2 and status["recoveries"] == {"in_place": 0, "restart": 1}, status
    [incident] = incidents
    assert incident["tiers"] == ["restart"], incident  # the in-place tier declined at the verdict
    assert "the hang is not the loader's" in incident["escalation"] and "in no known wait" in incident["witness"]
    assert "(train auto, witness: one place 3.0 s)" in incident["detail"], incident["detail"]
    assert "was held at one place (tests/fixtures/loader_loop.py:hang_here)" in incident["detail"], incident["detail"]
    assert_each_sample_once(fed, epochs=(2,))


def test_a_rebuilt_loader_that_hangs_again_escalates_to_the_restart(tmp_path):
    status, incidents, stderr, fed = run_loop(tmp_path, {"hang": "blocked", "epoch": 1, "batch": 6, "times": 2})
    assert status["attempt"] == 2 and status["recoveries"] == {"in_place": 0, "restart": 1}, status
    [incident] = incidents
    assert incident["tiers"] == ["in_place", "restart"] and "no batch within" in incident["escalation"], incident
    assert_each_sample_once(fed, epochs=(2,))


def test_a_sample_that_waits_seconds_on_a_socket_after_fast_batches_is_no_hang(tmp_path):
    """The idle floor's false kill of issue 38, inside a loader worker: the training process waits for that worker's
    batch, but the worker waits 6 s on a server outside the tree: the phase's own bound holds (10 s)."""
    port, answered = slow_server(6.0)
    status, incidents, _, fed = run_loop(tmp_path, {"hang": "socket", "port": port, "epoch": 1, "batch": 6})
    assert answered.is_set()
    assert incidents == [] and status["attempt"] == 1 and status["restarts"] == 0, incidents
    assert_each_sample_once(fed)


def test_a_tree_frozen_while_it_waits_for_a_batch_is_restarted_not_taken_for_the_loaders(tmp_path):
    """The whole tree frozen from outside (SIGSTOP) while the training process waited for a batch: its last word
    named the worker that owed it, but no rebuilt loader brings a stopped process its batch. /proc shows it stopped:
    its word is dropped, and the stall is the frozen tree's restart, said so; before, the in-place tier replaced the
    workers of a process that could not take the batch, then escalated. The worker owes the batch because it waits
    on a server (an outside wait: the phase's own bound), so the freeze comes once the status shows the word."""
    port, _ = slow_server(120.0)
    supervisor, state_dir, fed = start_loop(tmp_path, {"hang": "socket", "port": port, "epoch": 1, "batch": 6,
                                                       "attempt": 1}, extra="[watchdog]\nauto_floor = 60\n")
    try:
        def waiting_for_a_batch() -> dict | None:
            shown = ((status_of(state_dir) or {}).get("watchdog") or {})
            return shown if shown.get("waiting_kind") == "loader" else None
        watchdog = wait_for(waiting_for_a_batch, timeout=120, what="the training process's word on its batch")
        trainer = psutil.Process(read_state(state_dir)["status"]["worker_pid"])
        for process in [trainer, *trainer.children(recursive=True)]:
            process.send_signal(signal.SIGSTOP)
    finally:
        status, incidents, _, fed_lines = finish_loop(supervisor, state_dir, fed)
    assert "waits for a batch from train loader worker" in watchdog["waiting"], watchdog
    assert status["attempt"] == 2 and status["recoveries"] == {"in_place": 0, "restart": 1}, status
    [incident] = incidents
    assert incident["tiers"] == ["restart"], incident
    assert incident["escalation"] == f"the training process (pid {trainer.pid}) is stopped: restart", incident
    assert "(train auto, idle " in incident["detail"], incident["detail"]
    assert_each_sample_once(fed_lines, epochs=(2,))


def test_workers_killed_inside_a_batch_handover_are_replaced_without_a_traceback(tmp_path):
    """Issue 41: an in-place kill while the training process takes a batch's tensors from the worker (the worker
    stopped inside the handover of its shared-memory file descriptor) printed a multiprocessing traceback into the
    run's output. Three such kills in one run, train and val loaders: each one line, no traceback. With pin memory
    (torch's pin-memory thread is then the receiver that dies of the kill; without it the main thread's RuntimeError
    printed nothing even before the fix: not run again here, for the suite's time)."""
    hangs = [{"hang": "handover", "epoch": 1, "batch": 5, "pin_memory": True},
             {"hang": "handover", "loader": "val", "epoch": 1, "batch": 5}, {"hang": "handover", "epoch": 2, "batch": 7}]
    status, incidents, stderr, fed = run_loop(tmp_path, hangs)
    assert status["attempt"] == 1 and status["recoveries"] == {"in_place": 3, "restart": 0}, status
    assert [i["tier"] for i in incidents] == ["in_place"] * 3, incidents
    assert stderr.count("loader workers replaced on the supervisor's word") == 3, stderr
    assert "Traceback" not in stderr, stderr
    assert_each_sample_once(fed)


def climb_then(rung: str, hang: dict) -> tuple[str, list[dict]]:
    """A ladder of one rung, ``rung`` (TOML), and the plans that climb to it: attempt 1's loader worker hangs, then its
    rebuilt loader's again (``times`` 2: in place escalates to the restart, which climbs: a loader wait weighs the
    loader's rungs), then ``hang`` in attempt 2, resumed at that rung from the checkpoint at batch 4."""
    extra = f'[ladder]\nrungs = [{rung}]\nprior_between_hangs = "off"\n[restart]\nbackoff_initial = 0.5\n'
    return extra, [{"hang": "blocked", "epoch": 1, "batch": 5, "times": 2}, {**hang, "attempt": 2}]


def assert_climbed(status: dict, incidents: list[dict]) -> dict:
    """Attempt 1's escalated in-place recovery restarted at rung 1; attempt 2's incident."""
    assert status["attempt"] >= 2 and status["rung"] == 1, status
    climb, resumed = incidents[:2]
    assert climb["tiers"] == ["in_place", "restart"] and climb["rung"] == 0, climb
    assert (resumed["attempt"], resumed["rung"], resumed["epoch"]) == (2, 1, 1), resumed
    return resumed


# The default ladder's loader rungs with worker processes (workers = 2 here; the forkserver is the CUDA and ROCm
# ladders' rung, spawn one a user adds), each loader hang kind at the forkserver's, where every rebuild escalated.
LOADER_RUNGS = [('{ start_method = "forkserver" }', "blocked"), ('{ start_method = "forkserver" }', "spinning"),
                ('{ start_method = "forkserver" }', "stopped"), ('{ start_method = "spawn" }', "spinning"),
                ("{ workers = 1 }", "stopped"), ("{ persistent_workers = false }", "blocked")]


@pytest.mark.parametrize(("rung", "hang"), LOADER_RUNGS,
                         ids=["forkserver-blocked", "forkserver-spinning", "forkserver-stopped", "spawn-spinning",
                              "workers1-stopped", "per_pass-blocked"])
def test_a_loader_hang_at_each_loader_rung_after_the_climb_is_recovered_in_place(tmp_path, rung, hang):
    """Issue 48: at the forkserver rung every rebuild escalated (its bound learned from the fork rung's loader starts
    ran out while the training process still launched the new workers). At each rung, in an attempt resumed there
    after the climb: in place, 0 lost, 0 trained twice; the rebuild's bound from this attempt's own starts."""
    extra, plans = climb_then(rung, {"hang": hang, "epoch": 1, "batch": 9})
    status, incidents, _, fed = run_loop(tmp_path, plans, extra)
    assert status["attempt"] == 2 and status["recoveries"] == {"in_place": 1, "restart": 1}, status
    resumed = assert_climbed(status, incidents)
    assert_in_place({**status, "attempt": 1, "recoveries": {"in_place": 1, "restart": 0}}, [resumed])
    resumed_at = len(fed) - 1 - fed[::-1].index((1, "4", 8))  # attempt 2 resumed at batch 4 (sample 8)
    attempt_2 = fed[resumed_at:]
    assert [i for e, b, i in attempt_2 if e == 1 and not b.startswith("val")] == list(range(8, TRAIN))
    assert_each_sample_once(attempt_2, epochs=(2,))


@pytest.mark.parametrize("rung", ['{ loader = "threads" }', '{ loader = "process", workers = 0 }'],
                         ids=["threads", "workers0"])
def test_without_loader_worker_processes_a_loader_hang_restarts_saying_why(tmp_path, rung):
    """The threads loader (a thread cannot be killed) and workers = 0 (the loop loads its own samples): the in-place
    tier does not apply, and the restart's incident says why."""
    extra, plans = climb_then(rung, {"hang": "blocked", "epoch": 1, "batch": 9})
    status, incidents, _, _ = run_loop(tmp_path, plans, extra)
    resumed = assert_climbed(status, incidents)
    assert resumed["tiers"] == ["restart"] and "the loader has no worker processes to replace" \
        in resumed["escalation"], resumed


def test_a_fourth_and_fifth_loader_hang_within_the_hour_after_three_that_worked_are_in_place(tmp_path):
    """Issue 48: in_place_max (3) counted the recoveries that worked, and the fourth loader hang of a night restarted
    though the three before had each cost seconds and lost nothing. It counts those that escalated."""
    hangs = [{"hang": "blocked", "epoch": 1, "batch": 5}, {"hang": "spinning", "loader": "val", "epoch": 1, "batch": 5},
             {"hang": "stopped", "epoch": 2, "batch": 5}, {"hang": "blocked", "loader": "val", "epoch": 2, "batch": 5},
             {"hang": "spinning", "epoch": 2, "batch": 9}]
    status, incidents, _, fed = run_loop(tmp_path, hangs)
    assert status["attempt"] == 1 and status["recoveries"] == {"in_place": 5, "restart": 0}, status
    assert [i["tier"] for i in incidents] == ["in_place"] * 5, incidents
    assert_each_sample_once(fed)


def test_loader_hangs_of_workers_that_gave_batches_are_found_at_the_idle_floor(tmp_path):
    """Issue 48: in an attempt's first epoch (its first steps slow for the model's sake: 10 x those intervals) and
    right after an in-place rebuild, a hang of workers that had already given batches was bounded as a new loader's
    first batch or the slow intervals' (7.8-9.7 s on the CPU demo): it is the loader's own rhythm, the idle floor."""
    # (batch 9: the first hang's workers had at most batches 5-8 in hand, so the rebuilt loader's own meet it)
    hangs = [{"hang": "blocked", "epoch": 1, "batch": 5, "slow": 0.8}, {"hang": "spinning", "epoch": 1, "batch": 9}]
    status, incidents, _, fed = run_loop(tmp_path, hangs)
    assert status["recoveries"] == {"in_place": 2, "restart": 0}, status
    for incident in incidents:
        assert "(train auto, witness: loader 3.0 s)" in incident["detail"], incident["detail"]
    assert_each_sample_once(fed)


def test_a_spin_after_a_mid_epoch_checkpoint_or_validation_is_found_at_the_idle_floor(tmp_path):
    """Issue 48: the training process spinning right after a mid-epoch checkpoint (its batch after the save) and at
    the next epoch's first forward after validation was bounded by the save's own bound ("checkpoint auto", "save
    auto 10.0 s") though the witness named one place from its first word: it is training's, the idle floor."""
    hangs = [{"hang": "main_spinning", "epoch": 1, "batch": 4}, {"hang": "main_spinning", "attempt": 2, "epoch": 2,
                                                                 "batch": 0}]
    status, incidents, _, _ = run_loop(tmp_path, hangs)
    assert status["attempt"] == 3 and status["recoveries"] == {"in_place": 0, "restart": 2}, status
    for incident in incidents:
        assert "witness: one place 3.0 s)" in incident["detail"] and "was held at one place" in incident["detail"], \
            incident["detail"]
