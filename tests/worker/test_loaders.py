"""persistent_workers=False for real: Ultralytics' loader keeps its workers, ours makes them anew each epoch."""

import os

import torch
from ultralytics.data.build import InfiniteDataLoader

from worker.loading.loaders import EpochWorkersDataLoader, hook_samples, make_epoch_workers


class Pids(torch.utils.data.Dataset):
    def __len__(self):
        return 8

    def __getitem__(self, index):
        return os.getpid()


def worker_pids_per_epoch(loader, epochs=3):
    return [set(int(x) for batch in loader for x in batch) for _ in range(epochs)]


def test_ultralytics_infinite_loader_keeps_its_workers_across_epochs():
    loader = InfiniteDataLoader(Pids(), batch_size=2, num_workers=2)
    epochs = worker_pids_per_epoch(loader)
    loader.close()
    assert epochs[0] == epochs[1] == epochs[2] and os.getpid() not in epochs[0]


def test_epoch_workers_loader_makes_new_workers_every_epoch_and_ends_them():
    loader = make_epoch_workers(InfiniteDataLoader(Pids(), batch_size=2, num_workers=2))
    assert isinstance(loader, EpochWorkersDataLoader)
    epochs = worker_pids_per_epoch(loader)
    assert all(len(e) == 2 for e in epochs)
    assert not (epochs[0] & epochs[1]) and not (epochs[1] & epochs[2])
    assert loader.iterator is None  # shut down between epochs: no worker outlives its epoch


def test_sample_hook_runs_only_in_dataloader_workers(tmp_path):
    dataset = Pids()
    marker = tmp_path / "seen"
    hook_samples(dataset, lambda: marker.write_text(str(os.getpid())))
    dataset[0]
    assert not marker.exists()  # the main process is not hooked
    loader = InfiniteDataLoader(dataset, batch_size=2, num_workers=1)
    pids = worker_pids_per_epoch(loader, epochs=1)[0]
    loader.close()
    assert int(marker.read_text()) in pids
