"""The decision core on its own: events in, actions out, no processes, no clock."""

from dataclasses import replace

import pytest

from supervisor.decision import core
from supervisor.decision.model.actions import IncidentResumed, PrepareStandby, PrimeStandby, RecordIncident, Spawn
from supervisor.decision.model.incident import Loss, Stacks
from supervisor.decision.model.pace import PACE_BATCHES
from supervisor.decision.model.signatures import scan
from supervisor.decision.model.survivors import Survivor
from supervisor.decision.recovery import probe
from supervisor.decision.stall import watchdog
from supervisor.decision.status_view import snapshot
from supervisor.exit_codes import EXIT_CONFIG, EXIT_FAILED, EXIT_OK, EXIT_REBOOT_NEEDED
from supervisor.vocabulary import KernelKind
from tests.helpers.driver import COMMAND, PID, Driver, healthy, kinds, loading, make, verdicts
from worker.wire.contract import HeartbeatMessage


def test_hang_in_training_is_detected_at_the_auto_timeout_and_climbs_one_rung():
    d = Driver(make())
    assert d.boot_and_spawn().rung == 0
    d.beat("train", kind="phase")
    d.train_until(1010, 0.5)  # healthy at 0.5 s per batch: auto = max(10, 10 x 0.5) = 10 s
    assert d.s.state == core.State.HEALTHY
    last = d.t
    assert verdicts(d.at(last + 9.9)(core.Tick())) == []
    actions = d.at(last + 10.01)(core.Tick())
    assert kinds(actions) == ["Log", "PrimeStandby", "KillTree"]
    incident = actions[-1].incident
    assert (incident.reason, incident.phase, incident.rung) == ("hang", "train", 0)
    assert d.s.state == core.State.STOPPING
    actions = d(core.TreeKilled(killed=3))
    spawn = [a for a in actions if isinstance(a, Spawn)][0]
    # One hang 10 s in is no proof against rung 0 (the prior, rung_choice.py): the same rung again.
    assert (spawn.rung, spawn.rung_settings, spawn.attempt) == (0, {}, 2)
    assert d.s.restarts_by_reason == {"hang": 1} and d.s.hangs_by_phase == {"train": 1}
    # Judged on its own hangs alone, one hang in 10 s of training climbs one rung.
    alone = at_rung_1_after_a_hang()
    assert alone.s.rung == 1 and alone.s.ladder.settings(1) == {"workers": 4}


def test_a_restarts_kill_first_tells_the_standby_asked_for_so_its_loader_is_fed_during_the_kill():
    """Issue 59.1: where a standby was asked for, the kill of a hang's tree is told to it first (PrimeStandby), so a
    ready one loads the resumed batches while the tree dies; a stop that saves first, a run without a standby and a
    kill that ends the run tell it nothing."""
    def hung(**sections):
        d = Driver(make(**sections))
        d.boot_and_spawn()
        d.beat("train", kind="phase")
        d.train_until(1010, 0.5)
        return d, d.at(d.t + 10.01)(core.Tick())

    d, actions = hung()
    assert kinds(actions) == ["Log", "PrimeStandby", "KillTree"] and actions[1] == PrimeStandby()
    _, actions = hung(worker={"standby": False})
    assert kinds(actions) == ["Log", "KillTree"]
    stopped = healthy()
    assert "PrimeStandby" not in kinds(stopped(core.StopRequested("SIGTERM")))  # it saves first, then exits
    stopped.beat("save", kind="checkpoint", path="/x/last.pt", epoch=1, batch=20, progress=stopped.progress)
    assert stopped(core.WorkerExited(0)) == [core.KillTree(None)]


def test_a_standby_is_asked_for_once_the_attempts_own_start_is_done_with_the_rung_a_hang_moves_to():
    d = Driver(make())
    d.boot_and_spawn()
    for name in ("checkpoint", "model", "amp_check", "dataset", "loaders"):  # its own start: never shared with one
        assert "PrepareStandby" not in kinds(d.beat("setup", kind="step", step=name))
    # The first batch's step: the loader's workers make it. A first batch that never runs (the seeds' most frequent
    # hang) then restarts from a standby.
    standby = standbys(d.beat("setup", kind="step", step="first_batch"))
    # rung 1's settings: where a hang goes next; its loader held for rung 0's (the same environment, test below)
    assert standby == [PrepareStandby({"workers": 4}, {})]
    assert "PrepareStandby" not in kinds(d.beat("setup", kind="step", step="first_batch", done=1, total=2))
    assert "PrepareStandby" not in kinds(d.beat("setup", kind="step", step="first_step"))
    assert "PrepareStandby" not in kinds(d.beat("train", kind="phase"))
    assert "PrepareStandby" not in kinds(d.at(1001).beat(epoch=1, epochs=3, batch=1, batches=10))  # the same rung
    assert "PrepareStandby" not in kinds(d.at(1002).beat(epoch=1, epochs=3, batch=2, batches=10))  # once an attempt
    # A word of the witness in an earlier step (the model's profile, slow on a loaded machine) is of a wait that is
    # over: the standby is made for where a hang would go now, once (it was made for rung 0, then again for rung 1).
    worded = Driver(make())
    worded.boot_and_spawn()
    worded.beat("setup", kind="step", step="model")
    worded.beat("setup", kind="wait", progress=worded.progress,
                wait={"kind": "elsewhere", "where": "thop/profile.py:211 in __torch_function__", "stalled": 1.0})
    assert standbys(worded.beat("setup", kind="step", step="first_batch")) == [PrepareStandby({"workers": 4}, {})]
    assert "PrepareStandby" not in kinds(worded.beat("train", kind="phase"))
    assert "PrepareStandby" not in kinds(worded.at(1001).beat(epoch=1, epochs=3, batch=1, batches=10))
    unreported = Driver(make())  # a worker that reports no startup steps: at its first batch
    unreported.boot_and_spawn()
    assert standbys(unreported.at(1001).beat(epoch=1, epochs=3, batch=1, batches=10)) == \
        [PrepareStandby({"workers": 4}, {})]
    off = Driver(make(worker={"standby": False}))
    off.boot_and_spawn()
    assert "PrepareStandby" not in kinds(off.beat("setup", kind="step", step="first_batch"))
    assert "PrepareStandby" not in kinds(off.at(1001).beat(epoch=1, epochs=3, batch=1, batches=10))


def standbys(actions) -> list:
    return [a for a in actions if isinstance(a, PrepareStandby)]


def test_the_standby_follows_the_rung_a_hang_would_move_to_as_the_attempt_trains():
    d = Driver(make())
    d.boot_and_spawn()
    d.beat("train", kind="phase")
    assert standbys(d.at(1001).beat(epoch=1, epochs=3, batch=1, batches=10)) == \
        [PrepareStandby({"workers": 4}, {})]
    # Hang-free training lowers rung 0's hang rate (the prior): a hang 10 s in stays at rung 0
    # (test_hang_in_training_is_detected...). The standby made for rung 1 would not serve it: one for rung 0 is asked
    # for, once, at a review (every standby.REVIEW_EVERY seconds of training), not at every batch.
    later = train(d, 30, PID)
    assert standbys(later) == [PrepareStandby({})]
    d.at(d.t + 10.01)(core.Tick())
    spawn = [a for a in d(core.TreeKilled(killed=1)) if isinstance(a, Spawn)][0]
    assert spawn.rung_settings == {}  # where the standby was made for


def test_a_ready_standbys_loader_is_held_for_the_current_rung_where_both_rungs_share_an_environment():
    """Issue 48.5: a standby is made for the rung an evidence-free hang would move to, but a restart's hang mostly
    keeps the rung once its evidence is read (a spin, a lock, a frozen tree); where a launch at the current rung would
    take the same standby (the same environment), its held datasets and loader workers are the current rung's, not
    dropped at that launch. A standby of another environment serves only the other rung: it holds that one's."""
    for rungs, after, held in (([{"workers": 4}], {"workers": 4}, {}),
                               ([{"env": {"HSA_ENABLE_INTERRUPT": "0"}}], {"env": {"HSA_ENABLE_INTERRUPT": "0"}}, None)):
        d = Driver(make(ladder={"rungs": rungs, "prior_between_hangs": "off"}))
        d.boot_and_spawn()
        [standby] = standbys(d.beat("setup", kind="step", step="first_batch"))
        assert standby == PrepareStandby(after, held)
        # what the shell builds the ready standby for (agent.py): rung 0's empty settings are settings too
        assert standby.held == (after if held is None else held)


def test_once_an_attempt_trained_with_amp_on_the_next_attempts_are_told_its_check_passed():
    for amp, told in ((True, True), (False, False)):
        d = Driver(make())
        assert d.boot_and_spawn().amp_passed is False  # the first attempt checks
        d.beat("setup", kind="settings", settings={"amp": amp, "device": "cuda:0"})
        d.beat("train", kind="phase")
        d.train_until(1010, 0.5)
        d.at(d.t + 10.01)(core.Tick())
        spawn = [a for a in d(core.TreeKilled(killed=1)) if isinstance(a, Spawn)][0]
        assert spawn.amp_passed is told


def test_auto_timeout_follows_the_slowest_recent_interval():
    d = Driver(make())
    d.boot_and_spawn()
    d.beat("train", kind="phase")
    d.train_until(1030, 3.0)  # 3 s per batch: 30 s timeout, not the 10 s floor
    last = d.t
    assert d.at(last + 25)(core.Tick()) == []
    assert "KillTree" in kinds(d.at(last + 30.1)(core.Tick()))


def test_a_beat_without_progress_is_not_progress():
    d = Driver(make())
    d.boot_and_spawn()
    d.beat("train", kind="phase")
    d.train_until(1005, 0.5)
    last, counter = d.t, d.progress
    for dt in range(1, 10):
        d.at(last + dt).beat(progress=counter)  # keep-alive pings with the same counter
    assert "KillTree" in kinds(d.at(last + 10.01)(core.Tick()))


def test_messages_from_other_processes_never_count_as_progress():
    d = Driver(make())
    d.boot_and_spawn()
    d.beat("train", kind="phase")
    d.train_until(1005, 0.5)
    last = d.t
    for dt in range(1, 10):
        d.at(last + dt).beat(pid=PID + 1, progress=10_000 + dt)  # a DataLoader worker's stray beats
    assert d.s.messages_ignored == 9
    assert "KillTree" in kinds(d.at(last + 10.01)(core.Tick()))


def test_startup_timeout_covers_spawn_to_first_training_batch():
    d = Driver(make(watchdog={"startup_timeout": 60}))
    d.boot_and_spawn()
    d.at(1030).beat("setup", kind="phase")  # setup messages do not end startup
    d.at(1031).beat("train", kind="phase")
    assert verdicts(d.at(1059)(core.Tick())) == []
    actions = d.at(1060.1)(core.Tick())
    assert actions[-1].incident.phase == "startup"


def test_validation_uses_val_intervals_and_falls_back_to_training_ones():
    d = Driver(make())
    d.boot_and_spawn()
    d.beat("train", kind="phase")
    d.train_until(1010, 2.0)  # train: 20 s auto
    d.at(d.t + 1).beat("val", kind="phase")
    last = d.t
    assert verdicts(d.at(last + 19)(core.Tick())) == []  # no val interval yet: the training ones decide
    actions = d.at(last + 20.1)(core.Tick())
    assert actions[-1].incident.phase == "val"


def test_numeric_stall_timeout_overrides_auto():
    d = Driver(make(watchdog={"stall_timeout": 3}))
    d.boot_and_spawn()
    d.beat("train", kind="phase")
    d.train_until(1005, 0.5)
    assert "KillTree" in kinds(d.at(d.t + 3.01)(core.Tick()))


def test_crash_restarts_after_backoff_at_the_same_rung_and_climbs_when_it_repeats():
    d = Driver(make(restart={"backoff_initial": 2}))
    d.boot_and_spawn()
    d.beat("train", kind="phase")
    d.train_until(1005, 0.5)
    d.beat(kind="error", progress=d.progress, error="RuntimeError: boom")
    assert "KillTree" in kinds(d(core.WorkerExited(1)))
    assert d.s.incidents[-1].reason == "crash"
    assert "RuntimeError: boom" in d.s.incidents[-1].detail
    d(core.TreeKilled(killed=1))
    assert d.s.state == core.State.BACKOFF and d.s.rung == 0
    assert d.at(d.t + 1.9)(core.Tick()) == []
    spawn = d.at(d.t + 0.2)(core.Tick())[0]
    assert isinstance(spawn, Spawn) and spawn.rung == 0
    d(core.Spawned(PID + 1, "/x/last.pt"))
    d.beat(pid=PID + 1, progress=1, epoch=1, epochs=3, batch=11, batches=20)  # it trains again, then crashes
    d.beat("train", kind="error", pid=PID + 1, progress=1, error="RuntimeError: boom again")
    d(core.WorkerExited(1))
    d(core.TreeKilled(killed=1))
    assert d.s.rung == 1  # the same failure twice: one rung safer
    assert d.s.backoff_until - d.t == pytest.approx(2.0)  # it trained in between: the backoff starts over


def test_signal_deaths_are_named():
    d = Driver(make())
    d.boot_and_spawn()
    d(core.WorkerExited(-11))
    assert d.s.incidents[-1].detail == "killed by SIGSEGV"


def test_restart_budget_ends_the_supervisor_with_a_clear_error():
    d = Driver(make(restart={"max_restarts": 2, "window": 600}, watchdog={"startup_timeout": 5}))
    d.boot_and_spawn()
    exits = []
    for i in range(3):
        d.at(d.t + 6)(core.Tick())
        actions = d(core.TreeKilled(killed=1))
        exits = [a for a in actions if isinstance(a, core.Exit)]
        if not exits:
            d(core.Spawned(PID + i + 1, None))
    assert len(exits) == 1 and exits[0].code == EXIT_FAILED
    assert "restart budget spent: 3 restarts" in exits[0].text and "max_restarts = 2" in exits[0].text
    assert d.s.state == core.State.FAILED


def test_restart_budget_window_forgets_old_restarts():
    d = Driver(make(restart={"max_restarts": 1, "window": 100}, watchdog={"startup_timeout": 5}))
    d.boot_and_spawn()
    d.at(d.t + 6)(core.Tick())
    d(core.TreeKilled(killed=1))
    d(core.Spawned(PID + 1, None))
    d.at(d.t + 200)(core.Tick())  # the first restart is out of the window by now
    actions = d(core.TreeKilled(killed=1))
    assert any(isinstance(a, Spawn) for a in actions)


def test_survivors_of_sigkill_in_the_gpu_driver_mean_reboot_and_no_new_worker():
    d = Driver(make(watchdog={"startup_timeout": 5}))
    d.boot_and_spawn()
    d.at(d.t + 6)(core.Tick())
    actions = d(core.TreeKilled(killed=2, survivors=(Survivor(77, "python", "disk-sleep", ("kfd_wait_on_events",)),)))
    assert kinds(actions) == ["RecordIncident", "Exit"]
    assert actions[1].code == EXIT_REBOOT_NEEDED and "reboot" in actions[1].text and "pid 77" in actions[1].text


def test_normal_completion_exits_zero():
    d = Driver(make())
    d.boot_and_spawn()
    d.beat("train", kind="phase")
    d.beat()
    d.beat("done", kind="phase")
    assert kinds(d(core.WorkerExited(0))) == ["KillTree"]
    actions = d(core.TreeKilled(killed=0))
    assert actions == [core.Exit(EXIT_OK, "training finished after 1 attempt(s)")]
    assert d.s.state == core.State.SUCCEEDED


def test_a_worker_that_never_exits_after_done_is_killed_and_the_run_succeeds_without_a_restart():
    d = Driver(make(watchdog={"save_timeout": 20}))
    d.boot_and_spawn()
    d.beat("train", kind="phase")
    d.beat()
    d.beat("done", kind="phase")
    assert verdicts(d.at(d.t + 19)(core.Tick())) == []
    actions = d.at(d.t + 2)(core.Tick())
    assert kinds(actions) == ["Log", "KillTree"]
    incident = actions[1].incident
    assert (incident.reason, incident.phase) == ("hang", "done") and "nothing is lost" in incident.detail
    assert incident.loss.seconds == 0.0 and d.s.goodput.lost_seconds == 0.0
    assert d(core.TreeKilled(killed=3))[-1] == core.Exit(EXIT_OK, "training finished after 1 attempt(s)")
    assert (d.s.state, d.s.rung, d.s.restarts_by_reason, d.s.hangs_by_phase) == (
        core.State.SUCCEEDED, 0, {}, {"done": 1})


def test_exit_zero_before_done_is_a_crash():
    d = Driver(make())
    d.boot_and_spawn()
    d(core.WorkerExited(0))
    assert d.s.incidents[-1].reason == "crash"


def test_stop_asks_for_a_checkpoint_then_exits_zero_without_restart():
    d = healthy()
    actions = d(core.StopRequested("SIGTERM"))
    assert kinds(actions) == ["Log", "Log", "RequestCheckpoint"]
    d.beat("save", kind="checkpoint", path="/x/last.pt", epoch=1, batch=20, progress=d.progress)
    assert d(core.WorkerExited(0)) == [core.KillTree(None)]  # saved and gone: clean up the rest
    actions = d(core.TreeKilled(killed=0))
    assert kinds(actions) == ["RecordIncident", "Exit"] and actions[1].code == EXIT_OK
    assert "after saving a checkpoint" in actions[1].text
    assert d.s.state == core.State.STOPPED and d.s.restart_times == []


def test_a_stop_whose_save_failed_says_no_checkpoint_was_written_and_counts_the_loss():
    d = healthy()  # 20 batches in 9.5 s since the first, no checkpoint yet
    d(core.StopRequested("SIGTERM"))
    actions = d(core.WorkerExited(0))  # a full disk: our worker exits 0 after its save failed, no checkpoint said
    assert kinds(actions) == ["Log", "KillTree"] and actions[1].incident.loss.batches == 20
    exit = d(core.TreeKilled(killed=0))[-1]
    assert exit.code == EXIT_OK and "without a new checkpoint (none was written: the 10 s and 20 batches" in exit.text
    assert d.s.goodput.lost_seconds == pytest.approx(9.5) and d.s.goodput.lost_batches == 20
    assert d.s.incidents[-1].loss.seconds == pytest.approx(9.5)


def test_a_checkpoint_written_in_the_background_loses_the_batches_after_its_position_not_after_its_message():
    """The worker copies the model at batch 20 and a thread writes it: "checkpoint written" comes two batches later.
    A hang then throws away batches 21-30 (the next worker resumes at 20), and the time since batch 20's beat."""
    d = Driver(make())
    d.boot_and_spawn()
    d.beat("train", kind="phase")
    for batch in range(1, 23):
        d.at(1000 + 0.5 * batch).beat(epoch=1, epochs=3, batch=batch, batches=40, samples=4)
    d.beat("train", kind="checkpoint", path="/s/last.pt", seconds=0.05, epoch=1, batch=20, progress=d.progress)
    for batch in range(23, 31):
        d.at(1000 + 0.5 * batch).beat(epoch=1, epochs=3, batch=batch, batches=40, samples=4)
    incident = [a for a in d.at(d.t + 10.01)(core.Tick()) if hasattr(a, "incident")][0].incident
    assert incident.loss == Loss(seconds=5.0, batches=10)
    assert d.s.goodput.lost_batches == 10


def test_a_worker_that_finishes_while_asked_to_save_has_succeeded():
    d = healthy()
    d(core.StopRequested("SIGTERM"))
    d.beat("done", kind="phase")
    d(core.WorkerExited(0))
    assert d(core.TreeKilled(killed=0))[-1].code == EXIT_OK and d.s.state == core.State.SUCCEEDED


def test_a_second_stop_or_the_save_timeout_kills_without_waiting():
    d = healthy(watchdog={"save_timeout": 60})
    d(core.StopRequested("SIGINT"))
    assert kinds(d(core.StopRequested("SIGINT"))) == ["Log", "KillTree"]
    d2 = healthy(watchdog={"save_timeout": 60})
    d2(core.StopRequested("SIGTERM"))
    asked = d2.t
    d2.train_until(asked + 59, 0.5)  # it trains on but never saves
    assert d2(core.Tick()) == []
    assert kinds(d2.at(asked + 60.1)(core.Tick())) == ["Log", "KillTree"]
    assert "without a new checkpoint" in d2(core.TreeKilled(killed=3))[-1].text


def test_a_hung_worker_asked_to_save_is_killed_at_its_stall_timeout_not_the_save_timeout():
    d = healthy(watchdog={"save_timeout": 300})  # 0.5 s batches: the auto stall timeout is 10 s
    last = d.t
    d.at(last + 1)(core.StopRequested("SIGTERM"))
    assert d.at(last + 9.9)(core.Tick()) == []
    actions = d.at(last + 10.01)(core.Tick())
    assert kinds(actions) == ["Log", "KillTree"] and "it is hung" in actions[0].text


def test_stop_before_the_first_batch_kills_at_once():
    d = Driver(make())
    d.boot_and_spawn()  # still starting: its checkpoint is the one it resumed from
    assert kinds(d(core.StopRequested("SIGTERM"))) == ["Log", "KillTree"]
    assert d(core.TreeKilled(killed=2))[-1].code == EXIT_OK and d.s.state == core.State.STOPPED


def test_a_restored_supervisor_continues_at_its_rung():
    first = Driver(make(watchdog={"startup_timeout": 5}))
    first.boot_and_spawn()
    first.at(first.t + 6)(core.Tick())
    first(core.TreeKilled(killed=1))
    record = first.s.persistent(first.t)
    second = Driver(make())
    second.s.restore(record)
    spawn = [a for a in second(core.Boot()) if isinstance(a, Spawn)][0]
    assert spawn.rung == 1 and spawn.attempt == 3  # attempt 2 was spawned before the first supervisor died
    assert second.s.restart_times == record["restart_times"]


def test_a_finished_training_is_not_started_again():
    d = Driver(make())
    d.s.restore({"state": "succeeded", "rung": 2})
    assert kinds(d(core.Boot())) == ["Exit"]


def test_intervals_are_per_attempt_so_a_slower_rung_gets_a_longer_timeout():
    d = Driver(make(watchdog={"startup_timeout": 100}))
    d.boot_and_spawn()
    d.beat("train", kind="phase")
    d.train_until(1010, 0.2)
    d.at(d.t + 11)(core.Tick())
    d(core.TreeKilled(killed=1))
    d(core.Spawned(PID + 1, None))
    d.progress = 0
    d.beat("train", kind="phase", pid=PID + 1)
    for _ in range(5):
        d.t += 4.0  # workers=0 runs 20x slower per batch
        d.beat(pid=PID + 1)
    assert verdicts(d.at(d.t + 39)(core.Tick())) == []


def test_exhausted_ladder_keeps_the_top_rung_and_says_so():
    d = Driver(make(workers=0, watchdog={"startup_timeout": 5}))
    d.boot_and_spawn()
    for i in range(2):
        d.at(d.t + 6)(core.Tick())
        actions = d(core.TreeKilled(killed=1))
        d(core.Spawned(PID + i + 1, None))
    assert d.s.rung == 1
    assert any(isinstance(a, core.Log) and "ladder exhausted" in a.text for a in actions)


def test_snapshot_reports_rates_progress_and_eta():
    d = Driver(make())
    d.boot_and_spawn()
    d.beat("train", kind="phase")
    for i in range(1, 6):
        d.t += 0.5
        d.beat(epoch=2, epochs=3, batch=i, batches=10, samples=4)
    snap = snapshot(d.s, core.Now(d.t, 0)).to_dict()
    assert snap["it_s"] == pytest.approx(2.0) and snap["samples_s"] == pytest.approx(8.0)
    assert snap["progress"] == pytest.approx(15 / 30)
    assert snap["eta_seconds"] == pytest.approx(15 / 2.0)


# Kernel messages ---------------------------------------------------------------------------------------------

SEEDS_LINE = ("workqueue: amdgpu_amdkfd_restore_userptr_worker [amdgpu] hogged CPU for >10000us 4 times, "
              "consider switching to WQ_UNBOUND")


def kernel(kind="stall", pid=None, in_tree=None, message=SEEDS_LINE):
    return core.KernelMessage(kind=KernelKind(kind), message=message, source="kmsg", pattern="amdkfd_workqueue_hog", pid=pid,
                              in_worker_tree=in_tree)


def test_a_stall_line_without_progress_kills_within_the_confirm_window():
    d = healthy(watchdog={"stall_timeout": 600}, kernel_log={"confirm_window": 10})
    t0 = d.t
    assert kinds(d(kernel())) == ["Log"]
    assert d.at(t0 + 9.9)(core.Tick()) == []
    actions = d.at(t0 + 10.0)(core.Tick())
    incident = actions[-1].incident
    assert incident.reason == "kernel" and incident.kernel_events[0]["message"] == SEEDS_LINE
    d(core.TreeKilled(killed=3))
    assert d.s.rung == 0 and d.s.kernel_events == {"stall": 1}  # one hang 10 s in: no proof against rung 0


def test_a_stall_line_while_training_progresses_kills_nothing():
    d = healthy(watchdog={"stall_timeout": 600})
    d(kernel())
    d.at(d.t + 0.5).beat()
    assert d.s.current.suspicion is None
    assert d.at(d.t + 30)(core.Tick()) == []  # only the stall timeout (600 s) is left
    assert d.s.kernel_events == {"stall": 1} and d.s.incidents == []


# Kernel lines seen in the field since the catalogue was written (issue 30; tests/fixtures/kernel/amdkfd_svm.dmesg)
FIELD_LINES = [
    ("stall", "workqueue: svm_range_restore_work [amdgpu] hogged CPU for >10000us 259 times, consider switching to "
              "WQ_UNBOUND"),
    ("stall", "workqueue: kfd_process_wq_release [amdgpu] hogged CPU for >10000us 4 times, consider switching to "
              "WQ_UNBOUND"),
    ("stall", "workqueue: svm_range_deferred_list_work [amdgpu] hogged CPU for >10000us 5 times, consider switching "
              "to WQ_UNBOUND"),
    ("gpu_fault", "amdgpu 0000:03:00.0: amdgpu: GCVM_L2_PROTECTION_FAULT_STATUS:0x00801031"),
    ("gpu_fault", "amdgpu 0000:c5:00.0: amdgpu: failed to remove hardware queue from MES, doorbell=0x1002"),
]


@pytest.mark.parametrize("kind, line", FIELD_LINES)
def test_the_field_lines_are_evidence_while_progress_stops_and_never_kill_while_training_progresses(kind, line):
    from supervisor.kernel.catalogue import classify

    found = classify(line)
    assert found is not None and found.kind == kind
    event = core.KernelMessage(kind=KernelKind(kind), message=line, source="kmsg", pattern=found.pattern)
    d = healthy(watchdog={"stall_timeout": 600}, kernel_log={"confirm_window": 10})
    d(event)
    d.at(d.t + 0.5).beat()  # training goes on: the line was about something else
    assert d.at(d.t + 30)(core.Tick()) == [] and d.s.incidents == []
    stopped = healthy(watchdog={"stall_timeout": 600}, kernel_log={"confirm_window": 10})
    t0 = stopped.t
    stopped(event)
    assert stopped.at(t0 + 9.9)(core.Tick()) == []
    incident = stopped.at(t0 + 10.0)(core.Tick())[-1].incident  # no progress within the confirm window
    assert incident.reason == "kernel" and incident.kernel_events[0]["pattern"] == found.pattern


def test_a_line_about_another_process_only_counts():
    d = healthy(watchdog={"stall_timeout": 600})
    d(kernel(pid=999, in_tree=False, message="INFO: task kworker:999 blocked for more than 122 seconds."))
    assert d.s.current.suspicion is None and d.s.kernel_events == {"stall": 1}


def test_gpu_lost_kills_and_ends_with_reboot_needed():
    d = healthy()
    actions = d(kernel("gpu_lost", message="amdgpu 0000:03:00.0: amdgpu: GPU reset(2) failed"))
    assert kinds(actions) == ["Log", "KillTree"]
    actions = d(core.TreeKilled(killed=3))
    assert kinds(actions) == ["RecordIncident", "Exit"] and actions[1].code == EXIT_REBOOT_NEEDED
    assert "GPU is lost" in actions[1].text and d.s.reboot_needed


def test_oom_kill_of_a_worker_process_names_the_crash():
    d = healthy()
    d(kernel("oom", pid=4300, in_tree=True, message="Out of memory: Killed process 4300 (python)"))
    d(core.WorkerExited(-9))
    incident = d.s.incidents[-1]
    assert incident.reason == "oom" and "OOM killer took pid 4300" in incident.detail
    d(core.TreeKilled(killed=1))
    assert d.s.restarts_by_reason == {"oom": 1} and d.s.rung == 0


# Work kept and lost (goodput), and the phases without a batch rhythm ----------------------------------------

def test_a_hang_loses_only_the_training_after_the_newest_checkpoint_and_the_incident_says_how_much():
    d = healthy()  # 0.5 s batches from t=1000 to 1010
    actions = d.beat("train", kind="checkpoint", path="/s/train/weights/last.pt", seconds=0.2, epoch=1, batch=20,
                     progress=d.progress)
    assert [type(a).__name__ for a in actions] == ["KeepVerifiedCopy"] and actions[0].path.endswith("last.pt")
    d.train_until(1014, 0.5)  # 8 more batches, 4 s of training after the checkpoint
    actions = d.at(d.t + 10.01)(core.Tick())
    incident = actions[-1].incident
    assert incident.loss == Loss(seconds=4.0, batches=8)
    assert incident.resumes_from == {"epoch": 1, "batch": 20, "path": "/s/train/weights/last.pt"}
    assert d.s.goodput.lost_seconds == 4.0 and d.s.trained() == pytest.approx(13.5)  # first batch at 1000.5
    d(core.TreeKilled(killed=1))
    d(core.Spawned(PID + 1, "/s/train/weights/last.pt"))
    d.at(d.t + 3)
    d.beat(pid=PID + 1, progress=1, epoch=1, epochs=3, batch=21, batches=40)
    assert d.s.incidents[-1].restart_seconds == pytest.approx(3.0)  # detection to the first new batch
    snap = snapshot(d.s, core.Now(d.t, 1_700_000_000 + d.t)).to_dict()
    assert snap["lost_seconds"] == 4.0 and snap["lost_batches"] == 8
    # kept 9.5 s of the 27 s since the boot at t=1000
    assert snap["goodput"] == pytest.approx((13.5 - 4.0) / (d.t - 1000.0))


def test_without_any_checkpoint_the_whole_attempt_is_lost():
    d = healthy()
    incident = d.at(d.t + 10.01)(core.Tick())[-1].incident
    assert incident.loss.batches == 20 and incident.loss.seconds == pytest.approx(9.5)
    assert incident.resumes_from is None


def test_a_stop_that_saves_loses_nothing():
    d = healthy()
    d(core.StopRequested())
    d.beat("train", kind="checkpoint", path="/x/last.pt", epoch=1, batch=19, progress=d.progress)
    d(core.WorkerExited(0))
    d(core.TreeKilled(killed=1))
    assert d.s.goodput.lost_seconds == 0.0 and d.s.incidents[-1].loss.seconds == 0.0
    assert d.s.exit.code == EXIT_OK and "after saving a checkpoint" in d.s.exit.text


def epoch_end(d: Driver, gap: float) -> None:
    """The worker's end of an epoch: save phase, validation, the save, then the next epoch's first phase."""
    d.at(d.t + 0.5).beat("save", kind="phase", epoch=1, epochs=3, batch=10, batches=10)
    d.at(d.t + gap).beat("val", kind="phase")
    d.at(d.t + 0.2).beat("val")
    d.at(d.t + 0.2).beat("save", kind="phase")
    d.at(d.t + gap).beat("save")  # on_model_save: the save itself
    d.at(d.t + 0.5).beat("train", kind="phase")


def test_the_end_of_an_epoch_is_bounded_by_what_the_run_observed_once_it_saw_one():
    d = healthy(watchdog={"save_timeout": 300})
    d.at(d.t + 0.5).beat("save", kind="phase", epoch=1, epochs=3, batch=10, batches=10)
    assert d.s.watch.deadline.at - d.t == 300  # nothing observed yet: the generous allowance
    d.at(d.t + 2.0).beat("val", kind="phase")
    d.at(d.t + 0.2).beat("val")
    d.at(d.t + 0.2).beat("save", kind="phase")
    d.at(d.t + 2.5).beat("save")
    d.at(d.t + 0.5).beat("train", kind="phase")
    assert d.s.watch.deadline.label == "save_timeout"  # until the next epoch's first batch, this is still its end
    d.train_until(d.t + 5, 0.5)
    assert d.s.epoch_end_seen == 2.5
    # the next epoch's end: 10 x 2.5 s, not 300 s
    d.at(d.t + 0.5).beat("save", kind="phase", epoch=1, epochs=3, batch=10, batches=10)
    due = d.s.watch.deadline
    assert (due.at - d.t, due.label) == (25.0, "save auto")
    actions = d.at(d.t + 25.01)(core.Tick())
    assert actions[-1].incident.phase == "save" and actions[-1].incident.reason == "hang"


def test_a_mid_epoch_checkpoint_bounds_the_next_one_and_never_an_epochs_end():
    """A long first epoch checkpoints inside it (every 10 min until a hang, more often after): a 0.3 s hold must not
    bound the epoch's end (10 x 0.5 s, then the floor: a 12 s validation set-up was killed as a hang), and a freeze
    inside a later checkpoint is found at the floor, not after the 300 s an unseen epoch end is given."""
    d = healthy(watchdog={"save_timeout": 300})  # 0.5 s batches; no epoch end seen yet
    d.at(d.t + 0.5).beat("save", kind="phase", epoch=1, epochs=3, batch=5, batches=10)
    assert d.s.watch.deadline.label == "save_timeout"  # the first checkpoint: as an epoch's end, nothing seen
    d.at(d.t + 0.3).beat("train", kind="phase")
    d.at(d.t + 0.5).beat(epoch=1, epochs=3, batch=6, batches=10)
    assert (d.s.checkpoint_seen, d.s.epoch_end_seen) == (0.5, None)
    d.train_until(d.t + 2, 0.5)
    d.at(d.t + 0.5).beat("save", kind="phase", epoch=1, epochs=3, batch=10, batches=10)  # the epoch's end
    due = d.s.watch.deadline
    assert (due.at - d.t, due.label) == (300.0, "save_timeout")
    assert d.at(d.t + 12)(core.Tick()) == []  # a 12 s validation set-up is no hang
    d.at(d.t).beat("val", kind="phase")
    d.at(d.t + 0.2).beat("val")
    d.at(d.t + 0.2).beat("save", kind="phase", epoch=1, epochs=3, batch=10, batches=10)
    d.at(d.t + 1.0).beat("save")
    d.at(d.t + 0.5).beat("train", kind="phase")
    d.at(d.t + 1.5).beat(epoch=2, epochs=3, batch=1, batches=10)
    assert (d.s.checkpoint_seen, d.s.epoch_end_seen) == (0.5, 12.0)
    d.train_until(d.t + 2, 0.5)
    d.at(d.t + 0.5).beat("save", kind="phase", epoch=2, epochs=3, batch=5, batches=10)  # the next checkpoint
    due = d.s.watch.deadline
    assert (due.at - d.t, due.label) == (10.0, "checkpoint auto")  # its own: max(floor, 10 x 0.5 s)
    actions = d.at(d.t + 10.01)(core.Tick())
    assert kinds(actions) == ["Log", "PrimeStandby", "KillTree"] and actions[-1].incident.phase == "save"


def test_later_startups_of_a_worker_that_reports_no_steps_are_bounded_by_the_startup_this_run_saw():
    d = Driver(make(watchdog={"startup_timeout": 600}))
    d.boot_and_spawn()
    assert d.s.watch.deadline.at - d.t == 600
    d.at(d.t + 3.0).beat(epoch=1, epochs=3, batch=1, batches=10)  # first batch 3 s after spawn
    d.at(d.t + 0.5).beat(epoch=1, epochs=3, batch=2, batches=10)
    d.at(d.t + 11)(core.Tick())  # hang
    d(core.TreeKilled(killed=1))
    d(core.Spawned(PID + 1, None))
    due = d.s.watch.deadline
    # Its whole startup is its first step, "imports": max(auto_floor, 10 x 3 s)
    assert (due.at - d.t, due.label) == (30.0, "imports auto")


def test_a_kernel_stall_line_during_startup_opens_the_confirm_window():
    d = Driver(make(watchdog={"startup_timeout": 600}, kernel_log={"confirm_window": 10}))
    d.boot_and_spawn()
    d.at(d.t + 5)(kernel(in_tree=None))
    assert d.s.watch.deadline.label == "kernel confirm window" and d.s.watch.deadline.at == d.t + 10
    actions = d.at(d.t + 10.01)(core.Tick())
    assert actions[1].incident.reason == "kernel" and actions[1].incident.phase == "startup"


def test_a_worker_that_exits_78_is_a_configuration_error_not_a_restart():
    d = Driver(make())
    d.boot_and_spawn()
    line = "yolo-train worker: last.pt: checkpoint of another training (model: checkpoint yolov8s.yaml, config yolov8n.yaml)"
    actions = d(core.WorkerExited(78, line))
    assert kinds(actions) == ["Log", "KillTree"]
    actions = d(core.TreeKilled(killed=1))
    assert d.s.exit.code == 78 and "checkpoint of another training" in d.s.exit.text and d.s.attempt == 1


def test_a_rung_shows_environment_variables_by_name_never_their_values():
    s = make(ladder={"rungs": [{"env": {"HF_TOKEN": "hunter2", "HSA_ENABLE_INTERRUPT": "0"}}, {"workers": 0}]})
    assert s.ladder.label(2) == "env=HF_TOKEN+HSA_ENABLE_INTERRUPT, workers=0"
    snap = snapshot(s, core.Now(0.0, 0.0)).to_dict()
    s.rung = 2
    assert "hunter2" not in str(snapshot(s, core.Now(0.0, 0.0)).to_dict()) + str(snap)


def test_a_gpu_lost_line_ends_the_run_only_as_the_kernels_own_word_about_a_gpu_it_uses():
    lost = "amdgpu 0000:03:00.0: amdgpu: GPU reset(2) failed"
    forged = healthy()  # device unset: a GPU training
    forged(core.KernelMessage(KernelKind.GPU_LOST, lost, "kmsg", "amdgpu_reset_failed", trusted=False))
    assert not forged.s.reboot_needed and forged.s.current.suspicion is not None  # suspicion, confirmed by a stall only
    forged.beat(epoch=1, epochs=3, batch=2, batches=10)
    assert forged.s.current.suspicion is None and forged.s.state == core.State.HEALTHY
    on_cpu = Driver(make())
    on_cpu.s.config.train["device"] = "cpu"
    on_cpu.boot_and_spawn()
    actions = on_cpu(core.KernelMessage(KernelKind.GPU_LOST, lost, "kmsg", "amdgpu_reset_failed"))
    assert kinds(actions) == ["Log"] and not on_cpu.s.reboot_needed and on_cpu.s.kernel_events == {"gpu_lost": 1}
    drill = Driver(make())
    drill.s.config.train["device"] = "cpu"
    drill.boot_and_spawn()
    drill(core.KernelMessage(KernelKind.GPU_LOST, lost, "kmsg", "amdgpu_reset_failed", trusted=False, drill=True))
    drill(core.TreeKilled(killed=1))
    assert drill.s.reboot_needed and drill.s.exit.code == EXIT_REBOOT_NEEDED


def test_the_same_failure_before_the_first_batch_twice_is_a_configuration_error_whatever_the_rung():
    d = Driver(make(restart={"backoff_initial": 1}))
    d.boot_and_spawn()
    d.beat("setup", kind="error", error="ValueError: imgsz='big' is not a valid image size")
    d(core.WorkerExited(1, "ValueError: imgsz='big' is not a valid image size"))
    d(core.TreeKilled(killed=1))
    assert d.s.state == core.State.BACKOFF and d.s.rung == 0  # before a batch: no rung can help, none is climbed
    d.at(d.t + 1.01)(core.Tick())
    d(core.Spawned(PID + 1, None))
    d.beat("setup", kind="error", pid=PID + 1, progress=1, error="ValueError: imgsz='big' is not a valid image size")
    d(core.WorkerExited(1))
    d(core.TreeKilled(killed=1))
    assert d.s.exit.code == 78 and d.s.attempt == 2 and d.s.rung == 0
    assert "imgsz='big'" in d.s.exit.text and "two attempts" in d.s.exit.text


def test_a_different_failure_before_the_first_batch_is_retried_and_a_batch_forgets_the_first():
    d = Driver(make(restart={"backoff_initial": 1}))
    d.boot_and_spawn()
    d(core.WorkerExited(1, "OSError: [Errno 5] Input/output error"))
    d(core.TreeKilled(killed=1))
    d.at(d.t + 1.01)(core.Tick())
    d(core.Spawned(PID + 1, None))
    d(core.WorkerExited(1, "RuntimeError: something else"))
    d(core.TreeKilled(killed=1))
    assert d.s.exit is None and d.s.state == core.State.BACKOFF


def test_a_changed_train_table_or_ladder_starts_again_at_rung_0():
    before = make()
    before.rung, before.attempt, before.remedies = 3, 4, {"batch": 8}
    before.training_fingerprint = core.training_fingerprint(before)
    record = before.persistent(0.0)
    same = make()
    same.restore(record)
    assert kinds(core.decide(same, core.Boot(), core.Now(0, 0))[1]) == ["Log", "Spawn"] and same.rung == 3
    changed = make(workers=4)
    changed.restore(record)
    actions = core.decide(changed, core.Boot(), core.Now(0, 0))[1]
    assert changed.rung == 0 and changed.remedies == {} and "changed since rung 3" in actions[0].text


def test_a_pause_of_the_supervisor_itself_moves_every_deadline_instead_of_blaming_the_worker():
    d = healthy()
    last = d.t
    d.at(last + 25)  # the supervisor was stopped for 20 s past a 10 s stall timeout
    actions = d(core.SupervisorPaused(20.0))
    assert kinds(actions) == ["Log"] and d.s.watch.deadline.at == last + 20 + 10
    assert d(core.Tick()) == []  # 5 s after the pause ended: still inside the stall timeout
    d.beat("done", kind="phase")  # it had finished meanwhile: its last words were queued behind the pause
    d(core.WorkerExited(0))
    d(core.TreeKilled(killed=0))
    assert d.s.state == core.State.SUCCEEDED and d.s.incidents == [] and d.s.hangs_by_phase == {}


# Probing back down the ladder --------------------------------------------------------------------------------

SAFER = 0.75  # seconds a batch at rung 1: slower than rung 0's 0.5 s, so rung 0 is worth probing


def at_rung_1_after_a_hang(**sections) -> Driver:
    """One hang after 10 s of training, rungs judged on their own hangs alone (no prior): at rung 1."""
    sections["ladder"] = {"prior_between_hangs": "off", **sections.get("ladder", {})}
    d = healthy(**sections)
    d.at(d.t + 10.01)(core.Tick())
    d(core.TreeKilled(killed=1))
    d(core.Spawned(PID + 1, "/s/last.pt"))
    d.pid = PID + 1
    return d


def train(d: Driver, seconds: float, pid: int, interval: float = 0.5) -> list:
    actions = []
    end = d.t + seconds
    while d.t + interval <= end and d.s.state == core.State.HEALTHY or d.s.state == core.State.STARTING:
        d.t += interval
        actions += d.beat(pid=pid, epoch=1, epochs=3, batch=1, batches=10, samples=4)
    return actions


def test_after_probe_after_of_healthy_training_the_faster_rung_is_tried_at_a_checkpoint():
    d = at_rung_1_after_a_hang(ladder={"probe_after": 60, "give_up_after": 3}, checkpoint={"every": 30})
    assert d.s.rung == 1 and probe.probe_in(d.s) == 60
    actions = train(d, 70, PID + 1, SAFER)
    assert kinds(actions)[-2:] == ["Log", "RequestCheckpoint"] and d.s.state == core.State.STOPPING
    assert d.s.stop.reason == core.Reason.PROBE and probe.rung_trained(d.s) == pytest.approx(60, abs=SAFER)
    d.beat("train", kind="checkpoint", pid=PID + 1, path="/s/last.pt", epoch=1, batch=5, progress=d.progress)
    assert kinds(d(core.WorkerExited(0))) == ["KillTree"]
    actions = d(core.TreeKilled(killed=1))
    spawn = [a for a in actions if isinstance(a, Spawn)][0]
    assert spawn.rung == 0 and d.s.probe.probing_from == 1 and d.s.restarts_by_reason == {"hang": 1, "probe": 1}
    assert len(d.s.restart_times) == 1  # a probe is planned: it spends no restart budget
    assert d.s.incidents[-1].reason == "probe" and d.s.incidents[-1].loss.seconds == 0.0
    assert d.s.goodput.lost_seconds == pytest.approx(9.5)  # the hang's; the probe lost nothing


def test_a_hang_on_the_probed_rung_returns_and_doubles_the_probation_and_a_rung_whose_probes_hung_is_left_alone():
    d = at_rung_1_after_a_hang(ladder={"probe_after": 60, "give_up_after": 1}, checkpoint={"every": 30})
    train(d, 70, PID + 1, SAFER)
    d.beat("save", kind="checkpoint", pid=PID + 1, path="/s/last.pt", epoch=1, batch=5, progress=d.progress)
    d(core.WorkerExited(0))
    d(core.TreeKilled(killed=1))
    d(core.Spawned(PID + 2, "/s/last.pt"))
    train(d, 5, PID + 2)
    actions = d.at(d.t + 10.01)(core.Tick())  # the probed rung 0 hangs again
    actions += d(core.TreeKilled(killed=1))
    assert d.s.rung == 1 and d.s.probe.probing_from is None and d.s.rungs[1].probation == 120.0
    # its probe hung give_up_after (1) times: never probed again (the hang that left it does not count)
    assert (d.s.rungs[0].hangs, d.s.rungs[1].hangs) == (2, 0) and d.s.rungs[0].failed_probes == 1
    assert probe.probe_in(d.s) is None
    assert any("not probed again" in a.text for a in actions if isinstance(a, core.Log))


def probing(**sections) -> Driver:
    """At rung 1 after a hang, probation served: the worker was just asked to save for the probe of rung 0."""
    d = at_rung_1_after_a_hang(ladder={"probe_after": 60}, checkpoint={"every": 30}, **sections)
    assert kinds(train(d, 70, PID + 1, SAFER))[-1] == "RequestCheckpoint" and d.s.stop.reason == core.Reason.PROBE
    return d


SHELL_FIELDS = {"id", "time", "reason", "phase", "rung", "epoch", "batch"}  # what the agent reads of an incident


@pytest.mark.parametrize("fault", ["frozen", "slow to exit"])
def test_a_probe_whose_save_goes_wrong_is_a_real_incident_and_training_goes_on_at_the_safer_rung(fault):
    d = probing(watchdog={"save_timeout": 30})
    asked = d.t
    if fault == "slow to exit":  # a command's SIGTERM: it trains on and exits late
        d.train_until(asked + 29, 0.5)
    actions = d.at(asked + 30.01)(core.Tick())  # SIGSTOPped: its stall timeout (10 s) comes first
    kill = [a for a in actions if isinstance(a, core.KillTree)][0]
    assert SHELL_FIELDS <= kill.incident.to_dict().keys() and kill.incident.reason == "hang"
    assert "asked to save, the worker" in kill.incident.detail and kill.incident.loss.batches > 0
    spawn = [a for a in d(core.TreeKilled(killed=2)) if isinstance(a, Spawn)][0]
    assert spawn.rung == 1 and d.s.probe.probing_from is None and d.s.restarts_by_reason == {"hang": 2}
    assert probe.probe_in(d.s) == 60  # its probation starts over: no probe at the restarted worker's first beats


def test_a_first_sigterm_during_a_probes_save_waits_for_it_and_a_second_kills():
    d = probing(watchdog={"save_timeout": 30})
    actions = d(core.StopRequested("SIGTERM"))
    assert kinds(actions) == ["Log"] and d.s.stop.reason == core.Reason.STOP  # the save under way serves the stop
    d.beat("save", kind="checkpoint", pid=PID + 1, path="/s/last.pt", epoch=1, batch=5, progress=d.progress)
    assert d(core.WorkerExited(0)) == [core.KillTree(None)]
    exit = d(core.TreeKilled(killed=1))[-1]
    assert exit.code == EXIT_OK and "after saving a checkpoint" in exit.text and d.s.rung == 1
    d2 = probing(watchdog={"save_timeout": 30})
    d2(core.StopRequested("SIGTERM"))
    actions = d2(core.StopRequested("SIGTERM"))
    assert kinds(actions) == ["Log", "KillTree"] and SHELL_FIELDS <= actions[1].incident.to_dict().keys()
    assert d2(core.TreeKilled(killed=1))[-1].code == EXIT_OK and d2.s.state == core.State.STOPPED


def test_a_probe_keeps_the_attempts_training_time_and_the_probed_rung_is_kept_after_probe_after():
    d = probing()
    before = d.s.trained()
    assert before == pytest.approx(9.5 + 60, abs=0.6)  # the attempt that hung, then probation at rung 1
    d.beat("save", kind="checkpoint", pid=PID + 1, path="/s/last.pt", epoch=1, batch=5, progress=d.progress)
    d(core.WorkerExited(0))
    d(core.TreeKilled(killed=1))
    d(core.Spawned(PID + 2, "/s/last.pt"))
    actions = train(d, 62, PID + 2)
    assert d.s.trained() == pytest.approx(before + 61, abs=0.6)
    assert d.s.rung == 0 and d.s.probe.probing_from is None  # kept after 60 s on it, not 60 s plus the attempt before
    assert any("held for" in a.text for a in actions if isinstance(a, core.Log))


def test_a_finished_command_whose_exit_hangs_ends_succeeded():
    d = Driver(make(watchdog={"save_timeout": 20}, worker=COMMAND))
    d(core.Boot())
    d(core.Spawned(PID, None))
    for batch in range(1, 41):
        d.at(d.t + 0.5).beat(epoch=3, epochs=3, batch=batch, batches=40)  # its bar read from its output
    assert d.s.watch.deadline.at == d.t + 20  # its exit is due: watched as our worker's after "done"
    actions = d.at(d.t + 20.01)(core.Tick())
    assert kinds(actions) == ["Log", "KillTree"] and actions[1].incident.phase == "done"
    assert d(core.TreeKilled(killed=1))[-1] == core.Exit(EXIT_OK, "training finished after 1 attempt(s)")
    assert d.s.state == core.State.SUCCEEDED and d.s.restart_times == []


def test_probing_survives_a_supervisor_restart_and_off_keeps_the_ladder_one_way():
    d = at_rung_1_after_a_hang(ladder={"probe_after": 60}, checkpoint={"every": 30})
    train(d, 40, PID + 1, SAFER)
    record = d.s.persistent(d.t)
    again = make(ladder={"probe_after": 60, "prior_between_hangs": "off"}, checkpoint={"every": 30})
    again.restore(record)
    assert again.rung == 1 and probe.probe_in(again) == pytest.approx(60 - 40, abs=2 * SAFER)
    off = at_rung_1_after_a_hang(ladder={"probe_after": "off"})
    assert probe.probe_in(off.s) is None and kinds(train(off, 200, PID + 1)).count("RequestCheckpoint") == 0


def test_each_rung_keeps_its_measured_speed():
    d = healthy()  # 0.5 s batches at rung 0
    d.train_until(d.t + 30, 0.5)
    assert d.s.rungs[0].speed() == pytest.approx(2.0)


def test_under_ddp_rank_0_is_the_progress_every_rank_its_own_liveness_and_a_stray_pid_is_not_a_rank():
    d = Driver(make())
    d.boot_and_spawn()
    d.beat("setup", kind="phase")  # the launcher itself (the worker's main process)
    for rank, pid in ((0, 5000), (1, 5001)):
        d.beat("setup", kind="settings", pid=pid, progress=0, rank=rank, settings={"device": f"cuda:{rank}"})
    d.at(d.t + 2)
    d.beat(pid=5000, progress=1, rank=0, epoch=1, epochs=3, batch=1, batches=10)  # rank 0's counter starts over
    assert d.s.state == core.State.HEALTHY and d.s.progress.batch == 1
    d.at(d.t + 1)
    d.beat(pid=5001, progress=1, rank=1, epoch=1, epochs=3, batch=7, batches=10)
    assert d.s.progress.batch == 1  # rank 1 is liveness only
    d.beat(pid=6000, progress=99, rank=1, batch=9)  # a DataLoader worker of rank 1 (it inherits RANK)
    snap = snapshot(d.s, core.Now(d.t, 0)).to_dict()
    assert [(r["rank"], r["pid"], r["device"]) for r in snap["ranks"]] == [(0, 5000, "cuda:0"), (1, 5001, "cuda:1")]
    assert snap["ranks"][0]["seconds_since_progress"] == 1.0 and snap["ranks"][1]["seconds_since_progress"] == 0.0
    assert d.s.messages_ignored == 1


def test_a_command_that_exits_0_has_finished_and_ours_must_say_done_first():
    command = Driver(make(worker=COMMAND))
    command(core.Boot())
    command(core.Spawned(PID, None))
    command.beat(epoch=3, epochs=3, batch=40, batches=40)
    command(core.WorkerExited(0))
    command(core.TreeKilled(killed=0))
    assert command.s.exit.code == EXIT_OK and command.s.state == core.State.SUCCEEDED
    ours = Driver(make())
    ours.boot_and_spawn()
    ours.beat(epoch=3, epochs=3, batch=40, batches=40)
    ours(core.WorkerExited(0))
    assert ours.s.incidents[-1].detail == "exited with status 0 before training finished"


def test_the_worker_kind_is_decided_once_from_the_config_and_says_what_the_worker_can_do():
    ours, command, no_standby = make().kind, make(worker=COMMAND).kind, make(worker={"standby": False}).kind
    assert (ours.name, command.name) == ("ultralytics", "command")
    assert not ours.exit_0_finishes and command.exit_0_finishes
    assert ours.saves_on_request and not command.saves_on_request
    assert ours.reports_loader_workers and not command.reports_loader_workers
    assert ours.reports_checkpoints and not command.reports_checkpoints
    assert ours.standby and not no_standby.standby and not command.standby
    assert not ours.progress_from_output and command.progress_from_output
    assert ours.default_ladder and not command.default_ladder
    assert ours.reads_launch_record and not command.reads_launch_record
    assert no_standby == replace(ours, standby=False)


def test_a_commands_exit_0_when_asked_to_save_is_its_word_it_saved_and_it_gets_no_standby():
    d = Driver(make(worker=COMMAND))
    d(core.Boot())
    d(core.Spawned(PID, None))
    assert "PrepareStandby" not in kinds(d.beat("setup", kind="step", step="first_batch"))
    d.beat("train", kind="phase")
    d.train_until(1010, 0.5)
    assert kinds(d(core.StopRequested("SIGTERM")))[-1] == "RequestCheckpoint"  # the shell sends it SIGTERM
    assert d(core.WorkerExited(0)) == [core.KillTree(None)] and d.s.stop.saved  # ours must say it saved first
    exit = d(core.TreeKilled(killed=0))[-1]
    assert exit.code == EXIT_OK and d.s.state == core.State.STOPPED and d.s.goodput.lost_batches == 0


def test_an_epochs_slow_first_batch_and_a_save_stretch_no_batch_interval():
    """The loader's start at an epoch's first batch (3 s here) is part of the epoch's end, not a batch interval:
    otherwise 10 x 3 s would be the stall timeout for the whole next epoch."""
    d = healthy()  # 0.5 s batches
    d.at(d.t + 0.5).beat("save", kind="phase", epoch=1, epochs=3, batch=10, batches=10)
    d.at(d.t + 0.5).beat("train", kind="phase")
    d.at(d.t + 3.0).beat(epoch=2, epochs=3, batch=1, batches=10)  # the loader's workers start: 3 s
    assert max(d.s.current.intervals["train"]) == 0.5 and d.s.epoch_end_seen == 3.0
    d.train_until(d.t + 2, 0.5)
    due = d.s.watch.deadline
    assert (due.label, due.at - d.t) == ("train auto", 10.0)
    d.at(d.t + 0.5).beat("save", kind="phase")  # a mid-epoch save: the worker says so, and it takes 4 s
    d.at(d.t + 4.0).beat("train", kind="phase")
    d.at(d.t + 0.5).beat(epoch=2, epochs=3, batch=7, batches=10)
    assert max(d.s.current.intervals["train"]) == 0.5
    assert (d.s.epoch_end_seen, d.s.checkpoint_seen) == (3.0, 4.0)  # each bounds the next of its kind


def test_an_oom_kill_names_only_the_exit_that_follows_it_soon():
    line = "Out of memory: Killed process 4343 (pt_data_worker) total-vm:1kB, anon-rss:1kB"
    soon = healthy()
    soon(core.KernelMessage(KernelKind.OOM, line, "kmsg", "oom_killed_process", pid=4343, in_worker_tree=True))
    soon.at(soon.t + 2)(core.WorkerExited(1))
    assert soon.s.incidents[-1].reason == "oom"
    late = healthy()
    late(core.KernelMessage(KernelKind.OOM, line, "kmsg", "oom_killed_process", pid=4343, in_worker_tree=True))
    late.train_until(late.t + core.OOM_EXIT_WINDOW + 5, 0.5)  # the worker trained on after losing a loader process
    late(core.WorkerExited(1))
    assert late.s.incidents[-1].reason == "crash"  # a later crash is its own, not the old OOM's


def test_a_finished_training_of_another_config_is_refused_not_called_done():
    before = make()
    before.state, before.training_fingerprint = core.State.SUCCEEDED, core.training_fingerprint(before)
    record = before.persistent(0.0)
    same = make()
    same.restore(record)
    core.decide(same, core.Boot(), core.Now(0, 0))
    assert same.exit.code == EXIT_OK and "already finished" in same.exit.text
    other = make(workers=2)
    other.restore(record)
    core.decide(other, core.Boot(), core.Now(0, 0))
    assert other.exit.code == 78 and "holds a finished training of another [train]" in other.exit.text
    assert other.persistent(0.0)["training_fingerprint"] == record["training_fingerprint"]  # its record kept


def test_an_attempts_first_batch_is_startup_not_a_batch_interval():
    """On an H100 the first batch came 3.5 s after the loop began (CUDA warm-up, the loader's start) and then
    10 x 3.5 s was the stall timeout for the whole attempt."""
    d = Driver(make())
    d.boot_and_spawn()
    d.at(d.t + 5).beat("train", kind="phase", epoch=1, epochs=3, batch=0, batches=32)
    d.at(d.t + 3.5).beat(epoch=1, epochs=3, batch=1, batches=32)
    for _ in range(10):
        d.at(d.t + 0.1).beat(epoch=1, epochs=3, batch=2, batches=32)
    assert max(d.s.current.intervals["train"]) == pytest.approx(0.1)
    assert d.s.watch.deadline.at - d.t == 10.0  # the auto floor, not 35 s


def test_a_state_directory_another_supervisor_took_stops_the_worker_without_a_save_and_exits_78():
    taken = "c.toml: state_dir /s is now in use by another supervisor (pid 7)"
    d = healthy()
    d(core.StopRequested("SIGTERM"))  # saving: its checkpoint would land in the other one's training
    assert kinds(d(core.StateDirTaken(taken))) == ["Log", "KillTree"]
    exit = d(core.TreeKilled(killed=1))[-1]
    assert exit.code == 78 and exit.text.startswith(taken) and "its own state_dir" in exit.text
    assert d.s.state == core.State.FAILED and d.s.goodput.lost_batches == 20
    backing_off = healthy()
    backing_off(core.WorkerExited(1))
    backing_off(core.TreeKilled(killed=0))
    assert backing_off.s.state == core.State.BACKOFF
    assert backing_off(core.StateDirTaken(taken))[-1].code == 78 and backing_off.s.state == core.State.FAILED


def test_a_wrappers_script_speaks_for_the_worker_and_its_own_dataloader_workers_still_do_not():
    """``command = ["./run.sh"]``: the worker's pid is the shell, the python it runs sends the beats; they were
    ignored and every attempt was killed as hung. The first of the tree to speak is the one that counts."""
    d = Driver(make())
    d.boot_and_spawn()

    def from_tree(pid: int, batch: int) -> list:
        d.progress += 1
        message = HeartbeatMessage.from_wire({"v": 1, "pid": pid, "kind": "beat", "phase": "train",
                                              "progress": d.progress, "epoch": 1, "epochs": 3, "batch": batch,
                                              "batches": 40})
        return d(core.HeartbeatReceived(message, from_worker_tree=True))

    script = PID + 1
    for batch in range(1, 21):
        d.at(d.t + 0.5)
        from_tree(script, batch)
    assert d.s.state == core.State.HEALTHY and d.s.progress.batch == 20 and d.s.messages_ignored == 0
    from_tree(PID + 2, 39)  # the script's own DataLoader worker, also in the tree
    d.beat(pid=PID + 3, progress=10_000, batch=40)  # a stranger
    assert d.s.messages_ignored == 2 and d.s.progress.batch == 20
    assert verdicts(d.at(d.t + 9.9)(core.Tick())) == []


def test_it_s_is_timed_by_when_beats_were_sent_not_when_a_burst_of_them_arrived():
    """After a backlog, status showed 1280 it/s for a loop training at 4.7; the pipe's read bursts biased the
    rung speeds about 19% high."""
    d = Driver(make())
    d.boot_and_spawn()
    d.beat("train", kind="phase")
    sent = 500.0  # the sender's monotonic clock: only its differences count
    for _burst in range(4):  # 40 beats at 4.7 it/s, read 10 at a time
        d.at(d.t + 10 / 4.7 + 0.2)
        for _ in range(10):
            sent += 1 / 4.7
            d.beat(epoch=1, epochs=3, batch=1, batches=40, sent=sent)
    assert d.s.current.batches_per_second() == pytest.approx(4.7)
    assert d.s.rungs[0].speed() == pytest.approx(4.7, rel=1e-3)


def test_goodput_is_timed_by_the_monotonic_clock_and_its_time_survives_a_supervisor_restart():
    """A wall clock set back gave goodput None (or above 1). Monotonic time does not survive the supervisor, so the
    earlier supervisors' time is kept as a duration in the state file."""
    d = healthy()  # booted at t=1000, 0.5 s batches from 1000.5 to 1010: 9.5 s trained
    snap = snapshot(d.s, core.Now(d.t + 10, 1_700_000_000 - 3600)).to_dict()  # the wall clock set back an hour
    assert snap["goodput"] == pytest.approx(9.5 / 20)
    record = d.s.persistent(d.t + 10)  # then the supervisor dies
    again = Driver(make())
    again.s.restore(record)
    again.at(5.0)(core.Boot())  # a new supervisor after a reboot: another monotonic origin
    assert snapshot(again.s, core.Now(15.0, 0)).to_dict()["goodput"] == pytest.approx(9.5 / 30)


def test_a_paused_supervisor_keeps_the_training_its_worker_did_meanwhile_in_goodput():
    """Ctrl-Z stops the supervisor alone: the worker trains on and its beats wait in the pipe. Only the deadlines
    move by the pause; the training is timed by the beats (their ``sent``), so goodput stays ~1 (it was 0.11)."""
    d = Driver(make())
    d.boot_and_spawn()
    d.beat("train", kind="phase", sent=d.t)
    while d.t + 0.5 <= 1010:
        d.t += 0.5
        d.beat(epoch=1, epochs=3, batch=1, batches=10, samples=4, sent=d.t)
    woke = d.t + 60  # stopped for 60 s; the worker beat every 0.5 s meanwhile, read at once on waking
    d.at(woke)(core.SupervisorPaused(60.0))
    for i in range(1, 121):
        d.beat(epoch=1, epochs=3, batch=1, batches=10, samples=4, sent=woke - 60 + i * 0.5)
    d.train_until(woke + 10, 0.5)  # and on, read as sent
    snap = snapshot(d.s, core.Now(d.t, 1_700_000_000 + d.t)).to_dict()
    assert d.s.trained() == pytest.approx(d.t - 1000.5)
    assert snap["goodput"] == pytest.approx((d.t - 1000.5) / (d.t - 1000.0))


def test_a_pause_of_the_supervisor_and_its_worker_together_is_no_training():
    """Ctrl-Z of the whole job: no beat was sent during the pause, so the pause is not counted as trained."""
    d = Driver(make())
    d.boot_and_spawn()
    d.beat("train", kind="phase", sent=d.t)
    while d.t + 0.5 <= 1010:
        d.t += 0.5
        d.beat(epoch=1, epochs=3, batch=1, batches=10, samples=4, sent=d.t)
    d.at(d.t + 60)(core.SupervisorPaused(60.0))
    while d.t + 0.5 <= 1080:
        d.t += 0.5
        d.beat(epoch=1, epochs=3, batch=1, batches=10, samples=4, sent=d.t)
    assert d.s.trained() == pytest.approx(1080 - 1000.5 - 60)


def test_a_signature_acts_only_on_the_failure_that_ended_the_worker():
    for line in ("ModuleNotFoundError: No module named 'wandb'", "OSError: [Errno 28] No space left on device: 'x'"):
        d = healthy()
        found = scan(line)
        d(core.SignatureSeen(found.name, found.remedy, found.advice, line))  # harmless: training went on
        d.train_until(d.t + 2, 0.5)
        d(core.WorkerExited(1, last_words="RuntimeError: boom"))  # a later crash of its own cause
        d(core.TreeKilled(killed=1))
        assert d.s.exit is None and d.s.state == core.State.BACKOFF, line
        assert d.s.incidents[-1].reason == "crash"
    d = healthy()
    d.beat(kind="error", progress=d.progress, error="ModuleNotFoundError: No module named 'polars'")
    d(core.WorkerExited(1, last_words="    import polars"))
    d(core.TreeKilled(killed=1))
    assert d.s.exit.code == EXIT_CONFIG and "missing from its Python environment" in d.s.exit.text


def test_the_incident_is_one_record_enriched_by_the_shell_and_written_once_when_complete():
    d = healthy()
    kill = d.at(d.t + 10.01)(core.Tick())[-1]
    where = Stacks("DataLoader worker in sleep at faults.py hang_forever", ("main (pid 4242) in poll",),
                   "DataLoader worker 1 (pid 77) in sleep, faults.py:87 hang_forever", 0.4, "incidents/x/stacks.json")
    assert d(core.IncidentEnriched("another-id", ({"pid": 1},))) == []  # not the incident being stopped
    d(core.IncidentEnriched(kill.incident.id, ({"pid": PID, "state": "sleeping"},), ("last line",), stacks=where))
    assert "RecordIncident" not in kinds(d(core.TreeKilled(killed=2, seconds=0.5, confirmed_wall=1.0)))
    status = snapshot(d.s, core.Now(d.t, 1_700_000_000 + d.t)).to_dict()["last_incident"]
    assert status["culprit"] == where.culprit and status["kill"]["processes"] == 2
    assert status["output_tail"] == ["last line"] and "restart_seconds" not in status  # not complete yet
    d(core.Spawned(PID + 1, None))
    actions = d.at(d.t + 4).beat(pid=PID + 1, progress=1, epoch=1, epochs=3, batch=1, batches=10)
    [resumed] = [a for a in actions if isinstance(a, IncidentResumed)]  # recovered: the notice's moment
    assert "RecordIncident" not in kinds(actions) and resumed.incident.restart_seconds == pytest.approx(4.0)
    # written once training has gone on PACE_BATCHES batches after it: their pace against the batches before its stall
    records = []
    for n in range(PACE_BATCHES):
        records += [a for a in d.at(d.t + 0.7).beat(pid=PID + 1, progress=2 + n, epoch=1, epochs=3, batch=2, batches=10)
                    if isinstance(a, RecordIncident)]
        assert len(records) == (n == PACE_BATCHES - 1), n
    assert d.at(d.t + 0.7).beat(pid=PID + 1, epoch=1, epochs=3, batch=2, batches=10) == []  # written once
    [record] = records
    line = record.incident.to_dict()
    assert line == snapshot(d.s, core.Now(d.t, 1_700_000_000 + d.t)).to_dict()["last_incident"]  # the same record
    assert line["restart_seconds"] == pytest.approx(4.0) and line["culprit"] == where.culprit
    assert line["after"] == {"batches": PACE_BATCHES, "seconds": pytest.approx(0.7 * PACE_BATCHES),
                             "before_batches": 19, "before_seconds": pytest.approx(9.5),  # all the attempt had
                             "ratio": pytest.approx(1.4), "extra_seconds": pytest.approx(0.2 * PACE_BATCHES),
                             "slowest": pytest.approx(0.7)}
    assert line["settings"] == {} and line["time_iso"].endswith("Z")
    restored = make()
    restored.restore(d.s.persistent(d.t))
    assert restored.incidents == d.s.incidents  # recorded: a restarted supervisor does not write it again


def test_an_incident_not_written_yet_is_written_by_the_next_supervisor_or_at_the_exit():
    d = healthy()
    d.at(d.t + 10.01)(core.Tick())
    d(core.TreeKilled(killed=1))  # the supervisor dies here: the incident is in the state file only
    restored = Driver(make())
    restored.s.restore(d.s.persistent(d.t))
    assert not restored.s.incidents[-1].recorded
    restored.t = d.t
    restored(core.Boot())
    actions = restored(core.StopRequested())  # still starting: stopped at once, a second incident
    assert kinds(actions)[:1] == ["RecordIncident"] and actions[0].incident.reason == "hang"
    actions = restored(core.TreeKilled(killed=1))
    assert kinds(actions) == ["RecordIncident", "Exit"] and actions[0].incident.reason == "stop"
    assert all(i.recorded for i in restored.s.incidents)
    assert [i["reason"] for i in restored.s.persistent(d.t)["incidents"]] == ["stop"]  # the rest: incidents.jsonl


def test_a_commands_lost_work_is_counted_down_to_where_its_next_attempt_resumed_or_unknown():
    d = Driver(make(worker=COMMAND))
    d(core.Boot())
    d(core.Spawned(PID, None))  # a command: its checkpoints are its own
    for batch in range(1, 47):  # 46 batches, the last checkpoint (unseen by us) after batch 44
        d.at(d.t + 0.5).beat(epoch=2, epochs=3, batch=batch, batches=50)
    [kill] = [a for a in d.at(d.t + 20)(core.Tick()) if isinstance(a, core.KillTree)]
    assert kill.incident.loss == Loss(None, None) and kill.incident.to_dict()["lost_batches"] is None  # unknown yet
    d(core.TreeKilled(killed=1))
    d(core.Spawned(PID + 1, "/run/ck/step-94.ckpt"))
    [record] = [a for a in d.at(d.t + 2).beat(pid=PID + 1, progress=1, epoch=2, epochs=3, batch=44, batches=50)
                if isinstance(a, IncidentResumed)]
    assert record.incident.loss == Loss(seconds=1.0, batches=2)  # 2 batches at the measured 2 it/s
    assert (d.s.goodput.lost_batches, d.s.goodput.lost_seconds) == (2, 1.0)
    # the next attempt never shows a position: its loss stays unknown, counted nowhere
    d.at(d.t + 20)(core.Tick())
    d(core.TreeKilled(killed=1))
    d(core.Spawned(PID + 2, None))
    actions = d.at(d.t + 2).beat(pid=PID + 2, progress=1, epoch=None, batch=None)
    assert [a.incident.to_dict()["lost_batches"] for a in actions if isinstance(a, IncidentResumed)] == [None]
    assert d.s.goodput.lost_batches == 2


def test_an_oom_kill_of_a_reported_loader_worker_is_the_workers_though_no_walk_of_the_tree_saw_it():
    """The kernel names an OOM victim once it is dead; a loader worker killed and reaped between two walks of the tree
    is in neither (the shell says not the worker's): the worker's own report of its loader workers says it is."""
    d = loading()
    oom = core.KernelMessage(KernelKind.OOM, "Out of memory: Killed process 5001 (pt_data_worker)", "kmsg", "oom_killed_process", 5001,
                             in_worker_tree=False)
    assert kinds(d(oom)) == ["Log"] and d.s.current.oom is not None
    actions = d.at(d.t + 1)(core.WorkerExited(1, "RuntimeError: DataLoader worker (pid 5001) is killed by signal"))
    incident = [a for a in actions if isinstance(a, core.KillTree)][0].incident
    assert incident.reason == core.Reason.OOM and "OOM killer took pid 5001" in incident.detail
