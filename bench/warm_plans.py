"""What a launch's first step costs after the standby's (issue 59.1): the launch's device warm-up at the training's
batch (worker/startup/device_warmup.py), timed after a standby-like first step made each way, side by side in one run,
each way in a fresh process as an attempt is one:

- ``none``: no step before it (a cold start's warm-up);
- ``other-flags-1``: a step at one image under torch's defaults, then the trainer's ``init_seeds`` (deterministic
  algorithms): the standby before 59.1;
- ``flags-1``: a step at one image under the trainer's flags (the standby now, where the batch does not fit in its grant);
- ``flags-batch``: a step at the training's batch under the trainer's flags (the standby with room, or the
  warm-up it runs at the verdict).

Each process prints the launch's warm-up seconds; rounds interleave the ways and the medians are printed.

    python3 -m bench.warm_plans --rounds 3        # a GPU: YOLOv8n, 640 px, batch 32, AMP
    python3 -m bench.warm_plans --first-step      # then the parts of the training's first two steps

``--first-step`` runs the warm-up each way the worker can, a fresh process each, rounds interleaved: in a thread
beside the training's thread (a cold launch's) and on the training's thread itself (``run_here``: the ready
standby's), as cuDNN's plans for the forward are a thread's own; then on the training thread with a held loader's
first batches pinned beside the first steps (as a standby fed at the verdict pins them), into new pinned blocks or
into blocks pinned ahead (worker/loading/pinned_ahead.py).
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import threading
import time

from bench.harness import ROOT

WAYS = ("none", "other-flags-1", "flags-1", "flags-batch")


def one(way: str, batch: int, imgsz: int) -> dict[str, float]:
    import torch
    from ultralytics.cfg import get_cfg
    from ultralytics.nn.tasks import DetectionModel
    from ultralytics.utils import DEFAULT_CFG
    from ultralytics.utils.torch_utils import init_seeds

    from worker.startup.device_warmup import DeviceWarmUp

    device = torch.device("cuda:0" if torch.cuda.is_available() else "cpu")
    args = get_cfg(DEFAULT_CFG, {})
    model = DetectionModel("yolov8n.yaml", nc=80, verbose=False).to(device)
    model.args = args
    dtype = torch.float16 if device.type == "cuda" else None
    before = {"none": None, "other-flags-1": 1, "flags-1": 1, "flags-batch": batch}[way]
    if way != "other-flags-1":
        init_seeds(1, deterministic=args.deterministic)
    figures = {}
    if before is not None:
        began = time.monotonic()
        warm = DeviceWarmUp(model, (before, 3, imgsz, imgsz), device, dtype).start()
        warm.finish()
        figures["standby_step"] = time.monotonic() - began
    init_seeds(1, deterministic=args.deterministic)  # the launch's trainer
    began = time.monotonic()
    warm = DeviceWarmUp(model, (batch, 3, imgsz, imgsz), device, dtype).start()
    warm.finish()
    assert warm.error is None, warm.error
    figures["launch_warmup"] = time.monotonic() - began
    return figures


WHERE = ("thread", "here", "here-pinning", "here-pinned-ahead")
LABELS = {"thread": "in a thread", "here": "on the training thread", "here-pinning": "+ batches pinned beside",
          "here-pinned-ahead": "+ the same, pinned ahead"}


def first_step(batch: int, imgsz: int, where: str) -> dict[str, float]:
    """After the launch's warm-up at the training's batch (the verdict's, where the standby ran it), the parts of
    the training's first two steps as Ultralytics' loop makes them, each part synchronized: what the warm-up leaves
    to the first step (the optimizer's state and kernels, the gradient scaler's, the EMA's, a real loss's)."""
    import torch
    from ultralytics.cfg import get_cfg
    from ultralytics.nn.tasks import DetectionModel
    from ultralytics.utils import DEFAULT_CFG
    from ultralytics.utils.torch_utils import ModelEMA, init_seeds

    from worker.startup.device_warmup import DeviceWarmUp

    device = torch.device("cuda:0" if torch.cuda.is_available() else "cpu")
    args = get_cfg(DEFAULT_CFG, {})
    init_seeds(1, deterministic=args.deterministic)
    model = DetectionModel("yolov8n.yaml", nc=80, verbose=False).to(device)
    model.args = args
    amp = device.type == "cuda"
    warm = DeviceWarmUp(model, (batch, 3, imgsz, imgsz), device, torch.float16 if amp else None)
    began = time.monotonic()
    (warm.start() if where == "thread" else warm.run_here()).finish()
    figures: dict[str, float] = {"warm_up": time.monotonic() - began}
    criterion = model.init_criterion()
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.001, fused=amp)  # as Ultralytics builds it on a GPU
    scaler = torch.amp.GradScaler(device.type, enabled=amp)
    ema = ModelEMA(model)

    def timed(name: str, fn) -> None:
        began = time.monotonic()
        fn()
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        figures[name] = figures.get(name, 0.0) + time.monotonic() - began

    pinned: list = []
    pinner = None
    if where.endswith(("pinning", "pinned-ahead")) and device.type == "cuda":
        # A held loader fed at the verdict: its pin-memory thread pins its first workers x prefetch batches while
        # the first step runs (8 workers, prefetch 2), into blocks made now or (pinned ahead) cached before.
        from worker.loading.pinned_ahead import pin_ahead

        count = 8 * 2 + 1
        if where.endswith("pinned-ahead"):
            pin_ahead(count, batch, 3, imgsz)
        stats = torch.cuda.host_memory_stats()
        made = stats.get("num_host_alloc", 0)

        def pin() -> None:
            began = time.monotonic()
            pinned.extend(pin_ahead(count, batch, 3, imgsz))  # each a copy into a block of its own, as the pin thread's
            figures["pinning_beside"] = time.monotonic() - began

        pinner = threading.Thread(target=pin)
        pinner.start()
    for step in (1, 2):
        n = 3 * batch  # three boxes an image, as a real batch has several
        images = torch.rand(batch, 3, imgsz, imgsz, device=device)
        targets = {"img": images, "batch_idx": torch.arange(batch, device=device).repeat_interleave(3).float(),
                   "cls": torch.randint(0, 80, (n, 1), device=device).float(),
                   "bboxes": torch.rand(n, 4, device=device) * 0.5 + 0.25}
        held = {}

        def forward():
            with torch.autocast(device.type, enabled=amp):
                held["loss"] = criterion(model(images), targets)[0].sum()

        def optimizer_step():
            scaler.unscale_(optimizer)
            torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm=10.0)
            scaler.step(optimizer)
            scaler.update()
            optimizer.zero_grad()

        timed(f"step{step}_forward_loss", forward)
        timed(f"step{step}_backward", lambda: scaler.scale(held["loss"]).backward())
        timed(f"step{step}_optimizer", optimizer_step)
        timed(f"step{step}_ema", lambda: ema.update(model))
    if pinner is not None:
        pinner.join()
        figures["pinned_blocks_made"] = torch.cuda.host_memory_stats().get("num_host_alloc", 0) - made
    return figures


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--imgsz", type=int, default=640)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--one", choices=WAYS)
    parser.add_argument("--first-step", action="store_true", help="the parts of the first two steps after it")
    parser.add_argument("--one-first-step", choices=WHERE)
    args = parser.parse_args()
    if args.one_first_step:
        print(json.dumps(first_step(args.batch, args.imgsz, args.one_first_step)))
        return
    if args.first_step:
        runs: dict[str, list[dict[str, float]]] = {w: [] for w in WHERE}
        for _ in range(args.rounds):
            for where in WHERE:
                done = subprocess.run([sys.executable, "-m", "bench.warm_plans", "--one-first-step", where, "--batch",
                                       str(args.batch), "--imgsz", str(args.imgsz)], cwd=ROOT, capture_output=True,
                                      text=True, check=True)
                runs[where].append(json.loads(done.stdout.strip().splitlines()[-1]))
        print(f"batch {args.batch}, {args.imgsz} px, {args.rounds} rounds, a fresh process each: the warm-up, then "
              f"the first two steps' parts (median, min-max), by where the warm-up ran")
        print(f"  {'part':22} " + "  ".join(f"{LABELS[w]:>26}" for w in WHERE))
        for name in dict.fromkeys(k for w in WHERE for k in runs[w][0]):
            cells = []
            for where in WHERE:
                seen = [r[name] for r in runs[where] if name in r]
                unit = "" if name.endswith("_made") else " s"  # a count, not seconds
                cells.append(f"{statistics.median(seen):7.3f}{unit} ({min(seen):.3f}-{max(seen):.3f})" if seen else "")
            print(f"  {name:22} " + "  ".join(f"{c:>26}" for c in cells))
        return
    if args.one:
        print(json.dumps(one(args.one, args.batch, args.imgsz)))
        return
    seen: dict[str, list[dict[str, float]]] = {w: [] for w in WAYS}
    for _ in range(args.rounds):
        for way in WAYS:
            done = subprocess.run([sys.executable, "-m", "bench.warm_plans", "--one", way, "--batch", str(args.batch),
                                   "--imgsz", str(args.imgsz)], cwd=ROOT, capture_output=True, text=True, check=True)
            seen[way].append(json.loads(done.stdout.strip().splitlines()[-1]))
    print(f"batch {args.batch}, {args.imgsz} px, {args.rounds} rounds: the launch's warm-up (median, min-max) after")
    for way, runs in seen.items():
        launch = [r["launch_warmup"] for r in runs]
        step = [r["standby_step"] for r in runs if "standby_step" in r]
        print(f"  {way:14} {statistics.median(launch):6.2f} s ({min(launch):.2f}-{max(launch):.2f})"
              + (f"   the step before it {statistics.median(step):.2f} s" if step else ""))


if __name__ == "__main__":
    main()
