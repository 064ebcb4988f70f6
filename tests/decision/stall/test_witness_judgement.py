"""The witness judged first, on a chosen clock: where the training process says it waits decides the stall's bound
and the tier, before the tree's activity and the stacks (supervisor/decision/stall/witness.py). ``loading`` trains at 0.5 s
a batch: its bound is 10 s over auto_floor, 5 s over idle_floor."""

import pytest

from supervisor.decision import core
from supervisor.decision.model.incident import Stacks, Tier
from supervisor.decision.recovery import in_place
from supervisor.decision.stall import watchdog
from supervisor.decision.status_view import snapshot
from tests.helpers.driver import LOADERS, PID, Driver, kinds, loading, make, verdicts

LAST_BATCH = 1010.0  # loading()'s last progress


def word(d: Driver, kind: str, pid: int = PID, rank: int | None = None, **fields) -> list:
    """The witness's report: where the main thread waits; the sender's progress counter unchanged."""
    extra = {} if rank is None else {"rank": rank}
    return d.beat("train", kind="wait", pid=pid, progress=d.progress if rank is None else 0,
                  wait={"kind": kind, "where": "trainer.py:42 in step", "stalled": 1.0, **fields}, **extra)


def loader_word(d: Driver, worker_pid: int, **extra) -> list:
    return word(d, "loader", **{"worker": 0, "worker_pid": worker_pid, "batch_index": 12, "loader": "train",
                                "function": "_try_get_data", **extra})


def test_a_batch_owed_by_a_known_loader_worker_is_bounded_as_an_idle_tree_and_replaced_without_stacks():
    """At the idle floor (3 s), not at 10 x the batch intervals (0.5 s here): the loader's own rhythm, no wait for a
    batch of it having been seen to end longer."""
    d = loading()
    d.t = LAST_BATCH + 1.0
    loader_word(d, 5001)  # spinning or blocked: the tree's activity is not asked (no TreeActivity at all)
    assert d.s.watch.deadline.label == "train auto, witness: loader"
    assert d.at(LAST_BATCH + 2.99)(core.Tick()) == []
    actions = d.at(LAST_BATCH + 3.01)(core.Tick())
    # the named worker's whole loader: a sibling stopped holding the result queue's lock withholds its batch too
    assert kinds(actions) == ["Log", "ReplaceLoaderWorkers"] and actions[1].pids == (5001, 5002)
    assert actions[1].rank is None
    incident = d.s.incidents[-1].to_dict()
    assert incident["tier"] == "in_place" and "(pid 5001, batch 12)" in incident["witness"]
    assert "stacks" not in incident  # no profiler was needed for the decision
    assert kinds(d.at(d.t + 0.3)(in_place.LoaderWorkersKilled((5001, 5002), (), 0.05))) == ["Log"]
    assert "IncidentResumed" in kinds(d.beat(epoch=1, epochs=3, batch=4, batches=10, samples=4))
    assert d.s.recoveries["in_place"] == 1 and d.s.attempt == 1


def test_a_batch_owed_while_the_training_process_itself_is_stopped_is_the_frozen_trees_restart():
    """The whole tree frozen (SIGSTOP) while the training process waited for a batch: its word names a worker, but no
    rebuilt loader can bring a stopped process its batch. /proc shows it stopped: the restart, saying so."""
    d = loading()
    d.t = LAST_BATCH + 1.0
    loader_word(d, 5001)
    d(core.TreeActivity(idle_since=LAST_BATCH + 1.0, stopped=frozenset({PID, 5001, 5002})))
    assert verdicts(d.at(LAST_BATCH + 4.99)(core.Tick())) == []
    actions = d.at(LAST_BATCH + 5.01)(core.Tick())
    assert "ReplaceLoaderWorkers" not in kinds(actions) and "KillTree" in kinds(actions)
    incident = d.s.incidents[-1].to_dict()
    assert incident["tier"] == "restart"
    assert incident["escalation"] == f"the training process (pid {PID}) is stopped: restart"
    # a loader worker stopped alone is its own hang: in place
    alone = loading()
    alone.t = LAST_BATCH + 1.0
    loader_word(alone, 5001)
    alone(core.TreeActivity(idle_since=LAST_BATCH + 1.0, stopped=frozenset({5001})))
    assert "ReplaceLoaderWorkers" in kinds(alone.at(LAST_BATCH + 5.01)(core.Tick()))


def test_without_a_word_a_busy_tree_keeps_the_auto_floor():
    d = loading()
    assert d.at(LAST_BATCH + 5.01)(core.Tick()) == []
    assert kinds(d.at(LAST_BATCH + 10.01)(core.Tick())) == ["Log", "InspectStall"]  # the stacks decide, as before


def test_a_wait_on_io_or_a_sleep_is_never_bounded_by_the_idle_floor_whatever_the_tree_does():
    for kind, function in (("io", "recv_into"), ("sleep", None)):
        d = loading()
        d(core.TreeActivity(idle_since=LAST_BATCH + 0.5))  # nothing of the tree runs: a socket, a FUSE read
        d.t = LAST_BATCH + 1.0
        word(d, kind, **({"function": function} if function else {}))
        assert verdicts(d.at(LAST_BATCH + 9.99)(core.Tick())) == [], kind  # no idle-floor kill of a healthy wait
        actions = d.at(LAST_BATCH + 10.01)(core.Tick())
        assert "KillTree" in kinds(actions), kind  # its own auto bound; and no loader to blame: the restart
        incident = d.s.incidents[-1].to_dict()
        assert incident["tiers"] == ["restart"] and "the hang is not the loader's" in incident["escalation"]
    idle = loading()  # the same idle tree without a word: the idle floor, as before
    idle(core.TreeActivity(idle_since=LAST_BATCH + 0.5))
    assert kinds(idle.at(LAST_BATCH + 5.01)(core.Tick())) == ["Log", "InspectStall"]


@pytest.mark.parametrize("in_place_spent", [False, True])
def test_a_device_wait_in_training_is_found_at_its_own_bound_and_restarts_with_the_witness_in_the_incident(
        in_place_spent):
    """No device wait of training was seen to last (none reached the witness's interval): the device's own rhythm
    is the floor, idle_floor (3 s), under the batches' (5 s over idle_floor at 0.5 s a batch). With in_place_max
    spent, the restart's incident still says why the hang was not the tier's (a CPU night said in_place_max)."""
    d = loading()
    if in_place_spent:
        d.s.escalations = [1_700_000_000 + LAST_BATCH - k for k in (300, 200, 100)]
    d.t = LAST_BATCH + 1.0
    word(d, "device", function="synchronize")
    assert verdicts(d.at(LAST_BATCH + 2.99)(core.Tick())) == []
    actions = d.at(LAST_BATCH + 3.01)(core.Tick())
    assert "KillTree" in kinds(actions) and "InspectStall" not in kinds(actions)
    incident = [a for a in actions if isinstance(a, core.KillTree)][0].incident
    assert incident.tiers == (Tier.RESTART,) and "the hang is not the loader's" in incident.escalation
    assert "waits for the device (synchronize)" in incident.witness
    stacks = Stacks("main (pid 4242) in cudaStreamSynchronize", ("main (pid 4242) ...",), None, 0.2, None)
    d(core.IncidentEnriched(incident.id, (), stacks=stacks))  # the stacks blame no loader worker either
    assert d.s.stop.incident.witness_agreed is True
    in_a_sample = Stacks("DataLoader worker in __getitem__", ("DataLoader worker 0 (pid 5001) ...",),
                         "DataLoader worker 0 (pid 5001) in __getitem__", 0.2, None, in_loader_worker=True)
    d(core.IncidentEnriched(incident.id, (), stacks=in_a_sample))
    assert d.s.stop.incident.witness_agreed is False  # the stacks blame a loader worker the witness did not name


def test_before_the_first_batch_a_device_wait_keeps_the_steps_own_bound():
    d = Driver(make())
    d.boot_and_spawn()
    d.beat("setup", kind="step", step="first_step")
    d.t += 1.0
    word(d, "device", function="synchronize")  # a cuDNN or MIOpen search: not a hang at 3 s
    assert d.at(d.t + 30)(core.Tick()) == [] and d.s.watch.deadline.label == "startup_timeout"


def test_progress_forgets_the_word():
    d = loading()
    d.t = LAST_BATCH + 1.0
    loader_word(d, 5001)
    d.beat(epoch=1, epochs=3, batch=4, batches=10, samples=4)  # the batch came after all
    since = d.t
    assert d.s.current.waits == {} and d.s.watch.deadline.label == "train auto"
    assert d.at(since + 5.01)(core.Tick()) == []


def test_a_word_that_names_no_reported_loader_worker_leaves_the_stacks_to_decide():
    d = loading()
    d.t = LAST_BATCH + 1.0
    loader_word(d, 9999)  # a worker this attempt never reported (its loader's start not said yet)
    assert d.at(LAST_BATCH + 5.01)(core.Tick()) == []
    assert kinds(d.at(LAST_BATCH + 10.01)(core.Tick())) == ["Log", "InspectStall"]


def test_under_ddp_the_rank_whose_loader_worker_owes_the_batch_is_named_and_replaced_in_that_rank():
    d = loading()
    d.beat("train", kind="loader", pid=7001, rank=1, progress=0, pids=[5101, 5102], seconds=0.4, loader="train")
    d.beat("val", kind="loader", pid=7001, rank=1, progress=0, pids=[5103], seconds=0.4, loader="val")
    d.t = LAST_BATCH + 1.0
    word(d, "collective", pid=7002, rank=0, function="all_reduce")  # rank 0 waits for rank 1's gradients
    loader_word(d, 5101, pid=7001, rank=1)
    actions = d.at(LAST_BATCH + 5.01)(core.Tick())
    # rank 1's training loader, not its validation loader nor rank 0's (5001, 5002)
    assert kinds(actions) == ["Log", "ReplaceLoaderWorkers"] and actions[1].pids == (5101, 5102) and actions[1].rank == 1
    assert d.s.incidents[-1].witness.startswith("rank 1 waits for a batch from train loader worker 0 (pid 5101")
    # the in-place incident names its rank as the restart's does: the hung one, and where each rank waited
    d.at(d.t + 0.3)(in_place.LoaderWorkersKilled(actions[1].pids, (), 0.05))
    assert "IncidentResumed" in kinds(d.at(d.t + 0.5).beat(epoch=1, epochs=3, batch=4, batches=10, samples=4))
    incident = d.s.incidents[-1].to_dict()
    assert incident["tier"] == "in_place" and incident["hung_rank"] == 1
    assert [(r["rank"], r["waiting_kind"]) for r in incident["ranks"]] == [(0, "collective"), (1, "loader")]
    assert incident["witness"].endswith("for rank 1")


def test_the_gap_an_in_place_recovery_closes_is_learned_as_no_epoch_end():
    """Issue 38: after an in-place recovery at an epoch's start, the next epoch end's bound went 3.5 s -> 41.6 s."""
    d = loading()
    d.at(d.t + 0.5).beat(epoch=1, epochs=3, batch=10, batches=10, samples=4)  # epoch 1's last batch
    d.at(d.t + 0.5).beat("save", kind="phase")  # a clean epoch end: 0.5 s gaps, up to epoch 2's first batch
    d.at(d.t + 0.5).beat("train", kind="phase")
    d.at(d.t + 0.5).beat(epoch=2, epochs=3, batch=1, batches=10, samples=4)
    assert d.s.epoch_end_seen == 0.5
    d.at(d.t + 0.5).beat(epoch=2, epochs=3, batch=10, batches=10, samples=4)
    d.at(d.t + 0.5).beat("save", kind="phase")
    d.at(d.t + 0.5).beat("train", kind="phase")  # epoch 3's loader hangs before its first batch
    start = d.t
    d.t += 1.0
    loader_word(d, 5001)
    actions = d.at(start + 5.01)(core.Tick())  # the epoch end's own bound (10 x 0.5 s), the word's idle floor
    assert kinds(actions) == ["Log", "ReplaceLoaderWorkers"]
    d.at(d.t + 0.3)(in_place.LoaderWorkersKilled(actions[1].pids, (), 0.05))
    assert "IncidentResumed" in kinds(d.at(d.t + 0.5).beat(epoch=3, epochs=3, batch=1, batches=10, samples=4))
    assert d.s.epoch_end_seen == 0.5 and d.s.checkpoint_seen is None  # the recovered stall taught nothing



def test_a_batch_owed_by_a_loader_worker_that_waits_on_a_socket_keeps_the_phase_bound():
    """The worker the training process waits for is itself in a socket's or a FUSE file's read (the tree's reading
    says so, host/outside_waits.py): a slow server, no deadlock; the phase's own bound, not the idle floor's."""
    d = loading()
    d.t = LAST_BATCH + 0.6
    d(core.TreeActivity(idle_since=LAST_BATCH + 0.5, outside=frozenset({5001})))
    loader_word(d, 5001)
    assert d.at(LAST_BATCH + 9.99)(core.Tick()) == []
    assert kinds(d.at(LAST_BATCH + 10.01)(core.Tick())) == ["Log", "ReplaceLoaderWorkers"]  # then it is its hang
    sibling = loading()  # another worker's socket says nothing of the named one
    sibling(core.TreeActivity(idle_since=LAST_BATCH + 0.5, outside=frozenset({5002})))
    sibling.t = LAST_BATCH + 1.0
    loader_word(sibling, 5001)
    assert kinds(sibling.at(LAST_BATCH + 5.01)(core.Tick())) == ["Log", "ReplaceLoaderWorkers"]


def test_a_new_passs_workers_that_owe_its_first_batch_are_bounded_as_a_loader_start():
    """Per-pass workers (``persistent_workers = false``) made at an epoch's start: the stretch up to its first batch
    is an epoch's end, bounded by save_timeout until one is seen; a batch owed by a named worker there is bounded as
    a loader start (2 x this run's longest, at least idle_floor) and replaced in place."""
    d = loading()
    d.beat("save", kind="phase", epoch=1, batch=10)
    d.t = LAST_BATCH + 2.0
    d.beat("train", kind="phase", epoch=2, batch=0)
    d.beat("train", kind="loader", pids=[5003, 5004], loader="train")  # made, their first batch to come
    d.t = LAST_BATCH + 3.0
    loader_word(d, 5003, batch_index=0)  # a new iterator's first batch
    assert d.s.watch.deadline.label.endswith("witness: a loader start")
    assert d.at(LAST_BATCH + 4.99)(core.Tick()) == []
    actions = d.at(LAST_BATCH + 5.01)(core.Tick())
    assert kinds(actions) == ["Log", "ReplaceLoaderWorkers"] and actions[1].pids == (5003, 5004)
    quiet = loading()  # without the witness's word, the epoch's end keeps its own bound
    quiet.beat("save", kind="phase", epoch=1, batch=10)
    quiet.t = LAST_BATCH + 2.0
    quiet.beat("train", kind="phase", epoch=2, batch=0)
    assert quiet.at(LAST_BATCH + 60)(core.Tick()) == []


def test_a_device_wait_is_bounded_by_the_device_waits_seen_in_its_phase():
    """A device wait of 1.2 s that ended in training (the witness spoke, then the batch came): training's next device
    wait gets 10 x 1.2 s; the bound is kept across supervisor restarts (a kept field), and is training's alone."""
    d = loading()
    d.t = LAST_BATCH + 0.7
    word(d, "device", function="synchronize")
    d.at(LAST_BATCH + 1.2).beat(epoch=1, epochs=3, batch=4, batches=10, samples=4)
    assert d.s.device_waits_seen == {"train": pytest.approx(1.2)}
    d.t += 0.6
    word(d, "device", function="synchronize")
    assert verdicts(d.at(LAST_BATCH + 1.2 + 11.9)(core.Tick())) == []
    assert "KillTree" in kinds(d.at(LAST_BATCH + 1.2 + 12.01)(core.Tick()))
    assert watchdog.device_wait_bound(d.s, "val") == 3.0


def spinning(d: Driver, at: float, *places: str, phase: str = "train") -> None:
    """The witness's words from ``at``, one each half second: the main thread in no known wait at each of ``places``
    (a loop in Python moves between the lines of its function)."""
    for k, where in enumerate(places):
        d.t = at + 0.5 * k
        d.beat(phase, kind="wait", pid=PID, progress=d.progress, wait={"kind": "elsewhere", "where": where,
                                                                          "stalled": d.t - LAST_BATCH})


SPIN = tuple(f"sitecustomize.py:{line} in _bench_hang" for line in (32, 33, 32))


def test_a_training_process_held_at_one_place_is_found_at_the_idle_floor_though_its_tree_is_busy():
    """Issue 38: the training process spinning in Python, its tree busy (no TreeActivity says idle), was found at the
    10 s auto_floor; held at one file and function for the whole stall, it is bounded as a device wait is: by the
    one-place stalls this run has seen end in training (none yet: idle_floor, 3 s), and restarted."""
    d = loading()
    spinning(d, LAST_BATCH + 1.0, *SPIN)
    shown = snapshot(d.s, core.Now(d.t, 1_700_000_000 + d.t)).to_dict()["watchdog"]  # status --json
    assert (shown["timeout"], shown["waiting_kind"]) == ("train auto, witness: one place", "elsewhere")
    assert shown["fires_in"] == pytest.approx(LAST_BATCH + 3.0 - d.t)
    assert verdicts(d.at(LAST_BATCH + 2.99)(core.Tick())) == []
    actions = d.at(LAST_BATCH + 3.01)(core.Tick())
    assert "KillTree" in kinds(actions)
    incident = [a for a in actions if isinstance(a, core.KillTree)][0].incident
    assert incident.tiers == (Tier.RESTART,) and "the hang is not the loader's" in incident.escalation
    assert "(train auto, witness: one place 3.0 s)" in incident.detail
    assert incident.detail.endswith("the training process was held at one place (sitecustomize.py:_bench_hang) "
                                    "for 3.0 s")
    assert d.s.one_place_seen == {}  # it never ended: no rhythm learned from it


def test_a_word_at_one_place_from_a_process_then_stopped_is_the_stopped_trees_not_a_place():
    """CI, a rank that stopped itself (SIGSTOP) just after its witness put it somewhere: the word is from before
    the stop. /proc shows the sender stopped: the idle bound's stall (10 x 0.5 s here), said so, not "held at one
    place" (3 s); another process of the tree stopped changes nothing."""
    for stopped, label, bound in ((frozenset({PID}), "train auto, idle", 5.0),
                                  (frozenset({PID + 7}), "train auto, witness: one place", 3.0)):
        d = loading()
        spinning(d, LAST_BATCH + 0.2, *["callbacks.py:12 in on_batch_end"] * 6)  # (spoken through to the verdict)
        d(core.TreeActivity(idle_since=LAST_BATCH + 0.5, stopped=stopped))
        assert d.s.watch.deadline == watchdog.Deadline(LAST_BATCH + bound, watchdog.DeadlineKind.PHASE, label)
        assert verdicts(d.at(LAST_BATCH + bound - 0.01)(core.Tick())) == []  # the stacks read ahead of the verdict
        actions = d.at(LAST_BATCH + bound + 0.01)(core.Tick())
        detail = [a for a in actions if isinstance(a, core.KillTree)][0].incident.detail
        assert ("held at one place (callbacks.py:on_batch_end)" in detail) == (bound == 3.0)


def test_an_import_under_way_is_at_no_place_of_its_own():
    """CI, twice: a lazy import on a loaded machine put every word of 3 s in importlib's ``_path_stat``, and the
    stall was killed as "held at one place". An import is work, not a loop: its words hold no place, and a busy
    tree keeps the auto_floor."""
    d = loading()
    spinning(d, LAST_BATCH + 0.5, *["<frozen importlib._bootstrap_external>:147 in _path_stat"] * 6)
    assert d.s.watch.deadline.label == "train auto"
    assert verdicts(d.at(LAST_BATCH + 9.99)(core.Tick())) == []


def epoch_end(d: Driver) -> float:
    """Epoch 1's end (0.3 s) seen, then two batches of epoch 2 and its end begun: the time of that last progress."""
    d.beat("save", kind="phase", epoch=1, epochs=3, batch=10, batches=10)
    d.t += 0.3
    d.beat(epoch=2, epochs=3, batch=1, batches=10, samples=4)  # an epoch's end of 0.3 s seen
    assert d.s.epoch_end_seen == pytest.approx(0.3)
    d.t += 0.5
    d.beat(epoch=2, epochs=3, batch=2, batches=10, samples=4)
    d.beat("save", kind="phase", epoch=2, epochs=3, batch=10, batches=10)
    return d.t


def test_at_an_epochs_end_one_place_keeps_the_ends_own_bound_and_a_device_wait_gets_trainings():
    """CI: the epoch's end after a resume (validation's set-up, its imports, the save) held at one place for 3.1 s
    was killed at idle_floor: one place while the save stretch is said keeps the end's own bound. A device wait
    there is the device's, bounded as in training (issue 48: a GPU kernel hang after a save found at 10 s)."""
    for kind, where, label, at in (("elsewhere", "trainer.py:40 in validate", "save auto", 10.0),
                                   ("device", "trainer.py:41 in save_model", "save auto, witness: device", 3.0)):
        d = loading()
        last = epoch_end(d)
        for k in range(1, 6):
            d.t = last + 0.5 * k
            d.beat("save", kind="wait", pid=PID, progress=d.progress,
                   wait={"kind": kind, "where": where, "stalled": 0.5 * k})
        assert d.s.watch.deadline.label == label, kind
        assert verdicts(d.at(last + at - 0.01)(core.Tick())) == [], kind
        assert "KillTree" in kinds(d.at(last + at + 0.01)(core.Tick())), kind


@pytest.mark.parametrize("phase", ["ending", "done"])
def test_once_trained_through_one_place_keeps_the_ends_own_bound(phase):
    """CI (tests/worker/test_ddp.py, twice): rank 1 trained through held one place in Ultralytics' ``_clear_memory``
    for 3 s while rank 0 validated best.pt, and the run got a second incident, "hang in done", at the idle floor. A
    rank's teardown is seen once per run: save_timeout bounds it, not training's rhythm."""
    d = loading()
    d.beat(phase, kind="phase", epoch=3, epochs=3, batch=10, batches=10)
    last = d.t
    for k in range(1, 13):
        d.t = last + 0.5 * k
        d.beat(phase, kind="wait", pid=PID, progress=d.progress,
               wait={"kind": "elsewhere", "where": "trainer.py:700 in _clear_memory", "stalled": 0.5 * k})
    assert d.s.watch.deadline.label == "save_timeout"
    assert verdicts(d.at(last + 6.0)(core.Tick())) == []


@pytest.mark.parametrize("after", ["validation", "a mid-epoch checkpoint"])
def test_a_spin_after_the_save_stretch_is_found_at_the_idle_floor(after):
    """Issue 48: the training process spinning in its forward right after "train" is said again (an epoch's first
    batch after validation and the save, or the batch after a mid-epoch checkpoint) was bounded by the save's own
    bound ("save auto 10.0 s", "checkpoint auto 24.4 s") though the witness named one place from its first word:
    it is training's, the idle floor."""
    d = loading()
    if after == "validation":
        last = epoch_end(d)
        d.beat("train", kind="phase", epoch=3, epochs=3, batch=0, batches=10)
    else:
        d.beat("save", kind="phase", epoch=1, epochs=3, batch=5, batches=10)
        d.beat("save", kind="checkpoint", path="/x/last.pt", seconds=0.05, epoch=1, batch=5, progress=d.progress)
        d.t += 2.4
        d.beat("train", kind="phase", epoch=1, epochs=3, batch=5, batches=10)
        d.t += 0.1
        d.beat(epoch=1, epochs=3, batch=6, batches=10, samples=4)  # a checkpoint's stretch of 2.5 s seen
        d.beat("save", kind="phase", epoch=1, epochs=3, batch=6, batches=10)
        d.t += 0.05
        d.beat("train", kind="phase", epoch=1, epochs=3, batch=6, batches=10)
    last = d.t
    for k in range(1, 6):
        d.t = last + 0.5 * k
        d.beat("train", kind="wait", pid=PID, progress=d.progress,
               wait={"kind": "elsewhere", "where": "tasks.py:80 in forward", "stalled": 0.5 * k})
    assert d.s.watch.deadline.label.endswith("witness: one place")
    assert verdicts(d.at(last + 2.99)(core.Tick())) == []
    actions = d.at(last + 3.01)(core.Tick())
    assert "KillTree" in kinds(actions)
    assert "was held at one place (tasks.py:forward)" in d.s.incidents[-1].detail


def test_a_spin_right_after_a_mid_epoch_checkpoint_is_not_bounded_by_the_saves_own_hold():
    """Issue 58.5, the CPU demo's timings: a mid-epoch checkpoint's hold of 0.75 s, the main thread at one place in
    it (the checkpoint's copy, its writer thread holding the GIL) until the next batch, taught the one-place bound
    10 x 0.75 s: a spin right after the next checkpoint was found at 7.5-8.4 s, not at the idle floor (3 s). The save
    stretch is no loop's rhythm in training."""
    d = loading()
    for batch in (5, 6):
        d.beat("save", kind="phase", epoch=1, epochs=3, batch=batch, batches=10)
        d.beat("save", kind="checkpoint", path="/x/last.pt", seconds=0.05, epoch=1, batch=batch, progress=d.progress)
        d.t += 0.05
        d.beat("train", kind="phase", epoch=1, epochs=3, batch=batch, batches=10)
        if batch == 6:
            break
        resumed = d.t
        for at in (0.5, 0.75):  # the hold, at one place, as the witness says it after one interval
            d.t = resumed + at
            d.beat("train", kind="wait", pid=PID, progress=d.progress,
                   wait={"kind": "elsewhere", "where": "serialization.py:640 in _save", "stalled": at})
        d.t = resumed + 0.8
        d.beat(epoch=1, epochs=3, batch=batch + 1, batches=10, samples=4)
        for _ in range(4):
            d.t += 0.5
            d.beat(epoch=1, epochs=3, batch=batch + 1, batches=10, samples=4)
    assert d.s.one_place_seen == {}
    last = d.t
    for k in range(1, 6):
        d.t = last + 0.5 * k
        d.beat("train", kind="wait", pid=PID, progress=d.progress,
               wait={"kind": "elsewhere", "where": "tasks.py:80 in forward", "stalled": 0.5 * k})
    assert verdicts(d.at(last + 2.99)(core.Tick())) == []
    assert "KillTree" in kinds(d.at(last + 3.01)(core.Tick()))


def test_a_long_stretch_at_one_place_that_ends_in_progress_raises_the_bound_to_ten_times_it():
    """A legitimate 2.5 s in one function (a metric, a callback) that then made progress: the next stall held at one
    place in training is not killed at that length again, nor before 10 x 2.5 s; the record is kept across
    attempts and supervisor restarts (a kept field) and is training's alone."""
    d = loading()
    spinning(d, LAST_BATCH + 1.0, "metrics.py:10 in compute", "metrics.py:12 in compute", "metrics.py:10 in compute")
    d.at(LAST_BATCH + 2.5).beat(epoch=1, epochs=3, batch=4, batches=10, samples=4)
    assert d.s.one_place_seen == {"train": pytest.approx(2.5)} and d.s.device_waits_seen == {}
    assert watchdog.one_place_bound(d.s, "train") == pytest.approx(25.0)
    assert watchdog.one_place_bound(d.s, "val") == 3.0
    since = d.t
    spinning(d, since + 1.0, "metrics.py:10 in compute", "metrics.py:11 in compute")
    assert verdicts(d.at(since + 3.01)(core.Tick())) == []  # the floor's kill of a known stretch: no more
    assert verdicts(d.at(since + 24.9)(core.Tick())) == []
    assert "KillTree" in kinds(d.at(since + 25.01)(core.Tick()))


def test_a_stretch_that_moved_between_places_teaches_nothing():
    d = loading()
    spinning(d, LAST_BATCH + 1.0, "model.py:40 in forward", "loss.py:7 in __call__")
    d.at(LAST_BATCH + 2.5).beat(epoch=1, epochs=3, batch=4, batches=10, samples=4)
    assert d.s.one_place_seen == {}


def test_a_place_that_changes_within_the_stall_keeps_todays_bound():
    """Another function, or another kind of wait before the same place, in this stall: not held at one place; a busy
    tree keeps the auto_floor (10 s), as without the rule."""
    for places in (("model.py:40 in forward", "model.py:41 in forward", "loss.py:7 in __call__"),
                   ("a.py:3 in step", "b.py:3 in step")):
        d = loading()
        spinning(d, LAST_BATCH + 1.0, *places)
        assert d.s.watch.deadline.label == "train auto", places
        assert verdicts(d.at(LAST_BATCH + 9.99)(core.Tick())) == [], places
        assert verdicts(d.at(LAST_BATCH + 10.01)(core.Tick())) != [], places
    locked = loading()
    locked.t = LAST_BATCH + 1.0
    word(locked, "lock", function="acquire")
    spinning(locked, LAST_BATCH + 1.5, *SPIN)
    assert locked.s.watch.deadline.label == "train auto"
    assert verdicts(locked.at(LAST_BATCH + 9.99)(core.Tick())) == []


def test_idle_floor_off_turns_the_one_place_bound_off():
    d = loading(watchdog={"idle_floor": "off"})
    spinning(d, LAST_BATCH + 1.0, *SPIN)
    assert d.s.watch.deadline.label == "train auto"
    assert verdicts(d.at(LAST_BATCH + 9.99)(core.Tick())) == []
    assert "KillTree" in kinds(d.at(LAST_BATCH + 10.01)(core.Tick()))


def test_before_the_first_batch_and_at_validations_first_one_place_keeps_the_own_bound():
    """A first step (CUDA's warm-up, a kernel search in Python) and validation's first batch (no rhythm of its own
    yet) keep their own bounds, as a device wait there does."""
    d = Driver(make())
    d.boot_and_spawn()
    d.beat("setup", kind="step", step="first_step")
    for k in range(3):
        d.t += 0.5
        d.beat("setup", kind="wait", pid=PID, progress=d.progress,
               wait={"kind": "elsewhere", "where": f"autotune.py:{k} in search", "stalled": 0.5 * (k + 1)})
    assert d.at(d.t + 30)(core.Tick()) == [] and d.s.watch.deadline.label == "startup_timeout"
    val = loading()
    val.beat("val", kind="phase", epoch=1, batch=10)
    since = val.t
    spinning(val, since + 1.0, "validator.py:5 in update", "validator.py:6 in update", phase="val")
    assert val.s.watch.deadline.label == "val auto"
    assert verdicts(val.at(since + 9.99)(core.Tick())) == []


def test_under_ddp_the_device_wait_rank_0_said_before_its_progress_is_learned():
    """Rank 0 speaks for the run: its word of a device wait that ended in its progress is the phase's rhythm, as a
    single process's is (its liveness bookkeeping must not drop the word before the progress reads it)."""
    d = loading()
    d.t = LAST_BATCH + 0.2
    d.beat(epoch=1, epochs=3, batch=4, batches=10, samples=4, pid=7002, rank=0, progress=1)
    d.t = LAST_BATCH + 0.9
    word(d, "device", pid=7002, rank=0, function="synchronize")
    d.t = LAST_BATCH + 1.6
    d.beat(epoch=1, epochs=3, batch=5, batches=10, samples=4, pid=7002, rank=0, progress=2)
    assert d.s.device_waits_seen == {"train": pytest.approx(1.4)}
    assert 0 not in d.s.current.waits  # and the word is of a stall that is over


def test_a_loader_hang_after_slow_first_steps_is_found_at_the_idle_floor():
    """Issue 48: in an attempt's first epoch (its first steps slow for the model's sake: 0.9 s intervals) and after
    an in-place rebuild, a batch owed by workers that had given batches was bounded at 10 x the slowest interval
    (7.8-9.7 s). It is the loader's rhythm: the idle floor; a wait for such a batch seen to end raises it."""
    d = loading()
    d.t += 0.9
    d.beat(epoch=1, epochs=3, batch=4, batches=10, samples=4)  # a slow first step's interval
    last = d.t
    d.t = last + 1.0
    loader_word(d, 5001, batch_index=5)
    assert d.s.watch.deadline.at == pytest.approx(last + 3.0)
    d.t = last + 1.2
    d.beat(epoch=1, epochs=3, batch=5, batches=10, samples=4)  # that wait ended after 1.2 s: the loader's own
    assert d.s.loader_waits_seen == {"train": pytest.approx(1.2)}
    last = d.t
    d.t = last + 1.0
    loader_word(d, 5001, batch_index=6)
    assert d.s.watch.deadline.at == pytest.approx(last + 12.0)
    fresh = loading()  # a new iterator's first batch (index 0) is its start, which teaches the rhythm nothing
    fresh.t += 1.0
    loader_word(fresh, 5001, batch_index=0)
    fresh.t += 1.0
    fresh.beat(epoch=1, epochs=3, batch=4, batches=10, samples=4)
    assert fresh.s.loader_waits_seen == {}


@pytest.mark.parametrize("kind, verdict_at", [("lock", 5.0), ("elsewhere", 20.0)])
def test_an_idle_tree_waiting_on_its_own_lock_at_an_epochs_end_is_bounded_as_in_training(kind, verdict_at):
    """H200 night (issue 48.4): the training process blocked on a lock at an epoch's end, its tree idle, was found at
    "save auto 21.4 s" (epoch ends of 2 s seen) against 3.5 s in training. A lock of its own with nothing of the tree
    running is bounded by training's idle bound (5 s here); a wait the witness cannot name keeps the end's own."""
    d = loading()
    d.beat("save", kind="phase", epoch=1, epochs=3, batch=10, batches=10)
    d.t += 2.0
    d.beat(epoch=2, epochs=3, batch=1, batches=10, samples=4)  # an epoch's end of 2 s seen: "save auto" 20 s idle
    d.t += 0.5
    d.beat(epoch=2, epochs=3, batch=2, batches=10, samples=4)
    d.beat("save", kind="phase", epoch=2, epochs=3, batch=10, batches=10)
    last = d.t
    d(core.TreeActivity(idle_since=last + 0.5))
    for k in range(1, int(verdict_at / 0.5)):  # the witness speaks twice a second
        d.t = last + 0.5 * k
        d.beat("save", kind="wait", pid=PID, progress=d.progress,
               wait={"kind": kind, "where": "sitecustomize.py:35 in _bench_hang", "stalled": 0.5 * k})
        assert verdicts(d(core.Tick())) == []
    assert verdicts(d.at(last + verdict_at - 0.01)(core.Tick())) == []
    assert verdicts(d.at(last + verdict_at + 0.01)(core.Tick())) != []


def spawn_rung(start: float | None, **sections) -> Driver:
    """Training at 0.5 s a batch whose loader workers took ``start`` s to their first batch (None: not said), then in
    validation, its loader's two workers made and owing its first batch (the witness's batch index 0)."""
    d = Driver(make(**sections))
    d.boot_and_spawn()
    d.beat("train", kind="phase")
    d.beat("train", kind="loader", pids=list(LOADERS), loader="train", **({} if start is None else {"seconds": start}))
    d.train_until(LAST_BATCH, 0.5)
    d.beat("val", kind="phase", epoch=1, epochs=3)
    d.beat("val", kind="loader", pids=[5101, 5102], loader="val")
    d.t = LAST_BATCH + 1.0
    d.beat("val", kind="wait", progress=d.progress, wait={
        "kind": "loader", "where": "dataloader.py:1300 in _try_get_data", "stalled": 1.0, "function": "_try_get_data",
        "loader": "val", "worker": 0, "worker_pid": 5101, "batch_index": 0})
    return d


def test_validations_first_batch_at_a_slow_starting_rung_is_bounded_by_the_loader_start_not_val_auto():
    """CI under load (issue 57.9): at the spawn rung, whose training loader took 8 s to start, validation's workers,
    still starting, were judged hung at "val auto 10.0 s" (auto_floor: no validation batch seen yet) and rebuilt.
    Their first batch is their start: 2 x this attempt's own (16 s), however short the phase's own bound."""
    d = spawn_rung(8.0)
    assert d.s.watch.deadline.label == "val auto, witness: a loader start"
    assert verdicts(d.at(LAST_BATCH + 15.9)(core.Tick())) == []
    assert kinds(verdicts(d.at(LAST_BATCH + 16.01)(core.Tick()))) == ["Log", "ReplaceLoaderWorkers"]


def test_a_loaders_first_batch_before_any_start_was_seen_is_bounded_by_the_startup_bound():
    """No start seen yet in this attempt: what honestly bounds a spawn start under load is the startup's bound
    (startup_timeout, 30 s here), not a fixed 10 s."""
    d = spawn_rung(None, watchdog={"startup_timeout": 30})
    assert verdicts(d.at(LAST_BATCH + 29.9)(core.Tick())) == []
    assert kinds(verdicts(d.at(LAST_BATCH + 30.01)(core.Tick()))) == ["Log", "ReplaceLoaderWorkers"]


def quick(interval: float, until: float = LAST_BATCH) -> Driver:
    """``loading`` at ``interval`` s a batch, up to ``until``."""
    d = Driver(make())
    d.boot_and_spawn()
    d.beat("train", kind="phase")
    d.beat("train", kind="loader", pids=list(LOADERS), seconds=0.4, loader="train")
    while d.t + interval <= until + 1e-9:
        d.t += interval
        d.beat(epoch=1, epochs=3, batch=3, batches=10, samples=4)
    return d


@pytest.mark.parametrize("kind", ["device", "loader"])
def test_a_named_wait_in_a_training_of_short_batches_is_judged_at_their_bound_not_the_idle_floor(kind):
    """Issue 59.3: at 0.1 s a batch (an H200's), a device wait or a batch owed by a named loader worker is a hang
    at 10 x the slowest batch, never under 1.5 s: every such wait that ended did so inside a batch."""
    d = quick(0.1)
    last = d.t
    d.t = last + 0.6
    word(d, "device", function="synchronize") if kind == "device" else loader_word(d, 5001)
    assert d.s.watch.deadline.at == pytest.approx(last + 1.5)
    assert verdicts(d.at(last + 1.49)(core.Tick())) == []
    assert verdicts(d.at(last + 1.51)(core.Tick())) != []


def test_a_named_wait_keeps_the_idle_floor_until_the_batches_are_known_and_follows_longer_waits_seen():
    """Fewer than NAMED_EVIDENCE batches: the idle floor (3 s); 0.2 s batches: 2 s; a device wait seen to end after
    1.2 s: 12 s, as before."""
    few = quick(0.1, until=1000.0 + 0.1 * (watchdog.NAMED_EVIDENCE - 1))
    assert watchdog.device_wait_bound(few.s, "train") == 3.0
    d = quick(0.2)
    assert watchdog.device_wait_bound(d.s, "train") == pytest.approx(2.0)
    assert watchdog.loader_wait_bound(d.s, "train") == pytest.approx(2.0)
    assert watchdog.one_place_bound(d.s, "train") == 3.0  # a loop in Python is no named wait: the idle floor
    last = d.t
    d.t = last + 0.7
    word(d, "device", function="synchronize")
    d.at(last + 1.2).beat(epoch=1, epochs=3, batch=4, batches=10, samples=4)
    assert watchdog.device_wait_bound(d.s, "train") == pytest.approx(12.0)
    assert watchdog.device_wait_bound(loading().s, "train") == 3.0  # 0.5 s batches: 5 s, so the idle floor's


def test_a_lock_nobody_else_will_end_in_a_training_of_short_batches_is_a_hang_at_their_bound():
    """The training thread blocked on a lock of its own, its tree idle, at 0.1 s a batch: 1.5 s after the tree fell
    idle, not the idle floor's 3 s; at 0.5 s a batch, the idle bound as before (10 x 0.5 s from the last batch)."""
    for interval, verdict_at in ((0.1, 0.5 + 1.5), (0.5, 5.0)):
        d = quick(interval)
        last = d.t
        d(core.TreeActivity(idle_since=last + 0.5))
        for k in range(1, 4):
            d.t = last + 0.5 * k
            d.beat("train", kind="wait", pid=PID, progress=d.progress,
                   wait={"kind": "lock", "where": "sitecustomize.py:35 in _bench_hang", "stalled": 0.5 * k})
        assert verdicts(d.at(last + verdict_at - 0.01)(core.Tick())) == [], interval
        assert verdicts(d.at(last + verdict_at + 0.01)(core.Tick())) != [], interval


def test_after_short_batches_a_healthy_5_s_join_at_an_epochs_end_is_not_killed():
    """The same 0.1 s batches: an epoch's end whose callback joins a thread that uploads (a socket) or sleeps for 5 s,
    every thread idle, is judged by its chain's end (the phase's own bound), not at the short batches' 1.5 s."""
    for end in ({"kind": "io", "function": "recv_into", "peer": "127.0.0.1:18765"},
                {"kind": "sleep", "function": "sleep"}):
        d = quick(0.1)
        d.beat("save", kind="phase", epoch=1, epochs=3, batch=10, batches=10)
        last = d.t
        d(core.TreeActivity(idle_since=last + 0.5, thread_idle_since=last + 0.5))
        for k in range(1, 11):
            d.t = last + 0.5 * k
            d.beat("save", kind="wait", pid=PID, progress=d.progress,
                   wait={"kind": "lock", "where": "threading.py:1139 in _wait_for_tstate_lock",
                         "function": "_wait_for_tstate_lock", "tid": 4243, "stalled": 0.5 * k,
                         "chain": [{"via": "join", "thread": "upload", "tid": 4250, "where": "callbacks.py:9 in upload",
                                    **end}]})
            assert verdicts(d(core.Tick())) == [], (end, k)
        d.at(last + 5.1).beat(epoch=2, epochs=3, batch=1, batches=10, samples=4)  # the join ended: training goes on
        assert d.s.state == core.State.HEALTHY and d.s.incidents == []
