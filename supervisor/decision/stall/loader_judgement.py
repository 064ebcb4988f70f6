"""Whether a hung tree's stacks allow the in-place tier (supervisor/decision/recovery/in_place.py): the training process
waits for a batch in its DataLoader (not in a GPU call, not in a collective) and the culprit is one or more of its
loader worker processes. Pure: a ``TreeCapture`` and the loader workers the worker reported in, a verdict out.
"""

from __future__ import annotations

from dataclasses import dataclass

from supervisor.decision.stall.stack_reading import ProcessStacks, TreeCapture
from worker.wire.contract import BATCH_WAIT_FILE, BATCH_WAIT_FUNCTIONS


@dataclass(frozen=True)
class LoaderVerdict:
    loader_wait: bool
    culprits: tuple[int, ...]
    why: str
    rank: int | None = None


STOPPED = ("T", "t")  # /proc's states of a stopped process (SIGSTOP, a tracer)


def waits_for_batch(p: ProcessStacks) -> bool:
    """Its main thread is inside the DataLoader iterator's wait for a batch."""
    main = next((t for t in p.threads if t.tid == p.pid), None)
    return main is not None and any(f.function in BATCH_WAIT_FUNCTIONS and f.path.endswith(BATCH_WAIT_FILE)
                                    for f in main.python_frames)


def stuck(p: ProcessStacks) -> bool:
    """A loader worker inside a sample, stopped, or on CPU: not one parked on its index queue."""
    return p.state in ("T", "t", "D", "R") or p.busy_dataloader_worker


def judge(capture: TreeCapture, loaders: dict[int, int | None]) -> LoaderVerdict:
    by_pid = {p.pid: p for p in capture.processes}
    reported = [by_pid[pid] for pid in loaders if pid in by_pid]
    culprits = [p for p in reported if stuck(p)]
    if not culprits:
        return LoaderVerdict(False, (), "no loader worker process is stuck: the hang is not the loader's")
    parents = {p.ppid for p in culprits}
    trainers = [by_pid[pid] for pid in parents if pid in by_pid]
    if trainers and all(t.state in STOPPED for t in trainers) and all(p.state in STOPPED for p in culprits):
        whose = "every rank's process is" if len(trainers) > 1 else "the training process is"
        return LoaderVerdict(False, (), f"{whose} stopped, as are the loader workers (the whole tree frozen): restart")
    if len(parents) != 1 or next(iter(parents)) not in by_pid:
        return LoaderVerdict(False, (), "the stuck loader workers belong to more than one training process")
    trainer = by_pid[next(iter(parents))]
    if not waits_for_batch(trainer) and trainer.ppid in by_pid and waits_for_batch(by_pid[trainer.ppid]):
        trainer = by_pid[trainer.ppid]  # forkserver workers: children of the server, which the trainer started
    if not waits_for_batch(trainer):
        return LoaderVerdict(False, (), f"the training process (pid {trainer.pid}) is not waiting for a batch: "
                                        f"{trainer.waited_in()}")
    pids = tuple(sorted(p.pid for p in culprits))
    return LoaderVerdict(True, pids, f"the training process (pid {trainer.pid}) waits for a batch and loader worker(s) "
                                     f"{', '.join(map(str, pids))} are stuck ({culprits[0].waited_in()})",
                         loaders.get(pids[0]))
