"""Pinned host memory made ahead for a loader's first batches, in a ready standby (worker/standby/ready.py).

A loader that pins its batches (Ultralytics' loaders do, on a GPU) copies each into page-locked memory from torch's caching
host allocator, which grows by one CUDA host allocation a block, rounded up to a power of two: page-locking tens of
megabytes a batch, in the driver, while the training thread waits on the same driver for its kernels and its device
memory. A fresh process pays it for its first workers x prefetch batches, which a ready standby fed at the verdict
loads exactly while the restart's checkpoint read and first step run. Pinned and released ahead, the blocks stay in
the allocator's cache and the first batches take them (bench/warm_plans.py measures a step beside each).
"""

from __future__ import annotations

from typing import Any

import torch

BOXES_PER_IMAGE = 8  # the small tensors' sizes fall in a few power-of-two blocks whatever the count


def batch_like(batch: int, channels: int, imgsz: int) -> dict[str, torch.Tensor]:
    """The tensors of one collated Ultralytics detection batch (its collate_fn): the images (uint8), the boxes, their
    classes and their images' indices (its shapes and file names are tuples, not pinned)."""
    boxes = batch * BOXES_PER_IMAGE
    return {"img": torch.empty(batch, channels, imgsz, imgsz, dtype=torch.uint8),
            "batch_idx": torch.empty(boxes), "cls": torch.empty(boxes, 1), "bboxes": torch.empty(boxes, 4)}


def block_bytes(batch: int, channels: int, imgsz: int) -> int:
    """The pinned memory one batch takes from the allocator: each tensor's bytes, rounded up to a power of two."""
    return sum(1 << max(t.numel() * t.element_size() - 1, 1).bit_length()
               for t in batch_like(batch, channels, imgsz).values())


def pin_ahead(count: int, batch: int, channels: int, imgsz: int) -> list[dict[str, torch.Tensor]]:
    """``count`` batches pinned at once (each a block of its own, as batches in flight hold theirs); dropped, their
    blocks go back to the cache for the loader's first batches."""
    like = batch_like(batch, channels, imgsz)
    return [{k: v.pin_memory() for k, v in like.items()} for _ in range(count)]


def in_flight(loader: Any) -> int:
    """How many batches a loader holds pinned at its start: its workers' prefetched ones, and the one in use."""
    return max(int(getattr(loader, "num_workers", 0)), 1) * int(getattr(loader, "prefetch_factor", None) or 2) + 1
