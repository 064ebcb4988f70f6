"""The first step's device warm-up (worker/device_warmup.py): it runs the model's forward and backward in a thread, and
leaves the model as it found it. Run here on the CPU, the same code a GPU runs (the trainer starts it on CUDA only)."""

import torch
from ultralytics.nn.tasks import DetectionModel

from worker.device_warmup import DeviceWarmUp


def model_state(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def test_the_warm_up_runs_a_forward_and_backward_and_puts_back_every_buffer_and_gradient():
    torch.manual_seed(0)
    model = DetectionModel("yolov8n.yaml", nc=2, verbose=False).train()
    before = model_state(model)
    params = list(model.parameters())
    pending = {i: torch.randn_like(params[i]) for i in (0, 5)}  # accumulated before a checkpoint, restored by a resume
    for i, grad in pending.items():
        params[i].grad = grad.clone()
    rng = torch.get_rng_state()
    warm = DeviceWarmUp(model, (2, 3, 64, 64), torch.device("cpu"), None).start()
    warm.thread.join()
    assert warm.error is None and warm.seconds is not None
    # It trained a step's worth of the model: batch norm's statistics moved and gradients are there ...
    moved = [k for k, v in model.state_dict().items() if "running" in k and not torch.equal(v, before[k])]
    assert moved and sum(p.grad is not None for p in params) > len(pending)
    assert warm.finish().startswith("device warm-up ")
    # ... and none of it is left for the first batch: the same numbers, bit for bit, and only the gradients it found.
    after = model_state(model)
    assert all(torch.equal(after[k], before[k]) for k in before)
    assert [i for i, p in enumerate(params) if p.grad is not None] == sorted(pending)
    assert all(torch.equal(params[i].grad, grad) for i, grad in pending.items())
    assert torch.equal(torch.get_rng_state(), rng)  # no random number drawn: augmentations and sampling unmoved
    assert warm.finish() is None  # said once


def test_a_warm_up_that_fails_is_said_and_leaves_the_model_as_it_was():
    model = DetectionModel("yolov8n.yaml", nc=2, verbose=False).train()
    before = model_state(model)
    warm = DeviceWarmUp(model, (2, 5, 64, 64), torch.device("cpu"), None).start()  # 5 channels: the model has 3
    line = warm.finish()
    assert line.startswith("device warm-up failed (RuntimeError: ") and line.endswith("the first step warms itself")
    after = model_state(model)
    assert all(torch.equal(after[k], before[k]) for k in before)
