"""The first step's device warm-up, done while the loader makes the first batch.

A new process's first training step on a GPU pays once for what the next steps find ready: the GPU libraries loaded
(cuDNN's engines, cuBLAS), their kernels loaded and chosen (CUDA's lazy module loading, MIOpen's database). On the
H100, YOLOv8n at batch 32, 640 px: 0.9-1.2 s against 0.05 s for the second step. That is all restart time: every
attempt is a new process. Meanwhile the main thread only waits for the loader's first batch (1.4-1.5 s with 8
workers), so a thread runs one forward and backward of the model on a blank batch of the training's shape there;
the real first step then took 0.18-0.19 s (a probe of the same model, two runs).

What the warm-up touches of the model is put back before the first batch: the buffers (batch norm's running
statistics) as they were, the gradients as the loop left them (none, or those an exact resume restored); the weights
are never stepped and no random generator is drawn from. So a resumed training trains the same numbers with or without it.
"""

from __future__ import annotations

import threading
import time
from typing import Any

import torch


class DeviceWarmUp:
    def __init__(self, model: torch.nn.Module, shape: tuple[int, ...], device: torch.device,
                 autocast_dtype: torch.dtype | None):
        self.model, self.shape, self.device, self.autocast_dtype = model, shape, device, autocast_dtype
        self.buffers = {name: b.detach().clone() for name, b in model.named_buffers()}
        # Gradients an exact resume restored (accumulated since the last optimizer step): set aside, not added to.
        self.grads = [p.grad for p in model.parameters()]
        self.error: BaseException | None = None
        self.seconds: float | None = None
        self.thread = threading.Thread(target=self._run, name="yolo-train-warmup", daemon=True)
        self.finished = False

    def start(self) -> DeviceWarmUp:
        for p in self.model.parameters():
            p.grad = None
        self.thread.start()
        return self

    def _run(self) -> None:
        began = time.monotonic()
        try:
            image = torch.zeros(self.shape, device=self.device)
            with torch.autocast(self.device.type, dtype=self.autocast_dtype or torch.float16,
                                enabled=self.autocast_dtype is not None):
                out = self.model(image)
            total = sum(t.float().sum() for t in _tensors(out))
            total.backward()
            if self.device.type == "cuda":
                torch.cuda.synchronize(self.device)
        except BaseException as e:  # a failed warm-up only leaves the first step as slow as it was
            self.error = e
        self.seconds = time.monotonic() - began

    def finish(self) -> str | None:
        """Wait for the warm-up, put the model back as it was; a line to print, once."""
        if self.finished:
            return None
        self.finished = True
        self.thread.join()
        with torch.no_grad():
            for name, b in self.model.named_buffers():
                if name in self.buffers:
                    b.copy_(self.buffers[name])
        for p, grad in zip(self.model.parameters(), self.grads):
            p.grad = grad
        self.buffers, self.grads = {}, []
        if self.error is not None:
            return f"device warm-up failed ({type(self.error).__name__}: {self.error}); the first step warms itself"
        return f"device warm-up {self.seconds:.1f} s, beside the loader's first batch"


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
