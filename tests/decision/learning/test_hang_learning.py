"""Checkpoints and a ladder that learn from the hangs they see (issue 23), driven through the pure core."""

import math

import pytest

from supervisor.config import ConfigError, parse
from supervisor.decision import core
from supervisor.decision.model.actions import Spawn
from supervisor.decision.learning import choices
from supervisor.decision.model import checkpoint_interval, rung_choice
from supervisor.decision.model.hang_history import HangHistory, HangPoint
from supervisor.decision.model.incident import Stacks
from supervisor.decision.model.rung_choice import RungFacts
from supervisor.decision.status_view import snapshot
from supervisor.exit_codes import EXIT_CONFIG
from tests.helpers.driver import PID, Driver, make


class Night:
    """A run on the Driver's clock: train at a rung's speed with checkpoints, hang, restart."""

    def __init__(self, speeds: dict[int, float], hold: float = 0.5, every_batches: int = 10, **sections):
        self.d = Driver(make(workers=8, **sections))
        self.speeds, self.hold, self.every_batches = speeds, hold, every_batches
        self.spawns = [self.d.boot_and_spawn()]
        self.pid = PID
        self.epoch, self.batch = 1, 0

    def train(self, seconds: float) -> None:
        """Train at the current rung's speed for ``seconds``, a checkpoint every ``every_batches`` batches."""
        d, interval = self.d, 1.0 / self.speeds.get(self.d.s.rung, 1.0)
        end = d.t + seconds
        while d.t + interval <= end:
            d.t += interval
            self.batch += 1
            d.beat(pid=self.pid, epoch=self.epoch, epochs=100, batch=self.batch, batches=10_000, samples=4)
            if self.batch % self.every_batches == 0:
                d.beat("train", kind="checkpoint", pid=self.pid, path="/s/last.pt", seconds=self.hold,
                       epoch=self.epoch, batch=self.batch, progress=d.progress)

    def hang(self, word: dict | None = None) -> list:
        """The worker stops; the stall timeout kills it; the next worker resumes from the newest checkpoint.
        ``word``: where the witness says the training process waits (a WaitReport's wire form), said at once."""
        d = self.d
        if word is not None:
            d.beat("train", kind="wait", pid=self.pid, progress=d.progress,
                   wait={"where": "trainer.py:42 in step", "stalled": 1.0, **word})
        actions = d.at(d.t + max(10.0, 10 / self.speeds.get(d.s.rung, 1.0)) + 0.01)(core.Tick())  # the auto timeout
        assert d.s.stop is not None and d.s.stop.reason == core.Reason.HANG
        actions += d(core.TreeKilled(killed=1))
        spawns = [a for a in actions if isinstance(a, Spawn)]
        if spawns:
            self.spawns.append(spawns[0])
            self.pid += 1
            d.t += 3.0  # the restart
            d(core.Spawned(self.pid, "/s/last.pt"))
            self.batch -= self.batch % self.every_batches  # resumed from the newest checkpoint
        return actions


# The checkpoint interval ---------------------------------------------------------------------------------------

def test_auto_is_the_default_and_a_run_that_has_not_hung_checkpoints_every_max():
    night = Night({0: 2.0})
    assert night.d.s.config.checkpoint.every == "auto" and night.spawns[0].checkpoint_every == 600.0
    snap = snapshot(night.d.s, core.Now(night.d.t, 0)).to_dict()
    assert snap["checkpoint_every"] == 600.0 and snap["checkpoint_interval"]["auto"] is True
    assert snap["checkpoint_interval"]["mean_time_between_hangs"] is None


def test_after_each_hang_the_interval_is_youngs_from_the_measured_hold_and_the_hang_rate():
    night = Night({0: 2.0, 1: 2.0}, hold=0.5)
    night.train(40)
    night.hang()
    # 40 s trained, one hang: sqrt(2 x 0.5 x 40) = 6.3 s, above the floor max(5, 10 x 0.5) = 5 s.
    assert night.spawns[-1].checkpoint_every == pytest.approx(math.sqrt(2 * 0.5 * 40), rel=0.03)
    night.train(20)
    night.hang()
    # Two hangs in 60 s of training (the 10 s stalls are no training): 30 s between hangs.
    assert night.spawns[-1].checkpoint_every == pytest.approx(math.sqrt(2 * 0.5 * 30), rel=0.05)
    view = snapshot(night.d.s, core.Now(night.d.t, 0)).to_dict()["checkpoint_interval"]
    assert view["hold_seconds"] == 0.5 and view["mean_time_between_hangs"] == pytest.approx(30, rel=0.05)


def test_while_hangs_are_frequent_a_restart_replays_no_longer_than_it_took():
    """Issue 48: each restart of a night replayed the batches since the newest checkpoint (28 a restart), and a
    restarted attempt's first batches run slow. While hangs come every FREQUENT seconds of training or more often,
    half an interval (the replay) is held to the restarts' own time, down to the floor (the checkpoints' own cost)."""
    young = checkpoint_interval.choose("auto", 600.0, [0.5], 400.0)
    assert young.seconds == pytest.approx(20.0) and young.restart is None
    held = checkpoint_interval.choose("auto", 600.0, [0.5], 400.0, [3.0, 3.2, 2.9])
    assert held.seconds == pytest.approx(6.0) and held.restart == 3.0  # 2 x the restarts' median
    assert checkpoint_interval.choose("auto", 600.0, [0.5], 400.0, [1.0]).seconds == 5.0  # no closer than the floor
    assert checkpoint_interval.choose("auto", 600.0, [0.5], 400.0, [12.0]).seconds == pytest.approx(20.0)  # shorter
    rare = checkpoint_interval.choose("auto", 600.0, [0.5], 5000.0, [3.0])  # a hang an hour or so: Young's alone
    assert rare.seconds == pytest.approx(math.sqrt(5000.0), abs=0.01) and rare.restart is None
    night = Night({0: 2.0}, hold=0.5)
    night.train(40)
    night.hang()
    night.train(40)
    assert len(night.d.s.hang_history.restarts) == 1 and night.d.s.hang_history.restarts[0] > 3.0
    assert night.d.s.incidents[-1].restart_seconds == night.d.s.hang_history.restarts[0]


def test_a_save_from_a_thread_lets_a_night_of_hangs_checkpoint_inside_a_short_epoch():
    """Issue 59.4: on one H200 a thread's save held the loop 30-80 ms, hangs came 8-14 s after each recovery and an
    epoch took 6 s; a fixed 5 s floor, with the replay held to twice a 3 s restart, gave 6-7 s: the checkpoint never
    came inside an epoch and every restart replayed from the last epoch's end. The floor follows the measured hold."""
    night = Night({0: 10.0}, hold=0.05, every_batches=5)
    for _ in range(3):
        night.train(12)
        night.hang()
    interval = night.spawns[-1].checkpoint_every
    assert interval is not None and interval < 5.0  # inside a 6 s epoch, at least once
    assert interval >= max(checkpoint_interval.LEAST, 10 * 0.05)
    slow = checkpoint_interval.choose("auto", 600.0, [1.3], 15.0, [3.0])  # a large model's 1.3 s hold: 13 s floor
    assert slow.seconds == pytest.approx(13.0)


def test_the_interval_is_clamped_to_the_floor_and_to_max_and_a_fixed_one_never_changes():
    assert checkpoint_interval.choose("auto", 600.0, [0.01], 1.0).seconds == checkpoint_interval.LEAST
    assert checkpoint_interval.choose("auto", 600.0, [2.0], 30.0).seconds == 20.0  # 10 holds: a tenth at most
    assert checkpoint_interval.choose("auto", 120.0, [5.0], 86400.0).seconds == 120.0
    assert checkpoint_interval.choose("auto", 600.0, [], 50.0).hold is None  # 1 s assumed until measured
    night = Night({0: 2.0, 1: 2.0}, checkpoint={"every": "30s"})
    night.train(40)
    night.hang()
    assert [s.checkpoint_every for s in night.spawns] == [30.0, 30.0]
    epoch = Night({0: 2.0}, checkpoint={"every": "epoch"})
    assert epoch.spawns[0].checkpoint_every is None


def test_checkpoint_keys_are_validated_with_one_line_naming_the_key():
    train = {"data": "demo"}
    config = parse({"train": train, "checkpoint": {"every": "auto", "max": "5m"}}, "<test>")
    assert (config.checkpoint.every, config.checkpoint.max) == ("auto", 300.0)
    with pytest.raises(ConfigError, match=r"checkpoint\.max"):
        parse({"train": train, "checkpoint": {"max": "soon"}}, "<test>")
    with pytest.raises(ConfigError, match=r'checkpoint\.every.*"auto"'):
        parse({"train": train, "checkpoint": {"every": "often"}}, "<test>")


def test_what_the_hangs_taught_survives_a_supervisor_restart():
    night = Night({0: 2.0, 1: 2.0}, hold=0.5)
    night.train(40)
    night.hang()
    record = night.d.s.persistent(night.d.t)
    again = make(workers=8)
    again.restore(record)
    assert again.hang_history.holds == night.d.s.hang_history.holds
    assert again.rungs == night.d.s.rungs
    assert choices.mean_time_between_hangs(again) == pytest.approx(choices.mean_time_between_hangs(night.d.s))


# The ladder ------------------------------------------------------------------------------------------------------

def test_hangs_that_come_as_often_whatever_the_rung_leave_the_run_on_the_fastest_rung():
    # A driver's bad night: a hang every 30 s of training, whatever the settings; rung 1 trains at half the speed.
    night = Night({0: 2.0, 1: 1.0, 2: 0.5})
    rungs = [0]
    for _ in range(5):
        night.train(30)
        night.hang()
        rungs.append(night.d.s.rung)
    # One hang in 30 s is no proof against rung 0 (the prior), and each later one comes no sooner: no slower rung is
    # paid for.
    assert rungs == [0, 0, 0, 0, 0, 0]
    facts = choices.rung_facts(night.d.s)
    assert facts[0].hangs == 5 and not facts[1].tried
    ladder = snapshot(night.d.s, core.Now(night.d.t, 0)).to_dict()["ladder"]
    assert set(ladder["rungs"]) == {"0"} and ladder["rungs"]["0"]["between_hangs"] == pytest.approx((150 + 300) / 6,
                                                                                                   abs=1)
    assert night.d.s.exit is None  # no livelock up the ladder, no budget spent climbing


# The seeds' pattern: a loader deadlock within seconds at every rung with worker processes, cured at rung 3.
QUICK_HANGS = (4, 5, 3, 4.5, 5.5, 3.5, 4)  # seconds of training before each: never twice at the same batch


def settings_deadlock(**ladder) -> Night:
    """Quick hangs until rung 3, which cures them: five at rung 0 within 22 s (one is no proof), then one at each
    rung above (the hangs below are their prior)."""
    night = Night({0: 2.0, 1: 1.8, 2: 1.6, 3: 1.4}, every_batches=5, ladder=ladder)
    rungs = []
    for seconds in QUICK_HANGS:
        night.train(seconds)
        night.hang()
        rungs.append(night.d.s.rung)
        if night.d.s.rung == 3:
            break
    assert rungs == [0, 0, 0, 0, 1, 2, 3]
    return night


def test_prior_between_hangs_is_a_duration_or_off_and_a_bad_one_is_named():
    train = {"data": "demo"}
    assert parse({"train": train}, "<test>").probe.prior_between_hangs == 300.0
    assert parse({"train": train, "ladder": {"prior_between_hangs": "10m"}}, "<test>").probe.prior_between_hangs == 600
    assert parse({"train": train, "ladder": {"prior_between_hangs": "off"}}, "<test>").probe.prior_between_hangs is None
    with pytest.raises(ConfigError, match=r'ladder\.prior_between_hangs.*"off"'):
        parse({"train": train, "ladder": {"prior_between_hangs": -5}}, "<test>")


def test_one_hang_a_few_seconds_in_is_no_proof_against_rung_0():
    night = Night({0: 2.0, 1: 1.8})
    night.train(6)
    actions = night.hang()
    assert night.d.s.rung == 0 and night.spawns[-1].rung == 0
    why = [a.text for a in actions if isinstance(a, core.Log) and "best known" in a.text][0]
    assert "one hang per 153 s (1 in 6 s trained + a prior of 1 in 300 s)" in why  # (6 + 300) / 2
    # The same hang judged on rung 0's evidence alone (prior_between_hangs = "off") climbs: 6 s between hangs.
    alone = Night({0: 2.0, 1: 1.8}, ladder={"prior_between_hangs": "off"})
    alone.train(6)
    alone.hang()
    assert alone.d.s.rung == 1


def test_a_hang_the_settings_cause_still_climbs_to_the_rung_that_cures_it_and_stays():
    night = settings_deadlock(probe_after="off")
    # Rung 1 and 2 each left at their first hang: the quick hangs at the rungs below are their prior.
    assert [choices.rung_facts(night.d.s)[k].hangs for k in range(4)] == [5, 1, 1, 0]
    night.train(300)  # cured: no hang, no choice to make
    assert night.d.s.rung == 3 and night.d.s.state == core.State.HEALTHY


def test_a_probe_goes_straight_to_the_fastest_rung_worth_retrying():
    night = settings_deadlock(probe_after=60, give_up_after=3)
    # Rung 0 hung 5 times in the burst; that was before the quiet at rung 3, which is the newer evidence.
    assert choices.rung_facts(night.d.s)[0].hangs == 5 and choices.probe_target(night.d.s) == 0
    probe(night)
    assert night.d.s.rung == 0 and night.d.s.probe.probing_from == 3  # not rung 2, then 1, then 0


def probe(night: Night) -> None:
    """Train until the probe's save is asked for, save, and start the probed rung."""
    for _ in range(2000):  # a batch at a time
        night.train(1 / night.speeds[night.d.s.rung])
        if night.d.s.state == core.State.STOPPING:
            break
    assert night.d.s.stop.reason == core.Reason.PROBE
    night.d.beat("train", kind="checkpoint", pid=night.pid, path="/s/last.pt", epoch=1, batch=night.batch,
                 progress=night.d.progress)
    night.d(core.WorkerExited(0))
    actions = night.d(core.TreeKilled(killed=1))
    night.spawns.append([a for a in actions if isinstance(a, Spawn)][0])
    night.pid += 1
    night.d(core.Spawned(night.pid, "/s/last.pt"))


def test_a_rung_left_after_a_burst_is_probed_after_quiet_even_measured_a_little_slower():
    # Rung 1 measured a little faster than rung 0 on a busy machine: rung 0 is still worth its probe.
    night = Night({0: 2.0, 1: 2.05}, every_batches=5, ladder={"probe_after": 60})
    for seconds in QUICK_HANGS[:5]:
        night.train(seconds)
        night.hang()
    assert night.d.s.rung == 1 and [f.hangs for f in choices.rung_facts(night.d.s)][:2] == [5, 0]
    probe(night)
    assert night.spawns[-1].rung == 0 and night.d.s.probe.probing_from == 1
    # It hangs on the probe: back to rung 1, probation doubled; three failed probes and it is left alone.
    for failed in (1, 2, 3):
        night.train(5)
        actions = night.hang()
        assert night.d.s.rung == 1 and night.d.s.rungs[0].failed_probes == failed
        if failed < 3:
            probe(night)
    assert choices.probe_target(night.d.s) is None and any("not probed again" in a.text for a in actions
                                                    if isinstance(a, core.Log))


def test_the_cpu_demo_one_loader_hang_at_batch_10_never_keeps_rung_0_away():
    # The CPU demo: 0.85 it/s, one hang at batch 10, probe_after = 15 s; rung 1 measured a hair faster.
    night = Night({0: 0.85, 1: 0.86}, every_batches=4, ladder={"probe_after": 15})
    night.train(10 / 0.85 + 0.01)
    night.hang()
    assert night.d.s.rung == 0  # one hang in 12 s: no proof
    # Judged on its evidence alone it climbs, and rung 0 is tried again after 15 s of quiet at rung 1.
    alone = Night({0: 0.85, 1: 0.86}, every_batches=4, ladder={"probe_after": 15, "prior_between_hangs": "off"})
    alone.train(10 / 0.85 + 0.01)
    alone.hang()
    assert alone.d.s.rung == 1
    start = alone.d.t
    probe(alone)
    assert alone.spawns[-1].rung == 0 and alone.d.t - start < 30


def test_a_startup_hang_at_a_rung_not_yet_measured_is_one_sample_not_a_climb():
    # The issue's bad night: rung 0 measured (one hang in 60 s), then a freeze before rung 1's first batch.
    rungs = [RungFacts(15.0, 60, 1, 1.0), RungFacts(None, 0, 1), RungFacts(None, 0, 0)]
    back = rung_choice.after_hang(1, rungs, 15.0, prior=300.0)
    assert back.rung == 0 and "rung 1 unmeasured: at rung 0's speed" in back.why
    # With nothing measured below (the first attempt's startup), or judged on evidence alone, it climbs as before.
    first = rung_choice.after_hang(0, [RungFacts(None, 0, 1), RungFacts(None, 0, 0)], 15.0, prior=300.0)
    assert first.rung == 1
    assert rung_choice.after_hang(1, rungs, 15.0).rung == 2


def test_the_prior_worked_example_from_the_readme():
    # Issue 29's H100: rung 0 at 15.68 it/s, started in 0.9 s, hung 6 s into training; a hang costs 26.7 s.
    untried = RungFacts(None, 0, 0)
    alone = rung_choice.after_hang(0, [RungFacts(15.68, 6, 1, 0.9), untried], 25.8)
    assert alone.rung == 1 and "keeps 2.88 it/s of 15.68" in alone.why  # the evidence alone: it moved
    first = rung_choice.after_hang(0, [RungFacts(15.68, 6, 1, 0.9), untried], 25.8, prior=300.0)
    assert first.rung == 0 and "keeps 13.35 it/s" in first.why  # 15.68 x 153 / (153 + 26.7)
    assert "one hang per 153 s (1 in 6 s trained + a prior of 1 in 300 s)" in first.why
    second = rung_choice.after_hang(0, [RungFacts(15.68, 12, 2, 0.9), untried], 25.8, prior=300.0)
    assert second.rung == 1 and "keeps 12.48 it/s" in second.why  # M = 312 / 3; 15.68 > 1.25 x 12.48


def test_rung_choice_judged_on_each_rungs_evidence_alone():
    # Rung 0: 18.7 it/s, starts in 10 s, hung after 30 s of training; 15 s from a hang to the next spawn.
    untried = RungFacts(None, 0, 0)
    after_first = rung_choice.after_hang(0, [RungFacts(18.7, 30, 1, 10.0), untried, untried], 15.0)
    assert after_first.rung == 1  # 18.7 x 30 / (30 + 15 + 10) = 10.2 it/s kept; an untried rung might keep 18.7
    after_second = rung_choice.after_hang(1, [RungFacts(18.7, 30, 1, 10.0), RungFacts(9.9, 30, 1, 10.0), untried],
                                          15.0)
    # Rung 1 keeps 9.9 x 30 / 55 = 5.4; rung 2 could keep at most 9.9, under 1.25 x 10.2: back to rung 0.
    assert after_second.rung == 0 and "10.20" in after_second.why
    # A rung whose start is slow (spawned loader workers: 40 s) pays for it at every hang.
    slow = RungFacts(18.7, 30, 1, 40.0)
    assert rung_choice.expected_goodput(slow, rung_choice.hang_cost(slow, 15.0, [slow])) == pytest.approx(6.6, abs=0.05)
    # A rung that never reached its first batch costs the mean start of those that did.
    assert rung_choice.hang_cost(untried, 15.0, [slow, RungFacts(9.9, 30, 1, 10.0), untried]) == 40.0


class SamePoint:
    """Attempts that each hang at one point, resumed from chosen checkpoints, their stacks as chosen (issue 30)."""

    def __init__(self, **sections):
        self.d = Driver(make(workers=8, **sections))
        self.spawns = [self.d.boot_and_spawn()]
        self.pid, self.resume = PID, 0

    def attempt(self, hang_batch: int, checkpoint_at: int | None = None, phase: str = "train",
                stacks: Stacks | None = None) -> list:
        """Train from the resume point to ``hang_batch`` (a checkpoint at ``checkpoint_at``), then hang in ``phase``."""
        d = self.d
        d.beat("train", kind="phase", pid=self.pid)
        for batch in range(self.resume + 1, hang_batch + 1):
            d.t += 0.5
            d.beat(pid=self.pid, epoch=1, epochs=3, batch=batch, batches=100, samples=4)
            if batch == checkpoint_at:
                d.beat("train", kind="checkpoint", pid=self.pid, path="/s/last.pt", seconds=0.2, epoch=1,
                       batch=batch, progress=d.progress)
                self.resume = batch
        if phase == "val":
            d.t += 0.5
            d.beat("val", kind="phase", pid=self.pid)
        actions = d.at(d.t + 60.01)(core.Tick())
        assert d.s.stop is not None and d.s.stop.reason == core.Reason.HANG, actions
        if stacks is not None:
            d(core.IncidentEnriched(d.s.stop.incident.id, ({"pid": self.pid},), stacks=stacks))
        actions += d(core.TreeKilled(killed=1))
        spawns = [a for a in actions if isinstance(a, Spawn)]
        if spawns:
            self.spawns.append(spawns[0])
            self.pid += 1
            d.t += 3.0
            d(core.Spawned(self.pid, "/s/last.pt" if self.resume else None))
        return actions


LOADER_WORKER = Stacks("DataLoader worker in sleep at faults.py hang_forever", ("main (pid 4242) in poll",),
                       "DataLoader worker 0 (pid 77) in sleep, faults.py:87 hang_forever", 0.4, None,
                       in_loader_worker=True)
MAIN = Stacks("main in futex wait at tasks.py forward", ("main (pid 4242) in futex wait",),
              "main (pid 4242) in futex wait, tasks.py:120 forward", 0.4, None)


def exit_of(actions):
    return next((a for a in actions if isinstance(a, core.Exit)), None)


def test_a_loader_hang_at_the_same_point_from_the_same_resume_point_climbs_to_the_rung_that_changes_the_loader():
    """Issue 30 (a): env-only rungs first, a hang in DataLoader worker 0 at batch 28 from scratch at each: exit 78
    after rungs 0-2 before, though rung 3 (no loader workers) cures it."""
    run = SamePoint(ladder={"rungs": [{"env": {"FOO_A": "1"}}, {"env": {"FOO_B": "1"}}, {"loader": "process",
                                                                                          "workers": 0}],
                            "probe_after": "off"})
    for _ in range(2):
        assert exit_of(run.attempt(28, stacks=LOADER_WORKER)) is None
    # The first hang: the ladder's own choice (rung 0: one hang is no proof); the second at the same point: straight
    # to the loader's rung.
    assert [spawn.rung for spawn in run.spawns] == [0, 0, 3] and run.spawns[-1].rung_settings["workers"] == 0
    run.d.beat("train", kind="phase", pid=run.pid)
    run.d.at(run.d.t + 0.5).beat(pid=run.pid, epoch=1, epochs=3, batch=29, batches=100)  # past the point: cured
    assert run.d.s.exit is None and run.d.s.state == core.State.HEALTHY


def test_the_same_point_from_different_resume_points_climbs_only_to_rungs_that_change_what_hung():
    """A loader hang at the same point climbs to the loader's rungs, skipping env rungs; once none is left untried,
    the third from a third different resume point ends the run as deterministic (exit 78)."""
    run = SamePoint(ladder={"rungs": [{"env": {"FOO_A": "1"}}, {"workers": 0}, {"env": {"FOO_B": "1"}}],
                            "probe_after": "off"})
    ends = [run.attempt(28, checkpoint_at=checkpoint_at, stacks=LOADER_WORKER) for checkpoint_at in (10, 20, 25)]
    # The first hang: the ladder's own choice (rung 0: one hang is no proof); the second at the same point:
    # workers = 0, never an env rung.
    assert [spawn.rung for spawn in run.spawns] == [0, 0, 2]
    assert [exit_of(actions) is None for actions in ends] == [True, True, False]
    exit_ = exit_of(ends[-1])
    assert exit_.code == EXIT_CONFIG and "epoch 1, batch 28" in exit_.text
    assert "from 3 different resume points" in exit_.text and "no rung left changes" in exit_.text


def test_a_validation_hang_climbs_to_val_false_and_a_main_process_hang_from_different_resume_points_ends_with_78():
    """Issue 30 (b): a hang in validation with the default ladder reached exit 78 after rungs 0-2: val = false, the
    documented cure, was never tried."""
    run = SamePoint(ladder={"probe_after": "off"})
    top = len(run.d.s.ladder) - 1
    assert run.d.s.ladder.settings(top)["val"] is False
    for _ in range(2):
        assert exit_of(run.attempt(28, phase="val", stacks=MAIN)) is None
    assert run.spawns[-1].rung == top and run.spawns[-1].rung_settings["val"] is False
    # A hang in the model's forward (the main process, in training) from different resume points: no rung changes
    # it, and three of them end the run as deterministic, where the ladder stood.
    main = SamePoint(ladder={"probe_after": "off"})
    ends = [main.attempt(28, checkpoint_at=c, stacks=MAIN) for c in (10, 20, 25)]
    assert [exit_of(a) is None for a in ends] == [True, True, False]
    assert exit_of(ends[-1]).code == EXIT_CONFIG and "3 times in a row" in exit_of(ends[-1]).text
    assert main.d.s.attempt == 3


def test_startup_hangs_at_the_resume_point_are_never_taken_for_a_deterministic_hang():
    d = Driver(make(workers=8, watchdog={"startup_timeout": 5}))
    d.boot_and_spawn()
    for i in range(4):
        d.at(d.t + 6)(core.Tick())
        d(core.TreeKilled(killed=1))
        d(core.Spawned(PID + i + 1, None))
    assert d.s.exit is None and d.s.rung == 4 and len(d.s.hang_history.same_point_run()) == 4


def test_hangs_between_which_checkpoints_land_spend_no_restart_budget_and_a_loop_still_does():
    night = Night({0: 2.0, 1: 1.0}, restart={"max_restarts": 2, "window": 3600})
    for _ in range(6):  # a hang every 30 s, a checkpoint every 5 s: the run moves on between hangs
        night.train(30)
        night.hang()
    s = night.d.s
    assert s.exit is None and len(s.restart_times) == 6 and s.budget_left(1_700_000_000 + night.d.t) == 2
    night.every_batches = 10**6  # from here on nothing is saved between hangs: a loop
    exits = []
    for seconds in (3, 4, 5):
        night.train(seconds)
        exits = [a for a in night.hang() if isinstance(a, core.Exit)]
    assert len(exits) == 1 and "restart budget spent: 3 restarts" in exits[0].text
    assert "none after a new checkpoint" in exits[0].text


def test_a_hangs_cost_is_the_measured_stall_and_the_loss_the_interval_now_in_force_allows():
    history = HangHistory()
    assert history.stall_cost(10.0) is None  # nothing measured: the ladder assumes DEFAULT_STALL_COST
    history.hang(HangPoint("train", 1, 50), trained=30.0, last_progress_at=100.0, lost=30.0)  # every = 10 min
    history.spawned(112.0)  # 10 s to detect, 2 s to kill and spawn
    assert history.stall_cost(None) == pytest.approx(12.0 + 30.0)
    assert history.stall_cost(10.0) == pytest.approx(12.0 + 5.0)  # at a 10 s interval, 5 s are lost on average


def test_a_rung_that_moved_a_hang_tied_to_a_point_later_is_not_left_for_the_rung_that_hung_there():
    """Issue 41: rung 0 hung twice in the validation after epoch 1; rung 5 (val = false) trained all 3 epochs and hung
    in the final validation; the chooser went "faster: rung 0" (rung 5 had hung too), which hung there again and
    again. A rung that moved the hang later is progress: rung 0 is not gone back to."""
    h = HangHistory()
    for _ in range(2):
        h.hang(HangPoint("val", 1, 8, None, 0), 10.0, None, 0.0)
    newest = HangPoint("val", 3, 8, (2, 8), 5)
    h.hang(newest, 40.0, None, 0.0)
    assert h.passed(newest) == frozenset({0})
    rungs = [RungFacts(10.0, 30, 2), *[RungFacts(None, 0, 0)] * 4, RungFacts(9.0, 30, 1)]
    assert rung_choice.after_hang(5, rungs, 15.0, prior=300.0).rung == 0  # what it did: rung 0 is faster
    choice = rung_choice.after_hang(5, rungs, 15.0, prior=300.0, passed=h.passed(newest))
    assert choice.rung == 5 and "rung 0 left" in choice.why
    # One hang at a point is chance (a bad night hangs later and later whatever the rung): no rung is left for it.
    chance = HangHistory()
    chance.hang(HangPoint("train", 1, 3, None, 0), 10.0, None, 0.0)
    later = HangPoint("train", 2, 5, None, 1)
    chance.hang(later, 20.0, None, 0.0)
    assert chance.passed(later) == frozenset()
    # Nor is a rung whose hangs sat later than the newest, or in another phase.
    h.hang(HangPoint("train", 4, 1, None, 5), 50.0, None, 0.0)
    assert h.passed(h.points[-1]) == frozenset()


def test_the_ladder_climbs_where_the_witness_points():
    """The seeds' quick hangs, each put by the witness somewhere: on the training process's own lock no rung changes
    it (the run stays, and no rung's record counts it); a loader wait climbs the loader's rungs as before; a device
    wait on a ladder with no rung that changes the device's runtime stays too."""
    lock = Night({0: 2.0, 1: 1.8, 2: 1.6, 3: 1.4}, every_batches=5, ladder={"prior_between_hangs": "off"})
    for seconds in QUICK_HANGS[:3]:
        lock.train(seconds)
        actions = lock.hang({"kind": "lock", "function": "acquire"})
        assert lock.d.s.rung == 0
    why = [a.text for a in actions if isinstance(a, core.Log) and "no rung changes it" in a.text]
    assert why and "counts against no rung" in why[0], [a.text for a in actions if isinstance(a, core.Log)]
    assert choices.rung_facts(lock.d.s)[0].hangs == 0
    loader = Night({0: 2.0, 1: 1.8}, ladder={"prior_between_hangs": "off"})
    loader.train(6)
    loader.d.beat("train", kind="loader", pid=loader.pid, pids=[5001], seconds=0.4, loader="train",
                  progress=loader.d.progress)
    loader.d.beat("train", kind="wait", pid=loader.pid, progress=loader.d.progress,
                  wait={"kind": "loader", "where": "dataloader.py:1 in _try_get_data", "stalled": 1.0, "worker": 0,
                        "worker_pid": 5001, "batch_index": 3, "loader": "train"})
    choice = choices.after_a_hang(loader.d.s)  # (the in-place tier comes first; where it fails, the restart climbs)
    assert choice.rung == 1 and "the loader's rungs" in choice.why and choice.counts  # workers halved
    device = Night({0: 2.0, 1: 1.8}, ladder={"prior_between_hangs": "off"})
    device.train(6)
    device.hang({"kind": "device", "function": "synchronize"})
    assert device.d.s.rung == 0 and choices.rung_facts(device.d.s)[0].hangs == 0
    silent = Night({0: 2.0, 1: 1.8}, ladder={"prior_between_hangs": "off"})  # no word: as before
    silent.train(6)
    silent.hang()
    assert silent.d.s.rung == 1


def test_a_device_wait_in_validation_climbs_to_val_false_past_the_loader_rungs():
    from supervisor.decision.learning import hang_evidence
    night = Night({0: 2.0}, ladder={"prior_between_hangs": "off"})
    night.train(6)
    night.d.beat("val", kind="phase", pid=night.pid)
    night.d.beat("val", pid=night.pid, epoch=1, epochs=100, batch=12, batches=10_000)
    evidence = hang_evidence.Evidence(hang_evidence.RUNTIME_KEYS | {"val"}, "")
    top = len(night.d.s.ladder) - 1
    assert night.d.s.ladder.settings(top).get("val") is False
    assert [k for k in range(1, top + 1) if hang_evidence.eligible(night.d.s, evidence)(k)] == [top]
    night.d.beat("val", kind="wait", pid=night.pid, progress=night.d.progress,
                 wait={"kind": "device", "where": "val.py:9 in step", "stalled": 1.0, "function": "synchronize"})
    assert choices.after_a_hang(night.d.s).rung == top
