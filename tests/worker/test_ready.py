"""What a ready standby holds (worker/standby/ready.py): the model built ahead, taken only by a launch that would build the
same one, and its weights then the checkpoint's."""

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
    assert "its first step run (forward, loss and backward, batch 2" in line, line
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())  # the copy stepped, not the model
    assert all(p.grad is None for p in model.parameters())

    line = ready._first_step(RefusesMoreThanOneImage(), args, torch.device("cpu"), 32, 16)
    assert "its first step run (forward and backward, batch 1" in line, line
