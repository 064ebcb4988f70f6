"""Issue 58, on a chosen clock: a wait on another thread of the training process is judged by the end of its chain
(witness.py ``end_of``); threads, not processes, are idle or busy (``TreeActivity``: the training thread and its
chain count, a runtime's spinning thread is said beside the hang); a stretch the witness cannot speak through is
judged by the training thread's own CPU time, and a stale word of one place stands for nothing."""

from supervisor.decision import core
from supervisor.decision.stall import watchdog, witness
from tests.helpers.driver import PID, Driver, make

MAIN, UPLOAD = 4243, 4250  # native thread ids
JOIN = {"kind": "lock", "where": "threading.py:1139 in _wait_for_tstate_lock", "function": "_wait_for_tstate_lock",
        "tid": MAIN}


def link(kind: str, via: str = "join", where: str = "callbacks.py:9 in upload", **fields) -> dict:
    return {"via": via, "thread": "upload", "tid": UPLOAD, "kind": kind, "where": where, **fields}


def trained(interval: float = 0.5) -> Driver:
    d = Driver(make())
    d.boot_and_spawn()
    d.beat("train", kind="phase")
    d.train_until(d.t + 20 * interval, interval)
    return d


def waits(d: Driver, at: float, n: int, chain: list[dict], phase: str = "train") -> None:
    """The witness's words, one each half second from ``at``: the main thread joins a thread doing ``chain``."""
    for k in range(n):
        d.t = at + 0.5 * k
        d.beat(phase, kind="wait", pid=PID, progress=d.progress,
               wait={**JOIN, "stalled": 0.5 * (k + 1), "chain": chain})


def verdict_at(d: Driver) -> float:
    return d.s.watch.deadline.at


def test_a_join_on_a_thread_in_a_socket_or_asleep_keeps_the_phases_bound_though_every_thread_is_idle():
    """Killed at idle_floor (3.5 s) 19 of 25 epoch ends in the issue: the main thread's own wait is a lock's, the
    tree idle. The chain ends on the world, or in a sleep the code chose: the phase's own bound (train auto, 10 s)."""
    for end in (link("io", function="recv_into", peer="127.0.0.1:18765"), link("sleep", function="sleep"),
                link("io", via="stands_in", function="recv"), link("sleep", via="future")):
        d = trained()
        last = d.t
        waits(d, last + 0.5, 2, [end])
        d.at(last + 1.5)(core.TreeActivity(idle_since=last + 0.5, thread_idle_since=last + 0.5))
        assert verdict_at(d) == last + 10, end
        assert decisions_kill(d, last + 6.0) is False  # a 6 s wait ends: no verdict came


def decisions_kill(d: Driver, until: float) -> bool:
    for t in range(int((until - d.t) * 4)):
        if any(isinstance(a, core.KillTree) for a in d.at(d.t + 0.25)(core.Tick())):
            return True
    return False


def test_a_join_on_a_thread_blocked_on_a_lock_is_a_deadlock_at_the_idle_floor_its_chain_named():
    """The threads that count idle (a runtime's thread spinning beside, the tree busy by it): idle_floor, the chain
    and the spinner said in the incident and the log."""
    d = trained(interval=0.2)
    last = d.t
    waits(d, last + 0.5, 2, [link("lock", function="acquire", where="callbacks.py:12 in locked")])
    assert watchdog.counted_threads(d.s) == {PID: (MAIN, frozenset({MAIN, UPLOAD}))}
    d.at(last + 1.5)(core.TreeActivity(idle_since=last + 0.5, thread_idle_since=last + 0.5,
                                       beside=("'AsyncEventsLoop' (tid 4260 of pid 4242)",)))
    due = verdict_at(d)
    assert due == last + 3.5  # idle_floor from the threads' idleness
    actions = d.at(due + 0.01)(core.Tick())
    [kill] = [a for a in actions if isinstance(a, core.KillTree)]
    said = kill.incident.witness
    assert "; main joins thread 'upload'; 'upload' waits on a lock (acquire) at callbacks.py:12 in locked; the chain " \
           "ends in a deadlock" in said
    assert "beside it, thread 'AsyncEventsLoop' (tid 4260 of pid 4242) spun on a CPU" in said
    [log] = [a for a in actions if isinstance(a, core.Log) and "killing the worker tree" in a.text]
    assert "main joins thread 'upload'" in log.text


def test_a_join_on_a_thread_that_works_is_bounded_by_the_chains_threads_busy():
    d = trained()
    last = d.t
    waits(d, last + 0.5, 2, [link("elsewhere", busy=True)])
    d.at(last + 1.5)(core.TreeActivity(idle_since=None, thread_idle_since=last + 0.5))
    assert verdict_at(d) == last + 10
    assert "'upload' runs on a CPU" in witness.describe(d.s.current.waits[None])


def test_the_status_says_the_chain_with_the_sockets_other_end():
    d = trained()
    waits(d, d.t + 0.5, 1, [link("io", function="recv_into", peer="127.0.0.1:18765")])
    said = witness.describe(d.s.current.waits[None])
    assert "main joins thread 'upload'; 'upload' waits on a socket to 127.0.0.1:18765 (recv_into)" in said


def test_a_silent_stretch_is_judged_by_the_training_threads_own_cpu_not_the_trees():
    """A runtime thread spinning beside keeps the tree busy: the training thread idle in a GIL-held C call is a hang
    at the idle floor all the same (before: the tree's activity, busy, gave the phase's own bound)."""
    d = trained()
    last = d.t
    d.at(last + 0.5).beat("train", kind="wait", progress=d.progress,
                          wait={"kind": "elsewhere", "where": "callbacks.py:18 in <listcomp>", "stalled": 0.5,
                                "tid": MAIN})
    d.at(last + 1.5)(core.TreeActivity(idle_since=None, thread_idle_since=last + 1.0))
    due = d.s.watch.deadline
    assert (due.at, due.label.endswith("witness silent, idle")) == (last + 4.0, True)


def test_a_word_of_one_place_gone_stale_before_its_bound_is_left_to_the_silence():
    """1.5 s of Python at one place, then pickle.dumps holding the GIL: the last word (at 1.5 s) is 1.5 s old at the
    one-place bound (3 s), killed there as "held at one place" before; the silence judges it: the training thread
    busy, the phase's own bound."""
    d = trained()
    last = d.t
    for k in range(3):
        d.at(last + 0.5 * (k + 1)).beat("train", kind="wait", progress=d.progress,
                                        wait={"kind": "elsewhere", "where": "callbacks.py:18 in <listcomp>",
                                              "stalled": 0.5 * (k + 1), "tid": MAIN})
    assert decisions_kill(d, last + 6.0) is False
    assert d.s.watch.deadline.at == last + 10
