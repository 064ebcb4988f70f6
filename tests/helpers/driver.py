"""The decision core on a chosen clock: ``Driver`` feeds it events at the times a test picks and keeps the actions;
``make`` builds a supervision from config sections, ``healthy`` and ``loading`` one already training."""

from pathlib import Path

from supervisor.config import parse
from supervisor.decision import core
from supervisor.decision.model.actions import ReadStacksAhead, Spawn
from supervisor.decision.model.incident import Stacks
from supervisor.decision.model.ladder import build_ladder
from supervisor.decision.stall import watchdog
from worker.wire.contract import HeartbeatMessage

PID = 4242
COMMAND = {"command": ["python", "train.py"]}  # [worker] command: a user's script as the worker


def make(extra: str = "", workers: int = 8, **sections) -> core.Supervision:
    raw = {"train": {"workers": workers, "epochs": 3}, **sections}
    config = parse(raw, "<test>", state_dir=Path("/nonexistent"))
    return core.Supervision(config, build_ladder(config.ladder, workers, rocm=False, cuda=False))


class Driver:
    """Feeds events at chosen times and keeps the actions."""

    def __init__(self, s: core.Supervision, answers_stacks: bool = True):
        self.s, self.t, self.progress = s, 1000.0, 0
        # A verdict due before its stacks were read asks for them first (core._tick) and is checked again once they
        # are; answers_stacks: answered at once here as by a shell with no stacks to give (then the kill reads them),
        # so a tick at a verdict's time returns the verdict. False: the test answers (or brings progress) itself.
        self.answers_stacks = answers_stacks

    def at(self, t: float):
        self.t = t
        return self

    def __call__(self, event) -> list:
        _, actions = core.decide(self.s, event, core.Now(mono=self.t, wall=1_700_000_000 + self.t))
        if self.answers_stacks and isinstance(event, core.Tick) and len(actions) == 1 \
                and isinstance(actions[0], ReadStacksAhead) and self.verdict_due():
            _, actions = core.decide(self.s, event, core.Now(mono=self.t, wall=1_700_000_000 + self.t))
        return actions

    def verdict_due(self) -> bool:
        due = self.s.watch.deadline
        return due.at is not None and self.t >= due.at

    def boot_and_spawn(self) -> Spawn:
        spawn = [a for a in self(core.Boot()) if isinstance(a, Spawn)][0]
        self(core.Spawned(PID, None))
        return spawn

    def beat(self, phase="train", kind="beat", pid=PID, progress=None, **fields):
        if progress is None:
            self.progress += 1
            progress = self.progress
        message = HeartbeatMessage.from_wire({"v": 1, "pid": pid, "kind": kind, "phase": phase, "progress": progress,
                                              **fields})
        assert message is not None
        return self(core.HeartbeatReceived(message))

    def train_until(self, t_end: float, interval: float):
        while self.t + interval <= t_end:
            self.t += interval
            self.beat(epoch=1, epochs=3, batch=1, batches=10, samples=4)


def kinds(actions):
    return [type(a).__name__ for a in actions]


def verdicts(actions):
    """A tick's actions but the stacks read ahead of a verdict (decision/recovery/stacks_ahead.py): [] where none is due."""
    return [a for a in actions if not isinstance(a, ReadStacksAhead)]


def healthy(**sections) -> Driver:
    d = Driver(make(**sections))
    d.boot_and_spawn()
    d.beat("train", kind="phase")
    d.train_until(1010, 0.5)
    return d


# The in-place tier's world: two loader workers, and the stacks of one of them stopped.
LOADERS = (5001, 5002)
STACKS = Stacks("DataLoader worker stopped", ("DataLoader worker 0 (pid 5001) stopped",), None, 0.1, None)


def loading(**sections) -> Driver:
    """Healthy at 0.5 s a batch, its loader workers reported."""
    d = Driver(make(**sections))
    d.boot_and_spawn()
    d.beat("train", kind="phase")
    d.beat("train", kind="loader", pids=list(LOADERS), seconds=0.4, loader="train")
    while d.t + 0.5 <= 1010:
        d.t += 0.5
        d.beat(epoch=1, epochs=3, batch=3, batches=10, samples=4)
    return d
