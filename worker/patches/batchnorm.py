"""Batch normalization through PyTorch's own kernels, never through MIOpen or cuDNN.

Why: MIOpen's batch-norm backward fails on RDNA1 (gfx1010, the RX 5600/5700): its reduction uses the DPP
modifiers ``row_bcast:15``/``row_bcast:31`` of GCN, which RDNA1 does not have, and the step dies with
``miopenStatusUnknownError`` (jc1122/pytorch-gfx1010, workarounds/batchnorm_gfx1010.py). Where MIOpen has no kernel
database for the GPU it compiles its batch-norm kernels at run time, as it does its convolutions (worker/patches/
conv2d.py). Every YOLO trains through BatchNorm2d.

How: ``torch.batch_norm`` takes a last argument, ``cudnn_enabled``, that ``torch.nn.functional.batch_norm`` fills
with ``torch.backends.cudnn.enabled``; ATen's ``_batch_norm_impl_index`` picks ``cudnn_batch_norm`` (CUDA builds) or
``miopen_batch_norm`` (ROCm builds) only when it is true, and otherwise ``native_batch_norm``: ATen's own kernels
(Welford statistics, then one elementwise pass; the backward, one reduction and one elementwise pass), compiled
ahead of time into the torch wheel for the GPU like any reduction. The autograd graph records the forward's choice,
so the backward follows it. The community's gfx1010 build of PyTorch makes the same choice in C++
(patches/pytorch-bn-rnn-gfx1010.patch: ``_select_batch_norm_backend`` skips MIOpen on gfx1010).

So this patch swaps ``torch.nn.functional.batch_norm`` for one that passes ``cudnn_enabled=False``, with
``torch.backends.cudnn.enabled`` off for the call (newer ATen's ``_select_batch_norm_backend`` reads that flag, not
the argument), and is otherwise the same function. Everything else is torch's own: the modules' running statistics, momentum, the cumulative
average of ``momentum=None``, ``num_batches_tracked``, ``affine=False``, ``track_running_stats=False``, eval mode,
autocast (batch norm is on none of autocast's lists: a float16 input keeps float32 statistics and parameters, as
natively), channels-last inputs. It covers BatchNorm1d/2d/3d and their lazy forms, and code that calls
``torch.nn.functional.batch_norm``; ``SyncBatchNorm`` too, where it uses that function (one process, or eval), and
its synchronised training path never reached MIOpen (ATen's ``batch_norm_stats``/``batch_norm_elemt`` family).
Code that imported the function by name before ``enable()``, or calls ``torch.batch_norm`` itself, keeps the native
path.

Few channels, large planes: ATen's kernels for a contiguous NCHW tensor give each channel one thread block, in the
statistics forward and in the backward; with 16 or 32 channels most of a large GPU idles while each block walks a
plane of hundreds of thousands of values. Its kernels for channels-last data (a 2-D input is one: rows of channels)
spread every channel over the whole grid. So a training-mode call with at most 32 channels and at least 2**15 values
per channel (YOLO's first, widest layers) runs ATen's batch norm on the input seen as rows of channels, copied there
and back: the same kernels' arithmetic (float statistics, ATen's running-statistics update), two copies forward and
two backward (one in the next layer's own contiguous()) for kernels that use the GPU. Above 32 channels the NCHW
kernels have blocks enough, and below 2**15 values a channel is a few loops of its block, which the copies' launches
would cost more than they save (``python -m bench.conv_fallback --bn-kernels`` compares the ways per shape).

Why not the batch norm from elementwise ops and reductions everywhere: ``native_batch_norm`` is one ATen call forward
and one backward, as cuDNN's, where the elementwise version is about ten forward and fifteen backward; with 57
BatchNorm2d in YOLOv8n that host time is the step's (as the conv fallback's was: ``python -m bench.conv_fallback``).

Public entry points: ``enable()``, ``disable()``, ``is_enabled()``, ``batch_norm()`` (a drop-in for
``torch.nn.functional.batch_norm``) and ``should_enable(mode, env, conv_fallback=...)``.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

import torch
import torch.nn.functional as F
from torch.overrides import handle_torch_function, has_torch_function_variadic

from worker.wire.contract import BATCHNORM_FALLBACK_MODES
from worker.wire.miopen_db import configured, gpu_arch_seen_by_runtime, kernel_db_lookup

# Architectures whose MIOpen batch-norm kernels are known not to run, by the card's real name (an
# HSA_OVERRIDE_GFX_VERSION does not change the hardware's instruction set).
MIOPEN_BATCHNORM_BROKEN = ("gfx1010", "gfx1011", "gfx1012", "gfx1013")


def batch_norm(input, running_mean, running_var, weight=None, bias=None, training=False, momentum=0.1, eps=1e-5):
    """``torch.nn.functional.batch_norm``, computed by ATen's own kernels (never cuDNN's or MIOpen's)."""
    if has_torch_function_variadic(input, running_mean, running_var, weight, bias):
        return handle_torch_function(batch_norm, (input, running_mean, running_var, weight, bias), input,
                                     running_mean, running_var, weight=weight, bias=bias, training=training,
                                     momentum=momentum, eps=eps)
    # The checks torch.nn.functional.batch_norm makes, with its messages.
    if training:
        size = input.size()
        values = size[0]
        for d in size[2:]:
            values *= d
        if values == 1:
            raise ValueError(f"Expected more than 1 value per channel when training, got input size {size}")
        if eps <= 0.0:
            raise ValueError(f"batch_norm eps must be positive during training, but got {eps}")
    elif eps < 0.0:
        raise ValueError(f"batch_norm eps must be non-negative, but got {eps}")
    # ATen up to torch 2.x read the last argument; newer ATen (_select_batch_norm_backend, measured with torch 2.11 on
    # an H100: CudnnBatchNormBackward0 with the argument off) reads the global flag instead: turn off both, for this
    # call alone. The autograd node records the forward's choice, so the backward follows it.
    shape = input.shape
    as_rows = training and is_rows_route(shape) and input.is_contiguous()
    if as_rows:  # few channels, large planes (module docstring): ATen's channels-last kernels on (N*H*W, C) rows
        input = input.permute(0, 2, 3, 1).reshape(-1, shape[1])
    enabled = torch._C._get_cudnn_enabled()
    if enabled:
        torch._C._set_cudnn_enabled(False)
    try:
        out = torch.batch_norm(input, weight, bias, running_mean, running_var, training, momentum, eps, False)
    finally:
        if enabled:
            torch._C._set_cudnn_enabled(True)
    if as_rows:
        n, c, h, w = shape
        return out.view(n, h, w, c).permute(0, 3, 1, 2).contiguous()
    return out


ROWS_MAX_CHANNELS = 32
ROWS_MIN_VALUES = 2**15  # values per channel (N*H*W)


def is_rows_route(shape) -> bool:
    """Whether a training-mode batch norm of an NCHW input of this shape runs on rows of channels (module docstring)."""
    return len(shape) == 4 and shape[1] <= ROWS_MAX_CHANNELS and shape[0] * shape[2] * shape[3] >= ROWS_MIN_VALUES


# -- patching torch.nn.functional.batch_norm ------------------------------------------------------

_native_batch_norm = None  # the function enable() replaced; None while disabled


def enable() -> None:
    """Route every batch norm that goes through ``torch.nn.functional.batch_norm`` (every torch.nn BatchNorm
    module does, looking it up at each call) to ATen's own kernels. Modules stay plain torch modules: checkpoints
    pickled meanwhile never reference this module."""
    global _native_batch_norm
    if _native_batch_norm is None:
        _native_batch_norm = F.batch_norm
        F.batch_norm = batch_norm


def disable() -> None:
    """Restore the native batch-norm path (cuDNN or MIOpen where torch.backends.cudnn.enabled)."""
    global _native_batch_norm
    if _native_batch_norm is not None:
        F.batch_norm = _native_batch_norm
        _native_batch_norm = None


def is_enabled() -> bool:
    return F.batch_norm is batch_norm


# -- deciding -----------------------------------------------------------------------------------

def should_enable(
    mode: str,
    env: Mapping[str, str] = os.environ,
    *,
    conv_fallback: bool,
    root: Path = Path("/"),
    hip_version: str | None = torch.version.hip,
) -> tuple[bool, str]:
    """Decide ``[patches] batchnorm_fallback``; returns (enable, reason in words).

    ``auto`` turns it on under ROCm when the Conv2d fallback is on (whatever turned it on: no MIOpen kernel
    database, the configuration, a rung, the remedy after a hang in MIOpen's compilation), when the card is RDNA1
    (gfx101x: MIOpen's batch-norm backward fails there), or when MIOpen has no kernel database for the architecture
    the runtime reports.
    """
    decided = configured("batchnorm_fallback", mode, BATCHNORM_FALLBACK_MODES)
    if decided is not None:
        return decided
    if not hip_version:
        return False, "auto: not a ROCm build of torch (no MIOpen)"
    if conv_fallback:
        return True, "auto: the Conv2d fallback is on, so MIOpen is avoided for batch norm too"
    arch = gpu_arch_seen_by_runtime(root, env)
    if arch is None:
        return False, "auto: ROCm build, but no AMD GPU found in the kfd topology; nothing to decide"
    card = arch.overridden_from or arch.name
    if card in MIOPEN_BATCHNORM_BROKEN:
        return True, f"auto: {arch.describe()}: MIOpen's batch-norm backward fails on RDNA1 (DPP row_bcast)"
    lookup = kernel_db_lookup(root, env, torch_dir=Path(torch.__file__).parent, arch=arch)
    if lookup.found is None:
        return True, f"auto: no MIOpen kernel database for {arch.describe()} in {lookup.searched()}"
    return False, f"auto: MIOpen kernel database for {arch.describe()} found: {lookup.found}"
