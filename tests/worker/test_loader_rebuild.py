"""The in-place tier's rebuild in a real loader (worker/loading/loader_recovery.py): a pass given up on the supervisor's word
has its live workers killed, not waited for, and goes on at the batch it waited for from new ones."""

import os
import signal
from functools import partial
from pathlib import Path

import pytest
import torch
from ultralytics.data.build import InfiniteDataLoader

from worker.loading import loader_recovery
from worker.wire.commands import CommandChannel
from worker.wire.contract import Command, CommandKind
from worker.heartbeat import Heartbeat

BATCH, WORKERS = 2, 3
MAKING = 9  # from this batch on, the first iterator's workers are each making a batch that takes a minute
NEW_WORKERS = False  # set in each worker process at its start: whether it is the rebuilt iterator's


def note_generation(marks: Path, _worker_id: int) -> None:
    global NEW_WORKERS
    NEW_WORKERS = (marks / "rebuilt").exists()


class Samples(torch.utils.data.Dataset):
    def __len__(self) -> int:
        return 40

    def __getitem__(self, index: int) -> int:
        if index >= MAKING * BATCH and not NEW_WORKERS:
            import time

            time.sleep(60)  # a worker mid-batch: it reads torch's exit word only after this sample
        return index


def test_a_rebuild_kills_the_given_up_passs_busy_workers_instead_of_waiting_for_their_batches(tmp_path):
    loader = InfiniteDataLoader(Samples(), batch_size=BATCH, num_workers=WORKERS, shuffle=False,
                                worker_init_fn=partial(note_generation, tmp_path))
    read, write = os.pipe()
    assert loader_recovery.install(loader, "train", CommandChannel(read), Heartbeat(None))
    batches = iter(loader)
    try:
        fed = [next(batches).tolist() for _ in range(MAKING)]
        assert fed[-1] == [2 * MAKING - 2, 2 * MAKING - 1]
        old = list(loader.iterator._workers)  # each now on a batch of MAKING.. (one a worker, round robin)
        owes = old[MAKING % WORKERS]  # the one whose batch comes next: "stuck", replaced on the supervisor's word
        (tmp_path / "rebuilt").touch()
        os.write(write, Command(CommandKind.REPLACE_LOADER_WORKERS, pids=(owes.pid,), seq=1).to_line())
        os.kill(owes.pid, signal.SIGKILL)

        assert next(batches).tolist() == [2 * MAKING, 2 * MAKING + 1]  # the batch it waited for, from new workers
        assert next(batches).tolist() == [2 * MAKING + 2, 2 * MAKING + 3]
        # torch's own shutdown would have joined each for 5 s and then sent SIGTERM: killed, they were not waited for
        assert [w.exitcode for w in old] == [-signal.SIGKILL] * WORKERS
        assert not {w.pid for w in old} & {w.pid for w in loader.iterator._workers}
        assert loader.recovery.recoveries == 1
    finally:
        batches.close()
        loader.close()
        os.close(read)
        os.close(write)


class Blocks(torch.utils.data.Dataset):
    """Batch MAKING never comes from the first iterator's workers (a worker stuck in it); any other does."""

    def __len__(self) -> int:
        return 40

    def __getitem__(self, index: int) -> int:
        if index // BATCH == MAKING and not NEW_WORKERS:
            import time

            time.sleep(60)
        return index


def test_a_forkserver_workers_kill_is_seen_at_once_though_its_sigchld_goes_to_the_forkserver(tmp_path):
    """torch hears of a worker's death by SIGCHLD, which only its parent gets; the forkserver's workers are not the
    training process's children, and torch's own check of its workers comes every 5 s of a wait."""
    import threading
    import time

    from worker.loading.loaders import start_workers_with

    loader = InfiniteDataLoader(Blocks(), batch_size=BATCH, num_workers=1, shuffle=False,
                                worker_init_fn=partial(note_generation, tmp_path))
    start_workers_with(loader, "forkserver")
    read, write = os.pipe()
    assert loader_recovery.install(loader, "train", CommandChannel(read), Heartbeat(None))
    batches = iter(loader)
    try:
        assert [next(batches).tolist() for _ in range(MAKING)][-1] == [2 * MAKING - 2, 2 * MAKING - 1]
        (worker,) = loader.iterator._workers
        with pytest.raises(ChildProcessError):  # not this process's child: its SIGCHLD goes to the forkserver
            os.waitid(os.P_PID, worker.pid, os.WEXITED | os.WNOHANG | os.WNOWAIT)

        def replace() -> None:  # once the training waits for the batch the worker is stuck in
            time.sleep(0.3)
            (tmp_path / "rebuilt").touch()
            os.write(write, Command(CommandKind.REPLACE_LOADER_WORKERS, pids=(worker.pid,), seq=1).to_line())
            os.kill(worker.pid, signal.SIGKILL)

        threading.Thread(target=replace, daemon=True).start()
        began = time.monotonic()
        assert next(batches).tolist() == [2 * MAKING, 2 * MAKING + 1]
        # torch's own first look at its workers came 5 s into the wait; this one within a second of the kill (the
        # new worker's start from the forkserver is in it too)
        assert time.monotonic() - began < 5.0
        assert loader.recovery.recoveries == 1
    finally:
        batches.close()
        loader.close()
        os.close(read)
        os.close(write)
