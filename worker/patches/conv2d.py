"""A Conv2d that computes through matrix products, bypassing MIOpen and cuDNN.

Why: on consumer AMD GPUs without a MIOpen kernel database (gfx1010, gfx1030 under
HSA_OVERRIDE_GFX_VERSION, ...) MIOpen compiles or searches convolution kernels at run time, and a
run can hang before its first batch. Matrix products (rocBLAS/hipBLASLt, cuBLAS) and a few
copies need no convolution kernel at all.

How: im2col + batched GEMM, in the model's own NCHW layout so that batch norm, SiLU and
concatenation run exactly as they do natively. ``im2col`` (a gather kernel, padding included)
turns the input into (N, Cin*kh*kw, Ho*Wo) columns; one ``baddbmm`` with the (Cout, Cin*kh*kw)
weight, bias folded in, gives the output. The backward is a custom autograd Function made of the
same pieces: the weight gradient is a batched GEMM against the columns (recomputed, not saved: they
are kh*kw times the input, too much memory for an 8 GB card) summed over the batch; the input
gradient, at stride 1, a convolution of the output gradient with the weight flipped in space
(im2col + GEMM again; the flipped weight is one gather), otherwise by phases (``_phase_grad_input``):
a stride-s convolution's input gradient splits into s*s interleaved phases, each a stride-1 convolution of
the output gradient with a part of the weight, so one im2col of the output gradient and one GEMM with the
parts stacked give every phase, and one permuting copy interleaves them. ATen's ``col2im``, which would
scatter the transposed product back instead, runs an int64 division chain per input value and is the
slowest kernel per byte of the step. A 1x1 stride-1 unpadded convolution skips the gather
(the input is already its own column matrix) and the Function: it is one ``bmm`` of ATen ops
whose backward (two GEMMs and the sum over the batch, the same kernels) autograd runs in C++;
except for float32 on a GPU whose matmul precision differs from cuDNN's (see Precision), which
only the Function can set around its backward. No native convolution kernel runs, forward or
backward.

Why this shape: each convolution is kept to a few ATen calls and kernels (a 3x3 at stride 1: 7
calls and 2 kernels forward, 13 calls and 6 kernels backward; a 1x1: 5 calls and 1 kernel
forward, 3 kernels backward run by autograd's C++) and no layout conversions, and what depends only
on a convolution's stride, padding, dilation and kernel size (``_Geometry``) is worked out once per
distinct set, not at every call: on a fast GPU a small model's step is partly host time. What is
left is the kernels' own, slower than cuDNN's (bench/RESULTS.md, ``conv_fallback.py``): im2col
writes and reads kh*kw times the input, where cuDNN's implicit GEMM reads it once.
``python -m bench.conv_fallback --host-overhead`` measures it per convolution.

Precision: float32 matrix products follow ``torch.backends.cudnn.allow_tf32``, the flag that
governs the convolutions they replace (TF32 on by default in PyTorch), not the matmul flag: the
Function sets the matmul precision (``torch.backends.cuda.matmul.fp32_precision``, by its raw
torch._C calls, in its forward and its backward) around its products when it differs. A float32
run that sets that precision as cuDNN's (``"tf32"`` while ``cudnn.allow_tf32``, PyTorch's default)
has nothing set per call, and its 1x1 convolutions take the Function-free path.
Under autocast the inputs are cast like ``torch.nn.functional.conv2d`` is (to the autocast dtype).

Public entry points: ``enable()``, ``disable()``, ``is_enabled()``, ``conv2d()`` (a drop-in for
``torch.nn.functional.conv2d``) and ``should_enable(mode, env)``.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

import torch
import torch.nn.functional as F
from torch.nn.modules.utils import _pair

from worker.wire.contract import CONV_FALLBACK_MODES
from worker.wire.miopen_db import configured, gpu_arch_seen_by_runtime, kernel_db_lookup

Pads = tuple[int, int, int, int]  # top, bottom, left, right


def conv2d(input, weight, bias=None, stride=1, padding=0, dilation=1, groups=1):
    """Same arguments and result as ``torch.nn.functional.conv2d``, computed without a conv kernel."""
    return _conv2d(input, weight, bias, _geometry(stride, padding, dilation, weight), groups)


def _conv2d(input, weight, bias, geo: _Geometry, groups: int) -> torch.Tensor:
    unbatched = input.dim() == 3
    if unbatched:
        input = input.unsqueeze(0)
    if torch._C._is_any_autocast_enabled():  # one cheap call when no autocast is on, the usual fp32 case
        device_type = input.device.type
        if torch.is_autocast_enabled(device_type):
            # conv2d is on autocast's lower-precision list; mirror it so the output dtype matches.
            dtype = torch.get_autocast_dtype(device_type)
            input, weight = input.to(dtype), weight.to(dtype)
            bias = bias.to(dtype) if bias is not None else None
    if geo.pointwise and groups == 1 and _matmul_precision_is_cudnns(input):
        out = _pointwise(input, weight, bias)
    else:
        out = _Conv2dMatmul.apply(input, weight, bias, geo, groups)
    return out.squeeze(0) if unbatched else out


class _Geometry:
    """What a convolution's stride, padding, dilation and kernel size decide, worked out once per distinct set (a
    model has a handful) instead of at every call: the host's work per convolution is what the fallback costs."""

    __slots__ = ("dilation", "extra", "flip_padding", "input_grad", "kernel", "padding", "pads", "phases", "pointwise",
                 "stride")

    def __init__(self, stride, padding, dilation, kernel: tuple[int, int]):
        self.kernel, self.stride, self.dilation = kernel, _pair(stride), _pair(dilation)
        self.pads = pads = _resolve_padding(padding, kernel, self.dilation)
        top, bottom, left, right = pads
        self.padding = ph, pw = min(top, bottom), min(left, right)  # the part im2col applies itself
        # The excess of 'same' padding with an even kernel, padded (and its gradient cut) around im2col.
        self.extra = (left - pw, right - pw, top - ph, bottom - ph) if pads != (ph, ph, pw, pw) else None
        # A 1x1 stride-1 unpadded convolution needs no gather: the input is its own column matrix.
        self.pointwise = kernel == (1, 1) and self.stride == (1, 1) and self.padding == (0, 0)
        (kh, kw), (dh, dw) = kernel, self.dilation
        self.flip_padding = (dh * (kh - 1) - ph, dw * (kw - 1) - pw)
        self.phases = None
        if self.pointwise:
            self.input_grad = "matmul"  # the transposed weight times the output gradient, nothing to scatter
        elif self.stride == (1, 1) and dh * (kh - 1) >= ph and dw * (kw - 1) >= pw:
            self.input_grad = "flipped"  # a stride-1 convolution of the output gradient (_flipped_grads)
        else:
            self.input_grad = "phases"  # _phase_grad_input
            self.phases = (_phase_taps(kh, self.stride[0], ph, dh), _phase_taps(kw, self.stride[1], pw, dw))


def _phase_taps(k: int, s: int, p: int, d: int) -> tuple[int, int, tuple]:
    """Along one axis of a convolution (kernel k, stride s, padding p, dilation d): input position s*a + r (phase r)
    receives from tap i the output gradient at a + o, with o = (r + p - i*d) / s where that divides. Returns the
    smallest and largest o, and ((r, o - smallest), i) for every such tap: the window of output-gradient positions
    each phase reads, and which tap sits where in it."""
    found = [(r, (r + p - i * d) // s, i) for r in range(s) for i in range(k) if (r + p - i * d) % s == 0]
    low, high = min(o for _, o, _ in found), max(o for _, o, _ in found)
    return low, high, tuple(((r, o - low), i) for r, o, i in found)


_geometries: dict = {}


def _geometry(stride, padding, dilation, weight) -> _Geometry:
    kernel = (weight.shape[-2], weight.shape[-1])
    try:
        key = (stride, padding, dilation, kernel)
        return _geometries[key]
    except KeyError:
        geo = _geometries[key] = _Geometry(stride, padding, dilation, kernel)
        return geo
    except TypeError:  # a list among the arguments: not hashable, worked out for this call alone
        return _Geometry(stride, padding, dilation, kernel)


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


def _pointwise(x, weight, bias) -> torch.Tensor:
    """A 1x1 stride-1 unpadded convolution: one batched GEMM of differentiable ATen ops, whose backward (two GEMMs
    and a sum over the batch, the kernels _Conv2dMatmul would run) autograd's C++ nodes run without Python."""
    n, c, h, w = x.shape
    cout = weight.shape[0]
    wmat = weight.reshape(cout, c).expand(n, -1, -1)  # a stride-0 batch: no copy; its gradient is summed over it
    cols = x.reshape(n, c, h * w)  # a view unless x is not contiguous (channels-last): a copy then
    out = torch.baddbmm(bias.view(1, cout, 1), wmat, cols) if bias is not None else torch.bmm(wmat, cols)
    return out.view(n, cout, h, w)


class _Conv2dMatmul(torch.autograd.Function):
    @staticmethod
    def forward(ctx, input, weight, bias, geo, groups):
        x = input.contiguous()
        if geo.extra is not None:
            x = F.pad(x, geo.extra)
        ctx.save_for_backward(x, weight)
        ctx.has_bias = bias is not None
        ctx.geo, ctx.groups = geo, groups
        saved = _tf32_like_cudnn(x)
        try:
            return _conv_matmul(x, weight, bias, geo, groups)
        finally:
            if saved is not None:
                _set_matmul_precision("cuda", "matmul", saved)

    @staticmethod
    def backward(ctx, grad_out):
        x, weight = ctx.saved_tensors
        geo, groups = ctx.geo, ctx.groups
        need_input, need_weight, need_bias = ctx.needs_input_grad[:3]
        grad_input = grad_weight = grad_bias = None
        grad_out = grad_out.contiguous()
        saved = _tf32_like_cudnn(grad_out)
        try:
            if need_bias and ctx.has_bias:
                grad_bias = grad_out.sum((0, 2, 3))
            if need_input and geo.input_grad == "flipped":
                grad_input, grad_weight = _flipped_grads(x, grad_out, weight, geo, groups, need_weight)
            else:
                gy = grad_out.view(grad_out.shape[0], grad_out.shape[1], -1)  # (n, cout, Ho*Wo), for both GEMMs
                if need_weight:
                    grad_weight = _weight_grad(x, gy, weight, geo, groups)
                if need_input and geo.input_grad == "phases":
                    grad_input = _phase_grad_input(grad_out, weight, x.shape, geo, groups)
                elif need_input:
                    grad_input = _grad_input(gy, weight, x.shape, groups)
            if grad_input is not None and geo.extra is not None:
                left, right, top, bottom = geo.extra
                h, w = grad_input.shape[-2:]
                grad_input = grad_input[..., top : h - bottom, left : w - right]
        finally:
            if saved is not None:
                _set_matmul_precision("cuda", "matmul", saved)
        return grad_input, grad_weight, grad_bias, None, None


def _conv_matmul(x, weight, bias, geo, groups) -> torch.Tensor:
    """Convolution of a contiguous NCHW tensor with symmetric padding: im2col + one batched GEMM."""
    n, _, h, w = x.shape
    cout = weight.shape[0]
    (kh, kw), (sh, sw), (dh, dw), (ph, pw) = geo.kernel, geo.stride, geo.dilation, geo.padding
    ho, wo = (h + 2 * ph - dh * (kh - 1) - 1) // sh + 1, (w + 2 * pw - dw * (kw - 1) - 1) // sw + 1
    cols = _columns(x, geo.kernel, geo.stride, geo.padding, geo.dilation, ho * wo, geo.pointwise)
    if groups == 1:
        wmat = _weight_batch(weight, n, transposed=False)
        out = torch.baddbmm(bias.view(1, cout, 1), wmat, cols) if bias is not None else torch.bmm(wmat, cols)
    else:
        wmat = weight.reshape(groups, cout // groups, -1)
        out = torch.matmul(wmat, cols.view(n, groups, -1, ho * wo)).view(n, cout, -1)
        if bias is not None:
            out = out + bias.view(1, cout, 1)
    return out.view(n, cout, ho, wo)


def _weight_batch(weight: torch.Tensor, n: int, transposed: bool) -> torch.Tensor:
    """The weight as the (Cout, Cin*kh*kw) matrix (or its transpose) repeated n times with a batch stride of 0, no
    copy: the left operand of a batched GEMM. One strided view, one ATen call where reshape, transpose and expand
    are up to three; a weight that is not contiguous (a channels-last model's) takes those."""
    cout = weight.shape[0]
    k = weight.numel() // cout
    if not weight.is_contiguous():
        matrix = weight.reshape(cout, k)
        return (matrix.t() if transposed else matrix).expand(n, -1, -1)
    if transposed:
        return weight.as_strided((n, k, cout), (0, 1, k), weight.storage_offset())
    return weight.as_strided((n, cout, k), (0, k, 1), weight.storage_offset())


def _flipped_grads(x, grad_out, weight, geo, groups, need_weight) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Input and weight gradients of a stride-1 convolution, from one im2col of the output gradient.

    The input gradient is itself a convolution: of the output gradient with the weight flipped in
    space and with input and output channels swapped within each group (im2col + GEMM is much
    faster than GEMM + col2im, whose kernel is slow). Its columns serve the weight gradient too:
    summed over the batch, input (Cin, H*W) times columns transposed (H*W, Cout*kh*kw) is the weight
    gradient with the same swap and flip, undone by the same gather. So the input's own columns,
    kh*kw times the input, are neither saved nor made again.
    """
    n, cin, h, w = x.shape
    cols = _columns(grad_out, geo.kernel, (1, 1), geo.flip_padding, geo.dilation, h * w, False)
    flip, unflip = _flip_indices(weight, groups)
    flipped = weight.take(flip)  # one gather kernel: the (Cin, Cout*kh*kw) matrix, or one per group
    xs = x.view(n, cin, h * w)
    swapped = None
    if groups == 1:
        grad_input = torch.bmm(flipped.expand(n, -1, -1), cols)
        if need_weight:
            swapped = _batch_summed_product(xs, cols)
    else:
        cols = cols.view(n, groups, -1, h * w)
        grad_input = torch.matmul(flipped, cols)
        if need_weight:
            swapped = torch.matmul(xs.view(n, groups, cin // groups, h * w), cols.transpose(2, 3)).sum(0)
    # Flipping twice is the identity: the inverse gather gives the weight gradient in the weight's shape.
    grad_weight = swapped.take(unflip) if swapped is not None else None
    return grad_input.view(n, cin, h, w), grad_weight


def _weight_grad(x, gy, weight, geo, groups) -> torch.Tensor:
    n, cout = gy.shape[:2]
    cols = _columns(x, geo.kernel, geo.stride, geo.padding, geo.dilation, gy.shape[2], geo.pointwise)
    if groups == 1:
        # (n, cout, K) then summed over the batch: a GEMM over the batch folded into the columns
        # would need the columns and the gradient transposed in memory, two large copies.
        return _batch_summed_product(gy, cols).view(weight.shape)
    cols = cols.view(n, groups, -1, cols.shape[-1]).transpose(2, 3)
    return torch.matmul(gy.view(n, groups, cout // groups, -1), cols).sum(0).view(weight.shape)


def _batch_summed_product(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """The sum over the batch of a[i] @ b[i].T, for contiguous a (n, M, K) and b (n, N, K): a weight gradient."""
    n, m, k = a.shape
    rows = b.shape[1]
    chunks = _k_chunks(m, rows, k)
    if chunks == 1:
        return torch.bmm(a, b.transpose(1, 2)).sum(0)
    # A weight gradient with a tiny output and a huge K (the first layer's: 16 x 27 over each image's 320*320
    # positions) is n GEMMs of one output tile each, and a batched GEMM gives a GEMM's tile one block: n blocks
    # walk all of K while the rest of the GPU idles. Cut each image's K into chunks, each its own GEMM in the batch,
    # and sum them after: n*chunks blocks. The operands are copied into that batch order (a chunk of an image is
    # not one stride away from the next image's), a pass over memory the GEMM was going to read anyway.
    parts = torch.matmul(a.view(n, m, chunks, k // chunks).transpose(1, 2),
                         b.view(n, rows, chunks, k // chunks).permute(0, 2, 3, 1))
    return parts.sum((0, 1))


SPLIT_K_MAX_OUTPUT = 32 * 32  # an output of one small GEMM tile at most: one block per image
SPLIT_K_MIN_K = 16384
SPLIT_K_CHUNK = 1024  # the shortest chunk of K: long enough that a block's loop over it outweighs its start


def _k_chunks(m: int, n: int, k: int) -> int:
    """Into how many chunks ``_batch_summed_product`` cuts K: 1 unless M*N fits one small tile and K is long; then the
    most, up to 64, that divide K into chunks of at least ``SPLIT_K_CHUNK``."""
    if m * n > SPLIT_K_MAX_OUTPUT or k < SPLIT_K_MIN_K:
        return 1
    return next((s for s in range(min(64, k // SPLIT_K_CHUNK), 1, -1) if k % s == 0), 1)


def _grad_input(gy, weight, input_shape, groups) -> torch.Tensor:
    """The input gradient of a pointwise convolution from its (n, Cout, H*W) output gradient: a GEMM with the
    transposed weight."""
    n, cout = gy.shape[:2]
    _, _, h, w = input_shape
    if groups == 1:
        gcols = torch.bmm(_weight_batch(weight, n, transposed=True), gy)
    else:
        wmat_t = weight.reshape(groups, cout // groups, -1).transpose(1, 2)
        gcols = torch.matmul(wmat_t, gy.view(n, groups, cout // groups, -1)).view(n, -1, gy.shape[-1])
    return gcols.view(n, -1, h, w)


def _phase_grad_input(grad_out, weight, input_shape, geo, groups) -> torch.Tensor:
    """The input gradient of any convolution, phase by phase (see the module docstring), without col2im.

    Input row s*a + r, phase r, gets the output gradient's rows a + o for its taps' offsets o (``_phase_taps``): a
    stride-1 correlation over a window of offsets. The columns of that window (one im2col, padded so that row a
    of every phase has its window) times the weight's taps stacked per phase, zeros where a phase has no tap at
    a window place ((Cin*s*s, Cout*window) per group, one gather), give all phases in (Cin, s, s) rows; one
    permuting copy interleaves them into the input's rows and columns. The GEMM multiplies the zeros too (a 3x3
    at stride 2: 16 products for 9 taps); it is not where the time goes, the memory traffic is."""
    n, _, ho, wo = grad_out.shape
    _, cin, h, w = input_shape
    (sh, sw), ((lh, hh, _), (lw, hw, _)) = geo.stride, geo.phases
    ah, aw = -(-h // sh), -(-w // sw)  # rows and columns of a phase
    kh, kw = hh - lh + 1, hw - lw + 1  # the window
    # im2col pads both sides alike: enough that row 0 reads offset lh (up) and row ah-1 reads ah-1+hh (down).
    ph, pw = max(0, -lh, ah + hh - ho), max(0, -lw, aw + hw - wo)
    bh, bw = ho + 2 * ph - kh + 1, wo + 2 * pw - kw + 1
    cols = _columns(grad_out, (kh, kw), (1, 1), (ph, pw), (1, 1), bh * bw, (kh, kw, ph, pw) == (1, 1, 0, 0))
    stacked = _phase_weight(weight, geo, groups, (kh, kw))
    if groups == 1:
        phases = torch.bmm(stacked.expand(n, -1, -1), cols)
    else:
        phases = torch.matmul(stacked, cols.view(n, groups, -1, bh * bw))
    top, left = lh + ph, lw + pw  # im2col's row top + a reads offset lh from row a
    # The (n, cin, sh, sw, bh, bw) product's window [top : top + ah, left : left + aw], permuted to
    # (n, cin, ah, sh, aw, sw): one strided view, one ATen call where a view, two slices and a permute are four.
    plane = bh * bw
    strides = (cin * sh * sw * plane, sh * sw * plane, bw, sw * plane, 1, plane)
    window = phases.as_strided((n, cin, ah, sh, aw, sw), strides, phases.storage_offset() + top * bw + left)
    grad_input = window.reshape(n, cin, ah * sh, aw * sw)
    return grad_input if (ah * sh, aw * sw) == (h, w) else grad_input[..., :h, :w]


_phase_cache: dict = {}


def _phase_weight(weight: torch.Tensor, geo: _Geometry, groups: int, window: tuple[int, int]) -> torch.Tensor:
    """The weight's taps stacked per phase for ``_phase_grad_input``: (Cin*sh*sw, Cout*kh*kw) rows (ci, rh, rw) and
    columns (co, u, v), or one such matrix per group; zero where phase (rh, rw) has no tap at window place (u, v).
    Indices and the mask of the places with no tap made once per shape, device and geometry; per call one gather
    and one fill (zeros written, not multiplied in: a weight that is not finite stays out of the phases it has
    no tap in, as in the native gradient)."""
    key = (weight.shape, weight.device, groups, geo.phases)
    cached = _phase_cache.get(key)
    if cached is None:
        cout, cin_g, kh, kw = weight.shape
        cout_g = cout // groups
        (sh, sw), (taps_h, taps_w) = geo.stride, (geo.phases[0][2], geo.phases[1][2])
        # (g, cin_g, cout_g, kh, kw): where weight[g*cout_g + co, ci, i, j] sits in the flattened weight
        where = torch.arange(weight.numel()).view(groups, cout_g, cin_g, kh, kw).transpose(1, 2)
        index = torch.full((groups, cin_g, sh, sw, cout_g, *window), -1)  # -1: no tap there, a zero
        for (rh, u), i in taps_h:
            for (rw, v), j in taps_w:
                index[:, :, rh, rw, :, u, v] = where[..., i, j]
        index = index.view(groups, cin_g * sh * sw, -1)
        index = index[0] if groups == 1 else index
        empty = index < 0
        cached = _phase_cache[key] = index.clamp(min=0).to(weight.device), empty.to(weight.device)
    index, empty = cached
    return weight.take(index).masked_fill_(empty, 0)


_flip_index_cache: dict = {}


def _flip_indices(weight: torch.Tensor, groups: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Indices that ``take`` turns a (Cout, Cin/g, kh, kw) weight with into the weight of its input gradient's
    convolution, flipped in space with input and output channels swapped within each group, as the matrix the GEMM
    wants ((Cin, Cout*kh*kw), or (g, Cin/g, Cout/g*kh*kw)); and the inverse, from that layout back to the weight's.
    Made once per shape and device: one gather instead of a transposing copy and a flip."""
    key = (weight.shape, weight.device, groups)
    indices = _flip_index_cache.get(key)
    if indices is None:
        cout, cin_g, kh, kw = weight.shape
        flip = torch.arange(weight.numel(), device=weight.device).view(groups, cout // groups, cin_g, kh, kw)
        flip = flip.transpose(1, 2).flip(3, 4).reshape(groups, cin_g, -1)
        flip = flip[0] if groups == 1 else flip
        unflip = torch.argsort(flip.flatten()).view(weight.shape)
        indices = _flip_index_cache[key] = flip, unflip
    return indices


def _columns(x, kernel, stride, padding, dilation, length, pointwise) -> torch.Tensor:
    """im2col: (N, C*kh*kw, Ho*Wo = length), rows in (c, i, j) order like the weight's (Cin, kh, kw)."""
    n, c, h, w = x.shape
    if pointwise:
        return x.view(n, c, length)  # a 1x1 stride-1 unpadded convolution needs no gather
    # PyTorch's CUDA im2col launches one kernel per image; channels are independent, so folding
    # the batch into them makes it one launch with the same (n, c, i, j) row order.
    # Written into a buffer of the final size: without out=, im2col allocates an input-sized
    # tensor and then grows it, copying the garbage across (a DtoD copy and a second allocation).
    k = kernel[0] * kernel[1]
    cols = x.new_empty((1, n * c * k, length))
    torch._C._nn.im2col(x.view(1, n * c, h, w), kernel, dilation, padding, stride, out=cols)
    return cols.view(n, c * k, length)


_get_matmul_precision = torch._C._get_fp32_precision_getter
_set_matmul_precision = torch._C._set_fp32_precision_setter


def _matmul_precision_is_cudnns(x: torch.Tensor) -> bool:
    """Whether float32 matrix products of ``x`` already compute as cuDNN's convolutions would, so that no precision
    has to be set around them: always off CUDA and outside float32."""
    if not x.is_cuda or x.dtype is not torch.float32:
        return True
    return _get_matmul_precision("cuda", "matmul") == ("tf32" if torch._C._get_cudnn_allow_tf32() else "ieee")


def _tf32_like_cudnn(x: torch.Tensor) -> str | None:
    """Make float32 matrix products use TF32 exactly when cuDNN convolutions would (``cudnn.allow_tf32``); returns
    the matmul precision to restore after, or None when nothing changed. The raw torch._C calls behind
    ``torch.backends.cuda.matmul.fp32_precision``, and no context manager: this runs twice per convolution."""
    if not x.is_cuda or x.dtype is not torch.float32:
        return None
    wanted = "tf32" if torch._C._get_cudnn_allow_tf32() else "ieee"
    saved = _get_matmul_precision("cuda", "matmul")
    if saved == wanted:
        return None
    _set_matmul_precision("cuda", "matmul", wanted)
    return saved


# -- patching torch.nn.Conv2d ------------------------------------------------------------------

_native_conv_forward = None  # the method enable() replaced; None while disabled


def _fallback_conv_forward(self, input, weight, bias):
    # Mirrors torch.nn.Conv2d._conv_forward, with conv2d above in place of F.conv2d.
    if self.padding_mode != "zeros":
        padded = F.pad(input, self._reversed_padding_repeated_twice, mode=self.padding_mode)
        return _conv2d(padded, weight, bias, _geometry(self.stride, 0, self.dilation, weight), self.groups)
    return _conv2d(input, weight, bias, _geometry(self.stride, self.padding, self.dilation, weight), self.groups)


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
    decided = configured("conv_fallback", mode, CONV_FALLBACK_MODES)
    if decided is not None:
        return decided
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
