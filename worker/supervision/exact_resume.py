"""Resuming inside an epoch exactly where a checkpoint left it: same sample order, trained batches skipped unloaded.

Ultralytics' training sampler draws each epoch's order from one generator that advances epoch after epoch, so a
new process cannot reproduce epoch E's order without replaying E shuffles, and it always starts an epoch at batch
1. Here the order of epoch E is a pure function of (seed, E) (``EpochOrderSampler``), so a resumed worker draws the
same order as an uninterrupted run; in the resumed epoch the sampler leaves out the indices of the batches already
trained, so their images are never loaded or decoded, the loader yields only the remaining batches
(``resuming_class``), and the training loop's batch index starts at B (``enumerate_from_resume_point``), which keeps
the warm-up, learning rate and loss means at the right iteration.

Under DDP each rank's pass is its share of that order, dealt as torch's DistributedSampler deals it, and the skip is
the rank's own samples: the batch index and samples a checkpoint records are per rank, the same in every rank.
"""

from __future__ import annotations

import builtins
import math
from dataclasses import dataclass
from itertools import islice
from typing import Any, Callable, Iterator

import torch


@dataclass
class ResumePoint:
    """Where a resumed run starts: ``batches`` batches of 0-based ``epoch`` are already trained, ``samples`` samples
    (of this rank) in them. The samples are what is skipped: a run resumed with another batch size (the OOM remedy
    halves it) starts at the batch index that leaves as many batches as the remaining samples fill."""

    epoch: int
    batches: int
    samples: int | None = None  # None: a checkpoint from before samples were kept, batches x the loader's batch size
    pending: bool = True  # until the resumed epoch's iteration starts

    def samples_done(self, batch_size: int) -> int:
        return self.samples if self.samples is not None else self.batches * batch_size


class EpochOrderSampler(torch.utils.data.Sampler):
    """Each pass is one epoch's order, a permutation drawn from (seed, epoch) alone; with ``ranks`` > 1, this
    ``rank``'s share of it, as DistributedSampler deals one (padded with its first indices to a multiple of the
    ranks, then every ranks-th index from the rank's own).

    ``next_epoch`` is the epoch of the next pass; the loader sets it when it makes a new iterator (first epoch,
    close_mosaic's reset, per-epoch workers), because a persistent iterator starts the next pass early, while the
    current epoch's last batches are still being prefetched.
    """

    def __init__(self, size: int, seed: int, resume: ResumePoint | None = None, batch_size: int = 1, rank: int = 0,
                 ranks: int = 1):
        self.size, self.seed, self.rank, self.ranks = size, seed, rank, ranks
        self.per_rank = math.ceil(size / ranks)
        self.next_epoch = 0
        self.skip = {resume.epoch: resume.samples_done(batch_size)} if resume else {}

    def order(self, epoch: int) -> list[int]:
        generator = torch.Generator()
        generator.manual_seed(self.seed * 1_000_003 + epoch)
        indices = torch.randperm(self.size, generator=generator).tolist()
        if self.ranks == 1 or not indices:
            return indices
        total = self.per_rank * self.ranks
        indices = (indices * math.ceil(total / len(indices)))[:total]
        return indices[self.rank:total:self.ranks]

    def same_order(self, other: "EpochOrderSampler") -> bool:
        """``other`` deals the same passes from here on: the same order, share, next epoch and skips."""
        return (self.size, self.seed, self.rank, self.ranks, self.next_epoch, self.skip) == \
            (other.size, other.seed, other.rank, other.ranks, other.next_epoch, other.skip)

    def set_epoch(self, epoch: int) -> None:
        """Called by the trainer under DDP, as on a DistributedSampler; the pass count already says the epoch."""

    def __iter__(self) -> Iterator[int]:
        epoch = self.next_epoch
        self.next_epoch += 1
        yield from self.order(epoch)[self.skip.pop(epoch, 0):]

    def __len__(self) -> int:
        return self.per_rank


def epoch_order(loader: Any, seed: int, resume: ResumePoint | None) -> EpochOrderSampler | None:
    """The epoch-keyed order (with the resume skip) that ``install`` gives ``loader``; None when its sampler is
    neither the plain shuffling one nor a shuffling DistributedSampler."""
    original = getattr(getattr(loader.batch_sampler, "sampler", None), "sampler", None)  # _RepeatSampler -> BatchSampler
    if isinstance(original, torch.utils.data.RandomSampler):
        rank, ranks = 0, 1
    elif isinstance(original, torch.utils.data.DistributedSampler) and original.shuffle and not original.drop_last:
        rank, ranks = original.rank, original.num_replicas
    else:
        return None
    return EpochOrderSampler(len(loader.dataset), seed, resume, loader.batch_size, rank, ranks)


def install(loader: Any, seed: int, current_epoch: Callable[[], int], resume: ResumePoint | None) -> bool:
    """Give a training loader the epoch-keyed order and the resume skip; False (loader untouched) when its sampler is
    neither the plain shuffling one nor a shuffling DistributedSampler."""
    sampler = epoch_order(loader, seed, resume)
    if sampler is None:
        return False
    loader.batch_sampler.sampler.sampler = sampler
    object.__setattr__(loader, "sampler", sampler)  # DataLoader refuses a plain assignment after __init__
    loader.__class__ = resuming_class(type(loader))
    loader.resume, loader.current_epoch = resume, current_epoch
    return True


def resuming_class(base: type) -> type:
    """``base`` (Ultralytics' InfiniteDataLoader or our per-epoch-workers one) that starts the resumed epoch at B.
    Made per base class because a loader's ``__class__`` can only be swapped for a subclass of the same layout."""

    class Resuming(base):
        resume: ResumePoint | None
        current_epoch: Callable[[], int]

        def _get_iterator(self):
            self.sampler.next_epoch = self.current_epoch()  # a new iterator starts a new pass: this epoch's
            return super()._get_iterator()

        @property
        def first_batch_index(self) -> int:
            """The batch index the current epoch's iteration starts at: in the resumed epoch, the index that leaves
            as many batches as the samples not yet trained fill (B at an unchanged batch size), else 0."""
            r = self.resume
            if r is None or not r.pending or r.epoch != self.current_epoch():
                return 0
            left = max(0, len(self.sampler) - r.samples_done(self.batch_size))
            return len(self) - (left // self.batch_size if self.drop_last else -(-left // self.batch_size))

        def __iter__(self):
            skip = self.first_batch_index
            if skip and self.resume is not None:
                self.resume.pending = False
            # The sampler's pass of this epoch is ``skip`` batches short: take only the batches it has, so the
            # next epoch's pass starts where it should.
            yield from islice(super().__iter__(), len(self) - skip)

    Resuming.__name__ = Resuming.__qualname__ = f"Resuming{base.__name__}"
    return Resuming


def enumerate_from_resume_point(iterable: Any, start: int = 0) -> Any:
    """``enumerate`` for Ultralytics' trainer module: the training loop's ``for i, batch in enumerate(loader)``
    numbers the resumed epoch's batches from B, so ``ni = i + nb * epoch`` is the uninterrupted run's iteration."""
    return builtins.enumerate(iterable, start + getattr(iterable, "first_batch_index", 0))


def patch_training_loop_enumerate() -> None:
    import ultralytics.engine.trainer as trainer_module

    trainer_module.enumerate = enumerate_from_resume_point  # a module global shadows the builtin there only
