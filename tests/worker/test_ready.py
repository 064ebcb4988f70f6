"""What a ready standby holds (worker/standby/ready.py): the model built ahead, taken only by a launch that would build the
same one, and its weights then the checkpoint's."""

import threading

import pytest
import torch

from worker.standby import ready
from worker.wire.contract import HELD_MODEL, StandbyReport


def spec(model: str, **train) -> dict:
    """What the supervisor asks for, with room on the host for all of it (4 GiB beyond the imports)."""
    return {"train": {"model": model, "data": "demo", "device": "cpu", **train}, "host_mib": 4096}


def test_the_held_model_is_taken_by_the_same_build_only_and_then_carries_the_checkpoints_weights():
    line = ready.prepare(spec("yolov8n.yaml"))
    assert line.startswith("ready in ") and "the model yolov8n.yaml built on cpu" in line, line
    held = ready.HELD["model"]
    assert ready.take_model("yolov8s.yaml", 2, 3) is None and "model" not in ready.HELD  # another scale: dropped

    ready.prepare(spec("yolov8n.yaml"))
    assert ready.take_model("yolov8n.yaml", 80, 3) is None  # other classes

    ready.prepare(spec("yolov8n.yaml"))
    held = ready.HELD["model"]
    checkpoint = type(held)(dict(held.yaml), nc=2, ch=3, verbose=False)  # a resume's cfg is the checkpoint's dict
    for p in checkpoint.parameters():
        torch.nn.init.constant_(p, 0.5)
    taken = ready.take_model(checkpoint.yaml, 2, 3)
    assert taken is held
    taken.load(checkpoint)  # as SupervisedTrainerMixin.get_model does with the checkpoint's weights
    assert all(torch.equal(a, b) for a, b in zip(taken.state_dict().values(), checkpoint.state_dict().values()))


def test_without_host_room_for_the_datasets_only_the_model_is_held_and_the_line_says_why(tmp_path):
    report = tmp_path / "standby-ready.json"
    line = ready.prepare({**spec("yolov8n.yaml", imgsz=64, batch=4, workers=2), "host_mib": 0, "report": str(report)})
    assert "no dataset (not held, beyond the host's 0 MiB allowed: the datasets (" in line, line
    said = StandbyReport.from_json(report.read_text())
    assert said.holds == (HELD_MODEL,) and said.why == line and said.host_allowance_mib == 0
    assert [d.files for d in said.data] == [32, 8]  # the demo's images, as read before the datasets were built
    assert "datasets" not in ready.HELD and "loader" not in ready.HELD
    ready.drop()


def test_a_model_that_cannot_be_built_ahead_leaves_the_launch_to_build_it():
    assert "not a YAML" in ready.prepare(spec("yolov8n.pt"))
    assert "not ready" in ready.prepare(spec("yolov8n.yaml", data="/nonexistent/data.yaml"))
    assert ready.HELD == {}


def test_the_held_loader_gives_the_batches_and_worker_seeds_a_new_one_would_from_the_resumed_position():
    """Its workers were started fed nothing; pointed at the sampler a resume positioned, they load what a loader
    built at the launch loads, in order, with the same seeds."""
    from ultralytics.data.build import build_dataloader

    from worker.supervision import exact_resume

    train = {"imgsz": 64, "batch": 4, "workers": 2, "seed": 0}
    line = ready.prepare(spec("yolov8n.yaml", **train))
    assert "the training loader (2 worker processes started)" in line, line
    held = ready.HELD.pop("loader")
    workers = [w.pid for w in held.iterator._workers]
    assert all(w.is_alive() for w in held.iterator._workers)
    ready.HELD.clear()
    resume = exact_resume.ResumePoint(epoch=1, batches=3)

    def first_batches(loader):
        exact_resume.install(loader, 0, lambda: 1, exact_resume.ResumePoint(resume.epoch, resume.batches))
        return [[name.rsplit("/", 1)[-1] for name in batch["im_file"]] for batch in loader], loader.iterator

    held.loader.held_iterator = held.iterator
    held.loader.__class__ = ready.held_class(type(held.loader))
    took, iterator = first_batches(held.loader)
    assert [w.pid for w in iterator._workers] == workers  # the held workers, not new ones

    torch.manual_seed(0 + 1 - 1)  # as the trainer's init_seeds (seed + 1 + RANK) before it builds its loader
    cold, cold_iterator = first_batches(build_dataloader(held.loader.dataset, batch=4, workers=2, shuffle=True,
                                                         rank=-1, device="cpu"))
    assert took == cold and len(took) == 8 - 3
    assert iterator._base_seed == cold_iterator._base_seed  # the workers' seeds: the same augmentations
    held.loader.close()


def checkpoint_at(path, epoch: int, batch: int, batch_size: int = 4, epochs: int = 100):
    """A mid-epoch checkpoint as the worker writes one, of what a resume reads: the exact position, and the epochs
    its training runs to (Ultralytics' default close_mosaic, 10, closes mosaic for the last 10)."""
    from worker.checkpoints.checkpointing import EXACT_KEY

    torch.save({"epoch": epoch - 1, "ema": None, "optimizer": {}, "train_args": {"epochs": epochs},
                EXACT_KEY: {"epoch": epoch, "batch": batch, "samples": batch * batch_size}}, path)
    return str(path)


def names_of(loader, epochs):
    """The images of each batch ``loader`` gives over ``epochs`` (a list the loader's epoch is read from)."""
    taken = []
    for _ in range(2):
        taken.append([[name.rsplit("/", 1)[-1] for name in batch["im_file"]] for batch in loader])
        epochs[0] += 1
    return taken


def launched_loader(resume_point, epochs, *, reset_first: bool = False, per_epoch: bool = False):
    """The held loader as the launch takes it and resumes it (worker/training/trainer.py), or None."""
    from worker.loading.loaders import make_epoch_workers
    from worker.supervision import exact_resume

    held = ready.HELD["loader"]
    loader = ready.take_loader(held.dataset_key, held.loader_key, workers_hooked=False)
    if loader is None:
        return None
    if per_epoch:
        make_epoch_workers(loader)
    loader.__class__ = ready.held_class(type(loader))
    exact_resume.install(loader, 0, lambda: epochs[0], resume_point)
    if reset_first:  # close_mosaic's reset at the resumed epoch's start, before its first batch
        loader.reset()
    return loader


def cold_batches(dataset, resume_point, per_epoch: bool = False):
    """What a loader built at the launch gives from the same position, over the same two epochs."""
    from ultralytics.data.build import build_dataloader

    from worker.loading.loaders import make_epoch_workers
    from worker.supervision import exact_resume

    torch.manual_seed(0 + 1 - 1)  # as the trainer's init_seeds (seed + 1 + RANK) before it builds its loader
    cold = build_dataloader(dataset, batch=4, workers=2, shuffle=True, rank=-1, device="cpu")
    if per_epoch:
        make_epoch_workers(cold)
    epochs = [resume_point.epoch]
    exact_resume.install(cold, 0, lambda: epochs[0], resume_point)
    seeds, cls = [], type(cold)  # each iterator's workers' seeds
    cold._get_iterator = lambda: (it := cls._get_iterator(cold), seeds.append(it._base_seed))[0]
    try:
        return names_of(cold, epochs), seeds, cold.sampler
    finally:
        cold.close()


@pytest.mark.parametrize("per_epoch", [False, True], ids=["persistent workers", "workers each epoch"])
def test_a_held_loader_fed_at_the_verdict_gives_what_a_cold_restart_gives_over_the_resumed_epoch_and_the_next(
        tmp_path, per_epoch):
    """Issue 59.1: the supervisor's word at the verdict feeds the held workers from the checkpoint's resumed
    position while the tree is killed; the launch that resumes from that same file takes them as they stand, and
    trains the batches a cold restart trains, the next epoch's too, with the same worker seeds."""
    from worker.supervision.exact_resume import ResumePoint

    ready.prepare(spec("yolov8n.yaml", imgsz=64, batch=4, workers=2, seed=0))
    checkpoint = checkpoint_at(tmp_path / "last.pt", epoch=1, batch=3)
    line = ready.prime(checkpoint)
    assert "load epoch 2 from batch 4 now, as" in line and checkpoint in line, line
    held = ready.HELD["loader"]
    workers, iterator = [w.pid for w in held.iterator._workers], held.iterator
    assert iterator._send_idx == iterator._prefetch_factor * 2  # its first batches asked for, before the launch
    ready.resuming(checkpoint)
    epochs = [1]
    loader = launched_loader(ResumePoint(1, 3, 12), epochs, per_epoch=per_epoch)
    assert loader is not None and loader.held_primed is not None
    made = []  # each epoch's iterator, where workers are made each epoch
    cls = type(loader)
    loader._get_iterator = lambda: (it := cls._get_iterator(loader), made.append(it))[0]
    took = names_of(loader, epochs)
    assert made[0] is iterator and [w.pid for w in iterator._workers] == workers  # the fed one took the first epoch
    assert len(made) == (2 if per_epoch else 1)
    cold, cold_seeds, cold_order = cold_batches(loader.dataset, ResumePoint(1, 3, 12), per_epoch)
    assert took == cold and [len(e) for e in took] == [8 - 3, 8]
    assert [it._base_seed for it in made] == cold_seeds
    assert loader.sampler.same_order(cold_order)  # the loader goes on as a cold one would (an in-place rebuild reads it)
    loader.close()
    ready.HELD.clear()


def test_a_held_loader_fed_from_another_checkpoint_than_the_launch_resumes_is_dropped(tmp_path, capsys):
    """The tree saved again between the verdict and the launch (an asynchronous save's write ending), or the
    launch resumes the verified copy: the workers loaded another position, so the launch starts new ones."""
    ready.prepare(spec("yolov8n.yaml", imgsz=64, batch=4, workers=2, seed=0))
    ready.prime(checkpoint_at(tmp_path / "last.pt", epoch=1, batch=3))
    workers = list(ready.HELD["loader"].iterator._workers)
    ready.resuming(checkpoint_at(tmp_path / "last.pt", epoch=1, batch=5))  # written again: another file
    assert launched_loader(None, [1]) is None
    for w in workers:
        w.join(30)
        assert not w.is_alive()
    assert "fed at the verdict from another checkpoint than this launch resumes" in capsys.readouterr().err
    ready.HELD.clear()


def test_a_reset_before_the_first_batch_of_a_loader_fed_at_the_verdict_resumes_from_its_own_order(tmp_path):
    """close_mosaic's reset at the resumed epoch's start stops the fed workers: the new iterator draws the loader's
    own order, its skip intact (the feeding drew a copy), so it trains what a cold restart trains."""
    from worker.supervision.exact_resume import ResumePoint

    ready.prepare(spec("yolov8n.yaml", imgsz=64, batch=4, workers=2, seed=0))
    checkpoint = checkpoint_at(tmp_path / "last.pt", epoch=1, batch=3)
    ready.prime(checkpoint)
    ready.resuming(checkpoint)
    epochs = [1]
    loader = launched_loader(ResumePoint(1, 3, 12), epochs, reset_first=True)
    took = names_of(loader, epochs)
    cold, _, _ = cold_batches(loader.dataset, ResumePoint(1, 3, 12))
    assert took == cold and [len(e) for e in took] == [8 - 3, 8]
    loader.close()
    ready.HELD.clear()


def test_in_the_last_close_mosaic_epochs_the_fed_workers_start_without_mosaic_and_survive_the_trainers_reset(tmp_path):
    """Ultralytics closes mosaic and resets the loader as a resume enters one of the last ``close_mosaic`` epochs: the
    standby's workers are started anew without mosaic at the verdict, the trainer's reset keeps them, and they give
    what a cold loader gives there, images and seeds alike."""
    import copy

    from worker.supervision.exact_resume import ResumePoint

    ready.prepare(spec("yolov8n.yaml", imgsz=64, batch=4, workers=2, seed=0))
    before = [w.pid for w in ready.HELD["loader"].iterator._workers]
    checkpoint = checkpoint_at(tmp_path / "last.pt", epoch=1, batch=3, epochs=3)  # epochs 1-3 close mosaic
    line = ready.prime(checkpoint)
    assert "started anew without mosaic" in line, line
    held = ready.HELD["loader"]
    fed = [w.pid for w in held.iterator._workers]
    assert not set(fed) & set(before)
    ready.resuming(checkpoint)
    epochs = [1]
    loader = launched_loader(ResumePoint(1, 3, 12), epochs)
    loader.dataset.close_mosaic(hyp=copy.copy(held.args))
    loader.reset()
    first = next(iter(loader))
    assert [w.pid for w in loader.iterator._workers] == fed  # kept through the reset
    loader.close()

    torch.manual_seed(0)
    from ultralytics.data.build import build_dataloader

    from worker.supervision import exact_resume

    cold = build_dataloader(loader.dataset, batch=4, workers=2, shuffle=True, rank=-1, device="cpu")
    exact_resume.install(cold, 0, lambda: 1, ResumePoint(1, 3, 12))
    cold.reset()
    cold_first = next(iter(cold))
    assert first["im_file"] == cold_first["im_file"] and torch.equal(first["img"], cold_first["img"])
    cold.close()
    ready.HELD.clear()


def test_a_standby_fed_nothing_to_prime_or_a_finished_checkpoint_says_so_and_feeds_at_the_launch(tmp_path):
    ready.HELD.clear()
    assert ready.prime(None) == "no training loader held to feed ahead"
    ready.prepare(spec("yolov8n.yaml", imgsz=64, batch=4, workers=2, seed=0))
    finished = tmp_path / "done.pt"
    torch.save({"epoch": -1, "ema": None, "optimizer": None}, finished)
    assert "fed at the launch" in ready.prime(str(finished)) and ready.HELD["loader"].primed is None
    assert "fed at the launch" in ready.prime(str(tmp_path / "missing.pt"))
    assert "load epoch 1 from its start now, as a start from scratch" in ready.prime(None)
    assert ready.prime(None) == "its training loader is fed already"
    ready.drop()
    ready.HELD.clear()


def test_a_held_loader_the_launch_does_not_take_has_its_workers_stopped_and_says_why(capsys):
    """CI: a standby held rung 0's loader and the launch ran rung 1's threads loader, which never asks for it: its two
    worker processes idled in the attempt's tree until its kill. Every launch that does not take it stops them."""
    ready.prepare(spec("yolov8n.yaml", imgsz=64, batch=4, workers=2, seed=0))
    workers = list(ready.HELD["loader"].iterator._workers)
    assert len(workers) == 2 and all(w.is_alive() for w in workers)
    ready.drop_loader("this rung loads on threads", "the threads start at the first batch")
    assert "loader" not in ready.HELD
    for w in workers:
        w.join(30)
        assert not w.is_alive()
    assert "held ready is dropped (this rung loads on threads): the threads start at the first batch" \
        in capsys.readouterr().err
    ready.HELD.clear()


class RefusesMoreThanOneImage(torch.nn.Module):
    """A model whose step at more than one image fails as a capped device's allocator refuses it (no GPU here)."""

    def __init__(self):
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 4, 3)

    def forward(self, x):
        if x.shape[0] > 1:
            raise torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")
        return self.conv(x)


def test_the_standbys_first_step_runs_through_the_loss_on_a_copy_and_at_one_image_where_the_batch_does_not_fit():
    from ultralytics.cfg import get_cfg
    from ultralytics.nn.tasks import DetectionModel
    from ultralytics.utils import DEFAULT_CFG

    args = get_cfg(DEFAULT_CFG, {"amp": False})
    model = DetectionModel("yolov8n.yaml", nc=2, verbose=False)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    line = ready._first_step(model, args, torch.device("cpu"), 64, 2)
    assert "its first step run (forward, loss, backward and the optimizer's step, batch 2" in line, line
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())  # the copy stepped, not the model
    assert all(p.grad is None for p in model.parameters())

    line = ready._first_step(RefusesMoreThanOneImage(), args, torch.device("cpu"), 32, 16)
    assert "its first step run (forward, backward and the optimizer's step, batch 1" in line, line


@pytest.fixture
def determinism_kept():
    """The standby's first step sets torch's determinism as the trainer does: put back for the tests after."""
    kept = torch.are_deterministic_algorithms_enabled(), torch.backends.cudnn.deterministic
    yield
    torch.use_deterministic_algorithms(kept[0])
    torch.backends.cudnn.deterministic = kept[1]
    for what in ("training_step", "warmup", "model"):
        ready.HELD.pop(what, None)


@pytest.mark.parametrize("deterministic", [True, False])
def test_the_standbys_first_step_runs_under_the_determinism_the_trainer_sets(determinism_kept, deterministic):
    from ultralytics.cfg import get_cfg
    from ultralytics.utils import DEFAULT_CFG

    torch.use_deterministic_algorithms(not deterministic)
    seen = []

    class Records(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.conv = torch.nn.Conv2d(3, 4, 3)

        def forward(self, x):
            seen.append((torch.are_deterministic_algorithms_enabled(), torch.backends.cudnn.deterministic))
            return self.conv(x)

    ready._first_step(Records(), get_cfg(DEFAULT_CFG, {"amp": False, "deterministic": deterministic}),
                      torch.device("cpu"), 32, 2)
    assert seen == [(deterministic, deterministic)]  # the algorithms the training will run


def test_a_first_step_that_fitted_only_at_one_image_runs_at_the_trainings_batch_at_the_verdict_for_the_launch(
        determinism_kept):
    from ultralytics.cfg import get_cfg
    from ultralytics.nn.tasks import DetectionModel
    from ultralytics.utils import DEFAULT_CFG

    args = get_cfg(DEFAULT_CFG, {"amp": False})
    ready._first_step(RefusesMoreThanOneImage(), args, torch.device("cpu"), 32, 4)  # the memory grant: one image
    ready.HELD["model"] = DetectionModel("yolov8n.yaml", nc=2, verbose=False)  # the whole device: the batch fits
    ready.HELD["model"].args = args
    threads = []  # where its forward ran: the forward's cuDNN plans are that thread's own
    ready.HELD["model"].register_forward_pre_hook(lambda *_: threads.append(threading.get_ident()))
    line = ready.warm_at_the_verdict()
    assert line == "; its first step run at batch 4 on the thread that trains"
    assert threads == [threading.get_ident()]  # run here, before the line: the launch comes on this thread
    warm = ready.HELD["warmup"]
    assert ready.take_warmup((4, 3, 64, 64), torch.device("cpu"), None) is None  # not the launch's shape: its own
    ready.HELD["warmup"] = warm
    assert ready.take_warmup((4, 3, 32, 32), torch.device("cpu"), torch.float16) is None  # nor its autocast
    ready.HELD["warmup"] = warm
    assert ready.take_warmup((4, 3, 32, 32), torch.device("cpu"), None) is warm
    said = warm.finish()
    assert warm.error is None and warm.through_loss, said
    assert said.endswith("at the verdict, beside the kill"), said
    assert ready.warm_at_the_verdict() == ""  # once


def test_a_first_step_run_at_the_trainings_batch_leaves_nothing_to_warm_at_the_verdict(determinism_kept):
    from ultralytics.cfg import get_cfg
    from ultralytics.nn.tasks import DetectionModel
    from ultralytics.utils import DEFAULT_CFG

    model = DetectionModel("yolov8n.yaml", nc=2, verbose=False)
    ready.HELD["model"] = model
    assert "batch 2" in ready._first_step(model, get_cfg(DEFAULT_CFG, {"amp": False}), torch.device("cpu"), 32, 2)
    assert ready.warm_at_the_verdict() == "" and "warmup" not in ready.HELD
