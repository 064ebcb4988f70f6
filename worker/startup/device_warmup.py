"""The first step's device warm-up, done on a copy of the model while the loader and the trainer get ready.

A new process's first training step on a GPU pays once for what the next steps find ready: the GPU libraries loaded
(cuDNN's engines, cuBLAS), their kernels loaded and chosen (CUDA's lazy module loading, MIOpen's database). Every
attempt is a new process, so that is restart time. A warm-up of the forward and backward alone leaves the loss's
kernels (the assigner's and the loss's own) to the first step; one through the loss as well leaves it close to a
later step's time (the probe's figures: bench/RESULTS.md, "the first step after a warm-up through the loss").

So a thread runs one forward, the loss on a blank batch with one box an image (detection models; other tasks stop
at the forward, whose outputs are summed), one backward and the optimizer's first step as Ultralytics' loop makes it
(unscaled, clipped, stepped at a zero learning rate: AdamW fused on a GPU, its choice for short runs, and SGD with
Nesterov momentum, its choice for long ones), on a deep copy of the model. The copy is made once the model is on the
device, before the datasets, the loaders, the optimizer and any exact resume are set up, so all of that and the
loader's first batch run beside it. The model that trains is never touched: its weights, buffers and gradients are
what the loop left them; the warm-up draws no random number. Its cost is one more copy of the weights (and, until its
optimizers' step ends, their state) on the device until the first batch (3 M parameters for YOLOv8n, 68 M for
YOLOv8x).

**Which thread.** The libraries, their kernels and the backward's convolutions (run on autograd's thread for the
device, whichever thread calls it) are the process's, but cuDNN's execution plans for the forward's convolutions are
the calling thread's own (PyTorch keeps them ``thread_local`` in ``Conv_v8.cpp``: a plan is not safe across threads).
So a warm-up in a thread leaves the forward's plans to the first step; where the thread that will train has time to
wait, it runs the warm-up itself (``run_here``: the ready standby, before and at the verdict).

**No fork beside it.** Its first steps load the GPU libraries (dlopen, which registers their destructors under glibc's
``__exit_funcs_lock``): a loader worker forked from this process at that moment is born with the lock held and
blocks forever at its first use of it (Ultralytics PR #26085: workers forked while the pin-memory thread started
hung at their first ``cv2.imdecode``). So a fork of this process (loader workers started "fork": ROCm's first rungs,
an in-place rebuild there) first waits for a running warm-up to end (``os.register_at_fork``); workers started from
the forkserver or spawned are not forks of this process and never wait.
"""

from __future__ import annotations

import copy
import os
import threading
import time
from typing import Any

import torch

_RUNNING: set[threading.Thread] = set()  # warm-up threads under way: a fork of this process waits for them


def _before_fork() -> None:
    """Before any ``os.fork`` of this process (a loader worker started "fork"), in the forking thread: no warm-up
    thread may be inside a library's load while the child is made."""
    for thread in tuple(_RUNNING):
        if thread is not threading.current_thread():
            thread.join()


os.register_at_fork(before=_before_fork)


class DeviceWarmUp:
    def __init__(self, model: torch.nn.Module, shape: tuple[int, ...], device: torch.device,
                 autocast_dtype: torch.dtype | None, beside: str = "beside the loaders' start and first batch"):
        self.shape, self.device, self.autocast_dtype, self.beside = tuple(shape), device, autocast_dtype, beside
        self.error: BaseException | None = None
        self.seconds: float | None = None
        self.through_loss = False
        self.optimizer_stepped = False
        try:
            self.model: torch.nn.Module | None = copy.deepcopy(model).train()
        except Exception as e:  # a model that cannot be copied is not warmed up: the first step warms itself
            self.model, self.error = None, e
        self.thread = threading.Thread(target=self._run, name="yolo-train-warmup", daemon=True)
        self.finished = False

    def start(self) -> DeviceWarmUp:
        if self.model is not None:
            _RUNNING.add(self.thread)
            self.thread.start()
        return self

    def run_here(self) -> DeviceWarmUp:
        """Run it now, in the calling thread, so the forward's plans are that thread's (see "Which thread")."""
        if self.model is not None:
            self._run()
        return self

    def _run(self) -> None:
        began = time.monotonic()
        try:
            image = torch.zeros(self.shape, device=self.device)
            with torch.autocast(self.device.type, dtype=self.autocast_dtype or torch.float16,
                                enabled=self.autocast_dtype is not None):
                out = self.model(image)
                loss = self._loss(out, image)
            scaler = torch.amp.GradScaler(self.device.type,
                                          enabled=self.autocast_dtype is torch.float16 and self.device.type == "cuda")
            scaler.scale(loss).backward()
            self._optimizer_steps(scaler)
            if self.device.type == "cuda":
                torch.cuda.synchronize(self.device)
        except BaseException as e:  # a failed warm-up only leaves the first step as slow as it was
            # Kept without its traceback: the frames of the forward it failed in hold what it had allocated (an out
            # of memory error: all of it), and this object lives as long as the trainer.
            self.error = e.with_traceback(None)
        self.model = None  # the copy's memory goes back to the allocator, for the real first step
        self.seconds = time.monotonic() - began
        _RUNNING.discard(self.thread)

    def _optimizer_steps(self, scaler: torch.amp.GradScaler) -> None:
        """The optimizer's first step on the copy's gradients, each way Ultralytics builds it; one whose state does
        not fit (a large model in a standby's memory grant) is left to the training's first step."""
        params = [p for p in self.model.parameters() if p.grad is not None]
        fused = {"fused": True} if self.device.type == "cuda" else {}
        try:
            for optimizer in (torch.optim.AdamW(params, lr=0.0, betas=(0.9, 0.999), weight_decay=0.0, **fused),
                              torch.optim.SGD(params, lr=0.0, momentum=0.9, nesterov=True)):
                scaler.unscale_(optimizer)
                torch.nn.utils.clip_grad_norm_(params, max_norm=10.0)
                scaler.step(optimizer)
                scaler.update()
            self.optimizer_stepped = True
        except torch.cuda.OutOfMemoryError:
            pass

    def _loss(self, out: Any, image: torch.Tensor) -> torch.Tensor:
        """The training loss of a detection model on one centred box an image, by a criterion of its own (the
        model's is left unmade); for any other model, its outputs summed."""
        from ultralytics.nn.tasks import DetectionModel

        if type(self.model) is DetectionModel and getattr(self.model, "args", None) is not None:
            n = image.shape[0]
            targets = {"img": image, "batch_idx": torch.arange(n, device=self.device, dtype=torch.float32),
                       "cls": torch.zeros(n, 1, device=self.device),
                       "bboxes": torch.tensor([[0.5, 0.5, 0.25, 0.25]], device=self.device).repeat(n, 1)}
            loss, _ = self.model.init_criterion()(out, targets)
            self.through_loss = True
            return loss.sum()
        return sum(t.float().sum() for t in _tensors(out))

    def finish(self) -> str | None:
        """Wait for the warm-up; a line to print, once."""
        if self.finished:
            return None
        self.finished = True
        if self.thread.ident is not None:  # started; the copy is dropped by the thread itself
            self.thread.join()
        if self.error is not None:
            return f"device warm-up failed ({type(self.error).__name__}: {self.error}); the first step warms itself"
        return f"device warm-up {self.seconds:.1f} s ({self.parts()} on a copy of the model), {self.beside}"

    def parts(self) -> str:
        """What it ran, for a line: "forward, loss, backward and the optimizer's step"."""
        parts = ["forward", *["loss"] * self.through_loss, "backward",
                 *["the optimizer's step"] * self.optimizer_stepped]
        return ", ".join(parts[:-1]) + " and " + parts[-1]


def _tensors(out: Any):
    if isinstance(out, torch.Tensor):
        if out.requires_grad:
            yield out
    elif isinstance(out, dict):
        for v in out.values():
            yield from _tensors(v)
    elif isinstance(out, (list, tuple)):
        for v in out:
            yield from _tensors(v)
