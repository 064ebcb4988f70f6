"""DataLoader patches: ``persistent_workers = false`` for real, and fault hooks inside loader workers.

Ultralytics' InfiniteDataLoader keeps one iterator, and so one set of worker processes, for the whole run,
whatever ``persistent_workers`` says. A ladder rung that asks for fresh workers every epoch (the seeds' fix
for workers that deadlock after a few epochs) needs a loader that really makes them anew.
"""

from __future__ import annotations

import ctypes
import signal
from typing import Any, Callable

import torch
from ultralytics.data.build import InfiniteDataLoader

PR_SET_PDEATHSIG = 1
PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL = 47, 4


def die_with_parent() -> None:
    """Ask the kernel to SIGKILL this process when its parent dies, so no orphan outlives a killed tree."""
    try:
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    except OSError:
        pass


def drop_ambient_capabilities() -> None:
    """The service grants the supervisor CAP_SYSLOG for /dev/kmsg; training has no use for it."""
    try:
        ctypes.CDLL(None, use_errno=True).prctl(PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0)
    except OSError:
        pass


class EpochWorkersDataLoader(InfiniteDataLoader):
    """An InfiniteDataLoader whose worker processes live for one epoch: made at its start, shut down at its end."""

    def __iter__(self):
        self.iterator = self._get_iterator()
        try:
            for _ in range(len(self)):
                yield next(self.iterator)
        finally:
            self.close()
            self.iterator = None


def make_epoch_workers(loader: InfiniteDataLoader) -> InfiniteDataLoader:
    if loader.num_workers > 0:
        loader.__class__ = EpochWorkersDataLoader
    return loader


def chain_worker_init(loader: Any, extra: Callable[[], None]) -> None:
    """Run ``extra`` in every DataLoader worker process after the loader's own worker_init_fn."""
    original = loader.worker_init_fn

    def worker_init(worker_id: int) -> None:
        if original is not None:
            original(worker_id)
        extra()

    loader.worker_init_fn = worker_init


def hook_samples(dataset: Any, in_worker: Callable[[], None]) -> None:
    """Call ``in_worker`` before each sample a loader worker loads: a DataLoader worker process or a thread loader's
    thread (the threads rung's workers), never the training thread itself (``workers = 0``)."""
    from worker.thread_loader import in_loader_thread

    base = type(dataset)

    def __getitem__(self, index):
        if torch.utils.data.get_worker_info() is not None or in_loader_thread():
            in_worker()
        return base.__getitem__(self, index)

    dataset.__class__ = type(f"Hooked{base.__name__}", (base,), {"__getitem__": __getitem__})
