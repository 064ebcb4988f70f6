"""The isolated loader's start (issue 29): the first batch of Ultralytics' training loader with its workers forked,
spawned, or forked from a preloaded forkserver, side by side in one run, each in a fresh process.

Each measurement is a process of its own (``--one METHOD``), as a worker attempt is: it imports torch and
Ultralytics; for "forkserver" it starts the server with the worker's preload (worker/loading/loaders.py) before anything
touches the device, and waits until its imports are done (``server ready``: the cost a standby pays ahead); then it
builds a model on the device and runs it once (on a GPU: the CUDA runtime a forked worker inherits), builds the
training loader (``--workers`` processes, the embedded demo at ``--imgsz``, mosaic and all), and times its first batch
(the workers' start) and its samples/s over ``--batches`` batches after the ones prefetched meanwhile. Also (issue
49): ``forkserver-forked``, the server forked from this process (a DDP rank's, worker/loading/loaders.py); ``threads``, the
threads loader (``--threads``), and ``threads-all-at-once``, its threads each handed their first batches at once. Rounds are
interleaved; the best round of each method is printed, with the ratios to fork.

    .venv/bin/python -m bench.first_batch                 # the CPU demo: 2 workers, 64 px
    .venv/bin/python -m bench.first_batch --methods forkserver,forkserver-forked,threads,threads-all-at-once
    python3 -m bench.first_batch --gpu                    # a GPU: 8 workers, 640 px, batch 32, 1,024 images
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

from bench.harness import ROOT

os.environ.setdefault("YOLO_OFFLINE", "1")
os.environ.setdefault("MPLBACKEND", "Agg")

METHODS = ("fork", "spawn", "forkserver", "forkserver-forked", "threads", "threads-all-at-once")


def endless(loader):
    while True:
        yield from loader


def one(method: str, args: argparse.Namespace) -> dict[str, float]:
    """One measurement in this process, printed as a JSON line."""
    began = time.perf_counter()
    import torch
    from ultralytics.cfg import get_cfg
    from ultralytics.data.build import build_dataloader, build_yolo_dataset
    from ultralytics.data.utils import check_det_dataset
    from ultralytics.nn.tasks import DetectionModel

    from worker.startup.demo_data import ensure_demo_dataset
    from worker.loading.loaders import start_forkserver, start_workers_with

    result = {"imports": time.perf_counter() - began}
    if method.startswith("forkserver"):
        import multiprocessing

        started = time.perf_counter()
        start_forkserver(fork=method == "forkserver-forked")
        ready = multiprocessing.get_context("forkserver").Process(target=time.sleep, args=(0,))
        ready.start()  # served once the server's imports are done
        ready.join()
        result["server_ready"] = time.perf_counter() - started
    device = torch.device("cuda:0" if args.gpu else "cpu")
    model = DetectionModel("yolov8n.yaml", verbose=False).to(device)
    with torch.no_grad():
        model(torch.zeros(1, 3, args.imgsz, args.imgsz, device=device))
    data = check_det_dataset(str(ensure_demo_dataset(train_images=args.images, size=args.imgsz)))
    torch.manual_seed(0)
    cfg = get_cfg(overrides={"imgsz": args.imgsz, "task": "detect"})
    dataset = build_yolo_dataset(cfg, data["train"], args.batch, data, mode="train")
    loader = build_dataloader(dataset, args.batch, args.workers, shuffle=True, rank=-1, device=str(device))
    if method.startswith("threads"):
        from worker.loading import thread_loader

        if method == "threads-all-at-once":  # every thread's first batches handed over at its start
            thread_loader.START_WINDOW = 1 << 30
        loader = thread_loader.thread_loader_from(loader, args.threads or os.cpu_count() or 1)
    else:
        start_workers_with(loader, method.split("-")[0])
    started = time.perf_counter()
    batches = endless(loader)
    next(batches)
    result["first_batch"] = time.perf_counter() - started
    for _ in range(2 * getattr(loader, "threads", args.workers)):  # what was prefetched while the rest started
        next(batches)
    result["to_prefetched"] = time.perf_counter() - started  # the start's whole cost, not its first batch alone
    started, samples = time.perf_counter(), 0
    for _ in range(args.batches):
        samples += len(next(batches)["im_file"])
    result["samples_s"] = samples / (time.perf_counter() - started)
    loader.close()
    return result


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--gpu", action="store_true", help="cuda:0, 640 px, batch 32, 8 workers, 1,024 images")
    parser.add_argument("--workers", type=int)
    parser.add_argument("--imgsz", type=int)
    parser.add_argument("--batch", type=int)
    parser.add_argument("--images", type=int)
    parser.add_argument("--batches", type=int, default=60, help="timed after the first and the prefetched")
    parser.add_argument("--threads", type=int, help="the threads loader's pool (default: the CPU count)")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--methods", default="fork,spawn,forkserver")
    parser.add_argument("--one", choices=METHODS, help=argparse.SUPPRESS)
    args = parser.parse_args()
    preset = {"workers": 8, "imgsz": 640, "batch": 32, "images": 1024} if args.gpu else \
        {"workers": 2, "imgsz": 64, "batch": 4, "images": 128}
    for key, value in preset.items():
        if getattr(args, key) is None:
            setattr(args, key, value)
    if args.one:
        print(json.dumps(one(args.one, args)), flush=True)
        return 0
    methods = args.methods.split(",")
    print(f"first batch of Ultralytics' training loader, {args.workers} workers, {args.imgsz} px, batch {args.batch}, "
          f"{args.images} images, {'cuda:0' if args.gpu else 'cpu'}; best of {args.rounds} rounds", flush=True)
    best: dict[str, dict[str, float]] = {}
    flags = [f"--{k}={getattr(args, k)}" for k in ("workers", "imgsz", "batch", "images", "batches")] + \
        ([f"--threads={args.threads}"] if args.threads else [])
    for _ in range(args.rounds):
        for method in methods:
            out = subprocess.run([sys.executable, "-m", "bench.first_batch", "--one", method, *flags] + (["--gpu"] if args.gpu else []),
                                 capture_output=True, text=True, cwd=ROOT)
            lines = [line for line in out.stdout.splitlines() if line.startswith("{")]
            if out.returncode != 0 or not lines:
                print(f"{method}: failed ({out.returncode}): {out.stderr[-800:]}", flush=True)
                continue
            got = json.loads(lines[-1])
            print(f"  {method}: " + ", ".join(f"{k} {v:.2f}" for k, v in got.items()), flush=True)
            if method not in best or got["first_batch"] < best[method]["first_batch"]:
                best[method] = got
    fork = best.get("fork")
    print(f"{'method':<12}{'first batch s':>15}{'x fork':>9}{'samples/s':>12}{'x fork':>9}{'server ready s':>16}")
    for method in methods:
        if method not in best:
            continue
        r = best[method]
        ratio = (lambda key: f"{r[key] / fork[key]:.2f}") if fork else (lambda key: "-")
        server = f"{r['server_ready']:.2f}" if "server_ready" in r else "-"
        print(f"{method:<12}{r['first_batch']:>15.2f}{ratio('first_batch'):>9}{r['samples_s']:>12.1f}"
              f"{ratio('samples_s'):>9}{server:>16}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
