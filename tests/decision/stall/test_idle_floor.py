"""An idle tree's floor (issue 29): a stall in which the worker's whole process tree does nothing is bounded by
``idle_floor`` instead of ``auto_floor``, in the pure core on a chosen clock."""

from pathlib import Path

from supervisor.config import parse
from supervisor.decision import core
from supervisor.decision.model.ladder import build_ladder
from supervisor.decision.stall import watchdog
from supervisor.decision.status_view import snapshot
from tests.helpers.driver import PID, Driver, healthy, kinds, make, verdicts


def trained_at(interval: float, **sections) -> Driver:
    """Training at ``interval`` s a batch for 10 s; the last batch at ``d.t``."""
    d = Driver(make(**sections))
    d.boot_and_spawn()
    d.beat("train", kind="phase")
    d.train_until(1010, interval)
    return d


def verdict_at(d: Driver, start: float, step: float = 0.05, limit: float = 60.0) -> float:
    """The first tick from ``start`` on at which the watchdog acts: seconds after the last progress, to ``step``."""
    last = d.s.current.last_progress_at
    for k in range(int(limit / step)):
        if verdicts(d.at(start + k * step)(core.Tick())):
            return round(round((start + k * step - last) / step) * step, 2)
    raise AssertionError("no verdict")


def test_a_stall_whose_tree_went_idle_is_found_at_the_idle_floor_and_says_so():
    d = trained_at(0.1)
    last = d.t
    d.at(last + 0.6)(core.TreeActivity(idle_since=last + 0.4))  # the sampler's first idle window began 0.4 s in
    due = d.s.watch.deadline
    assert (round(due.at - last, 2), due.label) == (3.4, "train auto, idle")  # idle for idle_floor (3 s)
    actions = d.at(last + 3.4)(core.Tick())
    assert kinds(actions) == ["Log", "PrimeStandby", "KillTree"]
    assert "no progress for 3.4 s in train (train auto, idle 3.4 s)" in actions[-1].incident.detail


def test_the_same_stall_on_a_busy_tree_waits_for_auto_floor():
    """A tree that spins (a GPU kernel that never ends, a busy loop) is no proof: the floor stays 10 s."""
    d = trained_at(0.1)
    last = d.t
    d.at(last + 0.6)(core.TreeActivity(idle_since=last + 0.4))
    d.at(last + 2.0)(core.TreeActivity(idle_since=None))  # busy again before its idle_floor was up
    assert verdicts(d.at(last + 9.9)(core.Tick())) == []
    assert (d.s.watch.deadline.label, verdict_at(d, last + 9.9)) == ("train auto", 10.0)


def test_the_factor_still_bounds_an_idle_tree_and_off_turns_the_floor_off():
    slow = trained_at(0.5)  # 10 x 0.5 s: an idle tree waits 5 s, not 3
    slow.at(slow.t + 0.5)(core.TreeActivity(idle_since=slow.t + 0.2))
    assert verdict_at(slow, slow.t + 0.5) == 5.0
    off = trained_at(0.1, watchdog={"idle_floor": "off"})
    off.at(off.t + 0.5)(core.TreeActivity(idle_since=off.t + 0.2))
    assert verdict_at(off, off.t + 0.5) == 10.0


def test_validation_is_bounded_by_its_own_intervals_only_before_the_floor_drops():
    """Validation's first batch is bounded by training's batches (another shape, maybe a kernel search): it keeps
    auto_floor; once validation has intervals of its own, an idle tree's stall there is found at idle_floor."""
    d = trained_at(0.1)
    d.t += 0.1
    d.beat("val", kind="phase")
    entered = d.t
    d.at(entered + 0.5)(core.TreeActivity(idle_since=entered))
    assert (d.s.watch.deadline.label, round(d.s.watch.deadline.at - entered, 2)) == ("val auto", 10.0)
    d.at(entered)(core.TreeActivity(idle_since=None))
    for _ in range(5):
        d.t += 0.2
        d.beat("val", epoch=1, epochs=3, batch=1, batches=10)
    last = d.t
    d.at(last + 0.5)(core.TreeActivity(idle_since=last + 0.1))
    assert (d.s.watch.deadline.label, round(d.s.watch.deadline.at - last, 2)) == ("val auto, idle", 3.1)


def test_a_startup_step_seen_before_is_bounded_by_the_idle_floor_one_never_seen_by_startup_timeout():
    """The seeds' first batch that never runs after a resume: its step was seen (0.2 s) in the first attempt."""
    d = trained_at(0.1)
    d.s.startup_steps_seen["first_step"] = 0.2
    d.s.startup_steps_seen.pop("model", None)
    d.at(d.t + 10.01)(core.Tick())  # a hang; the restart
    d(core.TreeKilled(killed=1))
    d(core.Spawned(PID + 1, "/s/last.pt"))
    d.beat("setup", kind="step", step="model", pid=PID + 1)
    entered = d.t
    d.at(entered + 1)(core.TreeActivity(idle_since=entered + 0.5))  # never seen: no auto bound to lower
    assert d.s.watch.deadline.label == "startup_timeout"
    d.at(entered + 2)(core.TreeActivity(idle_since=None))
    d.at(entered + 5).beat("setup", kind="step", step="first_step", pid=PID + 1)
    entered = d.t
    assert (d.s.watch.deadline.label, d.s.watch.deadline.at - entered) == ("first_step auto", 10.0)
    d.at(entered + 1.5)(core.TreeActivity(idle_since=entered + 0.5))
    due = d.s.watch.deadline
    assert (due.label, due.at - entered) == ("first_step auto, idle", 3.5)
    actions = d.at(entered + 3.5)(core.Tick())
    assert "KillTree" in kinds(actions) and actions[-1].incident.startup_step == "first_step"


def host_of_two() -> Driver:
    """Host 1 of two, its one rank (global rank 0, pid PID) training a batch every 0.1 s for 10 s."""
    raw = {"train": {"data": "demo", "workers": 2},
           "distributed": {"nnodes": 2, "node_rank": 1, "rdzv_endpoint": "10.0.0.1:29400", "rdzv_id": "job",
                           "run_dir": "/shared"}}
    s = core.Supervision(parse(raw, "host.toml", state_dir=Path("/nonexistent")),
                         build_ladder(None, 2, rocm=False, cuda=False))
    d = Driver(s)
    d.boot_and_spawn()
    d.beat("train", kind="phase", rank=0)
    for _ in range(100):
        d.t += 0.1
        d.beat(epoch=1, epochs=3, batch=1, batches=10, samples=4, rank=0)
    return d


def test_several_hosts_keep_auto_floor_a_rank_waiting_for_another_hosts_is_idle():
    d = host_of_two()
    d.at(d.t + 0.5)(core.TreeActivity(idle_since=d.t + 0.1))
    assert d.s.watch.deadline.label == "train auto"
    assert verdict_at(d, d.t) == 10.0


def test_several_hosts_a_tree_frozen_whole_is_found_at_the_idle_floor():
    """Every rank of this host stopped (SIGSTOP to the tree): it waits for no other host, so the idle floor holds. The
    tree is read for it from 0.5 s into the stall although an idle tree alone would not shorten the bound."""
    d = host_of_two()
    last = d.s.current.last_progress_at
    assert d.s.watch.tree_from == last + 0.5
    d.at(last + 0.5)(core.TreeActivity(idle_since=None, stopped=frozenset({PID})))  # the first reading: no window
    assert d.s.watch.deadline.label == "train auto"  # stopped, not idle yet
    d.at(last + 1.5)(core.TreeActivity(idle_since=last + 0.5, stopped=frozenset({PID})))
    assert d.s.watch.deadline.label == "train auto, idle"
    assert verdict_at(d, last + 1.5) == 3.5  # idle since 0.5 s in, for idle_floor (3 s)
    [hang] = d.s.incidents
    assert hang.ranks[0]["waiting_kind"] == "stopped"


def test_several_hosts_a_rank_stopped_among_running_ones_is_found_at_the_idle_floor_too():
    """Host 1 with two ranks, one stopped and one waiting for it in a collective: the stall is this host's own."""
    d = host_of_two()
    d.beat(epoch=1, epochs=3, batch=1, batches=10, samples=4, rank=1, pid=PID + 1)
    last = d.s.current.last_progress_at
    d.at(last + 1.5)(core.TreeActivity(idle_since=last + 0.5, stopped=frozenset({PID + 1})))
    assert d.s.watch.deadline.label == "train auto, idle"
    d.at(last + 2.5)(core.TreeActivity(idle_since=last + 0.5))  # continued, idle: a wait for another host
    assert d.s.watch.deadline.label == "train auto"


def test_a_report_between_workers_is_nobodys_and_a_pause_forgets_the_idleness():
    d = healthy()
    d.at(d.t + 10.01)(core.Tick())  # a hang: stopping
    d(core.TreeActivity(idle_since=d.t))
    assert d.s.current.idle_since is None
    d(core.TreeKilled(killed=1))
    d(core.Spawned(PID + 1, "/s/last.pt"))
    assert d.s.current.idle_since is None
    d.beat("train", kind="phase", pid=PID + 1)
    d(core.TreeActivity(idle_since=d.t))
    assert snapshot(d.s, core.Now(d.t + 2, 0)).watchdog.tree_idle_seconds == 2
    d(core.SupervisorPaused(30.0))  # nobody watched the tree meanwhile
    assert d.s.current.idle_since is None and snapshot(d.s, core.Now(d.t, 0)).watchdog.tree_idle_seconds is None


def test_the_tree_is_read_only_once_a_stall_lasts_so_long_that_idleness_could_shorten_it():
    """Batches every 0.1 s: from 0.5 s into a stall (never between batches). Every 0.5 s: from 2 s in, so idle for
    idle_floor (3 s) meets its idle bound (5 s). Every 1 s: never, the factor alone gives 10 s. Nor when off."""
    fast = trained_at(0.1)
    assert fast.s.watch.tree_from == fast.s.current.last_progress_at + 0.5
    slow = trained_at(0.5)
    assert slow.s.watch.tree_from == slow.s.current.last_progress_at + 2.0
    assert trained_at(1.0).s.watch.tree_from is None
    assert trained_at(0.1, watchdog={"idle_floor": "off"}).s.watch.tree_from is None
    stopping = trained_at(0.1)
    stopping.at(stopping.t + 10.01)(core.Tick())
    assert stopping.s.watch.tree_from is None


def test_progress_forgets_the_idleness_of_the_stall_before_it():
    d = trained_at(0.1)
    d.at(d.t + 1.5)(core.TreeActivity(idle_since=d.t + 0.5))
    d.t += 0.1
    d.beat(epoch=1, epochs=3, batch=2, batches=10, samples=4)  # it moved after all
    assert d.s.current.idle_since is None and d.s.watch.deadline.label == "train auto"
    d.beat("setup", kind="step", step="first_batch")  # a step's news, too
    assert d.s.current.idle_since is None


def first_batch_done(step: float = 8.0) -> Driver:
    """An attempt's first batch just done (after ``step`` s of startup): no batch interval seen yet."""
    d = Driver(make())
    d.boot_and_spawn()
    d.beat("train", kind="phase")
    d.t += step
    d.beat(epoch=1, epochs=3, batch=1, batches=4, samples=8)
    assert d.s.state == core.State.HEALTHY and not d.s.current.intervals.get("train")
    return d


def said(d: Driver, since: float, kind: str, where: str, n: int, **fields) -> None:
    for k in range(1, n + 1):
        d.t = since + 0.5 * k
        d.beat("train", kind="wait", pid=PID, progress=d.progress,
               wait={"kind": kind, "where": where, "stalled": 0.5 * k, **fields})


def test_an_attempts_first_batch_interval_has_no_short_bound_whatever_the_witness_or_the_tree_says():
    """A slow step (4-5 s on a CPU, or a big model on a small GPU) in an attempt's second batch, with no interval seen
    yet: its host asleep in the device wait and the tree idle, or its forward in one conv function after another, is
    no hang at idle_floor; the auto_floor (10 s) holds until the phase has a rhythm. Else every attempt's second batch
    is killed, a loop."""
    for kind, where, fields in (("device", "loss.py:80 in __call__", {"function": "item"}),
                                ("elsewhere", "torch/nn/modules/conv.py:456 in _conv_forward", {})):
        d = first_batch_done()
        last = d.t
        said(d, last, kind, where, 9, **fields)
        d(core.TreeActivity(idle_since=last + 0.2))
        assert d.s.watch.deadline.label == "train auto", kind
        assert verdict_at(d, last + 0.5) == 10.0, kind


def test_once_a_batch_interval_is_seen_a_device_wait_has_the_short_bound_again():
    d = first_batch_done()
    d.t += 0.2
    d.beat(epoch=1, epochs=3, batch=2, batches=4, samples=8)  # one interval: 0.2 s
    last = d.t
    said(d, last, "device", "loss.py:80 in __call__", 3, function="item")
    assert d.s.watch.deadline.label == "train auto, witness: device"
    assert verdict_at(d, last + 1.5) == 3.0
