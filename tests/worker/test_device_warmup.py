"""The first step's device warm-up (worker/startup/device_warmup.py): it runs a copy of the model's forward, loss and backward
in a thread, and leaves the model that trains untouched. Run here on the CPU, the same code a GPU runs (the trainer
starts it on CUDA only)."""

import threading

import torch
from ultralytics.cfg import get_cfg
from ultralytics.nn.tasks import ClassificationModel, DetectionModel

from worker.startup.device_warmup import DeviceWarmUp


def model_state(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def test_the_warm_up_runs_the_loss_and_backward_on_a_copy_and_leaves_the_model_that_trains_untouched():
    torch.manual_seed(0)
    model = DetectionModel("yolov8n.yaml", nc=2, verbose=False).train()
    model.args = get_cfg()  # as the trainer's set_model_attributes leaves it
    before = model_state(model)
    params = list(model.parameters())
    pending = {i: torch.randn_like(params[i]) for i in (0, 5)}  # accumulated before a checkpoint, restored by a resume
    for i, grad in pending.items():
        params[i].grad = grad.clone()
    rng = torch.get_rng_state()
    warm = DeviceWarmUp(model, (2, 3, 64, 64), torch.device("cpu"), None)
    copy = warm.model
    assert copy is not model and all(a.data_ptr() != b.data_ptr() for a, b in zip(copy.parameters(), params))
    warm.start().thread.join()
    assert warm.error is None and warm.through_loss and warm.model is None  # the copy is dropped once done
    # The copy trained a step's worth: batch norm's statistics moved and every trainable weight has a gradient ...
    moved = [k for k, v in copy.state_dict().items() if "running" in k and not torch.equal(v, before[k])]
    assert moved and all(p.grad is not None for p in copy.parameters() if p.requires_grad)
    line = warm.finish()
    assert line.startswith("device warm-up ") and "(forward, loss, backward and the optimizer's step on a copy of the model)" in line
    # ... and the model that trains is as it was: the same numbers bit for bit, the gradients it had, no criterion
    # made for it, no random number drawn.
    after = model_state(model)
    assert all(torch.equal(after[k], before[k]) for k in before)
    assert [i for i, p in enumerate(params) if p.grad is not None] == sorted(pending)
    assert all(torch.equal(params[i].grad, grad) for i, grad in pending.items())
    assert getattr(model, "criterion", None) is None
    assert torch.equal(torch.get_rng_state(), rng)
    assert warm.finish() is None  # said once


def test_a_model_without_a_detection_loss_is_warmed_through_its_forward_only():
    model = ClassificationModel("yolov8n-cls.yaml", nc=3, verbose=False).train()
    warm = DeviceWarmUp(model, (2, 3, 32, 32), torch.device("cpu"), None).start()
    line = warm.finish()
    assert warm.error is None and not warm.through_loss
    assert line.startswith("device warm-up ") and "(forward, backward and the optimizer's step on a copy of the model)" in line


def test_a_warm_up_that_fails_is_said_and_leaves_the_model_as_it_was():
    model = DetectionModel("yolov8n.yaml", nc=2, verbose=False).train()
    before = model_state(model)
    warm = DeviceWarmUp(model, (2, 5, 64, 64), torch.device("cpu"), None).start()  # 5 channels: the model has 3
    line = warm.finish()
    assert line.startswith("device warm-up failed (RuntimeError: ") and line.endswith("the first step warms itself")
    after = model_state(model)
    assert all(torch.equal(after[k], before[k]) for k in before)


class _SlowToWarm(torch.nn.Module):
    """A model whose forward takes a second: a warm-up inside a library's first load."""

    def __init__(self):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.ones(1))

    def forward(self, x):
        import time

        time.sleep(1.0)
        return x * self.weight


class _WarmedWhenForked(torch.utils.data.Dataset):
    def __init__(self, warm_up: DeviceWarmUp):
        self.warm_up = warm_up

    def __len__(self):
        return 2

    def __getitem__(self, index):
        return self.warm_up.seconds is not None  # as this forked worker found it


def test_a_loader_worker_is_never_forked_while_the_warm_up_runs():
    """Ultralytics PR #26085's window: a fork while another thread loads a library. A loader started "fork" while the
    warm-up runs forks only once it has ended; the warm-up's result is the same."""
    warm_up = DeviceWarmUp(_SlowToWarm(), (1, 1), torch.device("cpu"), None).start()
    loader = torch.utils.data.DataLoader(_WarmedWhenForked(warm_up), batch_size=2, num_workers=1,
                                         multiprocessing_context="fork")
    assert next(iter(loader)).tolist() == [True, True]  # the worker was forked after the warm-up's end
    assert warm_up.finish().startswith("device warm-up") and warm_up.error is None


ALLOCATED: list = []  # weak references to what _RefusedMidway allocated before it failed


class _RefusedMidway(torch.nn.Module):
    """A forward that allocates, then is refused more, as a device's allocator refuses a step that does not fit."""

    def __init__(self):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.ones(1))

    def forward(self, x):
        import weakref

        activations = torch.ones(1 << 20) * self.weight
        ALLOCATED.append(weakref.ref(activations))
        raise torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")


def test_a_warm_up_refused_for_memory_holds_none_of_what_it_allocated():
    """The error is kept for its line, and lives as long as the trainer (or the standby's next, smaller try)."""
    warm = DeviceWarmUp(_RefusedMidway(), (2, 3, 8, 8), torch.device("cpu"), None).start()
    line = warm.finish()
    assert "OutOfMemoryError" in line and isinstance(warm.error, torch.cuda.OutOfMemoryError)
    assert ALLOCATED and ALLOCATED[-1]() is None  # freed with the forward's frames, not held by the error


def test_run_here_warms_up_on_the_calling_thread_through_the_optimizers_step():
    """The forward's cuDNN plans are a thread's own: the thread that will train runs it itself where it can wait."""
    model = DetectionModel("yolov8n.yaml", nc=2, verbose=False).train()
    model.args = get_cfg()
    before = model_state(model)
    threads = []
    model.register_forward_pre_hook(lambda *_: threads.append(threading.get_ident()))  # copied with the model
    warm = DeviceWarmUp(model, (2, 3, 64, 64), torch.device("cpu"), None).run_here()
    assert threads == [threading.get_ident()] and warm.seconds is not None and warm.error is None
    assert warm.optimizer_stepped and warm.model is None
    assert "(forward, loss, backward and the optimizer's step on a copy of the model)" in warm.finish()
    after = model_state(model)
    assert all(torch.equal(after[k], before[k]) for k in before)  # the optimizers stepped the copy
