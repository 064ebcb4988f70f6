"""A hung tree's stacks read ahead of the verdict (decision/recovery/stacks_ahead.py), in the pure core on a chosen clock: asked
once a stall has lasted its bound less a lead, once per stall; kept only while that stall goes on; taken by the
verdict's incident, so the shell's kill reads none; not asked where [incidents] stacks is off or the in-place tier
would take the hang; asked again where the stall's bound grows or news starts a new one."""

import pytest

from supervisor.decision import core
from supervisor.decision.model.actions import DropStacksAhead, ReadStacksAhead
from supervisor.decision.model.incident import Stacks
from supervisor.decision.stall import watchdog
from tests.helpers.driver import PID, Driver, healthy, kinds, loading, make, verdicts

READ = Stacks("main (pid 4242) in cudaStreamSynchronize", ("main (pid 4242) cudaStreamSynchronize",), None, 1.1,
              "incidents/ahead-1/stacks.json")


def asked(actions) -> list[ReadStacksAhead]:
    return [a for a in actions if isinstance(a, ReadStacksAhead)]


def ticks(d: Driver, start: float, end: float, step: float = 0.1) -> list:
    """Every action of a tick each ``step`` from ``start`` to ``end`` (the agent ticks whenever something is due)."""
    actions = []
    for k in range(round((end - start) / step) + 1):
        actions += d.at(round(start + k * step, 6))(core.Tick())
    return actions


def test_asked_once_at_the_bound_less_the_budget_kept_and_taken_by_the_verdict_whose_kill_reads_none():
    d = healthy()  # 0.5 s a batch: train auto is its 10 s floor; the lead is stacks_budget (3 s)
    last = d.s.current.last_progress_at
    assert d.s.watch.deadline.at == last + 10.0 and d.s.watch.stacks_at == last + 7.0
    assert d.s.watch.wake.kind == watchdog.DeadlineKind.STACKS_AHEAD
    assert ticks(d, last + 0.1, last + 6.9) == []
    [ask] = asked(ticks(d, last + 7.0, last + 9.9))  # once in this stall, answered or not
    assert (ask.attempt, ask.since) == (1, last)
    said = d.at(last + 8.2)(core.StacksReadAhead(ask.since, last + 7.0, READ))
    assert kinds(said) == ["Log"] and "1.10 s" in said[0].text and "1.8 s before its verdict" in said[0].text
    assert d.s.watch.wake.kind == watchdog.DeadlineKind.PHASE  # read: the verdict is what is due next
    actions = d.at(last + 10.0)(core.Tick())
    assert kinds(actions)[-3:] == ["Log", "PrimeStandby", "KillTree"] and "read 3.00 s before the verdict" in actions[-3].text
    incident = actions[-1].incident
    assert incident.stacks.where == READ.where and incident.stacks.ahead == 3.0  # the shell reads nothing again
    assert incident.to_dict()["stacks_ahead_seconds"] == 3.0 and incident.to_dict()["stacks_seconds"] == 1.1
    assert d.s.current.stacks_ahead is None and "DropStacksAhead" not in kinds(actions)  # its file is the incident's
    d(core.IncidentEnriched(incident.id, (), stacks=incident.stacks))  # the shell moved it into its directory
    assert d.s.stop.incident.stacks.ahead == 3.0


def test_an_idle_tree_reads_them_at_half_its_short_bound():
    d = Driver(make())  # 0.1 s a batch: an idle tree's bound is its idle floor (3 s) from when it went idle
    d.boot_and_spawn()
    d.beat("train", kind="phase")
    d.train_until(1010, 0.1)
    last = d.s.current.last_progress_at
    d.at(last + 0.6)(core.TreeActivity(idle_since=last + 0.4))  # idle floor: the verdict at 3.4 s
    assert d.s.watch.deadline.at == pytest.approx(last + 3.4)
    assert d.s.watch.stacks_at == pytest.approx(last + 1.7)  # half of it: the budget (3 s) is longer
    assert asked(ticks(d, last + 0.7, last + 1.6)) == []
    assert len(asked(ticks(d, last + 1.71, last + 3.31))) == 1


def test_progress_drops_them_and_the_next_stall_is_read_afresh():
    d = healthy()
    last = d.s.current.last_progress_at
    [ask] = asked(d.at(last + 7.0)(core.Tick()))
    d.at(last + 8.1)(core.StacksReadAhead(ask.since, last + 7.0, READ))
    dropped = d.at(last + 8.3).beat(epoch=1, epochs=3, batch=2, batches=10, samples=4)  # the stall is over
    assert [a.path for a in dropped if isinstance(a, DropStacksAhead)] == [READ.path]
    assert d.s.current.stacks_ahead is None
    d.train_until(last + 12.0, 0.5)
    again, due = d.s.current.last_progress_at, d.s.watch.deadline.at  # (10 x the 8.3 s gap now)
    assert d.s.watch.stacks_at == due - 3.0
    [second] = asked(d.at(due - 3.0)(core.Tick()))
    assert second.since == again
    actions = d.at(due)(core.Tick())  # not told: the verdict's kill reads them, as before
    assert kinds(actions)[-1] == "KillTree" and actions[-1].incident.stacks is None


def test_progress_while_they_are_read_drops_them_at_once():
    """The shell answers before any other event; a stall that ended meanwhile (a pause moved every clock) keeps
    nothing of them."""
    d = healthy()
    last = d.s.current.last_progress_at
    [ask] = asked(d.at(last + 7.0)(core.Tick()))
    d.at(last + 7.5)(core.SupervisorPaused(4.0))
    answer = d.at(last + 8.0)(core.StacksReadAhead(ask.since, last + 7.0, READ))
    assert kinds(answer) == ["DropStacksAhead"] and d.s.current.stacks_ahead is None


def test_not_asked_where_incidents_stacks_is_off():
    d = healthy(incidents={"stacks": False})
    last = d.s.current.last_progress_at
    assert d.s.watch.stacks_at is None
    actions = ticks(d, last + 0.1, last + 10.0)
    assert asked(actions) == [] and kinds(actions)[-1] == "KillTree" and actions[-1].incident.stacks is None


def test_a_stall_whose_bound_grows_is_read_again_before_its_new_verdict():
    d = Driver(make())
    d.boot_and_spawn()
    d.beat("train", kind="phase")
    d.train_until(1010, 0.1)
    last = d.s.current.last_progress_at
    d.at(last + 0.6)(core.TreeActivity(idle_since=last + 0.4))
    [first] = asked(ticks(d, last + 0.71, last + 2.01))
    d.at(last + 2.6)(core.StacksReadAhead(first.since, last + 1.7, READ))
    d.at(last + 2.8)(core.TreeActivity(idle_since=None))  # busy again: its bound is 10 s once more
    assert d.s.watch.stacks_at == pytest.approx(last + 7.0)
    assert asked(ticks(d, last + 2.9, last + 6.9)) == []
    [again] = asked(ticks(d, last + 7.01, last + 9.91))
    assert again.since == last  # the same stall, read nearer its verdict


def test_news_in_a_startup_step_starts_a_new_stall_read_again():
    d = Driver(make(watchdog={"startup_timeout": 20}))
    d.boot_and_spawn()
    step = lambda done: d.beat("setup", kind="step", pid=PID, progress=d.progress, step="dataset", done=done,
                               total=100)
    d.at(1001.0)
    step(10)
    assert d.s.watch.deadline.at == 1021.0 and d.s.watch.stacks_at == 1018.0
    [ask] = asked(d.at(1018.0)(core.Tick()))
    d.at(1019.0)(core.StacksReadAhead(ask.since, 1018.0, READ))
    news = d.at(1019.5).beat("setup", kind="step", pid=PID, progress=d.progress, step="dataset", done=20, total=100)
    assert "DropStacksAhead" in kinds(news) and d.s.current.stacks_ahead is None
    assert d.s.watch.stacks_at == 1036.5  # its new bound (startup_timeout) less the lead
    assert asked(ticks(d, 1019.6, 1036.4)) == []
    [again] = asked(d.at(1036.5)(core.Tick()))
    assert again.since == 1019.5


def test_a_hang_the_in_place_tier_takes_is_not_read_ahead_one_it_would_pass_on_is():
    d = loading()  # loader workers reported: the in-place tier reads its own stacks
    last = d.s.current.last_progress_at
    assert d.s.watch.stacks_at is None
    assert kinds(ticks(d, last + 0.1, last + 10.0))[-1] == "InspectStall"
    d = loading()
    d.at(last + 1.0).beat("train", kind="wait", pid=PID, progress=d.progress,
                          wait={"kind": "device", "where": "trainer.py:42 in step", "stalled": 1.0,
                                "function": "synchronize"})  # the restart's: a device wait
    assert d.s.watch.stacks_at == last + 1.5  # half of the device wait's 3 s
    actions = ticks(d, last + 1.1, last + 3.0)
    assert len(asked(actions)) == 1 and verdicts(actions)[-1].incident.tiers[-1].value == "restart"


def test_a_loader_hang_past_in_place_max_is_the_restarts_and_read_ahead():
    """in_place_max (3) recoveries within in_place_window: the next loader hang goes to the restart, which finds its
    stacks read ahead and reads none at the kill (read there, they cost 1-2 s more in every such restart)."""
    d = loading()
    last = d.s.current.last_progress_at
    wall = 1_700_000_000 + last  # the driver's wall clock at the last batch
    d.s.escalations = [wall - 4000, wall - 300, wall - 100]  # one out of in_place_window (3600 s): 2 recent
    assert d(core.Tick()) == [] and d.s.watch.stacks_at is None  # the tier would take it, and reads its own
    d.s.escalations = [wall - 600, wall - 300, wall - 100]
    assert d(core.Tick()) == [] and d.s.watch.stacks_at == last + 7.0  # (the next decision judges the stall anew)
    [ask] = asked(ticks(d, last + 0.1, last + 9.9))
    d.at(last + 8.0)(core.StacksReadAhead(ask.since, last + 7.0, READ))
    actions = d.at(last + 10.0)(core.Tick())
    assert kinds(actions)[-1] == "KillTree"
    incident = actions[-1].incident
    assert incident.tiers[-1].value == "restart" and "in_place_max" in incident.escalation
    assert incident.stacks.where == READ.where
    assert incident.stacks.ahead == 3.0  # the kill reads nothing again
