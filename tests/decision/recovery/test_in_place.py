"""Recovery in place (supervisor/decision/recovery/in_place.py, worker/loading/loader_recovery.py): a hung DataLoader worker is
replaced without restarting training, and nothing is lost; whatever else happens escalates to the restart."""

from collections import Counter
import os
import signal
import subprocess
import sys
import threading
import time
from enum import Enum
from functools import partial
from pathlib import Path

import psutil
import pytest

from supervisor.decision import core, recovery, status_view
from supervisor.decision.model.actions import IncidentResumed, RecordIncident
from supervisor.decision.model.pace import PACE_BATCHES
from supervisor.decision.learning import choices
from supervisor.decision.model.incident import Tier
from supervisor.decision.recovery import in_place, restart
from supervisor.decision.recovery.tier import Escalate
from supervisor.telemetry import metric_table
from tests.helpers import ROOT
from tests.helpers.driver import COMMAND, PID, STACKS, Driver, kinds, loading, make
from tests.helpers.supervised import (demo_train, freeze_a_loader_worker, quiet_config, read_incidents, read_state,
                                      wait_until_fed)
from worker.supervision.exact_resume import EpochOrderSampler
from worker.training.trainer import RECORD_FED_ENV


def stall(d: Driver) -> in_place.InspectStall:
    actions = d.at(d.t + 10.01)(core.Tick())
    assert kinds(actions) == ["Log", "InspectStall"] and d.s.state == core.State.HEALTHY
    return actions[1]


def test_a_stuck_loader_worker_is_replaced_in_place_and_its_cost_recorded():
    d = loading()
    inspect = stall(d)
    assert inspect.loader_pids == {5001: None, 5002: None}
    actions = d(in_place.StallInspected(inspect.incident.id, True, (5001,), "waits for a batch", None, STACKS))
    assert kinds(actions) == ["Log", "ReplaceLoaderWorkers"] and actions[1].pids == (5001,)
    assert kinds(d.at(d.t + 0.5)(in_place.LoaderWorkersKilled((5001,), (), 0.05))) == ["Log"]
    # the bound: learned from this run's loader starts, 2 x 0.4 s, at least idle_floor (3 s)
    assert d.at(d.t + 2.9)(core.Tick()) == []
    d.beat("train", kind="loader", pids=[5003], seconds=0.9, loader="train")
    actions = d.beat(epoch=1, epochs=3, batch=4, batches=10, samples=4)
    assert "IncidentResumed" in kinds(actions)
    incident = d.s.incidents[-1].to_dict()
    assert incident["tier"] == "in_place" and incident["where"] == STACKS.where
    assert incident["tier_cost"]["batches_lost"] == 0 and incident["tier_cost"]["stall"] == pytest.approx(10.01)
    assert incident["tier_cost"]["action"] == pytest.approx(0.5) and incident["tier_cost"]["to_next_batch"] > 2.8
    assert d.s.recoveries == {"in_place": 1} and d.s.attempt == 1 and d.s.state == core.State.HEALTHY
    assert d.s.current.loaders == {5003: (None, "train")}  # a new iterator: all its workers new
    assert d.s.rungs[0].tier_seconds > 13  # the rung choice counts this cost, not a restart's
    assert choices.rung_facts(d.s)[0].hangs == 0


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
    actions = d(in_place.StallInspected(inspect.incident.id, False, (), "no loader worker process is stuck", None, STACKS))
    assert escalated(d, actions, "no loader worker")["where"] == STACKS.where


def test_a_loader_worker_that_survives_sigkill_restarts():
    d = loading()
    inspect = stall(d)
    d(in_place.StallInspected(inspect.incident.id, True, (5001,), "waits", None, STACKS))
    actions = d(in_place.LoaderWorkersKilled((5001,), ("pid 5001 (python, disk-sleep)",), 10.0))
    escalated(d, actions, "survived SIGKILL")


def test_no_batch_within_the_bound_restarts():
    d = loading()
    inspect = stall(d)
    d(in_place.StallInspected(inspect.incident.id, True, (5001,), "waits", None, STACKS))
    d(in_place.LoaderWorkersKilled((5001,), (), 0.1))
    assert d.s.watch.tree_from == d.t  # the rebuild's tree is read from the kill
    d.at(d.t + 1)(core.TreeActivity(idle_since=d.t))  # idle: the rebuilt loader hangs again
    escalated(d, d.at(d.t + 2.01)(core.Tick()), "no batch within 3 s")


def test_a_rebuild_whose_tree_is_busy_starting_its_workers_gets_the_busy_bound_until_it_idles():
    """CI under load: a rebuilt loader's spawned workers (each an interpreter importing torch) gave no batch within
    6 s, 2 x the attempt's own 3 s start, and the rebuild that would have worked escalated to a restart. While the
    tree is busy the bound is auto_factor x that start; once it idles, the rebuild's own bound holds again."""
    d = loading()
    d.beat("train", kind="loader", pids=[5001, 5002], seconds=1.0, loader="train")  # this attempt's start: 1 s
    inspect = stall(d)
    d(in_place.StallInspected(inspect.incident.id, True, (5001,), "waits", None, STACKS))
    d(in_place.LoaderWorkersKilled((5001,), (), 0.1))
    killed = d.t
    assert d.s.current.recovery.bound == 3.0  # max(idle_floor, 2 x 1 s)
    assert d.at(killed + 3.01)(core.Tick()) == []  # busy (or not yet read): 10 x 1 s
    assert d.s.watch.deadline.at == pytest.approx(killed + 10.0)
    d.at(killed + 6)(core.TreeActivity(idle_since=killed + 5))  # the new workers started, then nothing came
    escalated(d, d.at(killed + 6.01)(core.Tick()), "no batch within 3 s after the loader workers were replaced")


def test_a_rebuild_busy_past_the_busy_bound_restarts_saying_so():
    d = loading()
    inspect = stall(d)
    d(in_place.StallInspected(inspect.incident.id, True, (5001,), "waits", None, STACKS))
    d(in_place.LoaderWorkersKilled((5001,), (), 0.1))
    escalated(d, d.at(d.t + 4.01)(core.Tick()), "no batch within 4 s after the loader workers were replaced, its tree "
                                                 "busy")  # 10 x the 0.4 s start: a rebuilt loader spinning


def test_the_rebuilt_loaders_new_workers_start_the_bounds_clock_again():
    """A busy machine forks the rebuilt loader's workers slowly (CI, the VM oversubscribed four times over: 3 s
    passed before their first batch). Once the worker reports them, the bound for their first batch counts from
    there; a rebuild that never reports them keeps the bound from the kill."""
    d = loading()
    inspect = stall(d)
    d(in_place.StallInspected(inspect.incident.id, True, (5001,), "waits", None, STACKS))
    d(in_place.LoaderWorkersKilled((5001,), (), 0.1))
    killed = d.t
    d(core.TreeActivity(idle_since=killed))  # (a busy tree's bound is the test below's)
    d.t = killed + 2.5
    d.beat("train", kind="loader", pids=[5101, 5102], loader="train")  # made, not yet at their first batch
    assert d.at(killed + 3.01)(core.Tick()) == []
    assert d.s.current.loaders == {5101: (None, "train"), 5102: (None, "train")}
    escalated(d, d.at(killed + 5.51)(core.Tick()), "no batch within 3 s after the rebuilt loader's new workers")


def test_a_worker_that_exits_during_the_recovery_restarts():
    d = loading()
    inspect = stall(d)
    d(in_place.StallInspected(inspect.incident.id, True, (5001,), "waits", None, STACKS))
    d(in_place.LoaderWorkersKilled((5001,), (), 0.1))
    escalated(d, d(core.WorkerExited(1)), "exited with status 1 during the in-place recovery")


def test_in_place_off_is_todays_restart():
    off = loading(recovery={"in_place": False})
    assert kinds(off.at(off.t + 10.01)(core.Tick())) == ["Log", "PrimeStandby", "KillTree"]


def test_no_loader_reported_means_no_in_place_tier():
    """The threads rung and workers = 0 report no loader worker processes: a restart, whose incident says why the
    in-place tier did not apply; a [worker] command has no such tier at all."""
    d = Driver(make())
    d.boot_and_spawn()
    d.beat("train", kind="phase")
    d.train_until(1010, 0.5)
    actions = d.at(d.t + 10.01)(core.Tick())
    assert kinds(actions) == ["Log", "PrimeStandby", "KillTree"]
    incident = actions[-1].incident
    assert incident.tiers == ("restart",) and incident.escalation == in_place.NO_WORKERS
    command = Driver(make(worker=COMMAND))
    command.boot_and_spawn()
    command.beat("train", kind="phase")
    command.train_until(1010, 0.5)
    assert command.at(command.t + 10.01)(core.Tick())[1].incident.escalation is None


class Declines:
    """A tier ahead of the in-place one for the walk's tests: it applies (or not) and declines at once."""
    events: tuple = ()

    def __init__(self, calls: list, applies: bool):
        self.name, self.calls, self.applicable = Tier.IN_PLACE, calls, applies

    def applies(self, s, phase):
        self.calls.append(("applies", self.applicable))
        return self.applicable

    def begin(self, s, now, verdict):
        self.calls.append(("begin", verdict.phase))
        return Escalate("not this one's hang")

    def reads_own_stacks(self, s, phase, word):
        return False


def test_the_tiers_are_walked_cheapest_first_and_an_escalation_goes_on_from_the_tier_under_way(monkeypatch):
    calls: list = []
    monkeypatch.setattr(recovery, "TIERS", (Declines(calls, False), Declines(calls, True), in_place.TIER,
                                            restart.TIER))
    d = loading()
    inspect = stall(d)  # the first does not apply, the second declines: the in-place tier takes the hang
    assert calls == [("applies", False), ("applies", True), ("begin", "train")]
    assert inspect.incident.escalation == "not this one's hang" and d.s.current.recovery.tier is in_place.TIER
    actions = d(in_place.StallInspected(inspect.incident.id, False, (), "no loader worker process is stuck", None, STACKS))
    assert calls == [("applies", False), ("applies", True), ("begin", "train")]  # the walk went on, not over again
    incident = escalated(d, actions, "no loader worker")
    assert incident["tiers"] == ["in_place", "restart"]


def test_an_escalation_amends_the_hangs_one_incident():
    """One hang, one incident: the restart amends what the in-place tier opened (its id, its verdict's time and
    stall, its stacks), adds what the stop knows, and records the way it went; it is written once, when complete."""
    d = loading()
    inspect = stall(d)
    opened = inspect.incident
    d.at(d.t + 0.3)(in_place.StallInspected(opened.id, True, (5001,), "waits", None, STACKS))
    actions = d.at(d.t + 0.2)(in_place.LoaderWorkersKilled((5001,), (), 0.1))
    d(core.TreeActivity(idle_since=d.t))
    assert "RecordIncident" not in kinds(actions)
    actions = d.at(d.t + 3.01)(core.Tick())  # no batch within the bound: the restart takes the same incident
    assert "RecordIncident" not in kinds(actions)  # still open: the kill and the next first batch are to come
    [incident] = d.s.incidents
    assert [a.incident for a in actions if isinstance(a, core.KillTree)] == [incident]
    assert (incident.id, incident.time, incident.seconds_since_progress) == \
        (opened.id, opened.time, opened.seconds_since_progress)
    assert incident.loss is not None and incident.tier == Tier.RESTART
    assert incident.tiers == (Tier.IN_PLACE, Tier.RESTART) and "no batch within 3 s" in incident.escalation
    # The workers the first look blamed are gone: the restart reads the tree anew (no stacks kept to stand for it),
    # and the detail says what the first look saw and what followed (issue 41: it kept the first look's culprit).
    assert incident.stacks is None and incident.detail.startswith(opened.detail)
    assert f"its loader worker(s) were replaced in place (the first look: {STACKS.where}), then no batch within " \
        "3 s" in incident.detail
    d(core.TreeKilled(killed=3))
    d.progress = 0
    d.at(d.t + 1)(core.Spawned(PID, None))
    d.beat("train", kind="phase")
    written = [a.incident for a in d.at(d.t + 2).beat(epoch=1, epochs=3, batch=4, batches=10, samples=4)
               if isinstance(a, IncidentResumed)]
    assert [i.id for i in written] == [opened.id] and written[0].restart_seconds > 6
    assert d.s.recoveries == {"restart": 1}
    plain = Driver(make(recovery={"in_place": False}))  # a hang no cheaper tier takes: the restart alone, on the record
    plain.boot_and_spawn()
    plain.beat("train", kind="phase")
    plain.train_until(1010, 0.5)
    plain.at(plain.t + 10.01)(core.Tick())
    record = plain.s.incidents[-1].to_dict()
    assert record["tiers"] == ["restart"] and "escalation" not in record


def test_recoveries_are_keyed_by_every_tier_of_the_enum_not_a_hard_coded_pair(monkeypatch):
    """status --json's recoveries and the metric's series follow vocabulary.Tier: a tier added there is counted, at 0
    before its first, with no field to add."""
    more = Enum("Tier", {"IN_PLACE": "in_place", "RESTART": "restart", "RELOAD": "reload"}, type=str)
    monkeypatch.setattr(status_view, "Tier", more)
    d = loading()
    d.s.recoveries = Counter({"restart": 1, "reload": 2})
    status = status_view.snapshot(d.s, core.Now(d.t, 1_700_000_000 + d.t))
    assert status.to_dict()["recoveries"] == {"in_place": 0, "restart": 1, "reload": 2}
    assert status_view.Status.from_dict(status.to_dict()).recoveries == status.recoveries
    [row] = [row for row in metric_table.METRICS if row.name == "yolo_train_recoveries"]
    assert dict(row.read(metric_table.Scrape(status, 1_700_000_000 + d.t))) == \
        {("in_place",): 0, ("restart",): 1, ("reload",): 2}
    monkeypatch.undo()
    assert list(status_view.Status().to_dict()["recoveries"]) == [tier.value for tier in Tier]


def test_a_command_has_no_in_place_tier_even_where_its_script_reports_loader_workers():
    """A [worker] command reads no command pipe: its loader workers cannot be told of their replacement."""
    d = loading(worker=COMMAND)
    assert d.s.current.loaders and kinds(d.at(d.t + 10.01)(core.Tick())) == ["Log", "KillTree"]


def expected_order(fed: list[tuple[int, int, str]], disturbed: int, undisturbed: int) -> list[str]:
    """The images of epoch ``disturbed`` in an undisturbed run: the order is a pure function of (seed, epoch), and
    the undisturbed epoch's record says which image each dataset index is."""
    names = [n for e, _, n in fed if e == undisturbed]
    sampler = EpochOrderSampler(len(names), seed=0)
    image = dict(zip(sampler.order(undisturbed), names))
    return [image[i] for i in sampler.order(disturbed)]


@pytest.mark.e2e
def test_a_loader_worker_frozen_from_outside_is_replaced_and_training_goes_on_losing_nothing(write_config, tmp_path):
    config = write_config('name = "in-place"\n' + demo_train(epochs=2) + quiet_config() +
                          '[watchdog]\nstartup_timeout = 90\n')
    state_dir, fed_path = tmp_path / "state", tmp_path / "fed.txt"
    supervisor = subprocess.Popen([sys.executable, "-m", "supervisor", "run", "--config", str(config), "--state-dir",
                                   str(state_dir)], cwd=ROOT, env={**os.environ, RECORD_FED_ENV: str(fed_path)},
                                  stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    trainer, frozen, stderr = freeze_a_loader_worker(supervisor, fed_path)  # mid-epoch, no fault flag
    assert supervisor.returncode == 0, stderr[-3000:]
    status = read_state(state_dir)["status"]
    assert status["state"] == "succeeded" and status["attempt"] == 1  # the same training process throughout
    assert status["recoveries"] == {"in_place": 1, "restart": 0}
    [incident] = read_incidents(state_dir)
    assert incident["tier"] == "in_place" and incident["worker_pid"] == trainer.pid
    assert incident["tier_cost"]["batches_lost"] == 0 and "escalation" not in incident
    # named by the witness (the training process's word: the batch it waits for, owed by the frozen worker or by a
    # sibling whose send the frozen one holds up) or, without it, by the stacks
    assert "waits for a batch from train loader worker" in incident.get("witness", "") or \
        incident["culprit"].startswith("DataLoader worker")
    fed = [(int(e), int(b), n) for e, b, n in (line.split() for line in fed_path.read_text().splitlines())]
    epoch = incident["epoch"] - 1
    assert [n for e, _, n in fed if e == epoch] == expected_order(fed, epoch, 1 - epoch)  # none lost, none twice
    assert [b for e, b, _ in fed if e == epoch][::4] == list(range(8))
    assert not psutil.pid_exists(frozen.pid) and not psutil.pid_exists(trainer.pid)


def test_commands_cross_a_real_pipe_typed_and_each_rank_takes_what_concerns_it():
    from worker.wire.commands import CommandChannel
    from worker.wire.contract import Command, CommandKind

    read, write = os.pipe()
    try:
        for command in (Command(CommandKind.REPLACE_LOADER_WORKERS, rank=1, pids=(7, 8), seq=1),
                        Command(CommandKind.CHECKPOINT_AND_STOP, seq=2)):
            os.write(write, command.to_line())
        os.write(write, b'{"v": 9, "kind": "checkpoint_and_stop"}\nnot json\n')
        rank1 = CommandChannel(read, rank=1)
        assert not rank1.has(CommandKind.CHECKPOINT_AND_STOP)  # rank 0 alone saves
        assert rank1.take(CommandKind.REPLACE_LOADER_WORKERS) == [
            Command(CommandKind.REPLACE_LOADER_WORKERS, rank=1, pids=(7, 8), seq=1)]
        assert rank1.poll() == []  # nothing more, and never a wait
    finally:
        os.close(write)


def look_with_a_death_at_line(look, files: set[str], raise_at: int) -> int:
    """``look()`` in a thread of its own, a dead worker's RuntimeError raised at its ``raise_at``-th line in
    ``files`` (as torch's SIGCHLD handler raises it, at any bytecode); the lines it ran there. A thread, so that the
    exception state a trace function's raise leaves behind goes with it."""
    lines = 0

    def death(frame, event, arg):
        nonlocal lines
        if frame.f_code.co_filename not in files:
            return None
        if event == "line":
            lines += 1
            if lines == raise_at:
                raise RuntimeError("DataLoader worker (pid(s) 4242) exited unexpectedly")
        return death

    def traced():
        sys.settrace(death)
        try:
            look()
        except RuntimeError:
            pass
        finally:
            sys.settrace(None)

    thread = threading.Thread(target=traced)
    thread.start()
    thread.join()
    return lines


def test_a_death_raised_at_any_line_of_the_intake_loses_no_word_of_the_supervisor():
    """torch's SIGCHLD handler raises a killed loader worker's death at any bytecode of the main thread, also while
    the loader reads the command that explains it (seen once on CI: the command was read, the death came before it
    was recorded, and the handover's connection error that followed was raised as a real failure). Raised at every
    line of the intake in turn, the next look still knows the worker as replaced."""
    from worker.wire import commands as commands_module
    from worker.loading import loader_recovery as recovery_module
    from worker.wire.commands import CommandChannel
    from worker.wire.contract import Command, CommandKind
    from worker.heartbeat import Heartbeat
    from worker.loading.loader_recovery import LoaderRecovery

    intake = {commands_module.__file__, recovery_module.__file__}
    handover = ConnectionResetError(104, "Connection reset by peer")
    for raise_at in range(1, 200):
        read, write = os.pipe()
        try:
            recovery = LoaderRecovery("val", CommandChannel(read), Heartbeat(None))
            os.write(write, Command(CommandKind.REPLACE_LOADER_WORKERS, pids=(4242,)).to_line())
            lines = look_with_a_death_at_line(partial(recovery.is_replacement, handover, {4242, 4243}), intake,
                                              raise_at)
            assert recovery.is_replacement(handover, {4242, 4243}), f"the word lost at line {raise_at} of the intake"
        finally:
            os.close(write)
            os.close(read)
        if lines < raise_at:  # the intake ran through without reaching it: every line has had its turn
            break
    assert raise_at > 5


def test_a_replaced_workers_death_that_comes_before_the_word_waits_for_it():
    """Under DDP the supervisor's word reaches a rank through the launching worker's relay thread, which a loaded
    machine may run after the kill it announces (CI: rank 1 raised its replaced worker's death as a failure, the
    rank crashed, and a rebuild became a restart). The death waits for the word, a bounded while."""
    from worker.wire.commands import CommandChannel
    from worker.wire.contract import Command, CommandKind
    from worker.heartbeat import Heartbeat
    from worker.loading.loader_recovery import WORD_TRAILS, LoaderRecovery

    killed = RuntimeError("DataLoader worker (pid 4242) is killed by signal: Killed. ")
    read, write = os.pipe()
    try:
        recovery = LoaderRecovery("train", CommandChannel(read), Heartbeat(None))
        word = Command(CommandKind.REPLACE_LOADER_WORKERS, pids=(4242,)).to_line()
        relay = threading.Timer(0.3, os.write, (write, word))
        relay.start()
        assert recovery.is_replacement(killed, {4242})
        relay.join()
        started = time.monotonic()
        assert not recovery.is_replacement(RuntimeError("DataLoader worker (pid 77) exited unexpectedly"), {77})
        assert time.monotonic() - started >= WORD_TRAILS  # no word for it: a failure, after the trail
    finally:
        os.close(write)
        os.close(read)


def test_a_loader_failure_is_taken_for_a_replacement_only_on_the_supervisors_word():
    from worker.wire.commands import CommandChannel
    from worker.wire.contract import Command, CommandKind
    from worker.heartbeat import Heartbeat
    from worker.loading.loader_recovery import LoaderRecovery, dead_workers

    killed = RuntimeError("DataLoader worker (pid 4242) is killed by signal: Killed. ")
    assert dead_workers(killed) == {4242}
    assert dead_workers(RuntimeError("DataLoader worker (pid(s) 1, 2) exited unexpectedly")) == {1, 2}
    read, write = os.pipe()
    try:
        recovery = LoaderRecovery("train", CommandChannel(read), Heartbeat(None))
        # the OOM killer's, say: no word comes within its trail, and training fails as before
        assert not recovery.is_replacement(killed, {4242, 4243}, trail=0.2)
        os.write(write, Command(CommandKind.REPLACE_LOADER_WORKERS, pids=(4242,)).to_line())
        assert recovery.is_replacement(killed, {4242, 4243})
        assert recovery.is_replacement(ConnectionResetError(104, "reset"), {4242, 4243})  # killed mid-handover
        assert not recovery.is_replacement(ConnectionResetError(104, "reset"), {9, 10}, trail=0.2)  # another's
        assert recovery.is_replacement(RuntimeError("Pin memory thread exited unexpectedly"), {4242})
        assert not recovery.is_replacement(RuntimeError("CUDA error"), {4242})
    finally:
        os.close(write)


def _process(pid, ppid, state, frames=(), role=""):
    from supervisor.decision.stall.stack_reading import Frame, ProcessStacks, ThreadStack

    thread = ThreadStack(pid, None, state, "", None, [Frame(f, Path(p).name, 1, p, False) for f, p in frames])
    return ProcessStacks(pid, role=role, state=state, threads=[thread], ppid=ppid)


def test_the_stacks_say_whether_the_in_place_tier_applies():
    from supervisor.decision.stall.loader_judgement import judge
    from supervisor.decision.stall.stack_reading import TreeCapture

    waiting = [("get", "/usr/lib/python3.11/multiprocessing/queues.py"),
               ("_try_get_data", "/venv/torch/utils/data/dataloader.py"),
               ("_next_data", "/venv/torch/utils/data/dataloader.py")]
    parked = [("get", "/usr/lib/python3.11/multiprocessing/queues.py"),
              ("_worker_loop", "/venv/torch/utils/data/_utils/worker.py")]
    main = _process(100, 1, "S", waiting)

    def verdict(*workers, trainer=main):
        return judge(TreeCapture(100, [trainer, *workers], 0.1, 3.0), {101: None, 102: None})

    stopped = verdict(_process(101, 100, "T"), _process(102, 100, "S", parked))
    assert (stopped.loader_wait, stopped.culprits) == (True, (101,))
    server = _process(103, 100, "S", [("main", "/usr/lib/python3.11/multiprocessing/forkserver.py")])
    served = verdict(server, _process(101, 103, "T"), _process(102, 103, "S", parked))  # the forkserver rung
    assert (served.loader_wait, served.culprits) == (True, (101,)) and "pid 100" in served.why
    assert verdict(_process(101, 100, "S", parked), _process(102, 100, "S", parked)).culprits == ()
    # a sleep in the kernel that SIGKILL may well end (a killable wait shows D too): the kill is sent, and only a
    # survivor escalates (in_place.killed)
    in_kernel = verdict(_process(101, 100, "D"))
    assert in_kernel.culprits == (101,) and in_kernel.loader_wait
    main_hung = verdict(_process(101, 100, "T"), trainer=_process(100, 1, "S", [("hang_forever", "/w/faults.py")]))
    assert main_hung.culprits == () and "not waiting for a batch" in main_hung.why
    # the whole tree frozen (a driver hang, bench/burst.py): the stopped main process shows no frames to trust
    frozen_tree = verdict(_process(101, 100, "T"), _process(102, 100, "T"), trainer=_process(100, 1, "T"))
    assert frozen_tree.culprits == ()
    assert frozen_tree.why == ("the training process is stopped, as are the loader workers (the whole tree frozen): "
                               "restart")
    # under DDP, every rank frozen with its loader workers: a restart that says so, not "more than one process"
    ranks = [_process(100, 1, "T"), _process(200, 1, "T"), _process(101, 100, "T"), _process(201, 200, "T")]
    every = judge(TreeCapture(100, ranks, 0.1, 3.0), {101: 0, 201: 1})
    assert every.culprits == () and every.why.startswith("every rank's process is stopped")
    assert "more than one" in judge(TreeCapture(100, [*ranks[:1], _process(200, 1, "S", waiting), *ranks[2:]],
                                                0.1, 3.0), {101: 0, 201: 1}).why


def test_the_rung_choice_counts_an_in_place_recovery_by_its_own_cost():
    from supervisor.decision.model.rung_choice import RungFacts, expected_goodput

    restarted = RungFacts(speed=10.0, seconds=600.0, hangs=2)
    in_place = RungFacts(speed=10.0, seconds=600.0, hangs=0, tier_seconds=2 * 12.0)
    assert expected_goodput(restarted, 45.0) == pytest.approx(10.0 * 600 / (600 + 90))
    assert expected_goodput(in_place, 45.0) == pytest.approx(10.0 * 600 / (600 + 24))
    assert expected_goodput(RungFacts(10.0, 600.0, 0), 45.0) == 10.0
    # with a prior ([ladder] prior_between_hangs): one hang per M = (600 + 300) / 2 s, its in-place seconds per M added
    both = RungFacts(speed=10.0, seconds=600.0, hangs=1, tier_seconds=24.0)
    assert expected_goodput(both, 45.0, prior=300.0) == pytest.approx(10.0 * 450 / (450 + 45 + 450 * 24 / 600))


@pytest.mark.e2e
def test_under_ddp_one_ranks_frozen_loader_worker_is_replaced_in_that_rank(write_config, tmp_path):
    from tests.helpers.supervised import DDP_CONFIG

    config = write_config(DDP_CONFIG.format(extra_env="").replace("in_place = false", "in_place = true"))
    state_dir, fed = tmp_path / "state", tmp_path / "fed.txt"
    supervisor = subprocess.Popen([sys.executable, "-m", "supervisor", "run", "--config", str(config), "--state-dir",
                                   str(state_dir)], cwd=ROOT, env={**os.environ, RECORD_FED_ENV: str(fed)},
                                  stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    rank1_fed = Path(f"{fed}.rank1")
    try:
        wait_until_fed(rank1_fed, supervisor, 300, "rank 1 trained no batch")

        def rank(p: psutil.Process) -> str | None:
            return next((e for e in Path(f"/proc/{p.pid}/environ").read_text().split("\0") if e.startswith("RANK=")),
                        None)
        [rank1] = [p for p in psutil.Process(supervisor.pid).children(recursive=True)
                   if rank(p) == "RANK=1" and rank(p.parent()) != "RANK=1"]
        frozen = rank1.children()[0]
        frozen.send_signal(signal.SIGSTOP)
        _, stderr = supervisor.communicate(timeout=400)
    finally:
        if supervisor.poll() is None:
            supervisor.kill()
    assert supervisor.returncode == 0, stderr[-3000:]
    status = read_state(state_dir)["status"]
    assert status["attempt"] == 1 and status["recoveries"] == {"in_place": 1, "restart": 0}, stderr[-4000:]
    [incident] = read_incidents(state_dir)
    assert incident["tier"] == "in_place" and incident["tier_cost"]["batches_lost"] == 0
    assert f"rank 1 {frozen.pid}" in stderr


class _Numbers(__import__("torch").utils.data.Dataset):
    def __len__(self):
        return 24

    def __getitem__(self, i):
        return i


def test_a_validation_loader_goes_on_at_the_batch_it_waited_for_when_its_frozen_worker_is_replaced():
    """Real loader worker processes: Ultralytics' loader over a sequential sampler (validation's), one worker
    frozen, the command written, the worker killed: the pass yields every batch once, in order."""
    import torch
    from ultralytics.data.build import InfiniteDataLoader

    from worker.loading import loader_recovery
    from worker.wire.commands import CommandChannel
    from worker.wire.contract import Command, CommandKind
    from worker.heartbeat import Heartbeat

    loader = InfiniteDataLoader(_Numbers(), batch_size=2, num_workers=2, shuffle=False)
    read, write = os.pipe()
    try:
        assert loader_recovery.install(loader, "val", CommandChannel(read), Heartbeat(None))
        for _ in range(2):  # a persistent iterator: the second pass is a second validation
            got, batches = [], iter(loader)
            got += next(batches).tolist()  # the workers are up, and have prefetched
            frozen = min(w.pid for w in loader.iterator._workers)
            os.kill(frozen, signal.SIGSTOP)  # whenever it stops, the pass waits for a batch it holds: no race
            os.write(write, Command(CommandKind.REPLACE_LOADER_WORKERS, pids=(frozen,)).to_line())
            os.kill(frozen, signal.SIGKILL)
            got += [i for batch in batches for i in batch.tolist()]
            assert got == list(range(24))
            assert frozen not in {w.pid for w in loader.iterator._workers}
        assert loader.recovery.recoveries == 2
    finally:
        loader.close()
        os.close(write)
        os.close(read)
    assert torch.utils.data.get_worker_info() is None


def rebuild_bound(d: Driver, pid: int) -> float:
    """A stuck loader worker ``pid`` replaced in place now: the bound the tier then gives the rebuilt loader."""
    inspect = stall(d)
    d(in_place.StallInspected(inspect.incident.id, True, (pid,), "waits", None, STACKS))
    d(in_place.LoaderWorkersKilled((pid,), (), 0.1))
    d(core.TreeActivity(idle_since=d.t))  # the rebuild idle: its own bound holds (a busy one's is longer)
    return d.s.current.recovery.bound


def test_the_rebuild_bound_is_this_attempts_own_loader_start_never_another_rungs():
    """Issue 48: at the forkserver rung every rebuild escalated on a bound learned from the fork rung's loader starts
    (3 s, the training process still launching the new workers). The bound is 2 x the longest start of this
    attempt, the start method and worker count in force: a slow start of an earlier attempt raises no later one's,
    and a fast one lowers none."""
    d = Driver(make(restart={"backoff_initial": 0.1}))
    d.boot_and_spawn()
    d.beat("train", kind="phase")
    d.beat("train", kind="loader", pids=[5001, 5002], seconds=4.0, loader="train")  # attempt 1: 4 s to a batch
    d.train_until(1005, 0.5)
    d(core.WorkerExited(1))
    d(core.TreeKilled(killed=3))
    d.at(d.t + 1)(core.Tick())
    d(core.Spawned(PID + 1, None))
    assert d.s.attempt == 2 and d.s.current.loader_start_seen is None
    d.beat("train", kind="phase", pid=PID + 1, progress=1)
    d.beat("train", kind="loader", pid=PID + 1, pids=[5101, 5102], seconds=0.4, loader="train")
    d.progress = 1
    while d.t + 0.5 <= 1020:
        d.t += 0.5
        d.beat(pid=PID + 1, epoch=1, epochs=3, batch=3, batches=10, samples=4)
    assert rebuild_bound(d, 5101) == 3.0  # max(idle_floor, 2 x 0.4 s): not 2 x attempt 1's 4 s
    forkserver = loading()
    forkserver.beat("train", kind="loader", pids=[5001, 5002], seconds=2.6, loader="train")  # its own, slower start
    assert rebuild_bound(forkserver, 5001) == pytest.approx(5.2)


def test_in_place_recoveries_that_worked_do_not_spend_in_place_max():
    """Issue 48: the fourth loader hang of a night went to the restart though the three before had each worked. The
    cap counts in-place recoveries that escalated (a rebuild that brought no batch); those that worked are kept in
    the rung's record, count and cost, for the rung choice."""
    d = loading()
    for n in range(5):
        inspect = stall(d)
        d(in_place.StallInspected(inspect.incident.id, True, (5001,), "waits", None, STACKS))
        d(in_place.LoaderWorkersKilled((5001,), (), 0.1))
        d.at(d.t + 0.5).beat("train", kind="loader", pids=[5001, 5002], seconds=0.4, loader="train")
        assert "IncidentResumed" in kinds(d.beat(epoch=1, epochs=3, batch=4, batches=10, samples=4)), n
    assert d.s.recoveries == {"in_place": 5} and d.s.attempt == 1
    record = d.s.rungs[0]
    assert record.tier_recovered == 5 and record.tier_seconds > 5 * 10
    assert choices.rung_facts(d.s)[0].tier_recovered == 5


def test_in_place_recoveries_that_escalated_spend_in_place_max():
    d = loading(recovery={"in_place_max": 1}, restart={"backoff_initial": 0.1})
    stall_at = d.t
    rebuild_bound(d, 5001)
    escalated(d, d.at(d.t + 3.01)(core.Tick()), "no batch within 3 s")  # a rebuild that brought no batch
    assert d.s.rungs[0].tier_escalated == 1
    d(core.Spawned(PID + 1, None))
    d.beat("train", kind="phase", pid=PID + 1, progress=1)
    d.beat("train", kind="loader", pid=PID + 1, pids=[5101, 5102], seconds=0.4, loader="train")
    d.progress = 1
    while d.t + 0.5 <= stall_at + 40:
        d.t += 0.5
        d.beat(pid=PID + 1, epoch=1, epochs=3, batch=3, batches=10, samples=4)
    actions = d.at(d.t + 10.01)(core.Tick())
    assert "KillTree" in kinds(actions)
    incident = d.s.incidents[-1]
    assert incident.tiers == ("restart",) and "more than in_place_max (1) in-place recoveries that escalated" \
        in incident.escalation, incident


def test_the_batches_after_an_in_place_rebuild_are_timed_against_those_before_and_the_incident_written_then():
    """Issue 59.2: the incident's ``after``, the first PACE_BATCHES training batches after the rebuild's next batch,
    against the batches before the stall; neither the stall's gap nor an epoch's end (validation, the save) is a
    batch's."""
    d = loading()
    inspect = stall(d)
    d(in_place.StallInspected(inspect.incident.id, True, (5001,), "waits for a batch", None, STACKS))
    d.at(d.t + 0.5)(in_place.LoaderWorkersKilled((5001,), (), 0.05))
    d.at(d.t + 0.5).beat("train", kind="loader", pids=[5003], seconds=0.4, loader="train")
    assert "IncidentResumed" in kinds(d.at(d.t + 0.5).beat(epoch=1, epochs=3, batch=4, batches=10, samples=4))
    assert not d.s.incidents[-1].recorded  # its batches after are to come
    written = []
    for n in range(PACE_BATCHES):
        if n == 10:  # an epoch's end: 6 s of validation and its save, then the next epoch's first batch
            d.at(d.t + 3).beat("val", kind="phase")
            d.at(d.t + 2).beat("save", kind="phase")
            d.at(d.t + 1).beat("train", kind="phase")
        written += [a.incident for a in d.at(d.t + 0.6).beat(epoch=2, epochs=3, batch=n % 10 + 1, batches=10, samples=4)
                    if isinstance(a, RecordIncident)]
    assert [i.id for i in written] == [], "the batch after the epoch's end started the count anew, not one of them"
    written = [a.incident for a in d.at(d.t + 0.6).beat(epoch=2, epochs=3, batch=1, batches=10, samples=4)
               if isinstance(a, RecordIncident)]
    assert [i.id for i in written] == [inspect.incident.id]
    after = written[0].to_dict()["after"]
    assert (after["batches"], after["before_batches"]) == (PACE_BATCHES, 19)  # 19: all the attempt had before
    assert after["slowest"] == pytest.approx(0.6) and after["ratio"] == pytest.approx(1.2)
    assert after["extra_seconds"] == pytest.approx(0.1 * PACE_BATCHES)
    assert written[0].to_dict()["tier"] == "in_place"
