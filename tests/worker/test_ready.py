"""What a ready standby holds (worker/ready.py): the model built ahead, taken only by a launch that would build the
same one, and its weights then the checkpoint's."""

import torch

from worker import ready


def test_the_held_model_is_taken_by_the_same_build_only_and_then_carries_the_checkpoints_weights():
    line = ready.prepare({"model": "yolov8n.yaml", "data": "demo", "device": "cpu"})
    assert line.startswith("ready in ") and "the model yolov8n.yaml built on cpu" in line, line
    held = ready.HELD["model"]
    assert ready.take_model("yolov8s.yaml", 2, 3) is None and "model" not in ready.HELD  # another scale: dropped

    ready.prepare({"model": "yolov8n.yaml", "data": "demo", "device": "cpu"})
    assert ready.take_model("yolov8n.yaml", 80, 3) is None  # other classes

    ready.prepare({"model": "yolov8n.yaml", "data": "demo", "device": "cpu"})
    held = ready.HELD["model"]
    checkpoint = type(held)(dict(held.yaml), nc=2, ch=3, verbose=False)  # a resume's cfg is the checkpoint's dict
    for p in checkpoint.parameters():
        torch.nn.init.constant_(p, 0.5)
    taken = ready.take_model(checkpoint.yaml, 2, 3)
    assert taken is held
    taken.load(checkpoint)  # as SupervisedTrainerMixin.get_model does with the checkpoint's weights
    assert all(torch.equal(a, b) for a, b in zip(taken.state_dict().values(), checkpoint.state_dict().values()))


def test_a_model_that_cannot_be_built_ahead_leaves_the_launch_to_build_it():
    assert "not a YAML" in ready.prepare({"model": "yolov8n.pt", "data": "demo", "device": "cpu"})
    assert "not ready" in ready.prepare({"model": "yolov8n.yaml", "data": "/nonexistent/data.yaml", "device": "cpu"})
    assert ready.HELD == {}
