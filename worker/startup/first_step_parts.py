"""Where an attempt's first training step goes, part by part, for its startup line.

A restart's first step is most of what a ready standby leaves to the restart (bench/restart_breakdown.py), and the
step is one span in the startup steps: the device's work is asynchronous, so what the host's clock sees of it is
wherever it next waits. Here each boundary of the first step waits for the device (once per attempt: the step ends in
a wait for its losses anyway), so each part holds its own device time: the wait for the device warm-up, the batch's
move to the device, the model's prediction, the loss, the backward, the optimizer's step (with the gradient scaler's
and the EMA's; absent where the first batch only accumulates) and what the loop does after it.
"""

from __future__ import annotations

import time
from typing import Any

import torch


class FirstStepParts:
    def __init__(self) -> None:
        self.device: torch.device | None = None
        self.marks: list[tuple[str, float]] = []
        self.open = False
        self.pinned: tuple[int, float] | None = None

    def begin(self, device: torch.device) -> None:
        self.device, self.marks, self.open = device, [("", time.monotonic())], True
        self.pinned = _pinned_blocks_made(device)

    def mark(self, part: str) -> None:
        """``part`` of the first step just ended (once: a part seen again, as a second forward, is not its own)."""
        if not self.open or any(name == part for name, _ in self.marks):
            return
        if self.device is not None and self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        self.marks.append((part, time.monotonic()))

    def watch(self, model: Any) -> None:
        """Mark the prediction's end at the model's last layer (an Ultralytics model's head), the loss's at the
        model's own forward (which computes the loss when given a batch) and the backward's at the gradient of the
        model's first parameter (its stem's, among the backward's last), whether or not this batch steps."""
        layers = getattr(model, "model", None)
        if isinstance(layers, torch.nn.Sequential) and len(layers):
            self._once(layers[-1], "predict")
        self._once(model, "loss")
        first = next((p for p in model.parameters() if p.requires_grad), None)
        if first is not None:
            handle = None

            def accumulated(_: torch.Tensor) -> None:
                handle.remove()
                self.mark("backward")

            handle = first.register_post_accumulate_grad_hook(accumulated)

    def _once(self, module: torch.nn.Module, part: str) -> None:
        hook = None

        def done(*_: Any) -> None:
            hook.remove()
            self.mark(part)

        hook = module.register_forward_hook(done)

    def report(self) -> str:
        """The parts' seconds in order ("first step: warm-up wait 0.00, to the device 0.01, ..."), once."""
        if not self.open:
            return ""
        self.mark("after")
        self.open = False
        ends = self.marks[1:]
        parts = ", ".join(f"{name} {at - before:.2f}" for (name, at), (_, before) in zip(ends, self.marks))
        made = _pinned_blocks_made(self.device)
        if made is not None and self.pinned is not None:  # the loader's pinning beside it, in the same driver
            parts += f"; pinned blocks made beside it {made[0] - self.pinned[0]} ({made[1] - self.pinned[1]:.2f} s)"
        return f"first step: {parts}"


def _pinned_blocks_made(device: torch.device | None) -> tuple[int, float] | None:
    """How many blocks torch's pinned host allocator has made in this process, and its seconds in CUDA doing so."""
    if device is None or device.type != "cuda" or not hasattr(torch.cuda, "host_memory_stats"):
        return None
    stats = torch.cuda.host_memory_stats()
    return int(stats.get("num_host_alloc", 0)), float(stats.get("host_alloc_time.total", 0)) / 1e6
