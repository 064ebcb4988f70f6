"""The first step's parts (worker/startup/first_step_parts.py), on a real Ultralytics model's training step on the
CPU: each boundary is seen once, in the loop's order, and the hooks are gone after it."""

import re

import torch
from ultralytics.cfg import get_cfg
from ultralytics.nn.tasks import DetectionModel

from worker.startup.first_step_parts import FirstStepParts


def a_step(model: DetectionModel, parts: FirstStepParts) -> None:
    images = torch.rand(2, 3, 64, 64)
    batch = {"img": images, "batch_idx": torch.tensor([0.0, 1.0]), "cls": torch.zeros(2, 1),
             "bboxes": torch.tensor([[0.5, 0.5, 0.25, 0.25]]).repeat(2, 1)}
    parts.mark("to the device")
    loss, _ = model(batch)
    loss.sum().backward()
    parts.mark("optimizer")  # where the trainer's optimizer_step ends


def test_the_first_steps_parts_are_each_timed_once_in_the_loops_order_and_the_hooks_are_removed():
    model = DetectionModel("yolov8n.yaml", nc=2, verbose=False).train()
    model.args = get_cfg()
    parts = FirstStepParts()
    parts.mark("to the device")  # before the first step: not its part
    parts.begin(torch.device("cpu"))
    parts.mark("warm-up wait")
    parts.watch(model)
    a_step(model, parts)
    report = parts.report()
    assert re.fullmatch(r"first step: warm-up wait \d+\.\d\d, to the device \d+\.\d\d, predict \d+\.\d\d, "
                        r"loss \d+\.\d\d, backward \d+\.\d\d, optimizer \d+\.\d\d, after \d+\.\d\d", report), report
    assert sum(float(s) for s in re.findall(r"\d+\.\d\d", report)) > 0  # the forward and backward took time
    assert parts.report() == ""  # said once
    hooks = [m for m in model.modules() if m._forward_hooks]
    assert not hooks and not next(model.parameters())._post_accumulate_grad_hooks
    a_step(model, parts)  # a later step marks nothing
    assert parts.report() == ""
