"""The startup in steps, each with its own bound, in the pure core with a chosen clock: a step is bounded by
``startup_timeout`` until this run has seen it, then by 10 x its slowest stretch seen (floor 10 s); a scan that
progresses is never a hang; the incident names the step and its bound; what was seen survives a supervisor restart."""

from __future__ import annotations

import copy

from supervisor.decision import core
from supervisor.decision.stall import watchdog
from supervisor.decision.status_view import snapshot
from tests.helpers.driver import PID, Driver, kinds, make, verdicts
from worker.wire.contract import StartupStep

STEPS_OF_A_START = [("checkpoint", 0.5), ("model", 0.4), ("amp_check", 0.2), ("dataset", 2.0), ("loaders", 0.3),
                    ("dataset", 0.5), ("loaders", 0.6), ("first_batch", 0.8)]  # entered, then seconds in it


def step(d: Driver, name: str, done: int | None = None, total: int | None = None):
    fields = {} if done is None else {"done": done, "total": total}
    return d.beat("setup", kind="step", pid=d.s.current.worker_pid, progress=d.progress, step=name, **fields)


def start(d: Driver, imports: float = 3.0, steps=STEPS_OF_A_START, first_batch: bool = True) -> None:
    """The worker's startup as our worker reports it, from its spawn (now): each step entered, then its seconds."""
    d.at(d.t + imports)
    for name, seconds in steps:
        step(d, name)
        d.at(d.t + seconds)
    if first_batch:
        d.beat(pid=d.s.current.worker_pid, epoch=1, epochs=3, batch=1, batches=10, samples=4)


def hang_in_training(d: Driver, pid: int) -> None:
    d.at(d.t + 0.5).beat(pid=d.s.current.worker_pid, epoch=1, epochs=3, batch=2, batches=10)
    d.at(d.t + 11)(core.Tick())
    d(core.TreeKilled(killed=3))
    d(core.Spawned(pid, "/x/last.pt"))


def test_a_first_batch_that_never_runs_is_found_in_the_first_batch_steps_bound_learnt_from_the_start_before():
    d = Driver(make(watchdog={"startup_timeout": 600}))
    d.boot_and_spawn()
    start(d)
    assert d.s.state == core.State.HEALTHY
    assert d.s.startup_steps_seen == {"imports": 3.0, "checkpoint": 0.5, "model": 0.4, "amp_check": 0.2,
                                      "dataset": 2.0, "loaders": 0.6, "first_batch": 0.8}
    hang_in_training(d, PID + 1)
    # Attempt 2 (a resume) goes through its steps, each bounded by what attempt 1 showed of it ...
    d.at(d.t + 2.0)
    assert d.s.watch.deadline.label == "imports auto" and d.s.watch.deadline.at == d.t - 2.0 + 30.0
    start(d, imports=0.0, steps=STEPS_OF_A_START[:-1], first_batch=False)
    step(d, "first_batch")
    entered = d.t
    due = d.s.watch.deadline
    # ... and the first batch that never runs (the seeds' post-resume hang) is found 10 s after its step began,
    # not 10 x the whole startup (10 x 8.3 s) nor the 600 s of startup_timeout.
    assert (due.at - entered, due.label) == (10.0, "first_batch auto")
    assert verdicts(d.at(entered + 9.9)(core.Tick())) == []
    actions = d.at(entered + 10.01)(core.Tick())
    assert kinds(actions)[-3:] == ["Log", "PrimeStandby", "KillTree"]
    incident = actions[-1].incident
    assert (incident.reason, incident.phase) == ("hang", "startup")
    assert (incident.startup_step, incident.startup_step_bound, incident.startup_step_seen) == ("first_batch", 10.0,
                                                                                                0.8)
    assert "in startup step first_batch (first_batch auto 10.0 s)" in incident.detail
    recorded = incident.to_dict()
    assert (recorded["startup_step"], recorded["startup_step_bound"]) == ("first_batch", 10.0)


def test_a_step_not_seen_yet_is_bounded_by_startup_timeout_from_its_own_entry_and_a_slow_one_by_ten_times_itself():
    d = Driver(make(watchdog={"startup_timeout": 100}))
    d.boot_and_spawn()
    start(d, steps=[("checkpoint", 0.5), ("model", 4.0), ("dataset", 1.0), ("loaders", 1.0), ("first_batch", 1.0)])
    hang_in_training(d, PID + 1)
    d.at(d.t + 1.0)
    step(d, "checkpoint")
    step(d, "model")
    assert (d.s.watch.deadline.at - d.t, d.s.watch.deadline.label) == (40.0, "model auto")  # 10 x 4 s
    d.at(d.t + 30)
    step(d, "amp_check")  # not seen in attempt 1 (it trained on the CPU): startup_timeout, from its entry
    assert (d.s.watch.deadline.at - d.t, d.s.watch.deadline.label) == (100.0, "startup_timeout")
    actions = d.at(d.t + 100.01)(core.Tick())
    assert actions[-1].incident.startup_step == "amp_check" and actions[-1].incident.startup_step_seen is None
    # 10 x the model's 30 s seen is more than startup_timeout: never more than it.
    assert d.s.startup_steps_seen["model"] == 30.0


def test_a_long_scan_that_progresses_is_never_a_hang_and_one_that_stops_progressing_is():
    d = Driver(make(watchdog={"startup_timeout": 60}))
    d.boot_and_spawn()
    start(d, imports=2.0, steps=[("checkpoint", 0.5), ("model", 0.5)], first_batch=False)
    step(d, "dataset")
    for done in range(1, 1201):  # 329,299 labels scanned in 20 minutes, a report every second
        d.at(d.t + 1.0)
        assert step(d, "dataset", done=done * 274, total=329_299) == []
        assert d(core.Tick()) == []
    assert d.s.state == core.State.STARTING
    view = snapshot(d.s, core.Now(d.t, 0.0)).to_dict()
    # One second between reports seen: 10 s (the floor) without one is a hang; no more does the scan need.
    assert (view["startup_step"], view["startup_step_bound"]) == ("dataset", 10.0)
    assert view["startup_step_progress"] == {"done": 328_800, "total": 329_299}
    assert view["startup_steps_seen"]["dataset"] == 1.0
    step(d, "dataset", done=1, total=50_000)  # the next pass (caching images) starts again at 1: news too
    last = d.t
    for _ in range(2):  # the same word again, from a loop that no longer scans: no news
        d.at(d.t + 4)
        step(d, "dataset", done=1, total=50_000)
    assert verdicts(d(core.Tick())) == []
    actions = d.at(last + 10.01)(core.Tick())
    assert actions[-1].incident.startup_step == "dataset" and "no progress for 10.0 s" in actions[-1].incident.detail


def test_the_first_batch_of_spawned_loader_workers_is_kept_apart_from_forked_ones():
    # prior off: one hang climbs, so the next attempt starts on the spawned-workers rung this test is about
    d = Driver(make(ladder={"rungs": [{"start_method": "spawn"}], "prior_between_hangs": "off"},
                    watchdog={"startup_timeout": 600}))
    d.boot_and_spawn()
    start(d)  # rung 0, forked workers: first batch 0.8 s
    hang_in_training(d, PID + 1)
    assert d.s.rung == 1
    start(d, imports=0.5, steps=STEPS_OF_A_START[:-1], first_batch=False)
    step(d, "first_batch")  # spawned workers import torch for 28 s: not within 10 x the forked workers' 0.8 s
    assert d.s.watch.deadline.label == "startup_timeout"
    d.at(d.t + 28.0).beat(pid=PID + 1, epoch=1, epochs=3, batch=3, batches=10)
    assert d.s.state == core.State.HEALTHY
    assert (d.s.startup_steps_seen["first_batch"], d.s.startup_steps_seen["first_batch spawn"]) == (0.8, 28.0)


def test_the_steps_seen_survive_a_supervisor_restart_and_a_pause_moves_the_steps_clock():
    first = Driver(make(watchdog={"startup_timeout": 600}))
    first.boot_and_spawn()
    start(first)
    saved = copy.deepcopy(first.s.persistent(first.t))
    restarted = Driver(make(watchdog={"startup_timeout": 600}))
    restarted.s.restore(saved)
    restarted.boot_and_spawn()
    assert restarted.s.watch.deadline.label == "imports auto"
    start(restarted, steps=STEPS_OF_A_START[:-1], first_batch=False)
    step(restarted, "first_batch")
    entered = restarted.t
    restarted.at(entered + 5)(core.SupervisorPaused(60.0))
    assert restarted.s.watch.deadline.at == entered + 60.0 + 10.0
    assert [s.value for s in StartupStep] == ["imports", "checkpoint", "process_group", "model", "amp_check",
                                              "dataset", "loaders", "first_batch", "first_step"]


def test_the_first_batchs_step_on_the_device_is_bounded_apart_from_the_loaders_start():
    """The H100's 3.7-4.0 s "first batch" was a 1.3 s loader start and the first step's kernel search: one bound of
    10 x both (37-40 s) let a loader that never delivers wait as long as a device step that never ends."""
    d = Driver(make(watchdog={"startup_timeout": 600}))
    d.boot_and_spawn()
    start(d, steps=[*STEPS_OF_A_START[:-1], ("first_batch", 1.3), ("first_step", 2.5)])
    assert (d.s.startup_steps_seen["first_batch"], d.s.startup_steps_seen["first_step"]) == (1.3, 2.5)
    hang_in_training(d, PID + 1)
    start(d, imports=0.0, steps=STEPS_OF_A_START[:-1], first_batch=False)
    step(d, "first_batch")
    assert (d.s.watch.deadline.at - d.t, d.s.watch.deadline.label) == (13.0, "first_batch auto")  # the loader's own
    d.at(d.t + 1.0)
    step(d, "first_step")
    entered = d.t
    assert (d.s.watch.deadline.at - entered, d.s.watch.deadline.label) == (25.0, "first_step auto")
    actions = d.at(entered + 25.01)(core.Tick())
    assert kinds(actions)[-1] == "KillTree"
    assert (actions[-1].incident.startup_step, actions[-1].incident.startup_step_bound) == ("first_step", 25.0)
