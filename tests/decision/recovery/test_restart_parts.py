"""Where a restart's seconds go (issue 48): the incident names the kill, the wait until the next worker, each startup
step of that worker, and how it came (cold, or the standby's kind); a ready standby's model step is a load."""

import pytest

from supervisor.decision import core
from supervisor.vocabulary import WorkerStart
from tests.helpers.driver import PID, healthy
from worker.wire.contract import HELD_LOADER_WORKERS, HELD_MODEL


def restarted(start: WorkerStart, held: tuple[str, ...] = ()):
    d = healthy()  # 0.5 s batches until t=1010
    d.at(d.t + 10.01)(core.Tick())  # the verdict
    verdict = d.t
    d.at(verdict + 0.4)(core.TreeKilled(killed=1, seconds=0.4))
    d.at(verdict + 1.0)(core.Spawned(PID + 1, "/s/train/weights/last.pt", start=start))
    for at, step in ((1.0, "imports"), (1.1, "checkpoint"), (1.5, "model"), (1.7, "dataset"), (1.8, "loaders"),
                     (2.4, "first_batch"), (2.6, "first_step")):
        d.at(verdict + at).beat(phase="setup", kind="step", pid=PID + 1, progress=0, step=step)
        if step == "first_batch":  # the worker's settings come as its training starts
            d.at(verdict + at).beat(phase="setup", kind="settings", pid=PID + 1, progress=0,
                                    settings={"held": list(held)})
    d.at(verdict + 3.0).beat(pid=PID + 1, progress=1, epoch=1, epochs=3, batch=21, batches=40)
    return d.s.incidents[-1]


def test_the_incident_names_each_part_of_a_restart_and_how_the_worker_came():
    incident = restarted(WorkerStart.COLD)
    assert incident.restart_start is WorkerStart.COLD
    assert incident.restart_seconds == pytest.approx(3.0)
    parts = incident.restart_parts
    assert parts["kill"] == pytest.approx(0.4) and parts["to_spawn"] == pytest.approx(0.6)
    assert parts["checkpoint"] == pytest.approx(0.4) and parts["model"] == pytest.approx(0.2)
    assert parts["loaders"] == pytest.approx(0.6) and parts["first_step"] == pytest.approx(0.4)
    assert "model_load" not in parts
    assert incident.to_dict()["restart_parts"] == parts and incident.to_dict()["restart_start"] == "cold"


def test_a_ready_standby_loads_the_checkpoint_into_its_model_and_builds_none():
    parts = restarted(WorkerStart.READY).restart_parts
    assert "model" not in parts and parts["model_load"] == pytest.approx(0.2)


def test_under_ddp_each_ranks_share_of_the_restart_is_in_the_incident_and_its_steps_bound_nothing():
    """Issue 49: the launching worker says one ``checkpoint`` step for its ranks' whole start; each rank says its own
    steps, kept per rank (``rank_parts``): from the spawn to the rank's first word, then each of its steps, the one a
    rank is in at the run's first batch (rank 0's) counted to it. The run's startup step stays the launcher's."""
    d = healthy()
    d.at(d.t + 10.01)(core.Tick())
    verdict = d.t
    d.at(verdict + 0.4)(core.TreeKilled(killed=1, seconds=0.4))
    d.at(verdict + 1.0)(core.Spawned(PID + 1, "/s/train/weights/last.pt"))
    d.at(verdict + 1.1).beat(phase="setup", kind="step", pid=PID + 1, progress=0, step="checkpoint")
    ranks = {0: PID + 10, 1: PID + 11}
    steps = ((0.0, "checkpoint"), (0.3, "process_group"), (0.5, "model"), (0.7, "dataset"), (0.8, "loaders"),
             (1.0, "first_batch"), (2.0, "first_step"))
    for rank, late in ((0, 1.5), (1, 1.6)):
        d.at(verdict + late).beat(phase="setup", kind="phase", pid=ranks[rank], progress=1, rank=rank)
    for at, step in steps:
        for rank, late in ((0, 1.5), (1, 1.6 + (1.0 if step == "first_batch" else 0.0))):
            if step == "first_step" and rank == 1:
                continue  # rank 1 is still loading its first batch at the run's first
            d.at(verdict + late + at).beat(phase="setup", kind="step", pid=ranks[rank], progress=1, rank=rank,
                                           step=step)
    assert d.s.current.startup_step.value == "checkpoint"  # the launcher's, not a rank's
    d.at(verdict + 4.0).beat(pid=ranks[0], progress=2, rank=0, epoch=1, epochs=3, batch=21, batches=40)
    incident = d.s.incidents[-1]
    assert incident.restart_parts["checkpoint"] == pytest.approx(2.9)  # the launcher's one step
    by_rank = {r.rank: r.parts for r in incident.rank_parts}
    assert list(by_rank[0]) == ["start", "checkpoint", "process_group", "model", "dataset", "loaders", "first_batch",
                                "first_step"]
    assert by_rank[0]["start"] == pytest.approx(0.5) and by_rank[1]["start"] == pytest.approx(0.6)
    assert by_rank[0]["process_group"] == pytest.approx(0.2) and by_rank[0]["first_step"] == pytest.approx(0.5)
    assert by_rank[1]["first_batch"] == pytest.approx(4.0 - 3.6)  # entered at 3.6, open at the first batch
    assert "first_step" not in by_rank[1]
    assert incident.to_dict()["rank_parts"][1] == {"rank": 1, "parts": by_rank[1]}


def test_held_loader_workers_leave_the_first_batch_its_loading_only_and_say_so():
    parts = restarted(WorkerStart.READY, held=(HELD_MODEL, HELD_LOADER_WORKERS)).restart_parts
    assert "first_batch" not in parts and parts["first_batch_held"] == pytest.approx(0.2)
    assert "first_batch_held" not in restarted(WorkerStart.READY, held=(HELD_MODEL,)).restart_parts
