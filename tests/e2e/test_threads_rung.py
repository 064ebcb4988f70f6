"""The threads rung for real: the supervisor climbs to it, the worker trains through a thread loader (no DataLoader
worker process in its tree), loader faults still fire there, and exact resume keeps its sample order on it."""

from __future__ import annotations

import threading

import pytest
import torch

from tests.helpers.supervised import climb_to_loader_rung
from worker.startup.demo_data import ensure_demo_dataset
from worker.supervision.exact_resume import ResumePoint, install
from worker.loading.loaders import hook_samples
from worker.loading.thread_loader import thread_loader_from

BATCH = 4  # the demo's 32 training images: 8 batches an epoch


@pytest.fixture(scope="module")
def data():
    from ultralytics.data.utils import check_det_dataset

    return check_det_dataset(str(ensure_demo_dataset()))


def demo_loader(data, workers: int):
    """Ultralytics' training loader as its trainer builds it, not yet iterated."""
    from ultralytics.cfg import get_cfg
    from ultralytics.data.build import build_dataloader, build_yolo_dataset

    torch.manual_seed(0)
    cfg = get_cfg(overrides={"imgsz": 64, "task": "detect"})
    dataset = build_yolo_dataset(cfg, data["train"], BATCH, data, mode="train")
    return build_dataloader(dataset, BATCH, workers, shuffle=True, rank=-1)


@pytest.mark.e2e
def test_rung_1_trains_on_threads_without_worker_processes_and_its_loader_faults_fire(tmp_path):
    # attempt 1 (rung 0, workers = 2): the training loop hangs after its first batch; attempt 2 (rung 1): the
    # loader's threads hang, which only a hook that fires on those threads can do; attempt 3 (rung 1) finishes.
    status, first, second = climb_to_loader_rung(tmp_path, "threads-rung", '{ loader = "threads", threads = 2 }')
    assert first["settings"]["loader"] == "process" and first["kill"]["processes"] == 3  # main + 2 workers
    # The killed tree of the threads rung: the training process alone, its loader threads inside it.
    assert second["kill"]["processes"] == 1 and second["kill"]["survivors"] == []
    assert second["settings"]["loader"] == "threads" and second["settings"]["threads"] == 2
    assert (status["settings"]["loader"], status["settings"]["threads"], status["settings"]["workers"]) == (
        "threads", 2, 0)


def test_loader_faults_fire_on_loader_threads_and_not_in_the_training_thread(data):
    fired: list[str] = []
    threaded = thread_loader_from(demo_loader(data, workers=2), threads=2)
    hook_samples(threaded.dataset, lambda: fired.append(threading.current_thread().name))
    next(iter(threaded))
    assert fired and set(fired) <= {"thread-loader-0", "thread-loader-1"}
    fired.clear()
    in_process = demo_loader(data, workers=0)  # workers = 0: the training thread loads; nothing to hang there
    hook_samples(in_process.dataset, lambda: fired.append(threading.current_thread().name))
    next(iter(in_process))
    assert fired == []


def test_exact_resume_on_the_thread_loader_draws_the_uninterrupted_order(data):
    """Resumed at epoch 2 batch 4 on the threads rung: the batches an uninterrupted process loader gives from there."""
    epoch = [0]
    uninterrupted = demo_loader(data, workers=0)
    assert install(uninterrupted, 0, lambda: epoch[0], None)
    expected = {}
    for epoch[0] in range(3):
        expected[epoch[0]] = [b["im_file"] for b in uninterrupted]

    epoch[0] = 1
    resumed = thread_loader_from(demo_loader(data, workers=2), threads=2)
    assert install(resumed, 0, lambda: epoch[0], ResumePoint(epoch=1, batches=3))
    assert resumed.first_batch_index == 3
    got_1 = [b["im_file"] for b in resumed]
    epoch[0] = 2
    got_2 = [b["im_file"] for b in resumed]
    assert got_1 == expected[1][3:] and got_2 == expected[2]
    assert expected[1] != expected[2]  # the control: epochs do differ, so equal lists mean the order was kept
    # close_mosaic's reset in a later epoch: the new run starts that epoch's order, not the sampler's next pass
    resumed.reset()
    assert [b["im_file"] for b in resumed] == expected[2]
