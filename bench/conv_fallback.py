"""The whole YOLOv8n training step with the Conv2d fallback against native convolution.

One step = forward, detection loss, backward and optimizer step (SGD with momentum and
Nesterov, as Ultralytics' default), batch 16 at 640x640 by default, on synthetic images and
boxes. Each precision (fp32, and fp16 under autocast with a GradScaler, as Ultralytics' AMP) is
timed native, then with the fallback, from the same initial weights, in one process; the
ratio is fallback / native of the median step time. Before timing, one step of each is
compared: the relative difference of the loss and of the flattened gradient.

Goal (issue 6): ratio <= 1.8 on an H100.

    python -m bench.conv_fallback                      # cuda, batch 16, imgsz 640
    python -m bench.conv_fallback --device cpu --batch 2 --imgsz 128 --steps 3   # smoke test
    python -m bench.conv_fallback --profile out/       # also writes a kernel table per run
"""

from __future__ import annotations

import argparse
import copy
import statistics
import sys
import time
from pathlib import Path


import torch

from worker.patches import conv2d as conv_fallback


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


def gradient(model, batch, amp: bool, device: str) -> tuple[float, torch.Tensor]:
    model.zero_grad(set_to_none=True)
    with torch.autocast(device, dtype=torch.float16, enabled=amp):
        loss, _ = model.loss(batch)
        loss = loss.sum()
    loss.backward()
    grads = torch.cat([p.grad.flatten().float() for p in model.parameters() if p.grad is not None])
    model.zero_grad(set_to_none=True)
    return loss.item(), grads


def compare_numerics(base, batch, amp: bool, device: str) -> str:
    # TF32 off on both sides for this check, so that a real error is not lost in TF32 rounding.
    saved_tf32 = torch.backends.cudnn.allow_tf32
    torch.backends.cudnn.allow_tf32 = False
    conv_fallback.disable()
    loss_n, grad_n = gradient(copy.deepcopy(base), batch, amp, device)
    conv_fallback.enable()
    loss_f, grad_f = gradient(copy.deepcopy(base), batch, amp, device)
    conv_fallback.disable()
    torch.backends.cudnn.allow_tf32 = saved_tf32
    rel_grad = ((grad_f - grad_n).norm() / grad_n.norm()).item()
    return f"loss native {loss_n:.6g} fallback {loss_f:.6g} (rel {abs(loss_f - loss_n) / abs(loss_n):.2e}), grad rel diff {rel_grad:.2e}"


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
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--imgsz", type=int, default=640)
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--steps", type=int, default=20, help="timed steps per round")
    parser.add_argument("--rounds", type=int, default=3, help="alternations of native and fallback")
    parser.add_argument("--precisions", default="fp32,fp16", help="comma-separated: fp32, fp16")
    parser.add_argument("--check-layers", action="store_true", help="per-layer error against a float32 reference")
    parser.add_argument("--profile", type=Path, help="directory for one profiled step per run")
    args = parser.parse_args(argv)

    device = args.device
    name = torch.cuda.get_device_name() if device == "cuda" else "cpu"
    print(f"device {name}; torch {torch.__version__}; batch {args.batch}; imgsz {args.imgsz}; "
          f"median of {args.rounds}x{args.steps} steps after {args.warmup} warm-up; "
          f"cudnn.allow_tf32={torch.backends.cudnn.allow_tf32} (the fallback's fp32 matmuls follow it)")
    base = build_model(device)
    batch = synthetic_batch(args.batch, args.imgsz, device)
    rows = []
    for precision in args.precisions.split(","):
        amp = precision == "fp16"
        print(f"[{precision}] numerics: {compare_numerics(base, batch, amp, device)}", flush=True)
        if args.check_layers:
            compare_layers(device, torch.float16 if amp else torch.float32)
        # Native and fallback alternate in rounds, so that a drift of the machine (clocks, a
        # neighbour) falls on both; the figure is the median over all timed steps of each.
        steps = {label: Step(copy.deepcopy(base), amp, device) for label in ("native", "fallback")}
        times = {label: [] for label in steps}
        for round_ in range(args.rounds):
            for label, step in steps.items():
                (conv_fallback.enable if label == "fallback" else conv_fallback.disable)()
                times[label] += time_steps(step, batch, args.warmup if round_ == 0 else 1, args.steps, device)
        medians = {label: statistics.median(t) for label, t in times.items()}
        for label, t in times.items():
            print(f"[{precision}] {label:8s} median {medians[label]:8.2f} ms/step "
                  f"(quartiles {statistics.quantiles(t, n=4)[0]:.2f}..{statistics.quantiles(t, n=4)[2]:.2f}, "
                  f"{len(t)} steps)", flush=True)
        if args.profile:
            args.profile.mkdir(parents=True, exist_ok=True)
            for label, step in steps.items():
                (conv_fallback.enable if label == "fallback" else conv_fallback.disable)()
                profile_step(step, batch, args.profile / f"profile_{precision}_{label}.txt")
        if device == "cuda":
            print(f"[{precision}] peak memory of both runs {torch.cuda.max_memory_allocated() / 2**30:.2f} GiB")
            torch.cuda.reset_peak_memory_stats()
        del steps
        conv_fallback.disable()
        rows.append((precision, medians["native"], medians["fallback"]))

    print(f"\n{'precision':10s} {'native ms':>10s} {'fallback ms':>12s} {'ratio':>6s}   ({name}, batch {args.batch}, imgsz {args.imgsz})")
    for precision, native, fallback in rows:
        print(f"{precision:10s} {native:10.2f} {fallback:12.2f} {fallback / native:6.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
