"""Several hosts in the pure core (issue 30): one rung for the job at every attempt, each attempt's hang, seconds and
speed credited to the rung it was spawned at; the job's checkpoints known to every host."""

from pathlib import Path

from supervisor.config import parse
from supervisor.decision import core
from supervisor.decision.model.actions import PublishCheckpoint, PublishLadder, ReadStacksAhead, Spawn
from supervisor.decision.model.ladder import build_ladder
from worker.wire.contract import HeartbeatMessage, MessageKind, Phase


class Host:
    """One host's core on a chosen clock: two hosts, rank 0 on host 0, rank 1 on host 1."""

    def __init__(self, node_rank: int, **sections):
        raw = {"train": {"data": "demo", "workers": 2},
               "distributed": {"nnodes": 2, "node_rank": node_rank, "rdzv_endpoint": "10.0.0.1:29400",
                               "rdzv_id": "job", "run_dir": "/shared"},
               "ladder": {"prior_between_hangs": "off"},  # one hang climbs: these tests are about where it goes
               **sections}
        self.s = core.Supervision(parse(raw, "host.toml", state_dir=Path("/nonexistent")),
                                  build_ladder(None, 2, rocm=False, cuda=False))
        self.node_rank, self.t, self.progress, self.pid = node_rank, 0.0, 0, 10
        self.spawns = [a for a in self(core.Boot()) if isinstance(a, Spawn)]
        self(core.Spawned(self.pid, None))

    def __call__(self, event) -> list:
        return core.decide(self.s, event, core.Now(mono=self.t, wall=1000.0 + self.t))[1]

    def train(self, batches: int, start: int = 0) -> None:
        for batch in range(start + 1, start + batches + 1):
            self.t += 0.5
            self.progress += 1
            self(core.HeartbeatReceived(HeartbeatMessage(
                pid=self.pid + 2, kind=MessageKind.BEAT, phase=Phase.TRAIN, progress=self.progress, epoch=1,
                epochs=2, batch=batch, batches=100, rank=self.node_rank, local_rank=0)))

    def hang(self) -> list:
        self.t += 600.0
        actions = self(core.Tick())
        if [type(a) for a in actions] == [ReadStacksAhead]:  # the verdict's stacks first, unread here
            actions = self(core.Tick())  # then the verdict, checked again
        return actions

    def killed(self) -> list:
        actions = self(core.TreeKilled(2))
        self.spawns += [a for a in actions if isinstance(a, Spawn)]
        if self.spawns and self.s.state == core.State.STARTING:
            self.pid += 10
            self(core.Spawned(self.pid, "/shared/weights/last.pt"))
        return actions


def published(actions):
    return [a for a in actions if isinstance(a, PublishLadder)]


def read(decision: PublishLadder, node_rank: int) -> core.JobLadderRead:
    return core.JobLadderRead(decision.seq, decision.rung, decision.remedies, node_rank, f"host-{node_rank}",
                              decision.cause)


def test_a_hang_decision_read_while_an_attempt_runs_restarts_it_at_once_and_the_job_goes_where_it_says():
    """Host 0 published rung 1 for its hang; host 1 read it while its ranks still ran: they are about to lose host 0's,
    so host 1 restarts now (reason peer: no hang of its own, no decision of its own), and both hosts spawn at rung 1."""
    a, b = Host(0), Host(1)
    a.train(20)
    b.train(20)
    [decision] = published(a.hang())
    assert decision.rung == 1 and decision.cause["reason"] == "hang"
    actions = b(read(decision, 0))
    assert any(isinstance(x, core.KillTree) for x in actions) and published(actions) == []
    incident = b.s.incidents[-1]
    assert incident.reason == core.Reason.PEER and incident.rung == 0
    assert "host 0 (host-0) restarts for its hang in train" in incident.detail
    b.killed()
    a.killed()
    assert [s.rung for s in a.spawns] == [s.rung for s in b.spawns] == [0, 1]
    assert b.s.rungs[0].hangs == 0 and b.s.consecutive_crashes == 0  # another host's hang is not this host's


def test_a_hang_that_moves_nothing_is_still_said_and_ends_the_other_hosts_attempt():
    """With several hosts every hang is announced, even one that stays on its rung, so the other hosts do not wait
    for their own bound (NCCL may say nothing of a peer gone). Read again after the restart, it ends nothing."""
    a, b = Host(0, ladder={}), Host(1)  # the default prior: one hang in 10 s of training does not climb
    a.train(20)
    b.train(20)
    [decision] = published(a.hang())
    assert decision.rung == 0
    assert any(isinstance(x, core.KillTree) for x in b(read(decision, 0)))
    b.killed()
    b.train(5)
    assert b(read(decision, 0)) == [] and b.s.state == core.State.HEALTHY  # the same decision again: no news


def test_an_older_decision_read_late_or_a_probes_ends_no_attempt():
    """A decision made before this attempt's spawn, shown late by a shared directory's cached attributes, and a
    probe's (it saves first: rank 0 may be this host's) end nothing; the next attempt still goes where they say."""
    b = Host(1)
    b.train(20)
    old = PublishLadder(seq=1, rung=1, remedies={}, cause={"reason": "hang", "phase": "train", "time": 900.0})
    assert not any(isinstance(x, core.KillTree) for x in b(read(old, 0)))
    assert b.s.state == core.State.HEALTHY and b.s.job_next.rung == 1
    probe = PublishLadder(seq=2, rung=0, remedies={}, cause={"reason": "probe"})
    assert not any(isinstance(x, core.KillTree) for x in b(read(probe, 0)))
    assert b.s.state == core.State.HEALTHY


def test_one_host_publishes_nothing_for_a_hang():
    one = Host(0, distributed={})
    one.train(20)
    assert published(one.hang()) == []


def test_two_hosts_deciding_at_once_both_train_on_the_decision_the_file_kept():
    """Both hosts chose at once; the file kept host 1's (rung 0 again: "faster"). Host 0 compared it with its rung,
    still 0 before its own pending choice applied, ignored it and spawned at its own rung 1."""
    a, b = Host(0), Host(1)
    a.train(20)
    b.train(20)
    [own] = published(a.hang())
    assert own.rung == 1
    kept = PublishLadder(seq=own.seq, rung=0, remedies={}, cause={"reason": "hang"})  # host 1's, at once
    said = a(read(kept, 1))
    a.killed()
    assert [s.rung for s in a.spawns] == [0, 0] and a.s.rung == 0
    assert "host 1 moved the job to rung 0" in said[0].text  # the job's decision replaced this host's own
    assert set(a.s.rungs) == {0} and a.s.rungs[0].hangs == 1


def test_the_host_without_rank_0_counts_the_jobs_checkpoints_in_its_budget_lost_work_and_goodput():
    """Host 1's ranks never report a checkpoint (global rank 0 saves): it spent its restart budget on every hang and
    exited 1, "none after a new checkpoint", while the job checkpointed between every hang."""
    b = Host(1, restart={"max_restarts": 2, "window": 3600}, checkpoint={"every": "5s"})
    position = 0
    for _ in range(5):
        b.train(20, start=position)  # 10 s of training
        position += 16
        b(core.JobCheckpointRead("/shared/weights/last.pt", 1, position, 0.3, 1000.0 + b.t - 2.0, node_rank=0))
        actions = b.hang()
        assert b.s.incidents[-1].loss.batches == 4  # the 4 batches after the job's checkpoint, 2 s of them
        actions += b.killed()
        assert not any(isinstance(a, core.Exit) for a in actions), actions
    assert b.s.budget_times == [] and b.s.checkpoint.batch == position
    assert b.s.goodput.lost_batches == 5 * 4 and b.s.goodput.lost_seconds == 5 * 2.0
    # Its own heartbeats' checkpoints (a host whose ranks include global rank 0) are published for the others.
    a = Host(0)
    a.train(2)
    a.progress += 1
    actions = a(core.HeartbeatReceived(HeartbeatMessage(
        pid=a.pid + 2, kind=MessageKind.CHECKPOINT, phase=Phase.TRAIN, progress=a.progress, epoch=1, epochs=2,
        batch=2, batches=100, rank=0, local_rank=0, path="/shared/weights/last.pt", seconds=0.3)))
    assert PublishCheckpoint("/shared/weights/last.pt", 1, 2, 0.3) in actions
    # ... and its own, read back from the shared file, are no news
    assert a(core.JobCheckpointRead("/shared/weights/last.pt", 1, 9, 0.3, 2000.0, node_rank=0)) == [] and \
        a.s.checkpoint.batch == 2


def test_the_job_checkpoint_file_is_read_once_per_change(tmp_path):
    from supervisor.state.job_ladder import JobCheckpointFile

    a, b = JobCheckpointFile(tmp_path, 0), JobCheckpointFile(tmp_path, 1)
    assert b.read_if_changed() is None
    a.publish(PublishCheckpoint("/shared/weights/last.pt", 2, 30, 0.4))
    read = b.read_if_changed()
    assert (read.path, read.epoch, read.batch, read.seconds, read.node_rank) == ("/shared/weights/last.pt", 2, 30,
                                                                                 0.4, 0)
    assert b.read_if_changed() is None


def test_hosts_with_different_run_dirs_never_meet_in_one_training(tmp_path):
    """Not yet tried before issue 30: each host would checkpoint and decide in its own directory. The ranks compare
    fingerprints that include run_dir once they meet (exit 78, one line), and until then nothing one host publishes
    reaches the other."""
    from supervisor.state.job_ladder import JobCheckpointFile, JobLadderFile
    from supervisor.attempt.rendezvous import rendezvous_of

    def config(node_rank, run_dir):
        return parse({"train": {"data": "demo"}, "distributed": {
            "nnodes": 2, "node_rank": node_rank, "rdzv_endpoint": "10.0.0.1:29400", "rdzv_id": "job",
            "run_dir": str(run_dir)}}, "host.toml", state_dir=tmp_path / f"state-{node_rank}")

    a, b = config(0, tmp_path / "a"), config(1, tmp_path / "b")
    assert rendezvous_of(a).fingerprint != rendezvous_of(b).fingerprint
    assert rendezvous_of(config(1, tmp_path / "a")).fingerprint == rendezvous_of(a).fingerprint
    JobLadderFile(a.distributed.run_dir, 0).publish(PublishLadder(seq=1, rung=2, remedies={}))
    JobCheckpointFile(a.distributed.run_dir, 0).publish(PublishCheckpoint("/a/weights/last.pt", 1, 8, 0.2))
    assert JobLadderFile(b.distributed.run_dir, 1).read_if_changed() is None
    assert JobCheckpointFile(b.distributed.run_dir, 1).read_if_changed() is None
