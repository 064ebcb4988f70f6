"""Recovery in place: a loader whose hung worker processes the supervisor killed goes on at the batch it waited for.

The supervisor, seeing the training process wait for a batch while a loader worker process is stuck, writes a
``REPLACE_LOADER_WORKERS`` command naming those processes, then SIGKILLs them (supervisor/decision/recovery/in_place.py).
torch's SIGCHLD handler makes the training process's ``next()`` raise ``RuntimeError: DataLoader worker (pid(s) N)
exited unexpectedly`` (or "is killed by signal"; a worker killed while it handed a batch over fails the receive with
a connection error instead). Here, inside the loader's own iteration, that error is taken for what the command says it
is: the old iterator is shut down, a new one starts at the batch that was waited for (the sampler's pass of this epoch
less the samples already yielded: the epoch-keyed order's skip, or ``PassSkipSampler`` for validation's sequential
one), and the pass goes on; the training loop never sees it.
Model, optimizer, AMP scaler and GPU context are untouched: no checkpoint is read, no batch lost or trained twice.

With pin memory the receive is the pin-memory thread's: a worker killed mid-handover kills that thread, whose death
Python prints as a traceback (``threading.excepthook``). That death is held (``hold_pin_thread_deaths``) until the
loader's own error says whose it was: the supervisor's replacement (dropped, the one line says it), or not (printed).

A loader worker that dies without such a command (the OOM killer, a crash in a sample) fails the training as
before. Every start of a loader's workers is reported (``Heartbeat.loader_started``: their pids, and how long the
first batch took), so the supervisor knows which processes are loader workers even when they are too stopped to
trace, and how long a new iterator may take to give a batch.
"""

from __future__ import annotations

import re
import threading
import time
from itertools import islice
from typing import Any, Iterator

import torch
from torch.utils.data._utils import signal_handling

from worker.wire.commands import CommandChannel
from worker.wire.contract import CommandKind
from worker.heartbeat import Heartbeat

# torch's words for it: its SIGCHLD handler's ("(pid N) is killed by signal: Killed", "(pid N) exited unexpectedly
# with exit code C") and its loader's periodic check's ("(pid(s) N, M) exited unexpectedly").
DEAD_WORKERS = re.compile(r"DataLoader worker \(pid(?:\(s\))? ([\d, ]+)\) (?:exited unexpectedly|is killed by signal)")

PIN_THREAD_DIED = "Pin memory thread exited unexpectedly"

# Pin-memory threads' deaths of a failed handover, held until the loader says whose they were.
HELD_PIN_THREAD_DEATHS: list[Any] = []


def hold_pin_thread_deaths() -> None:
    """Make ``threading.excepthook`` hold a pin-memory thread's death of a receive from a dead worker (an OSError or
    EOFError in torch's ``_pin_memory_loop``) instead of printing it; any other thread's error as before. Once."""
    previous = threading.excepthook
    if getattr(previous, "holds_pin_thread_deaths", False):
        return

    def hook(args: Any) -> None:
        frames, tb = set(), args.exc_traceback
        while tb is not None:
            frames.add(tb.tb_frame.f_code.co_name)
            tb = tb.tb_next
        if "_pin_memory_loop" in frames and issubclass(args.exc_type, (OSError, EOFError)):
            HELD_PIN_THREAD_DEATHS.append((previous, args))
        else:
            previous(args)

    hook.holds_pin_thread_deaths = True
    threading.excepthook = hook


def release_pin_thread_deaths(print_them: bool) -> None:
    """The held deaths: dropped (the supervisor's replacement, said in one line) or printed as Python would have."""
    while HELD_PIN_THREAD_DEATHS:
        previous, args = HELD_PIN_THREAD_DEATHS.pop(0)
        if print_them:
            previous(args)


def dead_workers(error: BaseException) -> set[int]:
    """The pids torch names in its "exited unexpectedly" error; empty for any other error."""
    found = DEAD_WORKERS.search(str(error)) if isinstance(error, RuntimeError) else None
    return {int(p) for p in found.group(1).replace(",", " ").split()} if found else set()


class PassSkipSampler(torch.utils.data.Sampler):
    """A sampler whose next pass leaves out its first ``skip_next`` indices (the validation loader's order; the
    training loader's ``EpochOrderSampler`` does the same with its per-epoch skip)."""

    def __init__(self, inner: Any):
        self.inner, self.skip_next = inner, 0

    def __iter__(self) -> Iterator[int]:
        skip, self.skip_next = self.skip_next, 0
        return islice(iter(self.inner), skip, None)

    def __len__(self) -> int:
        return len(self.inner)


WORD_TRAILS = 2.0  # seconds a replaced worker's death may come before the supervisor's word is on this rank's pipe


class LoaderRecovery:
    """One loader's link to the supervisor: its starts reported, its replaced workers recognised."""

    def __init__(self, name: str, commands: CommandChannel, hb: Heartbeat):
        self.name, self.commands, self.hb = name, commands, hb
        self.replaced: set[int] = set()  # pids the supervisor said it kills
        self.recoveries = 0

    def is_replacement(self, error: BaseException, workers: set[int], trail: float = WORD_TRAILS) -> bool:
        """The loader (whose iterator's worker processes are ``workers``) failed because the supervisor killed some of
        them: it said so first, on the command pipe. A death its word does not cover yet waits up to ``trail``
        seconds for it: under DDP the word comes through the launching worker's relay thread,
        which a loaded machine runs after the kill (CI: rank 1 took its replaced worker's death for a failure and
        crashed, and the rebuild that would have worked became a restart). A death no word explains (the OOM
        killer's, a crash in a sample) fails the training as before, that much later."""
        deadline = time.monotonic() + trail
        while True:
            said = self._said(error, workers)
            if said is not None:
                return said
            left = deadline - time.monotonic()
            if left <= 0 or not self.commands.readable(left):
                return False

    def _said(self, error: BaseException, workers: set[int]) -> bool | None:
        """Whether the supervisor's word read so far explains ``error``; None: it is a death a word may still come
        for."""
        # Recorded before they are dropped: a death raised meanwhile (torch's SIGCHLD handler, at any bytecode) must
        # not lose the word that explains it.
        for command in self.commands.peek(CommandKind.REPLACE_LOADER_WORKERS):
            self.replaced.update(command.pids)
        self.commands.drop(CommandKind.REPLACE_LOADER_WORKERS)
        dead = dead_workers(error)
        if dead:
            return True if dead <= self.replaced else None
        # A batch's tensors come through the worker that made it (a file descriptor handed over a socket, torch's
        # file_descriptor sharing): a worker frozen, then killed, mid-handover fails the receive with a connection
        # error before torch has seen it dead.
        # With pin_memory, that receive is the pin-memory thread's: it dies of it, and the loader says so.
        if isinstance(error, (OSError, EOFError)) or PIN_THREAD_DIED in str(error):
            return True if self.replaced & workers else None
        return False

    def started(self, iterator: Any, made_at: float | None) -> None:
        """Report the iterator's workers: when made (``made_at`` None), and again at its first batch."""
        pids = [w.pid for w in getattr(iterator, "_workers", ())]
        if pids:
            self.hb.loader_started(self.name, pids, None if made_at is None else time.monotonic() - made_at)


def stop_workers_now(iterator: Any) -> None:
    """Kill the live worker processes of a pass given up for a new iterator, rather than ask them to exit: a worker
    reads its exit word only between samples, so torch's shutdown waits for the batch each is making (a second and
    more of mosaics at 640 px; 5 s a worker, then SIGTERM, where one is stuck as well), all of it restart time of the
    in-place tier, while the new iterator waits. What they were making belongs to the pass given up."""
    for worker in getattr(iterator, "_workers", ()):
        if worker.is_alive():
            worker.kill()


WORKER_CHECK_SECONDS = 0.5


def check_workers_often(iterator: Any) -> None:
    """Make the iterator look for dead workers every ``WORKER_CHECK_SECONDS`` while it waits for a batch, not every
    5 s (torch's ``MP_STATUS_CHECK_INTERVAL``, bound as ``_try_get_data``'s default). torch learns of a worker's
    death from SIGCHLD, which only the worker's parent gets: workers started by the forkserver are its children, so
    the training process saw the supervisor's kill only at its next check, past the in-place tier's bound: a rebuild
    at the forkserver rung escalated, the training process waiting with no worker left."""
    wait = getattr(iterator, "_try_get_data", None)
    if wait is None:
        return

    def try_get_data(timeout: float = WORKER_CHECK_SECONDS):
        return wait(timeout)

    iterator._try_get_data = try_get_data


def recovering_class(base: type) -> type:
    """``base`` (a process loader, Ultralytics' or one of ours) whose pass survives the supervisor's replacement of
    its worker processes. Made per base class, as ``exact_resume.resuming_class``."""

    class Recovering(base):
        recovery: LoaderRecovery

        def __iter__(self):
            start = getattr(self, "first_batch_index", 0)  # > 0 in an epoch resumed from a checkpoint
            skipped = self.resume.samples_done(self.batch_size) if start and getattr(self, "resume", None) else 0
            wanted = len(self) - start
            made_at, reported, done = time.monotonic(), False, 0
            had_iterator = getattr(self, "iterator", None) is not None
            if not had_iterator and not getattr(base, "closes_each_pass", False):
                # Made here rather than at the first next(), so its workers are known before any can hang.
                self.iterator = self._get_iterator()
            inner, last = super().__iter__(), None  # last: the iterator of the last batch (per-epoch workers drop it)
            while done < wanted:
                try:
                    batch = next(inner)
                except StopIteration:
                    return
                except (RuntimeError, OSError, EOFError) as e:
                    replaced = False
                    try:
                        replaced = self._replaced(e, last)
                    finally:
                        release_pin_thread_deaths(print_them=not replaced)
                    if not replaced:
                        raise
                    self.recovery.replaced.clear()
                    inner.close()
                    made_at, reported, had_iterator = time.monotonic(), False, False
                    inner = self._rest_of_pass(skipped + done * self.batch_size, wanted - done)
                    self.recovery.recoveries += 1
                    print(f"yolo-train worker: {self.recovery.name} loader workers replaced on the supervisor's word "
                          f"({type(e).__name__}: {e}): a new iterator goes on at batch {start + done + 1}", flush=True)
                    continue
                if not reported:
                    reported = True
                    if not had_iterator:  # a persistent iterator's workers were reported at its start
                        self.recovery.started(self.iterator, made_at)
                done += 1
                last = self.iterator
                yield batch

        def _get_iterator(self):
            """Every iterator made, by this pass, a per-pass loader's own ``__iter__`` or a reset: its workers are
            reported as soon as they are made, so a batch they never give names them (per-pass workers that hang
            before an epoch's first batch were known only at that batch)."""
            iterator = super()._get_iterator()
            check_workers_often(iterator)
            self.recovery.started(iterator, None)
            return iterator

        def _replaced(self, error: BaseException, last: Any) -> bool:
            """Whether ``error`` is the supervisor's replacement of this iterator's workers; if so, the iterator is
            out of torch's SIGCHLD watch, which would raise the dead worker's death again (at any bytecode, at each
            child's exit) until the iterator's shutdown ends. Raised meanwhile, that death is the same one."""
            for _ in range(5):
                try:
                    it = self.iterator if self.iterator is not None else last
                    if not self.recovery.is_replacement(error, {w.pid for w in getattr(it, "_workers", ())}):
                        return False
                    if getattr(it, "_worker_pids_set", False):
                        signal_handling._remove_worker_pids(id(it))
                        it._worker_pids_set = False
                    return True
                except RuntimeError as again:
                    if not dead_workers(again):
                        raise
                    error = again
            return False

        def _rest_of_pass(self, skip_samples: int, batches: int) -> Iterator[Any]:
            """A new iterator whose first pass starts ``skip_samples`` into this one; its next ``batches``."""
            old, self.iterator = self.iterator, None
            if old is not None and hasattr(old, "_shutdown_workers"):
                stop_workers_now(old)
                old._shutdown_workers()  # the dead ones reaped, the queues and the pin-memory thread closed
            sampler = self.batch_sampler.sampler.sampler  # _RepeatSampler -> BatchSampler -> ours
            if hasattr(sampler, "skip"):  # exact_resume.EpochOrderSampler: the epoch's order, keyed by epoch
                sampler.skip[self.current_epoch()] = skip_samples
            else:
                sampler.skip_next = skip_samples
            self.iterator = self._get_iterator()
            try:
                for _ in range(batches):
                    yield next(self.iterator)
            finally:
                if getattr(base, "closes_each_pass", False):  # per-epoch workers: made and shut down per pass
                    self.close()
                    self.iterator = None

    Recovering.__name__ = Recovering.__qualname__ = f"Recovering{base.__name__}"
    return Recovering


def install(loader: Any, name: str, commands: CommandChannel, hb: Heartbeat) -> bool:
    """Make a process loader recover in place; False (untouched) where it cannot: no worker processes, or a sampler
    whose passes cannot be started part-way."""
    batch_sampler = getattr(loader.batch_sampler, "sampler", None)  # _RepeatSampler -> BatchSampler
    if loader.num_workers == 0 or not hasattr(batch_sampler, "sampler"):
        return False
    if not hasattr(batch_sampler.sampler, "skip"):
        if not isinstance(batch_sampler.sampler, torch.utils.data.SequentialSampler):
            return False  # shuffled without the epoch-keyed order: the pass cannot be started where it was
        batch_sampler.sampler = PassSkipSampler(batch_sampler.sampler)
    loader.__class__ = recovering_class(type(loader))
    loader.recovery = LoaderRecovery(name, commands, hb)
    hold_pin_thread_deaths()
    return True
