"""Issue 50, on a chosen clock: a stretch the witness could not speak through (C code holding the GIL: its thread
cannot run) is judged by what the tree does, not by the witness's last word; and a verdict is checked again after its
stacks are read, so progress that came meanwhile drops it (supervisor/decision/witness.py ``silent_from``,
watchdog.py ``silent_bound``, core.py ``_tick``)."""

from supervisor.decision import core
from supervisor.decision.learning import hang_evidence
from supervisor.decision.model.incident import Stacks
from supervisor.decision.stall import watchdog
from tests.helpers.driver import PID, Driver, healthy, kinds, make, verdicts

PICKLE = Stacks("main thread in pickle.dumps (callbacks.py:20 in on_fit_epoch_end)",
                ("pid 4242: dumps (callbacks.py:20 in on_fit_epoch_end)",), None, 0.4, "ahead-2/stacks.json")


def trained(interval: float = 0.5, answers_stacks: bool = True) -> Driver:
    """Healthy at ``interval`` a batch, its witness heard once (a stall of its first batch): it has a witness."""
    d = Driver(make(), answers_stacks)
    d.boot_and_spawn()
    d.beat("train", kind="phase")
    d.t += 0.7
    d.beat("train", kind="wait", progress=d.progress, wait={"kind": "elsewhere", "where": "a.py:1 in f",
                                                             "stalled": 0.5})
    d.train_until(d.t + 20 * interval, interval)
    return d


def listcomp(d: Driver, at: float, n: int, phase: str = "train") -> None:
    """The witness's words, one each half second from ``at``: Python's list comprehension before the C call."""
    for k in range(n):
        d.t = at + 0.5 * k
        d.beat(phase, kind="wait", pid=PID, progress=d.progress,
               wait={"kind": "elsewhere", "where": "callbacks.py:18 in <listcomp>", "stalled": 0.5 * (k + 1)})


def test_a_gil_held_call_after_a_word_at_one_place_is_work_while_the_tree_is_busy():
    """A healthy callback: 1 s of Python, then pickle.dumps holding the GIL for seconds. Its last word (<listcomp>)
    held "one place" for 3 s and killed it; silent after it, a busy tree works until the phase's own bound (10 s)."""
    d = trained()
    last = d.t
    listcomp(d, last + 0.5, 2)  # 0.5, 1.0: then silence
    assert verdicts(d.at(last + 3.5)(core.Tick())) == []  # was the one-place verdict at 3 s
    assert d.s.watch.deadline == watchdog.Deadline(last + 10, watchdog.DeadlineKind.PHASE, "train auto")
    assert verdicts(d.at(last + 9.9)(core.Tick())) == []
    d.at(last + 8.0).beat(epoch=1, epochs=3, batch=3, batches=10, samples=4)  # the dump ended: training goes on
    assert d.s.state == core.State.HEALTHY and d.s.incidents == []


def test_at_an_epochs_end_a_gil_held_save_keeps_the_ends_own_bound_and_the_incident_names_the_stacks_frame():
    d = trained(answers_stacks=False)
    d.beat("save", kind="phase", epoch=1, epochs=3, batch=10, batches=10)
    last = d.t
    listcomp(d, last + 0.5, 2, phase="save")
    assert d.s.watch.deadline.label == "save_timeout"  # busy: the end's own bound, never "one place"
    due = d.s.watch.deadline.at
    ahead = d.s.watch.stacks_at
    asked = d.at(ahead)(core.Tick())
    assert kinds(asked) == ["ReadStacksAhead"]
    d(core.StacksReadAhead(asked[0].since, ahead, PICKLE))
    actions = d.at(due + 0.01)(core.Tick())
    incident = [a for a in actions if isinstance(a, core.KillTree)][0].incident
    assert "<listcomp>" not in incident.witness and "held at one place" not in incident.detail
    assert incident.witness.startswith("the training process's witness said nothing for the last")
    assert incident.witness.endswith("the training thread busy; the stacks saw: main thread in pickle.dumps (callbacks.py:20 "
                                     "in on_fit_epoch_end)")


def test_an_idle_tree_held_by_a_c_call_is_found_at_the_idle_floor_mid_epoch_and_at_an_epochs_end():
    """An idle tree whose training process holds the GIL in a C call (its witness silent): 8.3 s mid-epoch (10 x a
    0.83 s batch), 25 s at an epoch's end; it is a hang at idle_floor (3 s) from the tree's idleness, in every phase."""
    for phase in ("train", "save"):
        d = trained(interval=0.83)
        if phase == "save":
            d.beat("save", kind="phase", epoch=1, epochs=3, batch=10, batches=10)
        last = d.t
        listcomp(d, last + 0.5, 1, phase=phase)
        d.at(last + 1.5)(core.TreeActivity(idle_since=last + 1.0, thread_idle_since=last + 1.0))
        due = d.s.watch.deadline
        assert (due.at, due.label.endswith("witness silent, idle")) == (last + 4.0, True), phase
        actions = d.at(last + 4.01)(core.Tick())
        incident = [a for a in actions if isinstance(a, core.KillTree)][0].incident
        assert "the training thread idle" in incident.witness and "the training thread idle" in incident.detail


def test_a_word_of_a_wait_that_releases_the_gil_is_no_silence():
    """A loader, the device, I/O, a sleep release the GIL: the witness keeps saying them, and one word stands."""
    d = trained()
    last = d.t
    d.at(last + 1.0).beat("train", kind="wait", progress=d.progress,
                          wait={"kind": "io", "where": "socket.py:5 in recv", "stalled": 1.0})
    d(core.TreeActivity(idle_since=last + 1.0, thread_idle_since=last + 1.0))
    assert d.s.watch.deadline == watchdog.Deadline(last + 10, watchdog.DeadlineKind.PHASE, "train auto")


def test_a_verdict_due_before_its_stacks_were_read_waits_for_them_and_progress_meanwhile_drops_it():
    """Issue 50: a 6 s wait got its verdict at 5.6 s, ended 0.8 s later, and was killed 2.8 s after it ended (the
    stacks read between the verdict and the kill). The stacks are read first; the verdict is checked after them."""
    d = trained(answers_stacks=False)
    last = d.t
    listcomp(d, last + 0.5, 2)
    d.at(last + 1.5)(core.TreeActivity(idle_since=last + 0.5, thread_idle_since=last + 0.5))  # the bound falls at once: no reading ahead came
    due = d.s.watch.deadline.at
    asked = d.at(due + 0.01)(core.Tick())
    assert kinds(asked) == ["ReadStacksAhead"] and d.s.state == core.State.HEALTHY  # no verdict, no kill yet
    d.at(due + 0.8).beat(epoch=1, epochs=3, batch=3, batches=10, samples=4)  # the wait ended while they were read
    late = d.at(due + 1.5)(core.StacksReadAhead(asked[0].since, due + 0.01, PICKLE))
    assert kinds(late) == ["DropStacksAhead"]
    assert verdicts(d.at(due + 1.5)(core.Tick())) == [] and d.s.state == core.State.HEALTHY
    assert d.s.incidents == []


def test_a_verdict_whose_stall_goes_on_through_the_reading_kills_with_those_stacks():
    d = trained(answers_stacks=False)
    last = d.t
    listcomp(d, last + 0.5, 2)
    d.at(last + 1.5)(core.TreeActivity(idle_since=last + 0.5, thread_idle_since=last + 0.5))
    due = d.s.watch.deadline.at
    asked = d.at(due + 0.01)(core.Tick())
    d.at(due + 1.5)(core.StacksReadAhead(asked[0].since, due + 0.01, PICKLE))
    actions = d(core.Tick())
    kill = [a for a in actions if isinstance(a, core.KillTree)][0]
    assert kill.incident.stacks.where == PICKLE.where and kill.incident.stacks.ahead == 1.49


def test_a_word_of_no_known_wait_from_an_idle_tree_is_no_busy_wait():
    """The verdict said "only an environment rung (a native busy wait looks so)" for a process asleep."""
    d = healthy()
    last = d.t
    for k in range(4):  # in a native call (pickle's dumps) from one place
        d.t = last + 0.5 * (k + 1)
        d.beat("train", kind="wait", pid=PID, progress=d.progress,
               wait={"kind": "elsewhere", "where": "callbacks.py:20 in on_fit_epoch_end", "function": "dumps",
                     "stalled": 0.5 * (k + 1)})
    assert hang_evidence.of(d.s).keys == frozenset({"env"}) and "its tree busy" in hang_evidence.of(d.s).why
    d(core.TreeActivity(idle_since=last + 0.5, thread_idle_since=last + 0.5))
    evidence = hang_evidence.of(d.s)
    assert evidence.keys == frozenset({"env", "start_method"})
    assert evidence.why.endswith("its tree idle (no busy wait): the rungs that change the device's runtime")


def test_progress_while_the_in_place_tier_reads_the_stacks_drops_its_verdict():
    """The in-place tier reads the stacks before it kills anything: the batch that comes meanwhile (the shell hands it
    over before the stacks' answer) ends the stall: no kill, no incident; the answer that follows changes nothing."""
    from supervisor.decision.recovery import in_place
    from tests.decision.recovery.test_in_place import stall
    from tests.helpers.driver import STACKS, loading

    d = loading()
    inspect = stall(d)
    said = d.at(d.t + 1.2).beat(epoch=1, epochs=3, batch=4, batches=10, samples=4)
    assert "KillTree" not in kinds(said) and "no hang, nothing killed" in said[0].text
    assert d(in_place.StallInspected(inspect.incident.id, False, (), "no loader worker is stuck", None, STACKS)) == []
    assert d.s.state == core.State.HEALTHY and d.s.incidents == [] and d.s.current.recovery is None
