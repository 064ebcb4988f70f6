"""The whole YOLOv8n training step with the fallbacks against native: the Conv2d fallback alone, and with the
batch-norm fallback too.

One step = forward, detection loss, backward and optimizer step (SGD with momentum and
Nesterov, as Ultralytics' default), batch 16 at 640x640 by default, on synthetic images and
boxes. Each precision (fp32, and fp16 under autocast with a GradScaler, as Ultralytics' AMP) is
timed native, with the conv fallback ("conv") and with both ("conv+bn"), from the same initial weights, in one
process; the ratio is a variant's median step time over native's. Before timing, one step of each is compared
with an IEEE float32 native step (TF32 off): the relative difference of the loss and of the flattened gradient.
Under fp16 the gradient is compared twice: as computed plainly, and with the loss scaled by 65536 as the
GradScaler scales it (the gradient unscaled after), which tells fp16 underflow apart from an error of the
fallback; on a GPU the conv fallback once more with ``allow_fp16_reduced_precision_reduction`` off (cuBLAS
accumulates in float32 throughout), which tells half-precision accumulation in its matrix products apart.

On a GPU each variant's step also gets its GPU kernel time (the device time of its kernels, from torch.profiler):
near the wall time the step is GPU-bound, well below it the host's work (Python, dispatch, launches) sets the pace.

Goals: issue 6, conv <= 1.8 x native; issue 40, conv+bn <= 1.15 x native, on an H100.

    python -m bench.conv_fallback                      # cuda, batch 16, imgsz 640
    python -m bench.conv_fallback --batch 16,32 --precisions fp16   # several batch sizes in one run
    python -m bench.conv_fallback --device cpu --batch 2 --imgsz 64 --steps 2 --rounds 1 --warmup 1   # smoke test
    python -m bench.conv_fallback --profile out/       # also writes a kernel table per run
    python -m bench.conv_fallback --host-overhead      # us per Conv2d forward+backward on tiny tensors, no model
    python -m bench.conv_fallback --bn-kernels         # ms per BatchNorm2d forward+backward by way, YOLOv8n shapes

``--host-overhead`` times one Conv2d module's forward and backward, native against the fallback, on tensors so
small (2x16x8x8) that the arithmetic is negligible: what remains is the host's work per convolution (Python, ATen
dispatch, kernel launches on a GPU), which is what the fallback adds to a launch-bound step (YOLOv8n has ~64 Conv2d).
On a CPU the native column is oneDNN's convolution, whose per-call setup is no reference for cuDNN's: compare the
fallback's figures (and ATen op counts) before and after a change there, and native against fallback on a GPU.
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import statistics
import sys
import time
from pathlib import Path


import torch

from worker.patches import batchnorm as bn_fallback
from worker.patches import conv2d as conv_fallback

VARIANTS = ("native", "conv", "conv+bn")  # which fallbacks are on
LOSS_SCALE = 2.0**16  # torch.amp.GradScaler's initial scale


def use(variant: str) -> None:
    """Turn the fallbacks of ``variant`` on and the others off."""
    (conv_fallback.enable if variant in ("conv", "conv+bn") else conv_fallback.disable)()
    (bn_fallback.enable if variant == "conv+bn" else bn_fallback.disable)()


def build_model(device: str):
    from ultralytics.cfg import get_cfg
    from ultralytics.nn.tasks import DetectionModel

    torch.manual_seed(0)
    model = DetectionModel("yolov8n.yaml", nc=80, verbose=False).to(device)
    model.args = get_cfg()  # the loss reads its gains (box, cls, dfl) from here
    model.train()
    return model


def synthetic_batch(batch: int, imgsz: int, device: str, boxes_per_image: int = 8) -> dict:
    g = torch.Generator().manual_seed(1)
    n = batch * boxes_per_image
    xy = torch.rand(n, 2, generator=g) * 0.8 + 0.1
    wh = torch.rand(n, 2, generator=g) * 0.2 + 0.02
    return {
        "img": torch.rand(batch, 3, imgsz, imgsz, generator=g).to(device),
        "batch_idx": torch.arange(batch).repeat_interleave(boxes_per_image).float().to(device),
        "cls": torch.randint(0, 80, (n, 1), generator=g).float().to(device),
        "bboxes": torch.cat([xy, wh], 1).to(device),
    }


class Step:
    """One training step of a model copy, in fp32 or fp16 autocast."""

    def __init__(self, model, amp: bool, device: str):
        self.model = model
        self.amp = amp
        self.device = device
        self.opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.937, nesterov=True)
        self.scaler = torch.amp.GradScaler(device, enabled=amp)

    def __call__(self, batch) -> torch.Tensor:
        with torch.autocast(self.device, dtype=torch.float16, enabled=self.amp):
            loss, _ = self.model.loss(batch)
            loss = loss.sum()
        self.scaler.scale(loss).backward()
        self.scaler.step(self.opt)
        self.scaler.update()
        self.opt.zero_grad(set_to_none=True)
        return loss.detach()


def sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def time_steps(step: Step, batch, warmup: int, steps: int, device: str) -> list[float]:
    for _ in range(warmup):
        step(batch)
    sync(device)
    times = []
    for _ in range(steps):
        if device == "cuda":
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            step(batch)
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end))
        else:
            t0 = time.perf_counter()
            step(batch)
            times.append((time.perf_counter() - t0) * 1e3)
    return times


def gradient(model, batch, amp: bool, device: str, scale: float = 1.0) -> tuple[float, torch.Tensor]:
    model.zero_grad(set_to_none=True)
    with torch.autocast(device, dtype=torch.float16, enabled=amp):
        loss, _ = model.loss(batch)
        loss = loss.sum()
    (loss * scale).backward()
    grads = torch.cat([p.grad.flatten().float() for p in model.parameters() if p.grad is not None]) / scale
    model.zero_grad(set_to_none=True)
    return loss.item(), grads


@contextlib.contextmanager
def ieee_fp32():
    """TF32 off for convolutions (and so the conv fallback's fp32 matmuls) and matmuls: a real error is not lost
    in TF32 rounding."""
    saved = torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32
    torch.backends.cudnn.allow_tf32 = torch.backends.cuda.matmul.allow_tf32 = False
    try:
        yield
    finally:
        torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32 = saved


@contextlib.contextmanager
def fp16_reductions(allowed: bool):
    matmul = torch.backends.cuda.matmul
    saved = matmul.allow_fp16_reduced_precision_reduction
    matmul.allow_fp16_reduced_precision_reduction = allowed
    try:
        yield
    finally:
        matmul.allow_fp16_reduced_precision_reduction = saved


def compare_numerics(base, batch, amp: bool, device: str) -> list[str]:
    """Each variant's loss and gradient against a float32 native step of the same weights, as lines to print."""

    def run(variant: str, amp: bool, scale: float = 1.0):
        use(variant)
        try:
            return gradient(copy.deepcopy(base), batch, amp, device, scale)
        finally:
            use("native")

    def rel(a: torch.Tensor, b: torch.Tensor) -> float:
        return ((a - b).norm() / b.norm()).item()

    with ieee_fp32():
        loss_ref, grad_ref = run("native", amp=False)
        got = {v: run(v, amp) for v in VARIANTS}
        lines = [
            "loss " + ", ".join(f"{v} {loss:.6g}" for v, (loss, _) in got.items()) + f" (fp32 native {loss_ref:.6g})",
            "grad rel err vs fp32 native: " + ", ".join(f"{v} {rel(g, grad_ref):.2e}" for v, (_, g) in got.items())
            + "; vs this precision's native: "
            + ", ".join(f"{v} {rel(g, got['native'][1]):.2e}" for v, (_, g) in got.items() if v != "native"),
        ]
        if amp:
            scaled = {v: run(v, amp, LOSS_SCALE) for v in VARIANTS}
            lines.append(f"loss scaled x{LOSS_SCALE:.0f} as GradScaler does: grad rel err vs fp32 native: "
                         + ", ".join(f"{v} {rel(g, grad_ref):.2e}" for v, (_, g) in scaled.items()))
            if device == "cuda":
                with fp16_reductions(False):
                    _, g = run("conv", amp)
                    _, gs = run("conv", amp, LOSS_SCALE)
                lines.append("conv with allow_fp16_reduced_precision_reduction off (fp32 accumulation): grad rel err "
                             f"vs fp32 native {rel(g, grad_ref):.2e} unscaled, {rel(gs, grad_ref):.2e} scaled")
    return lines


# (N, Cin, H, W, Cout, k, stride) of YOLOv8n layers at batch 16, 640: the first conv, a C2f
# bottleneck, a 1x1 at the smallest scale.
LAYER_SHAPES = [(16, 3, 640, 640, 16, 3, 2), (16, 32, 160, 160, 32, 3, 1), (16, 256, 20, 20, 256, 1, 1)]


def compare_layers(device: str, dtype: torch.dtype) -> None:
    """Error of fallback and native in ``dtype`` against an IEEE float32 reference, per layer."""
    import torch.nn.functional as F

    saved_tf32 = torch.backends.cudnn.allow_tf32
    torch.backends.cudnn.allow_tf32 = False
    try:
        for n, cin, h, w, cout, k, s in LAYER_SHAPES:
            x = torch.randn(n, cin, h, w, device=device)
            wt = torch.randn(cout, cin, k, k, device=device) / (cin * k * k) ** 0.5
            gy = torch.randn_like(F.conv2d(x, wt, None, s, k // 2))
            results = {}
            for label, fn, dt in (("ref", F.conv2d, torch.float32), ("native", F.conv2d, dtype), ("fallback", conv_fallback.conv2d, dtype)):
                xi = x.detach().to(dt).clone().requires_grad_()
                wi = wt.detach().to(dt).clone().requires_grad_()
                out = fn(xi, wi, None, s, k // 2)
                out.backward(gy.to(dt))
                results[label] = [t.float() for t in (out, xi.grad, wi.grad)]
            errs = {
                label: " ".join(f"{(a - r).norm() / r.norm():.1e}" for a, r in zip(results[label], results["ref"]))
                for label in ("native", "fallback")
            }
            print(f"  layer {cin}->{cout} k{k} s{s} at {h}x{w}: rel err out/dx/dw  native {errs['native']}  fallback {errs['fallback']}")
    finally:
        torch.backends.cudnn.allow_tf32 = saved_tf32


# (kernel, stride, bias, input channels) of the convolutions YOLOv8n is made of: 3x3 stride 1 and 2 (Conv, bias off
# before its BatchNorm), 1x1 (C2f, SPPF; with bias at the Detect head's outputs), and the first layer (3 channels in,
# an input that needs no gradient: the images). None: as many as the tensor's.
HOST_CASES = [(3, 1, False, None), (3, 2, False, None), (1, 1, False, None), (1, 1, True, None), (3, 1, True, None),
              (3, 2, False, 3)]


def host_overhead(device: str, precisions: list[str], shape=(2, 16, 8, 8), calls: int = 200, rounds: int = 7) -> None:
    """Print microseconds per Conv2d forward+backward, native against the fallback, and ATen ops per call
    (kernels too on a GPU). fp16 is under autocast, as in training with AMP."""
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile

    n, c, h, w = shape
    if device == "cpu":
        torch.set_num_threads(1)  # no intra-op threads to wake: per-call work, steadier on a shared machine
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device == "cuda" else [])

    def fwd_bwd(conv, x, gy, amp: bool) -> None:
        with torch.autocast(device, dtype=torch.float16, enabled=amp):
            out = conv(x)
        out.backward(gy)

    def timed(conv, x, gy, amp: bool) -> float:
        sync(device)
        t0 = time.perf_counter()
        for _ in range(calls):
            fwd_bwd(conv, x, gy, amp)
        sync(device)
        return (time.perf_counter() - t0) / calls * 1e6

    def counts(conv, x, gy, amp: bool) -> str:
        with profile(activities=activities) as prof:
            fwd_bwd(conv, x, gy, amp)
            sync(device)
        events = prof.events()
        aten = [e for e in events if e.name.startswith("aten::")]
        # Called from Python or autograd's engine, not from within another ATen op: what costs a call each.
        outer = sum(1 for e in aten if e.cpu_parent is None or not e.cpu_parent.name.startswith("aten::"))
        kernels = sum(1 for e in events if e.device_type == DeviceType.CUDA)
        return f"{outer}/{len(aten)}" + (f"/{kernels}" if device == "cuda" else "")

    what = "aten ops outermost/all" + ("/GPU kernels" if device == "cuda" else "")
    print(f"host overhead per Conv2d forward+backward, input {n}x{c}x{h}x{w} (requires grad), {c} output channels, "
          f"best of {rounds} rounds of {calls} calls (native and fallback alternating), device {device}, "
          f"torch threads {torch.get_num_threads()}")
    for precision in precisions:
        amp = precision == "fp16"
        print(f"{'[' + precision + '] conv':28s} {'native us':>10s} {'fallback us':>12s} {'added us':>9s} {'ratio':>6s}"
              f"   {what}, native | fallback")
        totals = {"native": 0.0, "fallback": 0.0}
        for k, s, bias, cin in HOST_CASES:
            torch.manual_seed(0)
            conv = torch.nn.Conv2d(cin or c, c, k, s, k // 2, bias=bias).to(device)
            x = torch.randn(n, cin or c, h, w, device=device, requires_grad=cin is None)
            gy = torch.randn_like(conv(x)).to(torch.float16 if amp else torch.float32)
            best = {"native": float("inf"), "fallback": float("inf")}
            count = {}
            try:
                for round_ in range(rounds):  # the least disturbed round: this measures work, not a neighbour's load
                    for variant in best:
                        use("conv" if variant == "fallback" else "native")
                        if round_ == 0:
                            for _ in range(20):
                                fwd_bwd(conv, x, gy, amp)
                            count[variant] = counts(conv, x, gy, amp)
                        best[variant] = min(best[variant], timed(conv, x, gy, amp))
            finally:
                use("native")
            tn, tf = best["native"], best["fallback"]
            for variant in totals:
                totals[variant] += best[variant]
            label = f"{k}x{k} stride {s}{' bias' if bias else ''}{f' from {cin} (first)' if cin else ''}"
            print(f"{label:28s} {tn:10.1f} {tf:12.1f} {tf - tn:9.1f} {tf / tn:6.2f}   {count['native']} | {count['fallback']}",
                  flush=True)
        print(f"{'sum':28s} {totals['native']:10.1f} {totals['fallback']:12.1f} "
              f"{totals['fallback'] - totals['native']:9.1f} {totals['fallback'] / totals['native']:6.2f}")


# (N, C, H, W) of YOLOv8n's batch norms at batch 16, 640 px: the largest planes, where the time is.
BN_SHAPES = [(16, 16, 320, 320), (16, 32, 160, 160), (16, 64, 80, 80), (16, 128, 40, 40), (16, 256, 20, 20)]


def bn_kernels(device: str, precisions: list[str], calls: int = 20) -> None:
    """Milliseconds per training-mode BatchNorm2d forward+backward at YOLOv8n's shapes, by way: native (cuDNN),
    the fallback as it is (``batch_norm``: rows of channels where ``is_rows_route`` says so, else ATen's NCHW
    kernels), ATen's NCHW kernels alone (one block per channel), the fallback on a channels-last copy (ATen's
    channels-last kernels, the copies to and from NCHW included), and statistics by var_mean with the rest in
    elementwise autograd ops. The ``rows`` line says which shapes the fallback routes."""
    import torch.nn.functional as F

    def var_mean_bn(x, weight, bias, eps=1e-5):
        var, mean = torch.var_mean(x, (0, 2, 3), correction=0, keepdim=True)
        scale = weight.view(1, -1, 1, 1) * torch.rsqrt(var + eps)
        return (x - mean) * scale + bias.view(1, -1, 1, 1)

    def nchw_bn(x, weight, bias, rm, rv):
        with torch.backends.cudnn.flags(enabled=False):
            return torch.batch_norm(x, weight, bias, rm, rv, True, 0.1, 1e-5, False)

    print("rows of channels (the fallback's route) at: "
          + ", ".join("x".join(map(str, s)) for s in BN_SHAPES if bn_fallback.is_rows_route(s)))
    ways = {
        "native": lambda x, w, b, rm, rv: F.batch_norm(x, rm, rv, w, b, True),
        "fallback": lambda x, w, b, rm, rv: bn_fallback.batch_norm(x, rm, rv, w, b, True),
        "nchw": lambda x, w, b, rm, rv: nchw_bn(x, w, b, rm, rv),
        "fallback-cl": lambda x, w, b, rm, rv: bn_fallback.batch_norm(
            x.contiguous(memory_format=torch.channels_last), rm, rv, w, b, True).contiguous(),
        "var_mean": lambda x, w, b, rm, rv: var_mean_bn(x, w, b),
    }
    for precision in precisions:
        dtype = torch.float16 if precision == "fp16" else torch.float32
        print(f"[{precision}] BatchNorm2d forward+backward ms/call, " + " ".join(f"{w:>12s}" for w in ways))
        total = dict.fromkeys(ways, 0.0)
        for shape in BN_SHAPES:
            c = shape[1]
            x = torch.randn(shape, device=device, dtype=dtype, requires_grad=True)
            gy = torch.randn(shape, device=device, dtype=dtype)
            w = torch.rand(c, device=device, requires_grad=True)
            b = torch.rand(c, device=device, requires_grad=True)
            rm, rv = torch.zeros(c, device=device), torch.ones(c, device=device)
            row = {}
            for name, fn in ways.items():
                for _ in range(3):
                    fn(x, w, b, rm, rv).backward(gy)
                sync(device)
                t0 = time.perf_counter()
                for _ in range(calls):
                    fn(x, w, b, rm, rv).backward(gy)
                sync(device)
                row[name] = (time.perf_counter() - t0) / calls * 1e3
                total[name] += row[name]
            print(f"  {'x'.join(map(str, shape)):>18s} " + " ".join(f"{row[n]:12.3f}" for n in ways), flush=True)
        print(f"  {'sum':>18s} " + " ".join(f"{total[n]:12.3f}" for n in ways))


KERNEL_STEPS = 3  # profiled steps whose device time is averaged


def gpu_kernel_ms(step: Step, batch, device: str, steps: int = KERNEL_STEPS) -> float:
    """Device time of a step's kernels, copies and memsets (the sum over them, from torch.profiler), in ms."""
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile

    step(batch)
    sync(device)
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for _ in range(steps):
            step(batch)
        sync(device)
    device_us = sum(e.self_device_time_total for e in prof.key_averages() if e.device_type == DeviceType.CUDA)
    return device_us / steps / 1e3


def profile_step(step: Step, batch, path: Path) -> None:
    from torch.profiler import ProfilerActivity, profile

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if torch.cuda.is_available() else [])
    with profile(activities=activities) as prof:
        step(batch)
        sync(step.device)
    sort = "cuda_time_total" if torch.cuda.is_available() else "cpu_time_total"
    path.write_text(prof.key_averages().table(sort_by=sort, row_limit=40))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--batch", default="16", help="batch size, or several comma-separated: 16,32")
    parser.add_argument("--imgsz", type=int, default=640)
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--steps", type=int, default=20, help="timed steps per round")
    parser.add_argument("--rounds", type=int, default=3, help="alternations of native and fallback")
    parser.add_argument("--precisions", default="fp32,fp16", help="comma-separated: fp32, fp16")
    parser.add_argument("--check-layers", action="store_true", help="per-layer error against a float32 reference")
    parser.add_argument("--profile", type=Path, help="directory for one profiled step per run")
    parser.add_argument("--matmul-tf32", action="store_true",
                        help="float32 matmuls in TF32 for the whole run (as cuDNN's convolutions): the conv fallback's "
                        "1x1 convolutions then skip its autograd Function in fp32, as they do in fp16")
    parser.add_argument("--host-overhead", action="store_true",
                        help="only time one Conv2d forward+backward on tiny tensors, native against the fallback")
    parser.add_argument("--bn-kernels", action="store_true",
                        help="only time one BatchNorm2d forward+backward at YOLOv8n's shapes, by way (see bn_kernels)")
    args = parser.parse_args(argv)
    if args.bn_kernels:
        bn_kernels(args.device, args.precisions.split(","))
        return 0
    if args.matmul_tf32:
        torch.backends.cuda.matmul.allow_tf32 = True
    if args.host_overhead:
        host_overhead(args.device, args.precisions.split(","))
        return 0

    device = args.device
    batch_sizes = [int(b) for b in str(args.batch).split(",")]
    name = torch.cuda.get_device_name() if device == "cuda" else "cpu"
    print(f"device {name}; torch {torch.__version__}; batch {args.batch}; imgsz {args.imgsz}; "
          f"median of {args.rounds}x{args.steps} steps after {args.warmup} warm-up; "
          f"cudnn.allow_tf32={torch.backends.cudnn.allow_tf32} (the fallback's fp32 matmuls follow it), "
          f"matmul.allow_tf32={torch.backends.cuda.matmul.allow_tf32}")
    base = build_model(device)
    rows = []
    for batch_size in batch_sizes:
        batch = synthetic_batch(batch_size, args.imgsz, device)
        for precision in args.precisions.split(","):
            amp = precision == "fp16"
            tag = f"[b{batch_size} {precision}]"
            if batch_size == batch_sizes[0]:  # the numerics once, at the first batch size
                for line in compare_numerics(base, batch, amp, device):
                    print(f"{tag} {line}", flush=True)
                if args.check_layers:
                    compare_layers(device, torch.float16 if amp else torch.float32)
            # The variants alternate in rounds, so that a drift of the machine (clocks, a neighbour) falls on all;
            # the figure is the median over all timed steps of each.
            steps = {v: Step(copy.deepcopy(base), amp, device) for v in VARIANTS}
            times = {v: [] for v in steps}
            for round_ in range(args.rounds):
                for variant, step in steps.items():
                    use(variant)
                    times[variant] += time_steps(step, batch, args.warmup if round_ == 0 else 1, args.steps, device)
            use("native")
            medians = {v: statistics.median(t) for v, t in times.items()}
            kernels = {}
            if device == "cuda":
                for variant, step in steps.items():
                    use(variant)
                    kernels[variant] = gpu_kernel_ms(step, batch, device)
                use("native")
            for variant, t in times.items():
                q = statistics.quantiles(t, n=4) if len(t) > 1 else [t[0]] * 3
                gpu = (f"; GPU kernels {kernels[variant]:.2f} ms/step, {kernels[variant] / medians[variant]:.0%} of it"
                       if variant in kernels else "")
                print(f"{tag} {variant:8s} median {medians[variant]:8.2f} ms/step "
                      f"(quartiles {q[0]:.2f}..{q[2]:.2f}, {len(t)} steps){gpu}", flush=True)
            if args.profile:
                args.profile.mkdir(parents=True, exist_ok=True)
                for variant, step in steps.items():
                    use(variant)
                    profile_step(step, batch, args.profile / f"profile_b{batch_size}_{precision}_{variant.replace('+', '_')}.txt")
                use("native")
            if device == "cuda":
                print(f"{tag} peak memory of the runs {torch.cuda.max_memory_allocated() / 2**30:.2f} GiB")
                torch.cuda.reset_peak_memory_stats()
            del steps
            rows.append((batch_size, precision, medians, kernels))

    print(f"\n{'batch':>5s} {'precision':9s} " + " ".join(f"{v + ' ms':>11s}" for v in VARIANTS)
          + " " + " ".join(f"{v + '/native':>15s}" for v in VARIANTS[1:])
          + ("   GPU kernels ms/step " + " ".join(VARIANTS) if device == "cuda" else "")
          + f"   ({name}, imgsz {args.imgsz})")
    for batch_size, precision, medians, kernels in rows:
        gpu = ("   " + " / ".join(f"{kernels[v]:.2f}" for v in VARIANTS)) if kernels else ""
        print(f"{batch_size:5d} {precision:9s} " + " ".join(f"{medians[v]:11.2f}" for v in VARIANTS)
              + " " + " ".join(f"{medians[v] / medians['native']:15.2f}" for v in VARIANTS[1:]) + gpu)
    if device == "cuda":
        print("GPU kernels: the device time of all kernels and copies of a step (torch.profiler, mean of "
              f"{KERNEL_STEPS} steps); near the wall time the step is GPU-bound, well below it the host's launches "
              "set the pace")
    return 0

if __name__ == "__main__":
    sys.exit(main())
