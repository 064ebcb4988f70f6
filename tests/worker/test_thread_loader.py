"""The thread loader against Ultralytics' own process loader, over the real YOLODataset of the embedded demo."""

from __future__ import annotations

import os
import threading
import time

import psutil
import pytest
import torch

from worker.startup.demo_data import ensure_demo_dataset
from worker.supervision.exact_resume import ResumePoint, install
from worker.loading.loaders import (chain_worker_init, die_with_parent, forkserver_pid, hook_samples, start_forkserver,
                            start_workers_with, worker_start_method)
from worker.loading.thread_loader import ThreadDataLoader, thread_loader_from

BATCH = 4  # the demo's 32 training images: 8 batches an epoch


@pytest.fixture(scope="module")
def data():
    from ultralytics.data.utils import check_det_dataset

    return check_det_dataset(str(ensure_demo_dataset()))


def process_loader(data, workers: int, seed: int = 0, mode: str = "train", imgsz: int = 64):
    """What Ultralytics' trainer builds: build_yolo_dataset + build_dataloader, its generator seeded from torch's."""
    from ultralytics.cfg import get_cfg
    from ultralytics.data.build import build_dataloader, build_yolo_dataset

    torch.manual_seed(seed)
    cfg = get_cfg(overrides={"imgsz": imgsz, "task": "detect"})
    dataset = build_yolo_dataset(cfg, data["train"], BATCH, data, mode=mode)
    return build_dataloader(dataset, BATCH, workers, shuffle=mode == "train", rank=-1)


def loader_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name.startswith("thread-loader-")]


def children() -> set[int]:
    # psutil reads every process's parent, so a thread that exits between a listing and a read (the loader's own
    # threads do, as the test runs) cannot fail the read the way /proc/<pid>/task/<tid>/children does.
    return {p.pid for p in psutil.Process().children()}


def assert_same_batch(a: dict, b: dict) -> None:
    assert a["im_file"] == b["im_file"]  # the same samples, in the same order
    for key in ("img", "cls", "bboxes", "batch_idx"):
        assert torch.equal(a[key], b[key]), key


def test_same_batches_as_the_process_loader_with_as_many_workers_mosaic_and_all(data):
    processes = process_loader(data, workers=2)
    threads = thread_loader_from(process_loader(data, workers=2), threads=2)
    assert threads.num_workers == 0 and threads.threads == 2 and len(threads) == len(processes) == 8
    for _ in range(2):  # the run goes on across epochs: new permutation, RNG streams carried on
        for a, b in zip(processes, threads, strict=True):
            assert_same_batch(a, b)
    # The trainer's close_mosaic: change the dataset, reset: a new base seed, permutation and dataset copies.
    from ultralytics.cfg import get_cfg

    for loader in (processes, threads):
        loader.dataset.close_mosaic(hyp=get_cfg(overrides={"imgsz": 64}))
        loader.reset()
    for a, b in zip(processes, threads, strict=True):
        assert_same_batch(a, b)
    processes.close()


class RecordPid:
    """A sample hook that pickles, as spawned workers receive it: marks the pid of each process that loads a sample."""

    def __init__(self, folder):
        self.folder = folder

    def __call__(self):
        (self.folder / str(os.getpid())).touch()


def test_spawned_workers_give_the_same_batches_as_forked_ones_and_run_the_hooks_and_init(data, tmp_path):
    """The ROCm rung ``start_method = "spawn"``: fresh interpreters, not forks, fed the pickled dataset with the
    worker's hooks on it, and the same batches for the same seed."""
    forked, spawned = process_loader(data, workers=2), process_loader(data, workers=2)
    start_workers_with(spawned, "spawn")
    chain_worker_init(spawned, die_with_parent)
    hook_samples(spawned.dataset, RecordPid(tmp_path))
    assert (worker_start_method(forked), worker_start_method(spawned)) == ("fork", "spawn")
    for a, b in zip(forked, spawned, strict=True):
        assert_same_batch(a, b)
    workers = [psutil.Process(w.pid) for w in spawned.iterator._workers]
    assert all("multiprocessing.spawn" in " ".join(w.cmdline()) for w in workers)  # not a copy of this process
    assert {int(p.name) for p in tmp_path.iterdir()} == {w.pid for w in workers}
    spawned.close()
    forked.close()


def test_forkserver_workers_fork_from_the_preloaded_server_and_give_the_same_batches_resumed_and_validating(
        data, tmp_path):
    """The isolated rung at fork's cost: workers forked from a server that imported torch and Ultralytics' data
    modules once (not from this process), fed the pickled dataset and hooks, the same batches as forked workers for
    the same seed: through the exact-resume sampler from a mid-epoch point, and in validation's loader."""
    start_forkserver()
    server = psutil.Process(forkserver_pid())
    deadline = time.monotonic() + 30
    while not server.cmdline() and time.monotonic() < deadline:  # started, maybe not yet past its exec
        time.sleep(0.01)
    assert server.ppid() == os.getpid() and "forkserver" in " ".join(server.cmdline())
    resume = ResumePoint(epoch=0, batches=3, samples=12)
    loaders = []
    for method in ("fork", "forkserver"):
        loader = process_loader(data, workers=2)
        start_workers_with(loader, method)
        chain_worker_init(loader, die_with_parent)
        hook_samples(loader.dataset, RecordPid(tmp_path / method))
        (tmp_path / method).mkdir()
        install(loader, 0, lambda: 0, ResumePoint(resume.epoch, resume.batches, resume.samples))
        loaders.append(loader)
    forked, served = loaders
    assert worker_start_method(served) == "forkserver"
    batches = list(zip(forked, served, strict=True))
    assert len(batches) == 8 - 3  # the resumed epoch starts at batch 4
    for a, b in batches:
        assert_same_batch(a, b)
    workers = [psutil.Process(w.pid) for w in served.iterator._workers]
    assert {w.ppid() for w in workers} == {server.pid}  # forked from the server, not from this process
    assert {int(p.name) for p in (tmp_path / "forkserver").iterdir()} == {w.pid for w in workers}
    validating = [process_loader(data, workers=2, mode="val") for _ in range(2)]
    start_workers_with(validating[1], "forkserver")
    for a, b in zip(*validating, strict=True):
        assert_same_batch(a, b)
    for loader in loaders + validating:
        loader.close()


@pytest.mark.parametrize("one_thread", [True, False])
def test_a_forkserver_forked_from_a_one_thread_process_is_a_fork_of_it_and_gives_the_same_batches(one_thread):
    """Issue 49: a DDP rank's forkserver, a new interpreter, imported torch, cv2 and Ultralytics while the rank built its
    trainer, and the rank's first batch waited for it. Forked from the rank at its first line instead (one thread, no
    CUDA), it is a copy of the rank with its imports done: its command line is the rank's, not ``-c 'from
    multiprocessing.forkserver import main ...'``; its workers give the same batches as forked ones; it ends with
    its last client. With a second thread running, a fork could copy a held lock: the new interpreter, as before."""
    import json
    import subprocess
    import sys

    from tests.helpers import ROOT

    code = f"from tests.worker.test_thread_loader import forked_server_child; forked_server_child({one_thread})"
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=300,
                         env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert out.returncode == 0, out.stderr[-3000:]
    seen = json.loads(out.stdout.splitlines()[-1])
    assert seen["server_parent"] == seen["pid"]
    assert (seen["server_cmdline"] == seen["cmdline"]) is one_thread, seen
    assert ("forkserver import main" in " ".join(seen["server_cmdline"])) is not one_thread, seen
    assert seen["workers_parent"] == [seen["server"]] and seen["same_batches"] == 8
    deadline = time.monotonic() + 60  # its client (the child above) is gone: the server reads EOF and exits
    while psutil.pid_exists(seen["server"]) and psutil.Process(seen["server"]).status() != psutil.STATUS_ZOMBIE \
            and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not psutil.pid_exists(seen["server"]) or psutil.Process(seen["server"]).status() == psutil.STATUS_ZOMBIE


def forked_server_child(one_thread: bool) -> None:
    """The test above's process: its forkserver started with ``fork=True``, then fork and forkserver loaders compared."""
    import json

    from ultralytics.data.utils import check_det_dataset

    if not one_thread:
        threading.Thread(target=time.sleep, args=(30,), daemon=True).start()
    start_forkserver(fork=True)
    server = psutil.Process(forkserver_pid())
    data = check_det_dataset(str(ensure_demo_dataset()))
    loaders = []
    for method in ("fork", "forkserver"):
        loader = process_loader(data, workers=2)
        start_workers_with(loader, method)
        chain_worker_init(loader, die_with_parent)
        loaders.append(loader)
    same = 0
    for a, b in zip(*loaders, strict=True):
        assert_same_batch(a, b)
        same += 1
    workers = sorted({psutil.Process(w.pid).ppid() for w in loaders[1].iterator._workers})
    for loader in loaders:
        loader.close()
    print(json.dumps({"pid": os.getpid(), "cmdline": psutil.Process().cmdline(), "server": server.pid,
                      "server_parent": server.ppid(), "server_cmdline": server.cmdline(), "workers_parent": workers,
                      "same_batches": same}), flush=True)


def test_spawned_workers_shut_down_mid_epoch_end_cleanly():
    """A spawned worker shut down while busy puts its last batch and exits at once, its queue's feeder thread still
    pickling that batch in torch's C++ (shareFd); finalizing the interpreter ends that thread with pthread_exit, whose
    unwinding through C++ calls std::terminate: SIGABRT (here 6 in 8 workers at 640 px), and the loader's shutdown
    raises "DataLoader worker ... is killed by signal: Aborted". Forked workers end with os._exit, and so do ours."""
    from ultralytics.data.utils import check_det_dataset

    data = check_det_dataset(str(ensure_demo_dataset(size=640)))  # big batches: their pickling takes a while
    exit_codes = []
    for _ in range(3):
        loader = process_loader(data, workers=2, imgsz=640)
        start_workers_with(loader, "spawn")
        batches = iter(loader)
        next(batches), next(batches)  # the workers busy making the rest of the epoch's batches
        workers = list(loader.iterator._workers)
        batches.close()
        loader.close()  # raised here
        exit_codes += [w.exitcode for w in workers]
    assert exit_codes == [0] * 6


def test_another_worker_count_gives_the_same_indices_but_other_augmentation_draws(data):
    """The control for the test above: its comparison does see augmentation that differs."""
    processes = process_loader(data, workers=2)
    threads = thread_loader_from(process_loader(data, workers=2), threads=3)
    pairs = list(zip(processes, threads, strict=True))
    assert all(a["im_file"] == b["im_file"] for a, b in pairs)
    assert not all(torch.equal(a["img"], b["img"]) for a, b in pairs)
    processes.close()


def test_same_tensors_as_workers_0_where_the_pipeline_is_deterministic(data):
    processes = process_loader(data, workers=0, mode="val")  # letterbox, no augmentation, no shuffle
    threads = thread_loader_from(process_loader(data, workers=0, mode="val"), threads=3)
    for a, b in zip(processes, threads, strict=True):
        assert_same_batch(a, b)


def test_an_iterator_dropped_mid_epoch_stops_its_threads_and_the_next_goes_on_from_there(data):
    processes = process_loader(data, workers=2)
    threads = thread_loader_from(process_loader(data, workers=2), threads=2)
    expected = [b for _ in range(2) for b in processes]
    processes.close()
    before = children()
    got = []
    for batch in threads:
        assert loader_threads() and children() == before  # threads, and not one process started
        got.append(batch)
        if len(got) == 3:
            break  # the for loop drops the iterator: its finally stops the threads
    assert loader_threads() == []
    got += list(threads)  # an epoch's worth, going on from batch 4, as the persistent process iterator does
    assert loader_threads() == [] and len(got) == 3 + 8
    for a, b in zip(expected[:len(got)], got, strict=True):
        assert_same_batch(a, b)


def test_prefetch_is_bounded(data):
    loader = thread_loader_from(process_loader(data, workers=2), threads=1)  # prefetch 4 batches of 8
    loaded = []
    base = type(loader.dataset)
    loader.dataset.__class__ = type("Counted", (base,), {
        "__getitem__": lambda self, i: loaded.append(i) or base.__getitem__(self, i)})
    iterator = iter(loader)
    for _ in range(3):  # the third batch taken hands over the full prefetch (the threads' start hands over 2)
        next(iterator)
    time.sleep(0.5)  # plenty to make all 8 batches, were they not bounded
    assert len(loaded) == (2 + loader.prefetch_factor * loader.threads) * BATCH < len(loader) * BATCH
    del iterator
    assert loader_threads() == []


def test_the_threads_start_with_two_batches_to_make_and_reach_their_full_prefetch_by_the_third(data):
    """Issue 49: every thread handed its first batches at the start made the first batch beside all the others, the
    Python half of each holding one GIL (32 threads, a rank's CPU count: 4.9 s more than forked workers' start).
    Batches handed over at each batch taken: 2, then 4 ahead, then the full prefetch_factor x threads (4 x 2 here)."""
    loader = thread_loader_from(process_loader(data, workers=2), threads=2)
    assert loader.prefetch_factor * loader.threads == 8
    batches = iter(loader)
    dispatched = []
    for _ in range(4):
        next(batches)
        dispatched.append(loader._run.dispatched)
    assert dispatched == [2, 1 + 4, 2 + 8, 3 + 8]
    del batches
    assert loader_threads() == []


def test_a_sample_error_is_raised_in_the_training_thread_at_its_batch(data):
    reference = [b["im_file"] for b in thread_loader_from(process_loader(data, workers=2), threads=2)]
    loader = thread_loader_from(process_loader(data, workers=2), threads=2)
    bad = reference[5][2]
    base = type(loader.dataset)

    def __getitem__(self, i):
        if self.im_files[i] == bad:
            raise OSError(f"cannot read {bad}")
        return base.__getitem__(self, i)

    loader.dataset.__class__ = type("Failing", (base,), {"__getitem__": __getitem__})
    got = []
    with pytest.raises(OSError, match="cannot read"):
        for batch in loader:
            got.append(batch["im_file"])
    assert got == reference[:5]
    assert loader_threads() == []


def test_bad_thread_counts_and_used_loaders_are_refused(data):
    with pytest.raises(ValueError, match="threads = 0; it must be at least 1"):
        thread_loader_from(process_loader(data, workers=0), threads=0)
    used = process_loader(data, workers=0)
    next(iter(used))
    with pytest.raises(ValueError, match="iterated already"):
        thread_loader_from(used, threads=2)
    assert isinstance(thread_loader_from(process_loader(data, workers=0), threads=1), ThreadDataLoader)


def test_a_standby_made_for_a_forkserver_rung_starts_the_server_before_it_waits(monkeypatch):
    import io

    from worker.training import train
    from worker.wire.contract import ENV_FORKSERVER

    events = []

    class Stdin(io.StringIO):
        def readline(self, *args):
            events.append("waits for its launch")
            return ""

    monkeypatch.setattr(train, "start_forkserver", lambda: events.append("starts the forkserver"))
    monkeypatch.setattr(train.sys, "stdin", Stdin())
    monkeypatch.delenv(ENV_FORKSERVER, raising=False)
    assert train.stand_by(os.getppid()) is None and events == ["waits for its launch"]
    events.clear()
    monkeypatch.setenv(ENV_FORKSERVER, "1")
    assert train.stand_by(os.getppid()) is None
    assert events == ["starts the forkserver", "waits for its launch"]
