"""Several hosts deciding at once, in the pure core (issue 30): one rung for the job at every attempt, and each
attempt's hang, seconds and speed credited to the rung it was spawned at."""

from pathlib import Path

from supervisor.config import parse
from supervisor.decision import core
from supervisor.decision.ladder import build_ladder
from worker.contract import HeartbeatMessage, MessageKind, Phase


class Host:
    """One host's core on a chosen clock: two hosts, rank 0 on host 0, rank 1 on host 1."""

    def __init__(self, node_rank: int):
        raw = {"train": {"data": "demo", "workers": 2},
               "distributed": {"nnodes": 2, "node_rank": node_rank, "rdzv_endpoint": "10.0.0.1:29400",
                               "rdzv_id": "job", "run_dir": "/shared"}}
        self.s = core.Supervision(parse(raw, "host.toml", state_dir=Path("/nonexistent")),
                                  build_ladder(None, 2, rocm=False, cuda=False))
        self.node_rank, self.t, self.progress, self.pid = node_rank, 0.0, 0, 10
        self.spawns = [a for a in self(core.Boot()) if isinstance(a, core.Spawn)]
        self(core.Spawned(self.pid, None))

    def __call__(self, event) -> list:
        return core.decide(self.s, event, core.Now(mono=self.t, wall=1000.0 + self.t))[1]

    def train(self, batches: int) -> None:
        for batch in range(1, batches + 1):
            self.t += 0.5
            self.progress += 1
            self(core.HeartbeatReceived(HeartbeatMessage(
                pid=self.pid + 2, kind=MessageKind.BEAT, phase=Phase.TRAIN, progress=self.progress, epoch=1,
                epochs=2, batch=batch, batches=100, rank=self.node_rank, local_rank=0)))

    def hang(self) -> list:
        self.t += 600.0
        return self(core.Tick())

    def killed(self) -> list:
        actions = self(core.TreeKilled(2))
        self.spawns += [a for a in actions if isinstance(a, core.Spawn)]
        return actions


def published(actions):
    return [a for a in actions if isinstance(a, core.PublishLadder)]


def read(decision: core.PublishLadder, node_rank: int) -> core.JobLadderRead:
    return core.JobLadderRead(decision.seq, decision.rung, decision.remedies, node_rank, f"host-{node_rank}",
                              decision.cause)


def test_a_decision_read_while_an_attempt_runs_is_the_next_attempts_and_the_hang_stays_the_rung_it_was_spawned_at():
    """Host 0 published rung 1; host 1 read it while its ranks still ran, then its own hang chose "faster: rung 0"
    from a hang credited to rung 1, published it, and the hosts trained on different rungs."""
    a, b = Host(0), Host(1)
    a.train(20)
    b.train(20)
    [decision] = published(a.hang())
    assert decision.rung == 1
    b(read(decision, 0))
    assert b.s.rung == 0  # its attempt runs on at the rung it was spawned at
    assert published(b.hang()) == []  # the job's rung for this failure is decided: no second decision
    assert b.s.incidents[-1].rung == 0
    b.killed()
    a.killed()
    assert [s.rung for s in a.spawns] == [s.rung for s in b.spawns] == [0, 1]
    assert b.s.rung_hangs == {"0": 1} and set(b.s.hang_history.rung_seconds) == {0}
    assert set(b.s.rung_speeds) == {"0"}


def test_two_hosts_deciding_at_once_both_train_on_the_decision_the_file_kept():
    """Both hosts chose at once; the file kept host 1's (rung 0 again: "faster"). Host 0 compared it with its rung,
    still 0 before its own pending choice applied, ignored it and spawned at its own rung 1."""
    a, b = Host(0), Host(1)
    a.train(20)
    b.train(20)
    [own] = published(a.hang())
    assert own.rung == 1
    kept = core.PublishLadder(seq=own.seq, rung=0, remedies={}, cause={"reason": "hang"})  # host 1's, at once
    said = a(read(kept, 1))
    a.killed()
    assert [s.rung for s in a.spawns] == [0, 0] and a.s.rung == 0
    assert "host 1 moved the job to rung 0" in said[0].text  # the job's decision replaced this host's own
    assert a.s.rung_hangs == {"0": 1}
