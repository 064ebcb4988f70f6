"""What the loader rungs cost: Ultralytics' training dataset read through each, side by side in one run.

(a) InfiniteDataLoader with ``workers = N`` (the top rung), (b) ``workers = 0`` (the safest process-free rung until
now), (c) ThreadDataLoader with ``threads = N`` (the safe rung that should keep its speed; goal: at least 0.9x (a)
in training throughput on a GPU), (d) ``workers = N`` started with "spawn" (the first loader rung of the CUDA and
ROCm ladders before "forkserver": bench/first_batch.py compares their starts). Each reads the embedded demo dataset (generated at ``--imgsz`` pixels, mosaic and all) for ``--batches`` batches
after ``--warmup`` ones (the first one's wait printed: the workers' start); the best of ``--rounds`` interleaved
rounds, in samples/s, with the ratio to (a). With ``--train``, a short real training (``--model``, YOLOv8n from its
yaml by default, device auto) at each loader, in iterations/s over the epochs after the first, with the ratio to
(a). With ``--ladder``, the same training at every rung of the default ladder for ``workers = N`` (its threads rung
with the CPU count of threads, as in the worker), against rung 0. With ``--threads-sweep 4,8,16@1``, the same
training with the threads loader at each of those pool sizes (``@1``: with a 1 ms ``sys.setswitchinterval``),
between two trainings at ``workers = N``, against their mean; each row also gives the share of the timed wall time
the training loop spent waiting for its next batch (low: the loop itself is what is slow). With ``--gil``, py-spy
samples each training's timed epochs: ``--gil holders``, the shares of wall time the training thread, the loader
threads and the rest held the GIL; ``--gil waits``, the share of the training thread's time spent waiting to take it
back (at the torch calls, which each release it).

    .venv/bin/python -m bench.rungs [--imgsz 64] [--workers N] [--batch 16] [--images 128] [--train]
    python3 -m bench.rungs --imgsz 640 --batch 32 --images 1024 --workers 8 --train --ladder   # a GPU machine
    python3 -m bench.rungs --imgsz 640 --batch 32 --images 1024 --workers 8 --epochs 4 --kinds workers \
        --rounds 1 --batches 8 --threads-sweep 4,8,12,16   # the threads rung's pool size, a GPU machine

Needs only torch and Ultralytics' wheels (and this repository).
"""

from __future__ import annotations

import argparse
import collections
import os
import shlex
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Iterator

os.environ.setdefault("YOLO_OFFLINE", "1")  # no download may stall the bench: fonts, AMP check weights
os.environ.setdefault("MPLBACKEND", "Agg")

from worker.startup.demo_data import ensure_demo_dataset
from worker.loading.loaders import start_workers_with
from worker.loading.thread_loader import thread_loader_from

KINDS = ("workers", "workers0", "threads", "spawn")


def label(kind: str, n: int) -> str:
    return {"workers": f"(a) workers={n}", "workers0": "(b) workers=0", "threads": f"(c) threads={n}",
            "spawn": f"(d) workers={n}, spawned"}[kind]


def build_loader(kind: str, n: int, data: dict, imgsz: int, batch: int, mode: str = "train") -> Any:
    import torch
    from ultralytics.cfg import get_cfg
    from ultralytics.data.build import build_dataloader, build_yolo_dataset

    torch.manual_seed(0)
    cfg = get_cfg(overrides={"imgsz": imgsz, "task": "detect"})
    dataset = build_yolo_dataset(cfg, data["train"], batch, data, mode=mode)
    loader = build_dataloader(dataset, batch, 0 if kind == "workers0" else n, shuffle=True, rank=-1,
                              device="cuda" if torch.cuda.is_available() else "cpu")
    start_workers_with(loader, "spawn" if kind == "spawn" else None)
    return thread_loader_from(loader, n) if kind == "threads" else loader


def endless(loader: Any) -> Iterator[Any]:
    while True:
        yield from loader


def read_rate(kind: str, n: int, data: dict, args: argparse.Namespace) -> float:
    loader = build_loader(kind, n, data, args.imgsz, args.batch)
    batches = endless(loader)
    start = time.perf_counter()
    next(batches)
    print(f"{label(kind, n)}: first batch after {time.perf_counter() - start:.2f} s (the workers' start)", flush=True)
    for _ in range(args.warmup - 1):  # the first images' decode
        next(batches)
    start = time.perf_counter()
    samples = sum(len(next(batches)["im_file"]) for _ in range(args.batches))
    rate = samples / (time.perf_counter() - start)
    batches.close()
    try:
        loader.close()
    except RuntimeError as e:  # after the timing: the rate stands, and the abort is worth seeing
        print(f"{label(kind, n)}: at the loader's shutdown: {e}", flush=True)
    return rate


KIND_SETTINGS = {"workers": {}, "workers0": {"workers": 0}, "threads": {"loader": "threads"},
                 "spawn": {"start_method": "spawn"}}  # on workers = N


def train_rate(name: str, settings: dict[str, Any], n: int, data_yaml: Path, args: argparse.Namespace,
               project: Path) -> float:
    """Iterations/s of a real training with a rung's ``settings`` on top of ``workers = n`` (threads: the CPU count
    unless the rung says, as in the worker) over the epochs after the first (model build, warm-up and worker start-up excluded), batch end to
    batch end within epochs, the wait for each epoch's first batch included (per-epoch workers pay theirs there)."""
    return train_timing(name, settings, n, data_yaml, args, project)[0]


class GilSampler:
    """py-spy sampling this process from ``start()`` to ``stop()``. ``holders``: who holds the GIL (``record --gil
    --threads`` samples only the thread holding it), as shares of that wall time by thread group. ``waits``: where the
    training thread is (``--idle --native``, which pauses the process at each sample: a run of its own), as the
    share of its samples waiting to take the GIL back, in ``pthread_cond_timedwait`` (CPython's GIL wait) under a
    torch call (its bindings release the GIL around every op) or under Python code returning from C."""

    RATES = {"holders": 100, "waits": 10}  # samples/s; a native sample pauses the process for milliseconds

    def __init__(self, mode: str) -> None:
        from supervisor.host.stacks import find_py_spy

        self.mode = mode
        self.exe = find_py_spy()
        self.out: Path | None = None
        self.process: subprocess.Popen | None = None
        self.started = 0.0
        self.rate = self.RATES[mode]

    def start(self) -> None:
        if self.exe is None:
            print("--gil: py-spy not found beside this Python nor on PATH: pip install py-spy", flush=True)
        if self.exe is None or self.process is not None:
            return
        fd, out = tempfile.mkstemp(prefix="gil-", suffix=".txt")
        os.close(fd)  # py-spy writes it
        self.out = Path(out)
        how = ["--gil", "--nonblocking"] if self.mode == "holders" else ["--idle", "--native"]
        self.process = subprocess.Popen(
            [self.exe, "record", "--pid", str(os.getpid()), *how, "--threads", "--rate", str(self.rate),
             "--format", "raw", "--output", str(self.out)],
            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        self.started = time.perf_counter()

    def stop(self) -> dict[str, float]:
        if self.process is None or self.out is None:
            return {}
        seconds = time.perf_counter() - self.started
        self.process.send_signal(signal.SIGINT)  # py-spy writes its samples on SIGINT
        _, errors = self.process.communicate(timeout=60)
        samples: collections.Counter[str] = collections.Counter()
        for line in self.out.read_text().splitlines():
            stack, _, count = line.rpartition(" ")
            samples[self.holder_group(stack) if self.mode == "holders" else self.training_state(stack)] += int(count)
        self.out.unlink(missing_ok=True)
        samples.pop("", None)
        if not samples:
            print(f"py-spy sampled nothing: {errors.strip()[-300:]}", flush=True)
            return {}
        total = self.rate * seconds if self.mode == "holders" else sum(samples.values())
        return {key: count / total for key, count in samples.items()}

    @staticmethod
    def thread_name(stack: str) -> str:
        return stack.split(";", 1)[0].partition("): ")[2]  # raw lines: 'thread (NATIVE_ID): NAME;frame;... COUNT'

    @staticmethod
    def holder_group(stack: str) -> str:
        """``training`` (the main thread), ``loader`` (thread-loader-*), ``pin_memory`` (torch's pin thread beside
        worker processes), ``other``."""
        name = GilSampler.thread_name(stack)
        if name == "MainThread":
            return "training"
        if name.startswith("thread-loader-"):
            return "loader"
        return "pin_memory" if "pin_memory" in stack else "other"

    @staticmethod
    def training_state(stack: str) -> str:
        """The training thread's sample as ``gil wait`` or ``running``; other threads ''."""
        if GilSampler.thread_name(stack) != "MainThread":
            return ""
        innermost = stack.split(";")[-3:]  # libc's own unnamed frames may sit under the wait
        return "gil wait" if any(f.startswith("pthread_cond_timedwait") for f in innermost) else "running"


def gil_line(sampled: dict[str, dict[str, float]]) -> str:
    parts = []
    if held := sampled.get("holders"):
        groups = [f"{group} {held[group]:.0%}" for group in ("training", "loader", "pin_memory", "other")
                  if group in held]
        parts.append(f"GIL held: {', '.join(groups)}; total {sum(held.values()):.0%} of wall time")
    if waits := sampled.get("waits"):
        parts.append(f"training thread waiting for the GIL {waits.get('gil wait', 0):.0%} of its samples")
    return "; ".join(parts) or "GIL: not sampled"


GIL_SAMPLED: dict[str, dict[str, dict[str, float]]] = {}  # training name -> sampler mode -> GilSampler.stop()


def train_timing(name: str, settings: dict[str, Any], n: int, data_yaml: Path, args: argparse.Namespace,
                 project: Path) -> tuple[float, float]:
    """``train_rate``'s iterations/s, and the share of that timed wall time the loop waited for batches: from a
    batch's end to the next one's start, which is the loader's ``next()`` (and the progress bar's few microseconds).
    With ``--gil``, who held the GIL over the timed epochs goes to ``GIL_SAMPLED[name]``."""
    from ultralytics.models.yolo.detect import DetectionTrainer

    from worker.loading.loaders import make_epoch_workers
    from worker.patches import amp_check, offline

    amp_check.install("local")  # Ultralytics' own check downloads a model
    offline.install()
    workers = settings.get("workers", n)
    threads = settings.get("threads") or os.cpu_count() if settings.get("loader") == "threads" else None

    class LoaderTrainer(DetectionTrainer):
        def __init__(self, *a: Any, **kw: Any):
            super().__init__(*a, **kw)
            self.args.workers = workers  # BaseTrainer forces 0 on CPU: honour the rung

        def get_dataloader(self, dataset_path: str, batch_size: int = 16, rank: int = 0, mode: str = "train"):
            loader = super().get_dataloader(dataset_path, batch_size, rank, mode)
            start_workers_with(loader, settings.get("start_method"))
            if threads:
                return thread_loader_from(loader, threads)
            return loader if settings.get("persistent_workers", True) else make_epoch_workers(loader)

    marks: list[tuple[int, float]] = []  # (epoch, time) at each epoch start and batch end
    waits: list[tuple[int, float]] = []  # (epoch, seconds from the previous mark to a batch's start)
    trainer = LoaderTrainer(overrides={
        "model": args.model, "data": str(data_yaml), "imgsz": args.imgsz, "batch": args.batch,
        "epochs": args.epochs, "workers": workers, "val": False, "plots": False, "project": str(project),
        "name": name, "exist_ok": True, "verbose": False})
    trainer.add_callback("on_train_epoch_start", lambda t: marks.append((t.epoch, time.perf_counter())))
    if args.gil:
        sampler = GilSampler(args.gil)
        trainer.add_callback("on_train_epoch_start", lambda t: sampler.start() if t.epoch == 1 else None)
        trainer.add_callback("on_train_epoch_end", lambda t: GIL_SAMPLED.setdefault(name, {}).update(
            {args.gil: sampler.stop()}) if t.epoch == args.epochs - 1 else None)
    trainer.add_callback("on_train_batch_end", lambda t: marks.append((t.epoch, time.perf_counter())))
    trainer.add_callback("on_train_batch_start", lambda t: waits.append((t.epoch, time.perf_counter() - marks[-1][1])))
    trainer.train()
    seconds = batches = waited = 0.0
    for epoch in range(1, args.epochs):
        times = [t for e, t in marks if e == epoch]
        seconds += times[-1] - times[0]
        batches += len(times) - 1
        waited += sum(w for e, w in waits if e == epoch)
    return batches / seconds, waited / seconds


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--imgsz", type=int, default=64)
    parser.add_argument("--workers", type=int, default=min(8, os.cpu_count() or 1), help="N, also the threads")
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--images", type=int, default=128, help="training images in the generated demo dataset")
    parser.add_argument("--batches", type=int, default=40, help="batches timed per loader and round")
    parser.add_argument("--warmup", type=int, default=4)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--train", action="store_true", help="also a short real training at each loader")
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--kinds", default=",".join(KINDS), help=f"a subset of {','.join(KINDS)}")
    parser.add_argument("--ladder", action="store_true", help="also train each rung of the default ladder")
    parser.add_argument("--model", default="yolov8n.yaml",
                        help="the trained model's yaml: a larger one makes the step GPU-bound, as on a slower GPU")
    parser.add_argument("--threads-sweep", default="", metavar="N,N@MS,...",
                        help="also train the threads loader at each pool size (@MS: with that sys.setswitchinterval in"
                             " milliseconds), against workers = N before and after")
    parser.add_argument("--gil", choices=("holders", "waits"),
                        help="sample each training's timed epochs with py-spy (beside this Python): who held the GIL,"
                             " or how often the training thread waited for it (pauses the process: slower rates)")
    args = parser.parse_args()
    kinds = args.kinds.split(",")
    if unknown := set(kinds) - set(KINDS):
        parser.error(f"--kinds: unknown {sorted(unknown)}; choose from {','.join(KINDS)}")

    import cv2
    import torch
    from ultralytics.data.utils import check_det_dataset

    print("command: " + shlex.join([sys.executable, *sys.argv]))
    print(f"torch {torch.__version__}, device {torch.cuda.get_device_name() if torch.cuda.is_available() else 'cpu'},"
          f" {os.cpu_count()} CPUs, cv2 threads {cv2.getNumThreads()}, torch threads {torch.get_num_threads()}")
    data_yaml = ensure_demo_dataset(train_images=args.images, val_images=8, size=args.imgsz)
    data = check_det_dataset(str(data_yaml))
    n = args.workers

    rates: dict[str, float] = {}
    for _ in range(args.rounds):  # interleaved, so a neighbour's load spreads over all of them
        for kind in kinds:
            rates[kind] = max(rates.get(kind, 0.0), read_rate(kind, n, data, args))
    print(f"\nread: imgsz {args.imgsz}, batch {args.batch}, {args.batches} batches, best of {args.rounds} rounds")
    report({label(kind, n): rate for kind, rate in rates.items()}, "samples/s", label("workers", n))

    if args.train:
        its: dict[str, float] = {}
        with tempfile.TemporaryDirectory(prefix="rungs-") as project:
            for kind in kinds:
                settings = {**KIND_SETTINGS[kind], "threads": n} if kind == "threads" else KIND_SETTINGS[kind]
                its[label(kind, n)] = train_rate(kind, settings, n, data_yaml, args, Path(project))
        print(f"\ntrain: {args.model}, imgsz {args.imgsz}, batch {args.batch}, {args.images} images, "
              f"epochs 2..{args.epochs}")
        report(its, "it/s", label("workers", n))
        if args.gil:
            for kind in kinds:
                print(f"  {label(kind, n)}: {gil_line(GIL_SAMPLED.get(kind, {}))}")
    if args.ladder:
        ladder_rates(n, data_yaml, args)
    if args.threads_sweep:
        threads_sweep(args.threads_sweep.split(","), n, data_yaml, args)
    return 0


def threads_sweep(entries: list[str], n: int, data_yaml: Path, args: argparse.Namespace) -> None:
    """The threads loader at each entry, ``N`` threads or ``N@MS`` (and ``sys.setswitchinterval`` MS milliseconds
    while it trains), between two trainings at ``workers = n`` (a drifting neighbour's load shows as the two
    differing), each against their mean, with the share of time the loop waited for batches. An entry may repeat."""
    rows: list[tuple[str, float, float, str]] = []  # shown name, it/s, waiting, training name
    default_interval = sys.getswitchinterval()
    with tempfile.TemporaryDirectory(prefix="sweep-") as project:
        before = train_timing("before", {}, n, data_yaml, args, Path(project))
        for k, entry in enumerate(entries):
            pool, _, ms = entry.partition("@")
            sys.setswitchinterval(float(ms) / 1000 if ms else default_interval)
            try:
                rate, waiting = train_timing(f"threads{k}", {"loader": "threads", "threads": int(pool)}, n,
                                             data_yaml, args, Path(project))
            finally:
                sys.setswitchinterval(default_interval)
            rows.append((f"threads={pool}" + (f", switch {ms} ms" if ms else ""), rate, waiting, f"threads{k}"))
        after = train_timing("after", {}, n, data_yaml, args, Path(project))
    base = (before[0] + after[0]) / 2
    print(f"\nthreads sweep: {args.model}, imgsz {args.imgsz}, batch {args.batch}, {args.images} images, epochs "
          f"2..{args.epochs}; workers={n}: {before[0]:.1f} it/s before, {after[0]:.1f} after (waiting "
          f"{before[1]:.0%}, {after[1]:.0%}); switch interval {default_interval * 1000:g} ms unless said")
    width = max(len(name) for name, *_ in rows)
    for name, rate, waiting, training in rows:
        print(f"  {name:<{width}} {rate:6.1f} it/s  {rate / base:5.2f}x  waiting for batches {waiting:4.0%}")
        if args.gil:
            print(f"  {'':<{width}} {gil_line(GIL_SAMPLED.get(training, {}))}")
    if args.gil:
        for training in ("before", "after"):
            print(f"  workers={n} {training}: {gil_line(GIL_SAMPLED.get(training, {}))}")


def ladder_rates(n: int, data_yaml: Path, args: argparse.Namespace) -> None:
    """Each rung of the default ladder for ``workers = n`` trained in turn, its training throughput against rung 0's.
    ``val = false`` changes no training step (validation is off in every run here): its saving is the validation."""
    from supervisor.decision.model.ladder import default_ladder

    ladder = default_ladder(n)
    its: dict[str, float] = {}
    trained: dict[str, str] = {}  # shown name -> training name
    with tempfile.TemporaryDirectory(prefix="ladder-") as project:
        for rung in range(len(ladder)):
            settings = ladder.settings(rung)
            if ladder.rungs[rung] == {"val": False}:
                continue
            shown, trained[shown] = f"rung {rung}: {ladder.label(rung)}", f"rung{rung}"
            its[shown] = train_rate(trained[shown], settings, n, data_yaml, args, Path(project))
    print(f"\ndefault ladder (workers = {n}, threads = {os.cpu_count()}): {args.model}, imgsz {args.imgsz}, batch {args.batch}, "
          f"{args.images} images, epochs 2..{args.epochs}")
    report(its, "it/s", next(iter(its)))
    if args.gil:
        for shown, training in trained.items():
            print(f"  {shown}: {gil_line(GIL_SAMPLED.get(training, {}))}")


def report(rates: dict[str, float], unit: str, reference: str) -> None:
    """Each rate with its ratio to the ``reference`` row's."""
    base = rates.get(reference)
    width = max(len(name) for name in rates)
    for name, rate in rates.items():
        ratio = f"{rate / base:5.2f}x" if base else ""
        print(f"  {name:<{width}} {rate:9.1f} {unit}  {ratio}")


if __name__ == "__main__":
    sys.exit(main())
