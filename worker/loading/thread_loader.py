"""A training loader without worker processes: Ultralytics' dataset read by a pool of threads in the training process.

DataLoader worker processes (fork, shared-memory queues, the HIP runtime in a forked child) are where ROCm training
hangs, and the ladder's cure, ``workers = 0``, costs most of the loader's speed. Image decoding and augmentation
(cv2, numpy) release the GIL, so threads keep most of that speed without a single process being started.

Same batches for the same seed. ``ThreadDataLoader`` with ``threads = N`` gives, batch for batch, the same sample
indices and the same tensors (mosaic and all) as the InfiniteDataLoader it was made from would give with
``workers = N``, because each thread plays one worker process exactly:

- the indices come from the same batch sampler object and generator, drawn in the same order as torch's iterator
  (its base seed first, then the permutation), so the order is the process loader's for the same seed;
- stream k takes batches k, k+N, k+2N ... in order, as torch's round-robin dispatch gives them to worker k;
- stream k has a copy of the dataset, as a forked worker has: its own mosaic buffer and image list. Sharing one would
  make mosaic partners depend on thread timing, and is a race: ``BaseDataset.load_image`` re-reads ``self.ims[i]``
  after another thread may have evicted it. The large read-only parts (labels, file lists, a RAM cache) are shared;
- stream k draws from its own ``random.Random`` and ``numpy.random.RandomState``, seeded as torch and then
  Ultralytics' ``seed_worker`` seed worker k: ``(base_seed + k) % 2**32``. Ultralytics' augmentations call the global
  ``random`` and ``np.random`` functions, which threads share; ``ultralytics.data.augment``'s ``random`` and ``np``
  names are replaced by stand-ins that send those calls to the calling stream's generators (and, from any other
  thread, to the global ones, unchanged).

Not identical: against a process loader with another worker count the indices are the same but the augmentation
draws differ (as they differ between process loaders of 8 and 4 workers). torch's own RNG is not per stream (the
detection pipeline draws nothing from it; torchvision's classification transforms do), nor is randomness drawn
outside ``ultralytics.data.augment`` (albumentations, for one). ``worker_init_fn`` is not called: it is meant for a
process, and Ultralytics' only one, seeding, is done as above. ``get_worker_info()`` is None in the threads.

Threads: cv2 is left as Ultralytics sets it at import, ``cv2.setNumThreads(0)`` (process-wide: each cv2 call runs on
its calling thread), so N threads use N cores, not N times cv2's pool. torch's intra-op threads are set to 1 in each
loader thread, as torch does in its worker processes: with OpenMP every thread that enters a parallel region (the
collate's copies) gets a team of its own, N teams of all cores otherwise.

Life cycle: the loader threads run only inside an epoch's iteration, and are stopped and joined when it ends or its
iterator is dropped, so none runs during validation or outlives training. Batches already made are kept, and the
next iteration goes on from them. ``reset()`` (after close_mosaic) starts over as torch's does: a new base seed, a new
permutation and fresh dataset copies. Memory is bounded: at most ``prefetch_factor`` batches per thread are made or
waiting; at a start, fewer (``START_WINDOW``), so that the first batch is not made beside every other thread's.
"""

from __future__ import annotations

import collections
import copy
import random
import threading
import types
from dataclasses import dataclass, field
from typing import Any, Iterator

import numpy as np
import torch

# Big per-image containers that __getitem__ only reads: shared by the stream copies instead of copied N times.
SHARED_DATASET_ATTRS = ("labels", "im_files", "label_files", "npy_files", "batch_shapes", "batch", "data")
RAM_CACHE_ATTRS = ("ims", "im_hw0", "im_hw")  # read-only too when cache == "ram" (no eviction then)
RNG_USING_MODULES = ("ultralytics.data.augment",)  # where Ultralytics draws augmentation randomness

# Batches handed to the threads when they start, doubled at each batch taken up to prefetch_factor x threads: the
# Python half of a sample holds the GIL, so N threads each making their first batch at once made the first one wait
# for about N batches' worth of it (32 threads, a rank's CPU count). Which stream makes which batch, and from which
# draws, does not depend on when it is handed over.
START_WINDOW = 2
_current = threading.local()  # .stream: the _Stream the calling loader thread serves


class _PerStreamRandom:
    """Stands in for a module of global-RNG functions (``random``, ``numpy.random``): a function bound to the global
    generator is taken from the calling loader thread's own generator instead; everything else passes through."""

    def __init__(self, module: Any, global_generator: Any, stream_attr: str):
        self._module = module
        self._global = global_generator
        self._stream_attr = stream_attr

    def __getattr__(self, name: str) -> Any:
        value = getattr(self._module, name)
        stream = getattr(_current, "stream", None)
        if stream is not None and getattr(value, "__self__", None) is self._global:
            return getattr(getattr(stream, self._stream_attr), name)
        return value


def install_per_stream_random() -> None:
    """Point the ``random`` and ``np`` names of Ultralytics' augmentation modules at per-stream stand-ins (once)."""
    import importlib

    for name in RNG_USING_MODULES:
        module = importlib.import_module(name)
        if isinstance(getattr(module, "random", None), _PerStreamRandom):
            continue
        numpy_view = types.ModuleType("numpy")
        numpy_view.__dict__.update(np.__dict__)
        numpy_view.random = _PerStreamRandom(np.random, np.random.mtrand._rand, "np_random")
        module.random = _PerStreamRandom(random, random._inst, "random")
        module.np = numpy_view


@dataclass
class _Stream:
    """What one worker process would own: its dataset copy, its generators, its queue of batches to make."""

    index: int
    dataset: Any
    random: random.Random
    np_random: np.random.RandomState
    todo: collections.deque = field(default_factory=collections.deque)  # (batch number, indices), not started
    done: collections.deque = field(default_factory=collections.deque)  # (batch number, batch, exception or None)
    cond: threading.Condition = field(default_factory=threading.Condition)
    stopping: bool = False


@dataclass
class _Run:
    """One iterator's worth of state, as torch's persistent iterator holds it: from creation to reset()."""

    batches: Iterator[list[int]]  # the batch sampler's endless iterator
    streams: list[_Stream]
    pending: collections.deque = field(default_factory=collections.deque)  # indices drawn, not yet dispatched
    drawn: int = 0  # batches of indices drawn from the sampler so far
    dispatched: int = 0  # batches handed to streams so far
    yielded: int = 0


class ThreadDataLoader:
    """A drop-in for Ultralytics' InfiniteDataLoader whose batches are made by threads, not worker processes."""

    num_workers = 0  # no processes: what the trainer logs and the worker reports
    persistent_workers = False

    def __init__(self, dataset: Any, batch_sampler: Any, sampler: Any, batch_size: int, collate_fn: Any,
                 drop_last: bool, pin_memory: bool, generator: torch.Generator | None, threads: int,
                 prefetch_factor: int = 2, lookahead: int = 0):
        if threads < 1:
            raise ValueError(f"thread loader: threads = {threads}; it must be at least 1")
        self.dataset = dataset
        self.batch_sampler = batch_sampler  # Ultralytics' _RepeatSampler: endless, epoch after epoch
        self.sampler = sampler  # DistributedSampler under DDP: the trainer calls its set_epoch
        self.batch_size = batch_size
        self.collate_fn = collate_fn
        self.drop_last = drop_last
        self.pin_memory = pin_memory
        self.generator = generator
        self.threads = threads
        self.prefetch_factor = prefetch_factor
        # How many batches of indices torch's iterator draws ahead of its consumer for the loader this one is made
        # from (prefetch_factor x workers): drawn alike, the sampler's generator is where torch's is when reset()
        # starts over, so the permutations after a reset are the same too.
        self.lookahead = lookahead
        self._run: _Run | None = None
        self._window = START_WINDOW  # batches in the making ahead of the next one taken (START_WINDOW says why)
        self._workers: list[threading.Thread] = []
        self._owner: object | None = None  # the iteration that started the running threads
        install_per_stream_random()

    def __len__(self) -> int:
        return len(self.batch_sampler.sampler)

    def __iter__(self) -> Iterator[Any]:
        """One epoch of batches, in sampler order, from the run that goes on across epochs."""
        if self._run is None:
            self._run = self._get_iterator()
        run = self._run
        end = run.yielded + len(self)  # batches already made for this epoch are kept by close(): not redone
        token = object()
        try:
            while run.yielded < end:
                if not self._workers:  # first batch, or close() was called between two batches
                    self._start_workers(run)
                    self._owner = token
                    self._window = START_WINDOW
                self._dispatch_to(run, run.yielded + min(self._window, self.prefetch_factor * self.threads))
                batch = self._take(run)
                self._window *= 2
                self._draw_to(run, run.yielded + 1 + self.lookahead)
                run.yielded += 1
                yield batch
        finally:
            if self._owner is token:  # not the threads of a newer iteration, when an old iterator is collected late
                self.close()

    def _draw_to(self, run: _Run, count: int) -> None:
        while run.drawn < count:
            run.pending.append(next(run.batches))
            run.drawn += 1

    def _dispatch_to(self, run: _Run, count: int) -> None:
        self._draw_to(run, count)
        while run.dispatched < count:
            stream = run.streams[run.dispatched % self.threads]
            with stream.cond:
                stream.todo.append((run.dispatched, run.pending.popleft()))
                stream.cond.notify_all()
            run.dispatched += 1

    def _take(self, run: _Run) -> Any:
        stream = run.streams[run.yielded % self.threads]
        with stream.cond:
            while not stream.done:
                stream.cond.wait()
            number, batch, error = stream.done.popleft()
        assert number == run.yielded, f"stream {stream.index} gave batch {number}, expected {run.yielded}"
        if error is not None:
            raise error  # the sample's own exception, at the batch it belongs to
        return batch

    def close(self) -> None:
        """Stop and join the loader threads. Each finishes the batch it is making; made batches are kept."""
        if not self._workers or self._run is None:
            return
        for stream in self._run.streams:
            with stream.cond:
                stream.stopping = True
                stream.cond.notify_all()
        for thread in self._workers:
            thread.join()
        for stream in self._run.streams:
            stream.stopping = False
        self._workers = []

    def reset(self) -> None:
        """Start over at the next iteration, as InfiniteDataLoader.reset does: after close_mosaic, for one."""
        self.close()
        self._run = None

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:
            pass

    def _get_iterator(self) -> _Run:
        """A new run: what torch's DataLoader makes under this name (a new iterator: base seed, sampler pass), so a
        subclass that hooks a new iterator there (exact resume's epoch-keyed sampler) hooks this loader too."""
        batches = iter(self.batch_sampler)  # lazy: the permutation is drawn at the first batch, after the seed
        base_seed = int(torch.empty((), dtype=torch.int64).random_(generator=self.generator).item())
        streams = []
        for k in range(self.threads):
            seed = (base_seed + k) % 2**32  # torch seeds worker k with base_seed + k; Ultralytics' seed_worker mods
            streams.append(_Stream(k, copy_dataset(self.dataset), random.Random(seed), np.random.RandomState(seed)))
        return _Run(batches, streams)

    def _start_workers(self, run: _Run) -> None:
        intra_op = torch.get_num_threads()
        ready = threading.Barrier(self.threads + 1)
        self._workers = [threading.Thread(target=self._serve, args=(stream, ready), name=f"thread-loader-{k}",
                                          daemon=True)  # a thread stuck in a sample must not keep the process alive
                         for k, stream in enumerate(run.streams)]
        for thread in self._workers:
            thread.start()
        ready.wait()
        torch.set_num_threads(intra_op)  # the loader threads' set_num_threads(1) also became the default of new ones

    def _serve(self, stream: _Stream, ready: threading.Barrier) -> None:
        torch.set_num_threads(1)
        ready.wait()
        _current.stream = stream
        pin = self.pin_memory and torch.cuda.is_available()
        while True:
            with stream.cond:
                while not stream.todo and not stream.stopping:
                    stream.cond.wait()
                if stream.stopping:
                    return
                number, indices = stream.todo.popleft()
            batch, error = None, None
            try:
                batch = self._fetch(stream.dataset, indices)
                if pin:
                    batch = torch.utils.data._utils.pin_memory.pin_memory(batch)
            except BaseException as e:  # handed to the training thread, which raises it at this batch
                error = e
            with stream.cond:
                stream.done.append((number, batch, error))
                stream.cond.notify_all()

    def _fetch(self, dataset: Any, indices: list[int]) -> Any:
        # What torch's _MapDatasetFetcher does in a worker process.
        getitems = getattr(dataset, "__getitems__", None)
        samples = getitems(indices) if getitems else [dataset[i] for i in indices]
        return self.collate_fn(samples)


def in_loader_thread() -> bool:
    """True on a ThreadDataLoader's thread while it makes a batch: where a DataLoader worker process would be."""
    return getattr(_current, "stream", None) is not None


def copy_dataset(dataset: Any) -> Any:
    """The dataset as a forked worker would see it: its own mutable state, the big read-only parts shared."""
    shared = [getattr(dataset, a) for a in SHARED_DATASET_ATTRS if hasattr(dataset, a)]
    if getattr(dataset, "cache", None) == "ram":
        shared += [getattr(dataset, a) for a in RAM_CACHE_ATTRS if hasattr(dataset, a)]
    return copy.deepcopy(dataset, {id(obj): obj for obj in shared})


def thread_loader_from(loader: Any, threads: int) -> ThreadDataLoader:
    """A ThreadDataLoader over ``loader``'s dataset, sampler, generator and collate function; ``loader`` must not be
    iterated afterwards (the two would draw from one generator)."""
    if getattr(loader, "iterator", None) is not None:
        raise ValueError("thread loader: the loader has been iterated already; convert it before its first batch")
    return ThreadDataLoader(
        dataset=loader.dataset, batch_sampler=loader.batch_sampler, sampler=loader.sampler,
        batch_size=loader.batch_size, collate_fn=loader.collate_fn, drop_last=loader.drop_last,
        pin_memory=loader.pin_memory, generator=loader.generator, threads=threads,
        prefetch_factor=loader.prefetch_factor or 2, lookahead=(loader.prefetch_factor or 0) * loader.num_workers)
