"""Pinned memory made ahead for a held loader's first batches (worker/loading/pinned_ahead.py). Pinning itself needs a
GPU (bench/warm_plans.py --first-step measures it there); here: its sizes, its count, and the host room it asks."""

import torch

from worker.loading import pinned_ahead
from worker.standby import ready


def test_a_batch_takes_one_power_of_two_block_a_tensor_as_torchs_pinned_allocator_rounds_them():
    like = pinned_ahead.batch_like(32, 3, 640)
    assert like["img"].shape == (32, 3, 640, 640) and like["img"].dtype == torch.uint8
    assert set(like) == {"img", "batch_idx", "cls", "bboxes"}  # the collated batch's tensors
    # 39.3 MB of images: a 64 MiB block; 256 boxes' indices and classes (1 KiB each) and coordinates (4 KiB)
    assert pinned_ahead.BOXES_PER_IMAGE == 8
    assert pinned_ahead.block_bytes(32, 3, 640) == (64 << 20) + 1024 + 1024 + 4096
    assert pinned_ahead.block_bytes(4, 3, 100) == (128 << 10) + 128 + 128 + 512  # 120,000 bytes of images


def test_a_loaders_first_batches_in_flight_are_its_workers_prefetched_ones_and_the_one_in_use():
    data = list(range(8))
    assert pinned_ahead.in_flight(torch.utils.data.DataLoader(data, num_workers=8)) == 8 * 2 + 1
    assert pinned_ahead.in_flight(torch.utils.data.DataLoader(data, num_workers=2, prefetch_factor=4)) == 9
    assert pinned_ahead.in_flight(torch.utils.data.DataLoader(data)) == 3  # no workers: as one


class _PinningLoader:
    pin_memory, num_workers, prefetch_factor = True, 8, 2


def test_the_standby_pins_ahead_only_within_its_host_room_and_says_what_it_left_out(monkeypatch):
    monkeypatch.setattr(ready, "ROOM", ready.HostRoom(0, None))  # no host room granted
    monkeypatch.setitem(ready.HELD, "loader", type("Held", (), {"iterator": None})())
    assert ready._pin_ahead(_PinningLoader(), 32, 3, 640) == ""
    assert ready.ROOM.left_out == ["pinned memory for its first batches (1088 MiB)"]  # 17 batches of 64 MiB
    assert "pinned memory" not in ready.ROOM.holds
    ready.ROOM.left_out.clear()
    unpinned = type("Loader", (), {"pin_memory": False})()  # on the CPU: nothing to pin
    assert ready._pin_ahead(unpinned, 32, 3, 640) == "" and ready.ROOM.left_out == []
