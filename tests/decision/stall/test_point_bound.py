"""No loop from a wait the judge got wrong (issue 58.4), on a chosen clock: verdicts at one point for one wait, each
short of the phase's own bound, give that point the phase's own bound in the next attempt, and their restarts spend
no budget. Timings of the CPU demo's 6 s join at the first epoch's end (0.5 s a batch, the tree idle: 5 s over the
idle floor, 10 s over auto_floor)."""

import pytest

from supervisor.decision import core
from supervisor.decision.model.actions import ReadStacksAhead
from supervisor.decision.model.state import Supervision
from supervisor.decision.stall import watchdog
from tests.helpers.driver import PID, Driver, kinds, make

JOIN = {"kind": "lock", "where": "threading.py:1139 in _wait_for_tstate_lock", "function": "_wait_for_tstate_lock"}


def attempt(d: Driver, batches: int = 10) -> float:
    """A new worker trains epoch 1 from its start to its last batch at 0.5 s a batch; the last progress's time."""
    d.at(d.t + 1.0)(core.Spawned(PID, None))
    d.beat("train", kind="phase", epoch=1, epochs=3, batch=0, batches=batches)
    for b in range(1, batches + 1):
        d.t += 0.5
        d.beat(epoch=1, epochs=3, batch=b, batches=batches, samples=4)
    return d.t


def epoch_end_wait(d: Driver, last: float, until: float) -> list:
    """The callback joins a thread: the witness says so every 0.5 s, the tree idle; the ticks up to ``until``."""
    d.at(last + 0.6)(core.TreeActivity(idle_since=last + 0.4))
    actions, k = [], 1
    while last + 0.5 * k <= until:
        d.t = last + 0.5 * k
        d.beat("train", kind="wait", progress=d.progress, wait={**JOIN, "stalled": 0.5 * k})
        actions += [a for a in d(core.Tick()) if not isinstance(a, ReadStacksAhead)]
        if "KillTree" in kinds(actions):
            return actions
        k += 1
    return actions


def killed(d: Driver) -> list:
    return d.at(d.t + 0.5)(core.TreeKilled(killed=3))


def killed_twice_at_the_epoch_end(d: Driver) -> None:
    """Two attempts, each killed at epoch 1's end in a 6 s wait: the point is owed the phase's bound."""
    for _ in (1, 2):
        last = attempt(d)
        epoch_end_wait(d, last, last + 6.0)
        killed(d)


def test_two_verdicts_at_one_epoch_end_for_one_wait_give_it_the_phases_bound_and_spend_no_budget():
    d = Driver(make(restart={"max_restarts": 1}))
    d(core.Boot())
    for n in (1, 2):
        last = attempt(d)
        actions = epoch_end_wait(d, last, last + 6.0)
        assert "KillTree" in kinds(actions) and d.t == pytest.approx(last + 5.0)  # train auto over the idle floor
        incident = d.s.incidents[-1]
        if n == 1:
            assert incident.point_bound is None
        else:
            assert incident.point_bound == ("this point gets the phase's bound after 2 verdicts here "
                                            "(lock at threading.py:_wait_for_tstate_lock)")
            assert any("this point gets the phase's bound after 2 verdicts here" in a.text for a in actions
                       if isinstance(a, core.Log))
        after = killed(d)
        assert "Spawn" in kinds(after), [a.text for a in after if isinstance(a, core.Log)]
    assert d.s.budget_times == []  # the one restart the budget allows was given back: no Exit at the second
    last = attempt(d)
    assert epoch_end_wait(d, last, last + 6.0) == []  # the 6 s join passes: the phase's own bound (train auto 10 s)
    assert d.s.watch.deadline.label == "train auto, this point gets the phase's bound after 2 verdicts here"
    assert d.s.watch.deadline.at == pytest.approx(last + 10.0)
    d.at(last + 6.2).beat("val", kind="phase", epoch=1, epochs=3, batch=10, batches=10)  # the wait ended
    assert d.s.state == core.State.HEALTHY


def test_the_point_keeps_its_bound_across_a_supervisor_restart_and_only_for_that_wait():
    d = Driver(make())
    d(core.Boot())
    killed_twice_at_the_epoch_end(d)
    restored = Supervision(d.s.config, d.s.ladder)
    restored.restore(d.s.persistent(d.t))
    assert restored.hang_history.owed_point() is not None
    again = Driver(restored)
    again.t = d.t
    again(core.Boot())
    last = attempt(again)
    assert epoch_end_wait(again, last, last + 6.0) == []
    # another wait at that point (a sleep there) is judged as any
    again.at(again.t + 0.5).beat("train", kind="wait", progress=again.progress,
                              wait={"kind": "sleep", "where": "cb.py:3 in on_end", "stalled": 0.5})
    assert "verdicts here" not in again.s.watch.deadline.label


def test_a_kill_at_the_phases_own_bound_there_spends_the_budget():
    d = Driver(make())
    d(core.Boot())
    killed_twice_at_the_epoch_end(d)
    last = attempt(d)
    actions = epoch_end_wait(d, last, last + 12.0)  # a wait that never ends: killed at the phase's own bound
    assert "KillTree" in kinds(actions) and d.t == pytest.approx(last + 10.0)
    killed(d)
    assert len(d.s.budget_times) == 1
