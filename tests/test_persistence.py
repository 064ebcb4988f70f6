"""What a restarted supervisor gets back: every field declared kept round-trips through the state file, and a state
file written before persistence was derived from the records restores as it did."""

import copy
import json
import math
import types
import typing

import pytest

from supervisor.decision import core, persistence
from supervisor.decision.hang_history import HangHistory, HangPoint
from supervisor.decision.incident import Incident, Kill, Loss
from supervisor.decision.state import CheckpointMark, Supervision
from supervisor.decision.vocabulary import Reason, State
from test_core import Driver, make

# Values unlike the defaults, for the kept types that are records of their own.
SAMPLES: dict[typing.Any, typing.Any] = {
    State: State.SUCCEEDED,  # the one state a restarted supervisor keeps
    CheckpointMark: CheckpointMark("/runs/x/weights/last.pt", 2, 5, 1_700_000_000.0, -math.inf, 0.5),
    HangHistory: HangHistory(rung_seconds={1: 2.5}, rung_starts={1: [3.0]}, stalls=[4.0], losses=[1.5],
                             hang_marks=[9.0], window_start=1.0, holds=[0.4], points=[HangPoint("train", 1, 7)]),
    Incident: Incident(id="2-1-1700000000", time=1_700_000_000.0, reason=Reason.HANG, phase="train", detail="stalled",
                       attempt=2, rung=1, rung_label="workers=4", worker_pid=4242, epoch=1, batch=7,
                       seconds_since_progress=12.5, last_progress_wall=1_699_999_987.5, loss=Loss(3.0, 6),
                       kill=Kill(3, 0.2), last_error="", settings={"workers": 4}),
}


def sample(hint: typing.Any) -> typing.Any:
    """A value of the type ``hint`` unlike its field's default; a kept type without one fails the test below."""
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if hint in SAMPLES:
        return SAMPLES[hint]
    if origin in (typing.Union, types.UnionType):
        return sample(next(a for a in args if a is not type(None)))
    if origin is list:
        return [sample(args[0])]
    if origin is dict:
        return {"1": sample(args[1])}
    return {int: 2, float: 2.5, str: "x", bool: True, typing.Any: "x"}[hint]


def kept_paths(cls: type, prefix: tuple[str, ...] = ()) -> list[tuple[tuple[str, ...], typing.Any]]:
    """(attribute path from a Supervision, type) of every kept field, flat records' included."""
    found = []
    for f, how, hint in persistence.kept_fields(cls):
        found += kept_paths(hint, prefix + (f.name,)) if how.flat else [(prefix + (f.name,), hint)]
    return found


def get(record, path):
    for name in path:
        record = getattr(record, name)
    return record


def put(record, path, value):
    setattr(get(record, path[:-1]), path[-1], value)


def test_every_kept_field_is_saved_and_restored():
    paths = kept_paths(Supervision)
    assert len(paths) > 20  # the rung, the budget, the goodput account, the probes, the hang history ...
    keys = persistence.keys(Supervision)
    assert len(keys) == len(set(keys)), "two kept fields share a key of the flat state file"
    s = make()
    for path, hint in paths:
        assert sample(hint) != get(s, path), f"{'.'.join(path)}: its sample is its default"
        put(s, path, copy.deepcopy(sample(hint)))
    s.goodput.booted_at = 0.0  # this supervisor's time, added to the earlier supervisors' when saved, is nil
    record = json.loads(json.dumps(s.persistent(0.0)))
    assert set(record) == set(keys)
    restored = make()
    restored.restore(record)
    assert [(p, get(restored, p)) for p, _ in paths] == [(p, get(s, p)) for p, _ in paths]


# A state file as the supervisor wrote it before the records declared what is kept (persistent() listed the keys):
# a run at rung 1 after a hang and a crash, probing from rung 2 earlier, one incident not yet in incidents.jsonl.
TODAY = {
    "attempt": 3, "budget_times": [1700001076.0],
    "checkpoint": {"batch": 40, "epoch": 1, "mono": 1020.0, "path": "/x/last.pt", "seconds": 0.7,
                   "wall": 1700001020.0},
    "epoch_end_seen": 3.5,
    "hang_history": {"hang_marks": [24.5], "holds": [0.7], "losses": [5.0],
                     "points": [{"batch": 50, "epoch": 1, "phase": "train"}], "rung_seconds": {"0": 24.5, "1": 20.3},
                     "rung_starts": {"0": [0.5], "1": [0.7, 0.7]}, "stalls": [30.0], "window_start": 0.0},
    "hangs_by_phase": {"train": 1},
    "incidents": [
        {"attempt": 1, "batch": 50, "detail": "no progress for 30.0 s in train (kernel confirm window 30.0 s)",
         "epoch": 1, "id": "1-1-1700001050", "last_progress_wall": 1700001020.0, "lost_batches": 10,
         "lost_seconds": 5.0, "phase": "train", "reason": "hang", "recorded": False,
         "resumes_from": {"batch": 40, "epoch": 1, "path": "/x/last.pt"}, "rung": 0, "rung_label": "defaults",
         "seconds_since_progress": 30.0, "time": 1700001050.0, "time_iso": "2023-11-14T22:30:50Z",
         "worker_pid": 4242},
        {"attempt": 2, "batch": 70, "detail": "exited with status 1", "epoch": 1, "id": "2-2-1700001076",
         "kill": {"confirmed_wall": None, "processes": 1, "seconds": 0.0, "survivors": []}, "last_error": None,
         "last_progress_wall": 1700001076.0, "lost_batches": 30, "lost_seconds": 20.3, "phase": "train",
         "reason": "crash", "recorded": True, "restart_seconds": 10.7,
         "resumes_from": {"batch": 40, "epoch": 1, "path": "/x/last.pt"}, "rung": 1, "rung_label": "workers=4",
         "seconds_since_progress": 0.0, "settings": {}, "time": 1700001076.0, "time_iso": "2023-11-14T22:31:16Z",
         "worker_pid": 4243}],
    "job_seq": 2, "kernel_events": {"stall": 1}, "last_failure": "crash:exited with status 1", "lost_batches": 40,
    "lost_seconds": 25.3, "probation": {"1": 120.0}, "probing_from": 2, "failed": {"0": 1}, "remedies": {"batch": 8},
    "restart_times": [1700001055.0, 1700001076.0], "restarts_by_reason": {"crash": 1, "hang": 1},
    "run_seconds": 107.0, "run_started_wall": 1700001000.0, "rung": 1, "rung_entered_trained": 24.5,
    "rung_hangs": {"0": 1}, "rung_speeds": {"0": [2.0, 2.0, 2.0], "1": [1.4286, 1.4286, 1.4286]},
    "startup_failure": None, "startup_seen": 0.7, "state": "healthy", "trained_seconds": 65.1,
    "training_fingerprint": "e3eed639ceb26a78"}


def test_a_state_file_of_todays_format_restores_the_same():
    restored = make()
    restored.restore(copy.deepcopy(TODAY))
    # Saved again before this supervisor boots: a checkpoint's monotonic time and the running state are not kept.
    assert restored.persistent(0.0) == {**TODAY, "state": State.STARTING.value, "run_seconds": None,
                                        "checkpoint": {**TODAY["checkpoint"], "mono": -math.inf}}
    d = Driver(restored)
    d(core.Boot())
    assert restored.persistent(d.t + 5)["run_seconds"] == pytest.approx(TODAY["run_seconds"] + 5)
    assert restored.rung == 1 and restored.attempt == 4 and restored.probe_in() is not None


def test_a_state_file_from_before_the_budget_and_run_seconds_were_kept_restores_as_it_did():
    older = {k: v for k, v in TODAY.items() if k not in ("budget_times", "run_seconds")}
    restored = make()
    restored.restore(copy.deepcopy(older))
    assert restored.persistent(0.0)["budget_times"] == TODAY["restart_times"]
    d = Driver(restored)
    d(core.Boot())
    assert restored.persistent(d.t)["run_seconds"] == TODAY["trained_seconds"]


def test_a_finished_training_and_a_shorter_ladder_restore_as_they_did():
    restored = make(workers=0)  # fewer rungs than rung 9
    restored.restore({**TODAY, "state": "succeeded", "rung": 9})
    assert restored.state == State.SUCCEEDED and restored.rung == len(restored.ladder) - 1
    assert json.loads(json.dumps(restored.persistent(0.0)))["state"] == "succeeded"
