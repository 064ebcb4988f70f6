"""What a restarted supervisor gets back: every field declared kept round-trips through the state file, and a state
file written before persistence was derived from the records, or before a rung's facts were one record, restores as
it did."""

import collections
import copy
import dataclasses
import enum
import json
import math
import types
import typing
from pathlib import Path

import pytest

from supervisor.decision import core
from supervisor.decision.model.actions import Spawn
from supervisor.decision.model import persistence
from supervisor.decision.model.hang_history import HangHistory
from supervisor.decision.model.incident import Incident, Tier
from supervisor.decision.model.rung_record import RungRecord
from supervisor.decision.model.state import CheckpointMark, Supervision
from supervisor.decision.recovery import probe
from supervisor.decision.status_view import snapshot
from supervisor.vocabulary import KernelKind, Reason, State
from tests.helpers.driver import Driver, make

# Values unlike the defaults, for the kept types whose reading back is their own (a restarted supervisor starts over
# unless finished; a checkpoint's monotonic time is not kept). Every other record's sample is made from its fields.
SAMPLES: dict[typing.Any, typing.Any] = {
    State: State.SUCCEEDED,  # the one state a restarted supervisor keeps
    CheckpointMark: CheckpointMark("/runs/x/weights/last.pt", 2, 5, 1_700_000_000.0, -math.inf, 0.5),
}


def sample(hint: typing.Any) -> typing.Any:
    """A value of the type ``hint`` unlike its field's default: a record's from its own kept fields (all of them
    for a record without), so a field added to one is in the round trip below without a line written for it."""
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if hint in SAMPLES:
        return SAMPLES[hint]
    if origin in (typing.Union, types.UnionType):
        return sample(next(a for a in args if a is not type(None)))
    if origin is list:
        return [sample(args[0])]
    if origin is tuple:  # tuple[X, ...] or tuple[X, Y]
        return (sample(args[0]),) if args[-1] is Ellipsis else tuple(sample(a) for a in args)
    if origin is dict:
        return {{int: 1, str: "1"}[args[0]]: sample(args[1])}  # keys as rungs are: 1 or "1"
    if origin is collections.Counter:  # counts by a word: Counter[Reason]
        return collections.Counter({sample(args[0]): 2})
    if isinstance(hint, type) and issubclass(hint, enum.Enum):
        return list(hint)[-1]
    if dataclasses.is_dataclass(hint):
        hints = typing.get_type_hints(hint)
        named = [f.name for f, _, _ in persistence.kept_fields(hint)] or [f.name for f in dataclasses.fields(hint)]
        return hint(**{name: sample(hints[name]) for name in named})
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


@pytest.mark.parametrize("record, not_kept", [(HangHistory, {"stall_since"}), (RungRecord, set()),
                                              (Incident, {"recorded"})])
def test_every_field_of_a_kept_record_is_saved_and_read_back(record, not_kept):
    """The records kept whole (the hang history, a rung's) or in a file of their own (an incident in
    incidents.jsonl): a field added to one is kept, or named here as not (a monotonic time; the state file's own
    mark)."""
    value = sample(record)
    fields = persistence.kept_fields(record)
    assert {f.name for f in dataclasses.fields(record)} - {f.name for f, _, _ in fields} == not_kept
    for f, _, _ in fields:
        assert getattr(value, f.name) != persistence.default(f), f"{f.name}: its sample is its default"
    restored = persistence.from_json(record, json.loads(json.dumps(persistence.to_json(value))))
    assert [(f.name, getattr(restored, f.name)) for f, _, _ in fields] == \
        [(f.name, getattr(value, f.name)) for f, _, _ in fields]


# incidents.jsonl lines as the supervisor wrote them before the incident's form was derived from its fields (with
# issue 30's in_loader_worker beside the stacks): a hang with everything known (several hosts, stacks, the kill, the
# in-place tier's escalation), a crash before the first batch, and a hang recovered in place (issue 28).
INCIDENT_LINES = [
    {"id": "3-1-1700000000", "time": 1700000000.0, "time_iso": "2023-11-14T22:13:20Z", "reason": "hang",
     "phase": "train", "detail": "no progress for 30.0 s in train", "attempt": 3, "rung": 1, "rung_label": "workers=4",
     "worker_pid": 4242, "epoch": 2, "batch": 7, "seconds_since_progress": 30.0, "last_progress_wall": 1699999970.0,
     "kernel_events": [{"kind": "stall", "pattern": "hung_task"}], "lost_seconds": 12.5, "lost_batches": 25,
     "resumes_from": {"epoch": 2, "batch": 0, "path": "/x/last.pt"}, "stopped_first_rank": 1, "node_rank": 0,
     "host": "gpu-a", "caused_by": {"node_rank": 1, "reason": "hang"}, "processes": [{"pid": 4242, "name": "python"}],
     "output_tail": ["Epoch 2/3 ..."], "where": "main in poll", "summary": ["main (pid 4242) in poll"],
     "culprit": "main (pid 4242) in poll", "stacks_seconds": 0.4, "stacks": "incidents/3-1/stacks.json",
     "in_loader_worker": True,
     "last_error": None, "settings": {"workers": 4},
     "kill": {"processes": 2, "seconds": 0.05, "survivors": ["4243 python"], "confirmed_wall": 1700000001.0},
     "restart_seconds": 11.5, "tier": "restart", "escalation": "no loader worker process is stuck"},
    {"id": "1-0-1700000000", "time": 1700000000.0, "time_iso": "2023-11-14T22:13:20Z", "reason": "crash",
     "phase": "startup", "detail": "exited with status 1", "attempt": 1, "rung": 0, "rung_label": "as configured",
     "worker_pid": None, "epoch": 0, "batch": 0, "seconds_since_progress": None, "last_progress_wall": None},
    {"id": "2-2-1700000000", "time": 1700000000.0, "time_iso": "2023-11-14T22:13:20Z", "reason": "hang",
     "phase": "val", "detail": "no progress for 10.0 s in val", "attempt": 2, "rung": 0, "rung_label": "as configured",
     "worker_pid": 4300, "epoch": 1, "batch": 3, "seconds_since_progress": 10.0, "last_progress_wall": 1699999990.0,
     "where": "DataLoader worker stopped", "summary": ["DataLoader worker 0 (pid 4301) stopped"], "culprit": None,
     "stacks_seconds": 0.2, "stacks": "incidents/2-2/stacks.json", "in_loader_worker": False, "tier": "in_place",
     "tier_cost": {"stall": 10.0, "action": 0.4, "to_next_batch": 0.9, "batches_lost": 0}},
]


@pytest.mark.parametrize("line", INCIDENT_LINES, ids=["hang", "crash", "in_place"])
def test_an_incident_of_todays_format_reads_back_and_writes_the_same(line):
    incident = Incident.from_dict(copy.deepcopy(line))
    assert incident.recorded  # a line of incidents.jsonl was written already
    written = incident.to_dict()
    assert list(written) == list(line) and json.dumps(written) == json.dumps(line)


def test_an_incident_recorded_before_the_tier_neutral_key_reads_its_tier_cost_and_writes_the_new_key():
    """Before issue 60 every tier's cost was kept under "in_place": an old line or state file reads it back."""
    old = copy.deepcopy(INCIDENT_LINES[2])
    old["in_place"] = old.pop("tier_cost")
    incident = Incident.from_dict(old)
    assert incident.cost == {"stall": 10.0, "action": 0.4, "to_next_batch": 0.9, "batches_lost": 0}
    assert incident.to_dict() == INCIDENT_LINES[2]


# A state file as the supervisor wrote it before the records declared what is kept (persistent() listed the keys)
# and before a rung's facts were one record (each in a map of its own): a run at rung 1 after a hang and a crash,
# probing from rung 2 earlier, one incident not yet in incidents.jsonl.
BEFORE = {
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
    "startup_failure": None, "startup_steps_seen": {"imports": 0.4, "first_batch": 0.3}, "state": "healthy",
    "trained_seconds": 65.1,
    "training_fingerprint": "e3eed639ceb26a78",
    "recoveries": {"in_place": 1, "restart": 3}, "in_place_failures": [1763800000.5], "loader_waits_seen": {"train": 0.4},
    "rung_in_place_seconds": {"0": 12.5}}
RUNG_MAPS = ("rung_speeds", "rung_hangs", "rung_in_place_seconds", "probation", "failed")
# The same training in today's state file: each rung's facts in its record.
TODAY = {**{k: v for k, v in BEFORE.items() if k not in (*RUNG_MAPS, "in_place_failures")}, "checkpoint_seen": 0.6,
         "escalations": BEFORE["in_place_failures"],
         "device_waits_seen": {"train": 1.5}, "one_place_seen": {"train": 2.5, "val": 0.8},
         "hang_history": {k: v for k, v in BEFORE["hang_history"].items() if k not in ("rung_seconds", "rung_starts")},
         "rungs": {"0": {"speeds": [2.0, 2.0, 2.0], "seconds": 24.5, "hangs": 1, "starts": [0.5], "failed_probes": 1,
                         "tier_seconds": 12.5},
                   "1": {"speeds": [1.4286, 1.4286, 1.4286], "seconds": 20.3, "starts": [0.7, 0.7],
                         "probation": 120.0}}}


def test_the_in_place_tiers_names_of_before_issue_60_restore_under_the_tier_neutral_ones():
    older = {**{k: v for k, v in TODAY.items() if k != "escalations"}, "in_place_failures": [1763800000.5],
             "rungs": {"0": {"speeds": [2.0], "seconds": 24.5, "in_place_seconds": 12.5, "in_place": 2,
                             "in_place_failed": 1}}}
    restored = make()
    restored.restore(copy.deepcopy(older))
    record = restored.rungs[0]
    assert (record.tier_seconds, record.tier_recovered, record.tier_escalated) == (12.5, 2, 1)
    assert restored.escalations == [1763800000.5]
    assert restored.persistent(0.0)["rungs"]["0"] == {"speeds": [2.0], "seconds": 24.5, "tier_seconds": 12.5,
                                                      "tier_recovered": 2, "tier_escalated": 1}


def test_a_state_file_of_todays_format_restores_the_same():
    restored = make()
    restored.restore(copy.deepcopy(TODAY))
    # Saved again before this supervisor boots: a checkpoint's monotonic time and the running state are not kept.
    assert restored.persistent(0.0) == {**TODAY, "state": State.STARTING.value, "run_seconds": None,
                                        "checkpoint": {**TODAY["checkpoint"], "mono": -math.inf}}
    d = Driver(restored)
    d(core.Boot())
    assert restored.persistent(d.t + 5)["run_seconds"] == pytest.approx(TODAY["run_seconds"] + 5)
    assert restored.rung == 1 and restored.attempt == 4 and probe.probe_in(restored) is not None


def test_the_counts_restore_keyed_by_the_vocabularys_words_and_count_on():
    restored = make()
    restored.restore(copy.deepcopy(TODAY))
    assert all(isinstance(k, Reason) for k in restored.restarts_by_reason)
    assert all(isinstance(k, Tier) for k in restored.recoveries) and restored.recoveries[Tier.IN_PLACE] == 1
    assert restored.kernel_events == {KernelKind.STALL: 1} and restored.kernel_events[KernelKind.GPU_LOST] == 0
    restored.restarts_by_reason[Reason.PROBE] += 1  # a word not counted yet: no field, no default to write
    restored.hangs_by_phase["val"] += 1
    saved = json.loads(json.dumps(restored.persistent(0.0)))
    assert saved["restarts_by_reason"] == {"crash": 1, "hang": 1, "probe": 1}
    assert saved["hangs_by_phase"] == {"train": 1, "val": 1} and saved["kernel_events"] == {"stall": 1}


def test_a_state_file_with_a_map_per_rung_fact_restores_into_the_rung_records():
    restored = make()
    restored.restore(copy.deepcopy(BEFORE))
    assert restored.rungs == {0: RungRecord([2.0, 2.0, 2.0], 24.5, 1, [0.5], None, 1, 12.5),
                              1: RungRecord([1.4286, 1.4286, 1.4286], 20.3, 0, [0.7, 0.7], 120.0)}
    # (that file knew no mid-epoch checkpoint's own stretch: none is seen until one is)
    assert restored.persistent(0.0) == {**TODAY, "checkpoint_seen": None, "device_waits_seen": {}, "one_place_seen": {},
                                        "state": State.STARTING.value,
                                        "run_seconds": None,
                                        "checkpoint": {**TODAY["checkpoint"], "mono": -math.inf}}


def test_the_state_file_the_supervisor_wrote_at_44465a3_restores_into_the_same_rung_facts():
    """tests/fixtures/state/capture.py ran that commit's core through hangs, a probe that hung and a recovery in
    place: restored here, the ladder's next choices and the status read from the rungs are what they were there."""
    written = json.loads((Path(__file__).parents[2] / "fixtures" / "state" / "supervisor-44465a3.json").read_text())
    assert set(RUNG_MAPS) <= set(written["state"]) and "rungs" not in written["state"]
    restored = make(workers=8, ladder=written["ladder"])
    core.restore(restored, copy.deepcopy(written["state"]))
    assert restored.rungs[0].hangs == 6 and restored.rungs[0].failed_probes == 1
    assert restored.rungs[1].probation == 120.0 and restored.rungs[1].tier_seconds == 11.998
    now = core.Now(*written["now"])
    shown = snapshot(restored, now).to_dict()
    assert {k: shown[k] for k in written["status"]} == written["status"]
    again = make(workers=8, ladder=written["ladder"])
    again.restore(json.loads(json.dumps(restored.persistent(0.0))))
    assert again.rungs == restored.rungs and not set(RUNG_MAPS) & set(restored.persistent(0.0))


def test_a_state_file_from_before_the_budget_and_run_seconds_were_kept_restores_as_it_did():
    older = {k: v for k, v in BEFORE.items() if k not in ("budget_times", "run_seconds")}
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


def _changed(key, value, record=BEFORE):
    record = copy.deepcopy(record)
    record[key] = value
    return record


def _without(record, path):
    record = copy.deepcopy(record)
    target = record
    for name in path[:-1]:
        target = target[name]
    del target[path[-1]]
    return record


# Issue 30: one-field changes to a state file, each of which crashed `run` with a traceback (systemd restarts it).
WRONGLY_TYPED = {
    "rung is text": _changed("rung", "x"),
    "rung_speeds is a list": _changed("rung_speeds", [1, 2]),
    "a hang point without epoch": _without(TODAY, ("hang_history", "points", 0, "epoch")),
    "a checkpoint path that is a number": _changed("checkpoint", {**TODAY["checkpoint"], "path": 1}),
    "budget_times is text": _changed("budget_times", "abc"),
    "hang_history is a list": _changed("hang_history", [1, 2]),
    "an incident without reason": _without(TODAY, ("incidents", 0, "reason")),
    "a probation of null": _changed("probation", {"1": None}),
    "an incident's epoch is text": _changed("incidents", [{**TODAY["incidents"][0], "epoch": "one"}]),
    "rung is true": _changed("rung", True),
    # the records whose reading is derived from their fields (issue 32): per type, as strict as the rest
    "a hang point resumed at text": _changed("hang_history", {**TODAY["hang_history"], "points": [
        {**TODAY["hang_history"]["points"][0], "resumed_at": "x"}]}),
    "a hang point resumed at one number": _changed("hang_history", {**TODAY["hang_history"], "points": [
        {**TODAY["hang_history"]["points"][0], "resumed_at": [1]}]}),
    "an incident's stacks flag is text": _changed("incidents", [{**TODAY["incidents"][0], "where": "main in poll",
                                                                 "in_loader_worker": "yes"}]),
    "an incident's kill is a number": _changed("incidents", [{**TODAY["incidents"][0], "kill": 3}]),
    "a rung that is not a number": _changed("rungs", {"x": {"hangs": 1}}, TODAY),
    "a rung's speeds that are text": _changed("rungs", {"0": {"speeds": "fast"}}, TODAY),
    "a rung's record that is a list": _changed("rungs", {"0": [1, 2]}, TODAY),
}


@pytest.mark.parametrize("case", list(WRONGLY_TYPED))
def test_a_wrongly_typed_state_file_is_a_corrupt_one_moved_aside_in_one_line(case, tmp_path, caplog):
    from supervisor.state.state_dir import StateDir
    (tmp_path / "supervisor.json").write_text(json.dumps({"version": 1, **WRONGLY_TYPED[case]}))
    assert StateDir(tmp_path, "<test>").read_state(make().restore) is None  # the run goes on at rung 0
    (aside,) = tmp_path.glob("supervisor.json.corrupt-*")
    [said] = [r.getMessage() for r in caplog.records]
    assert said.startswith(f"{tmp_path / 'supervisor.json'}: corrupt state file: ")
    assert f"moved aside to {aside}; training resumes from scratch" in said
    assert "\n" not in said and not (tmp_path / "supervisor.json").exists()


def test_a_rung_below_the_ladder_is_clamped_to_it():
    restored = make()
    restored.restore(_changed("rung", -1) | {"probing_from": -3})
    assert restored.rung == 0 and restored.probe.probing_from is None
    d = Driver(restored)
    assert [a for a in d(core.Boot()) if isinstance(a, Spawn)][0].rung == 0


def test_status_renders_a_malformed_last_incident_in_one_line():
    from supervisor.verbs.status import render
    for malformed in ({"reason": "hang"}, "x", {"time": "yesterday", "reason": 1, "phase": None, "detail": 2}):
        text = render({"state": "not running", "last_incident": malformed}, now=1_700_000_000.0)
        assert "last incident: unreadable record" in text


def test_an_in_place_incident_whose_cost_lacks_a_field_still_gets_its_notice():
    """The cost is the tier's own record, kept as a map: one written by another version (or by hand) without
    ``batches_lost`` reads back, and the notice says what it knows instead of failing when it is built."""
    from supervisor.decision.recovery.in_place import InPlaceTier

    line = copy.deepcopy(INCIDENT_LINES[2])
    del line["tier_cost"]["batches_lost"]
    incident = Incident.from_dict(line)
    notice = InPlaceTier().recovered(incident, "val")
    assert notice == "recovered in place from val: training again 1 s after the loader workers were replaced, " \
                     "? batches lost"
