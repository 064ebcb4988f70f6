"""An AMP check that never downloads.

Ultralytics' check_amp() fetches a pretrained model to compare fp32 and fp16 predictions; offline that
download can stall or fail the run. The local check compares the model being trained with itself: one
forward pass in fp32 and one under autocast on the same input. fp16 that overflows to inf/NaN or drifts
far (the classic failure of some consumer GPUs) turns AMP off for the run.
"""

from __future__ import annotations

import copy

import torch

MODES = ("local", "off", "ultralytics")


def outputs_agree(model: torch.nn.Module, device: torch.device, dtype: torch.dtype = torch.float16,
                  imgsz: int = 64, atol: float = 0.5) -> bool:
    """True when the model's output under autocast(dtype) is finite and within ``atol`` of the fp32 output."""
    probe = copy.deepcopy(model).float().eval()
    image = torch.rand(1, 3, imgsz, imgsz, device=device)
    with torch.no_grad():
        reference = _first_tensor(probe(image)).float()
        with torch.autocast(device.type, dtype=dtype):
            mixed = _first_tensor(probe(image)).float()
    return bool(torch.isfinite(mixed).all() and torch.allclose(reference, mixed, atol=atol, rtol=0.05))


def _first_tensor(output):
    while isinstance(output, (list, tuple)):
        output = output[0]
    return output


def local_check_amp(model: torch.nn.Module) -> bool:
    """Drop-in for ultralytics.utils.checks.check_amp, without the download."""
    device = next(model.parameters()).device
    if device.type in ("cpu", "mps"):
        return False  # as Ultralytics: AMP only on CUDA and ROCm
    agree = outputs_agree(model, device)
    print(f"yolo-train AMP check (local, no download): {'passed' if agree else 'failed, training in fp32'}",
          flush=True)
    return agree


def passed_earlier(model: torch.nn.Module) -> bool:
    """The check of an attempt after one whose check passed: the same GPU and torch, so not run again (it is part of
    each restart's start, bench/RESULTS.md; under ROCm its 64 px forward has MIOpen find its kernels for shapes
    training never uses)."""
    print("yolo-train AMP check: passed in an earlier attempt of this run; not run again", flush=True)
    return True


def install(mode: str, passed_before: bool = False) -> None:
    """Replace the trainer's AMP check according to ``[patches] amp_check``, or by ``passed_earlier``."""
    from ultralytics.engine import trainer

    if passed_before and mode != "off":
        trainer.check_amp = passed_earlier
    elif mode == "local":
        trainer.check_amp = local_check_amp
    elif mode == "off":
        trainer.check_amp = lambda model: True  # trust the `amp` argument as given
