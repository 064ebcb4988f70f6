"""The decision core on its own: events in, actions out, no processes, no clock."""

from pathlib import Path

import pytest

from supervisor import core
from supervisor.config import parse
from supervisor.exit_codes import EXIT_FAILED, EXIT_OK, EXIT_REBOOT_NEEDED
from supervisor.ladder import build_ladder, default_ladder

PID = 4242


def make(extra: str = "", workers: int = 8, **sections) -> core.Supervision:
    raw = {"train": {"workers": workers, "epochs": 3}, **sections}
    config = parse(raw, "<test>", state_dir=Path("/nonexistent"))
    return core.Supervision(config, build_ladder(config.ladder, workers))


class Driver:
    """Feeds events at chosen times and keeps the actions."""

    def __init__(self, s: core.Supervision):
        self.s, self.t, self.progress = s, 1000.0, 0

    def at(self, t: float):
        self.t = t
        return self

    def __call__(self, event) -> list:
        _, actions = core.decide(self.s, event, core.Now(mono=self.t, wall=1_700_000_000 + self.t))
        return actions

    def boot_and_spawn(self) -> core.Spawn:
        spawn = [a for a in self(core.Boot()) if isinstance(a, core.Spawn)][0]
        self(core.Spawned(PID, None))
        return spawn

    def beat(self, phase="train", kind="beat", pid=PID, progress=None, **fields):
        if progress is None:
            self.progress += 1
            progress = self.progress
        return self(core.Heartbeat({"v": 1, "pid": pid, "kind": kind, "phase": phase, "progress": progress,
                                    **fields}))

    def train_until(self, t_end: float, interval: float):
        while self.t + interval <= t_end:
            self.t += interval
            self.beat(epoch=1, epochs=3, batch=1, batches=10, samples=4)


def kinds(actions):
    return [type(a).__name__ for a in actions]


def healthy(**sections) -> Driver:
    d = Driver(make(**sections))
    d.boot_and_spawn()
    d.beat("train", kind="phase")
    d.train_until(1010, 0.5)
    return d


def test_hang_in_training_is_detected_at_the_auto_timeout_and_climbs_one_rung():
    d = Driver(make())
    assert d.boot_and_spawn().rung == 0
    d.beat("train", kind="phase")
    d.train_until(1010, 0.5)  # healthy at 0.5 s per batch: auto = max(10, 10 x 0.5) = 10 s
    assert d.s.state == core.State.HEALTHY
    last = d.t
    assert d.at(last + 9.9)(core.Tick()) == []
    actions = d.at(last + 10.01)(core.Tick())
    assert kinds(actions) == ["Log", "KillTree"]
    incident = actions[1].incident
    assert (incident["reason"], incident["phase"], incident["rung"]) == ("hang", "train", 0)
    assert d.s.state == core.State.STOPPING
    actions = d(core.TreeKilled(killed=3))
    spawn = [a for a in actions if isinstance(a, core.Spawn)][0]
    assert (spawn.rung, spawn.settings, spawn.attempt) == (1, {"workers": 4}, 2)
    assert d.s.restarts_by_reason == {"hang": 1} and d.s.hangs_by_phase == {"train": 1}


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
    assert d.at(1059)(core.Tick()) == []
    actions = d.at(1060.1)(core.Tick())
    assert actions[-1].incident["phase"] == "startup"


def test_validation_uses_val_intervals_and_falls_back_to_training_ones():
    d = Driver(make())
    d.boot_and_spawn()
    d.beat("train", kind="phase")
    d.train_until(1010, 2.0)  # train: 20 s auto
    d.at(d.t + 1).beat("val", kind="phase")
    last = d.t
    assert d.at(last + 19)(core.Tick()) == []  # no val interval yet: the training ones decide
    actions = d.at(last + 20.1)(core.Tick())
    assert actions[-1].incident["phase"] == "val"


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
    assert d.s.incidents[-1]["reason"] == "crash"
    assert "RuntimeError: boom" in d.s.incidents[-1]["detail"]
    d(core.TreeKilled(killed=1))
    assert d.s.state == core.State.BACKOFF and d.s.rung == 0
    assert d.at(d.t + 1.9)(core.Tick()) == []
    spawn = d.at(d.t + 0.2)(core.Tick())[0]
    assert isinstance(spawn, core.Spawn) and spawn.rung == 0
    d(core.Spawned(PID + 1, "/x/last.pt"))
    d(core.Heartbeat({"v": 1, "pid": PID + 1, "kind": "error", "phase": "train", "progress": 1,
                      "error": "RuntimeError: boom again"}))
    d(core.WorkerExited(1))
    d(core.TreeKilled(killed=1))
    assert d.s.rung == 1  # the same failure twice: one rung safer
    assert d.s.backoff_until - d.t == pytest.approx(4.0)  # second crash in a row: the backoff doubles


def test_signal_deaths_are_named():
    d = Driver(make())
    d.boot_and_spawn()
    d(core.WorkerExited(-11))
    assert d.s.incidents[-1]["detail"] == "killed by SIGSEGV"


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
    assert any(isinstance(a, core.Spawn) for a in actions)


def test_survivors_of_sigkill_mean_reboot_and_no_new_worker():
    d = Driver(make(watchdog={"startup_timeout": 5}))
    d.boot_and_spawn()
    d.at(d.t + 6)(core.Tick())
    actions = d(core.TreeKilled(killed=2, survivors=("pid 77 (python, disk-sleep)",)))
    assert kinds(actions) == ["Exit"]
    assert actions[0].code == EXIT_REBOOT_NEEDED and "reboot" in actions[0].text and "pid 77" in actions[0].text


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


def test_exit_zero_before_done_is_a_crash():
    d = Driver(make())
    d.boot_and_spawn()
    d(core.WorkerExited(0))
    assert d.s.incidents[-1]["reason"] == "crash"


def test_stop_asks_for_a_checkpoint_then_exits_zero_without_restart():
    d = healthy()
    actions = d(core.StopRequested("SIGTERM"))
    assert kinds(actions) == ["Log", "Log", "RequestCheckpoint"]
    assert d(core.WorkerExited(0)) == [core.KillTree(None)]  # saved and gone: clean up the rest
    actions = d(core.TreeKilled(killed=0))
    assert kinds(actions) == ["Exit"] and actions[0].code == EXIT_OK and "after saving a checkpoint" in actions[0].text
    assert d.s.state == core.State.STOPPED and d.s.restart_times == []


def test_a_worker_that_finishes_while_asked_to_save_has_succeeded():
    d = healthy()
    d(core.StopRequested("SIGTERM"))
    d.beat("done", kind="phase")
    d(core.WorkerExited(0))
    assert d(core.TreeKilled(killed=0))[0].code == EXIT_OK and d.s.state == core.State.SUCCEEDED


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
    assert "without a new checkpoint" in d2(core.TreeKilled(killed=3))[0].text


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
    assert d(core.TreeKilled(killed=2))[0].code == EXIT_OK and d.s.state == core.State.STOPPED


def test_a_restored_supervisor_continues_at_its_rung():
    first = Driver(make(watchdog={"startup_timeout": 5}))
    first.boot_and_spawn()
    first.at(first.t + 6)(core.Tick())
    first(core.TreeKilled(killed=1))
    record = first.s.persistent()
    second = Driver(make())
    second.s.restore(record)
    spawn = [a for a in second(core.Boot()) if isinstance(a, core.Spawn)][0]
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
    assert d.at(d.t + 39)(core.Tick()) == []


def test_default_ladder_matches_what_people_did_by_hand():
    assert default_ladder(8).rungs == ({}, {"workers": 4}, {"workers": 2}, {"workers": 1},
                                       {"persistent_workers": False}, {"workers": 0}, {"val": False})
    assert default_ladder(0).rungs == ({}, {"val": False})
    ladder = default_ladder(2)
    assert ladder.settings(3) == {"workers": 0, "persistent_workers": False}
    assert ladder.label(2) == "workers=1, persistent_workers=false"
    assert ladder.next(len(ladder) - 1) == len(ladder) - 1 and ladder.exhausted(len(ladder) - 1)


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
    snap = core.snapshot(d.s, core.Now(d.t, 0))
    assert snap["it_s"] == pytest.approx(2.0) and snap["samples_s"] == pytest.approx(8.0)
    assert snap["progress"] == pytest.approx(15 / 30)
    assert snap["eta_seconds"] == pytest.approx(15 / 2.0)


# Kernel messages ---------------------------------------------------------------------------------------------

SEEDS_LINE = ("workqueue: amdgpu_amdkfd_restore_userptr_worker [amdgpu] hogged CPU for >10000us 4 times, "
              "consider switching to WQ_UNBOUND")


def kernel(kind="stall", pid=None, in_tree=None, message=SEEDS_LINE):
    return core.KernelMessage(kind=kind, message=message, source="kmsg", pattern="workqueue_gpu_hog", pid=pid,
                              in_worker_tree=in_tree)


def test_a_stall_line_without_progress_kills_within_the_confirm_window():
    d = healthy(watchdog={"stall_timeout": 600}, kernel_log={"confirm_window": 10})
    t0 = d.t
    assert kinds(d(kernel())) == ["Log"]
    assert d.at(t0 + 9.9)(core.Tick()) == []
    actions = d.at(t0 + 10.0)(core.Tick())
    incident = actions[-1].incident
    assert incident["reason"] == "kernel" and incident["kernel_events"][0]["message"] == SEEDS_LINE
    d(core.TreeKilled(killed=3))
    assert d.s.rung == 1 and d.s.kernel_events == {"stall": 1}


def test_a_stall_line_while_training_progresses_kills_nothing():
    d = healthy(watchdog={"stall_timeout": 600})
    d(kernel())
    d.at(d.t + 0.5).beat()
    assert d.s.suspicion is None
    assert d.at(d.t + 30)(core.Tick()) == []  # only the stall timeout (600 s) is left
    assert d.s.kernel_events == {"stall": 1} and d.s.incidents == []


def test_a_line_about_another_process_only_counts():
    d = healthy(watchdog={"stall_timeout": 600})
    d(kernel(pid=999, in_tree=False, message="INFO: task kworker:999 blocked for more than 122 seconds."))
    assert d.s.suspicion is None and d.s.kernel_events == {"stall": 1}


def test_gpu_lost_kills_and_ends_with_reboot_needed():
    d = healthy()
    actions = d(kernel("gpu_lost", message="amdgpu 0000:03:00.0: amdgpu: GPU reset(2) failed"))
    assert kinds(actions) == ["Log", "KillTree"]
    actions = d(core.TreeKilled(killed=3))
    assert kinds(actions) == ["Exit"] and actions[0].code == EXIT_REBOOT_NEEDED
    assert "GPU is lost" in actions[0].text and d.s.reboot_needed


def test_oom_kill_of_a_worker_process_names_the_crash():
    d = healthy()
    d(kernel("oom", pid=4300, in_tree=True, message="Out of memory: Killed process 4300 (python)"))
    d(core.WorkerExited(-9))
    incident = d.s.incidents[-1]
    assert incident["reason"] == "oom" and "OOM killer took pid 4300" in incident["detail"]
    d(core.TreeKilled(killed=1))
    assert d.s.restarts_by_reason == {"oom": 1} and d.s.rung == 0
