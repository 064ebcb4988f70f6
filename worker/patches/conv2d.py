"""A Conv2d that computes through matrix products, bypassing MIOpen and cuDNN.

Why: on consumer AMD GPUs without a MIOpen kernel database (gfx1010, gfx1030 under
HSA_OVERRIDE_GFX_VERSION, ...) MIOpen compiles or searches convolution kernels at run time, and a
run can hang before its first batch. Matrix products (rocBLAS/hipBLASLt, cuBLAS) and a few
copies need no convolution kernel at all.

How: im2col + batched GEMM, in the model's own NCHW layout so that batch norm, SiLU and
concatenation run exactly as they do natively. ``im2col`` (a gather kernel, padding included)
turns the input into (N, Cin*kh*kw, Ho*Wo) columns; one ``baddbmm`` with the (Cout, Cin*kh*kw)
weight, bias folded in, gives the output. A 1x1 stride-1 convolution skips the gather: the input
is already its own column matrix. The backward is a custom autograd Function made of the same
pieces: the weight gradient is a batched GEMM against the columns (recomputed, not saved: they
are kh*kw times the input, too much memory for an 8 GB card), the input gradient a batched GEMM
with the transposed weight followed by ``col2im``. No native convolution kernel runs, forward
or backward.

Why this shape: on an H100 the GPU time of a YOLOv8n step with these kernels is close to
cuDNN's; what costs is host time per layer, so each convolution is kept to a handful of ATen
calls (3 forward, about 6 backward) and no layout conversions.

Precision: float32 matrix products follow ``torch.backends.cudnn.allow_tf32``, the flag that
governs the convolutions they replace (TF32 on by default in PyTorch), not the matmul flag.
Under autocast the inputs are cast like ``torch.nn.functional.conv2d`` is (to the autocast dtype).

Public entry points: ``enable()``, ``disable()``, ``is_enabled()``, ``conv2d()`` (a drop-in for
``torch.nn.functional.conv2d``) and ``should_enable(mode, env)``.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Mapping
from pathlib import Path

import torch
import torch.nn.functional as F
from torch.nn.modules.utils import _pair

from worker.contract import CONV_FALLBACK_MODES
from worker.patches.miopen_db import gpu_arch_seen_by_runtime, kernel_db_lookup

Pads = tuple[int, int, int, int]  # top, bottom, left, right


def conv2d(input, weight, bias=None, stride=1, padding=0, dilation=1, groups=1):
    """Same arguments and result as ``torch.nn.functional.conv2d``, computed without a conv kernel."""
    stride, dilation = _pair(stride), _pair(dilation)
    pads = _resolve_padding(padding, weight.shape[-2:], dilation)
    unbatched = input.dim() == 3
    if unbatched:
        input = input.unsqueeze(0)
    device_type = input.device.type
    if torch.is_autocast_enabled(device_type):
        # conv2d is on autocast's lower-precision list; mirror it so the output dtype matches.
        dtype = torch.get_autocast_dtype(device_type)
        input, weight = input.to(dtype), weight.to(dtype)
        bias = bias.to(dtype) if bias is not None else None
    out = _Conv2dMatmul.apply(input, weight, bias, stride, pads, dilation, groups)
    return out.squeeze(0) if unbatched else out


def _resolve_padding(padding, kernel_size, dilation) -> Pads:
    if isinstance(padding, str):
        if padding == "valid":
            return (0, 0, 0, 0)
        if padding != "same":
            raise ValueError(f"conv2d: padding={padding!r} is not one of 'same', 'valid' or an int/tuple")
        # The same split as PyTorch: the odd extra row or column goes to the bottom/right.
        (kh, kw), (dh, dw) = kernel_size, dilation
        th, tw = dh * (kh - 1), dw * (kw - 1)
        return (th // 2, th - th // 2, tw // 2, tw - tw // 2)
    ph, pw = _pair(padding)
    return (ph, ph, pw, pw)


class _Conv2dMatmul(torch.autograd.Function):
    @staticmethod
    def forward(ctx, input, weight, bias, stride, pads, dilation, groups):
        x = _pad_asymmetric(input.contiguous(), pads)
        padding = _symmetric(pads)
        ctx.save_for_backward(x, weight)
        ctx.has_bias = bias is not None
        ctx.config = (pads, stride, padding, dilation, groups)
        with _conv_precision(x):
            return _conv_matmul(x, weight, bias, stride, padding, dilation, groups)

    @staticmethod
    def backward(ctx, grad_out):
        x, weight = ctx.saved_tensors
        pads, stride, padding, dilation, groups = ctx.config
        need_input, need_weight, need_bias = ctx.needs_input_grad[:3]
        grad_input = grad_weight = grad_bias = None
        n, _, h, w = x.shape
        cout, cin_g, kh, kw = weight.shape
        grad_out = grad_out.contiguous()
        gy = grad_out.view(n, cout, -1)
        with _conv_precision(gy):
            if need_bias and ctx.has_bias:
                grad_bias = gy.sum((0, 2))
            if need_weight:
                cols = _columns(x, (kh, kw), stride, padding, dilation)
                if groups == 1:
                    grad_weight = torch.bmm(gy, cols.transpose(1, 2)).sum(0).reshape(weight.shape)
                else:
                    cols = cols.view(n, groups, -1, cols.shape[-1]).transpose(2, 3)
                    grad_weight = torch.matmul(gy.view(n, groups, cout // groups, -1), cols).sum(0)
                    grad_weight = grad_weight.reshape(weight.shape)
            if need_input:
                grad_input = _unpad_asymmetric(_grad_input(grad_out, weight, (h, w), stride, padding, dilation, groups), pads)
        return grad_input, grad_weight, grad_bias, None, None, None, None


def _conv_matmul(x, weight, bias, stride, padding, dilation, groups) -> torch.Tensor:
    """Convolution of a contiguous NCHW tensor with symmetric padding: im2col + one batched GEMM."""
    n, _, h, w = x.shape
    cout, _, kh, kw = weight.shape
    ho = (h + 2 * padding[0] - dilation[0] * (kh - 1) - 1) // stride[0] + 1
    wo = (w + 2 * padding[1] - dilation[1] * (kw - 1) - 1) // stride[1] + 1
    cols = _columns(x, (kh, kw), stride, padding, dilation)
    if groups == 1:
        wmat = weight.reshape(cout, -1).expand(n, -1, -1)  # a stride-0 batch: no copy
        out = torch.baddbmm(bias.view(1, cout, 1), wmat, cols) if bias is not None else torch.bmm(wmat, cols)
    else:
        wmat = weight.reshape(groups, cout // groups, -1)
        out = torch.matmul(wmat, cols.view(n, groups, -1, cols.shape[-1])).view(n, cout, -1)
        if bias is not None:
            out = out + bias.view(1, cout, 1)
    return out.view(n, cout, ho, wo)


def _grad_input(grad_out, weight, input_hw, stride, padding, dilation, groups) -> torch.Tensor:
    n, cout, ho, wo = grad_out.shape
    cout, cin_g, kh, kw = weight.shape
    (dh, dw), (ph, pw) = dilation, padding
    eh, ew = dh * (kh - 1) - ph, dw * (kw - 1) - pw
    if stride == (1, 1) and eh >= 0 and ew >= 0:
        # At stride 1 the input gradient is itself a convolution: of the output gradient with the
        # weight flipped in space and with input and output channels swapped within each group.
        # im2col + GEMM is much faster than GEMM + col2im, whose kernel is slow.
        flipped = weight.reshape(groups, cout // groups, cin_g, kh, kw).transpose(1, 2)
        flipped = flipped.reshape(groups * cin_g, cout // groups, kh, kw).flip(2, 3)
        return _conv_matmul(grad_out, flipped, None, (1, 1), (eh, ew), dilation, groups)
    gy = grad_out.view(n, cout, -1)
    wmat_t = weight.reshape(groups, cout // groups, -1).transpose(1, 2)
    if groups == 1:
        gcols = torch.bmm(wmat_t[0].expand(n, -1, -1), gy)
    else:
        gcols = torch.matmul(wmat_t, gy.view(n, groups, cout // groups, -1)).view(n, -1, gy.shape[-1])
    if kh == kw == 1 and stride == (1, 1) and padding == (0, 0):
        return gcols.view(n, -1, *input_hw)
    c = gcols.shape[1] // (kh * kw)
    # Batch folded into channels: one kernel launch instead of a loop over the images.
    folded = torch._C._nn.col2im(gcols.view(1, n * c * kh * kw, -1), input_hw, (kh, kw), dilation, padding, stride)
    return folded.view(n, c, *input_hw)


def _columns(x, kernel_size, stride, padding, dilation) -> torch.Tensor:
    """im2col: (N, C*kh*kw, Ho*Wo), rows in (c, i, j) order like the weight's (Cin, kh, kw)."""
    n, c, h, w = x.shape
    if kernel_size == (1, 1) and stride == (1, 1) and padding == (0, 0):
        return x.view(n, c, -1)  # a 1x1 convolution needs no gather
    # PyTorch's CUDA im2col launches one kernel per image; channels are independent, so folding
    # the batch into them makes it one launch with the same (n, c, i, j) row order.
    # Written into a buffer of the final size: without out=, im2col allocates an input-sized
    # tensor and then grows it, copying the garbage across (a DtoD copy and a second allocation).
    (kh, kw), (sh, sw), (dh, dw), (ph, pw) = kernel_size, stride, dilation, padding
    ho, wo = (h + 2 * ph - dh * (kh - 1) - 1) // sh + 1, (w + 2 * pw - dw * (kw - 1) - 1) // sw + 1
    cols = x.new_empty((1, n * c * kh * kw, ho * wo))
    torch._C._nn.im2col(x.view(1, n * c, h, w), kernel_size, dilation, padding, stride, out=cols)
    return cols.view(n, c * kh * kw, -1)


def _symmetric(pads: Pads) -> tuple[int, int]:
    """The part of the padding im2col applies itself (the same on both sides)."""
    top, bottom, left, right = pads
    return min(top, bottom), min(left, right)


def _pad_asymmetric(x: torch.Tensor, pads: Pads) -> torch.Tensor:
    """Pad the excess of 'same' padding with an even kernel, as PyTorch's own conv does."""
    top, bottom, left, right = pads
    ph, pw = _symmetric(pads)
    extra = (left - pw, right - pw, top - ph, bottom - ph)
    return F.pad(x, extra) if any(extra) else x


def _unpad_asymmetric(grad: torch.Tensor, pads: Pads) -> torch.Tensor:
    """The adjoint of _pad_asymmetric: drop the gradient of the extra rows and columns."""
    top, bottom, left, right = pads
    ph, pw = _symmetric(pads)
    if (top, bottom, left, right) == (ph, ph, pw, pw):
        return grad
    h, w = grad.shape[-2:]
    return grad[..., top - ph : h - (bottom - ph), left - pw : w - (right - pw)]


@contextlib.contextmanager
def _conv_precision(x: torch.Tensor):
    """Make float32 matrix products use TF32 exactly when cuDNN convolutions would."""
    if x.dtype != torch.float32 or x.device.type != "cuda":
        yield
        return
    matmul = torch.backends.cuda.matmul
    wanted = "tf32" if torch.backends.cudnn.allow_tf32 else "ieee"
    saved = matmul.fp32_precision
    if saved == wanted:
        yield
        return
    matmul.fp32_precision = wanted
    try:
        yield
    finally:
        matmul.fp32_precision = saved


# -- patching torch.nn.Conv2d ------------------------------------------------------------------

_native_conv_forward = None  # the method enable() replaced; None while disabled


def _fallback_conv_forward(self, input, weight, bias):
    # Mirrors torch.nn.Conv2d._conv_forward, with conv2d above in place of F.conv2d.
    if self.padding_mode != "zeros":
        padded = F.pad(input, self._reversed_padding_repeated_twice, mode=self.padding_mode)
        return conv2d(padded, weight, bias, self.stride, 0, self.dilation, self.groups)
    return conv2d(input, weight, bias, self.stride, self.padding, self.dilation, self.groups)


def enable() -> None:
    """Route every torch.nn.Conv2d, existing or new, through the fallback.

    Only the method ``Conv2d._conv_forward`` is swapped on the class: modules stay plain
    ``torch.nn.Conv2d`` instances, so checkpoints pickled meanwhile never reference this module.
    """
    global _native_conv_forward
    if _native_conv_forward is None:
        _native_conv_forward = torch.nn.Conv2d._conv_forward
        torch.nn.Conv2d._conv_forward = _fallback_conv_forward


def disable() -> None:
    """Restore the native convolution path."""
    global _native_conv_forward
    if _native_conv_forward is not None:
        torch.nn.Conv2d._conv_forward = _native_conv_forward
        _native_conv_forward = None


def is_enabled() -> bool:
    return torch.nn.Conv2d._conv_forward is _fallback_conv_forward


# -- deciding -----------------------------------------------------------------------------------

def should_enable(
    mode: str,
    env: Mapping[str, str] = os.environ,
    *,
    root: Path = Path("/"),
    hip_version: str | None = torch.version.hip,
) -> tuple[bool, str]:
    """Decide ``[patches] conv_fallback``; returns (enable, reason in words).

    ``auto`` turns the fallback on under ROCm when MIOpen has no kernel database for the
    architecture the runtime will report (HSA_OVERRIDE_GFX_VERSION, else the real one from the
    kfd topology under ``root``): that is when MIOpen compiles kernels at run time, the case in
    which runs were seen to hang before their first batch.
    """
    if mode not in CONV_FALLBACK_MODES:
        raise ValueError(f"[patches] conv_fallback = {mode!r}: expected one of {', '.join(CONV_FALLBACK_MODES)}")
    if mode == "on":
        return True, "conv_fallback = 'on' in the configuration"
    if mode == "off":
        return False, "conv_fallback = 'off' in the configuration"
    if not hip_version:
        return False, "auto: not a ROCm build of torch (cuDNN or CPU convolutions need no MIOpen database)"
    arch = gpu_arch_seen_by_runtime(root, env)
    if arch is None:
        return False, "auto: ROCm build, but no AMD GPU found in the kfd topology; nothing to decide"
    lookup = kernel_db_lookup(root, env, torch_dir=Path(torch.__file__).parent, arch=arch)
    if lookup.found is not None:
        return False, f"auto: MIOpen kernel database for {arch.describe()} found: {lookup.found}"
    return True, (f"auto: no MIOpen kernel database for {arch.describe()} in {lookup.searched()}; "
                  "convolutions use matrix products")
