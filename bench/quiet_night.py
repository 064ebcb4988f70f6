"""A quiet night costs nothing (issue 59.5): plain Ultralytics ``train()`` against ``yolo-train run`` on the same data
and settings, no hang, alternated in pairs in one run (plain first in even pairs, supervised first in odd ones, so a
drift of the machine's speed falls on both).

Each run is a fresh process timed from its start to its exit. Printed per pair and as ratios (supervised / plain) with
their spread (min / median / max over the pairs):

- the epochs: each run's steady epoch time from its own results.csv (Ultralytics' ``time`` column, the seconds since
  its training started, written at each epoch's end: (last - first) / (epochs - 1)), so the first epoch's warm-up and
  the final validation fall outside it;
- start to exit: the whole process, the supervisor's own start, the worker's start and teardown included;
- outside the epochs: start to exit less the ``time`` column's last value (the interpreter, the imports, the trainer's
  setup before training starts, the final validation of best.pt and the teardown after), for both; for the supervised
  run also the supervisor's own start (its process start to the worker's spawn, from ``worker_spawned`` in its status)
  and the worker's startup to its first batch (``startup_seconds``, with the longest stretch of each startup step).

    .venv/bin/python -m bench.quiet_night                          # the CPU demo, 5 pairs
    python3 -m bench.quiet_night --gpu --epochs 20 --images 2048     # YOLOv8n 640 px, batch 32, 8 workers, AMP
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from bench.harness import ROOT, add_training_args, apply_training_defaults, quiet_sections, write_config


@dataclass
class Run:
    kind: str  # "plain" or "supervised"
    wall_s: float
    epoch_s: float  # steady epoch time, from results.csv
    train_s: float  # results.csv's last ``time``: the seconds from training's start to its last epoch's end
    exit_code: int
    parts: dict = field(default_factory=dict)  # the supervised run's own: supervisor start, worker startup, steps

    @property
    def outside_s(self) -> float:
        return self.wall_s - self.train_s


def results_times(results_csv: Path) -> list[float]:
    with results_csv.open() as f:
        return [float(row["time"]) for row in csv.DictReader(f)]


def steady(times: list[float]) -> float:
    return (times[-1] - times[0]) / (len(times) - 1)


def train_args(a: argparse.Namespace, data: str) -> dict:
    return {"data": data, "model": a.model, "epochs": a.epochs, "imgsz": a.imgsz, "batch": a.batch,
            "workers": a.workers, "device": "0" if a.gpu else "cpu", "plots": False}


def run_plain(a: argparse.Namespace, data: str, out: Path) -> Run:
    args = {**train_args(a, data), "project": str(out), "name": "plain", "exist_ok": True}
    code = f"from ultralytics import YOLO; YOLO({a.model!r}).train(**{args!r})"
    began = time.monotonic()
    proc = subprocess.run([sys.executable, "-c", code], cwd=out, env={**os.environ, "YOLO_OFFLINE": "1"},
                          stdout=open(out / "plain.log", "w"), stderr=subprocess.STDOUT)
    wall = time.monotonic() - began
    times = results_times(out / "plain" / "results.csv")
    return Run("plain", wall, steady(times), times[-1], proc.returncode)


def run_supervised(a: argparse.Namespace, data: str, out: Path) -> Run:
    state = out / "state"
    cfg = write_config(out / "supervised.toml", train=train_args(a, data), sections=quiet_sections(), name="quiet")
    began_wall, began = time.time(), time.monotonic()
    proc = subprocess.run([sys.executable, "-m", "supervisor", "run", "--config", str(cfg), "--state-dir", str(state)],
                          cwd=ROOT, stdout=open(out / "supervised.log", "w"), stderr=subprocess.STDOUT)
    wall = time.monotonic() - began
    times = results_times(state / "train" / "results.csv")
    status = json.loads((state / "supervisor.json").read_text())["status"]
    spawned = status.get("worker_spawned")
    parts = {"supervisor_start_s": round(spawned - began_wall, 2) if spawned else None,
             "worker_startup_s": status.get("startup_seconds"),
             "startup_steps_s": status.get("startup_steps_seen") or {},
             "restarts": status.get("restarts"), "state": status.get("state")}
    return Run("supervised", wall, steady(times), times[-1], proc.returncode, parts)


def spread(values: list[float]) -> str:
    return f"{min(values):.3f} / {statistics.median(values):.3f} / {max(values):.3f}"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_training_args(parser)
    parser.add_argument("--pairs", type=int, default=5)
    parser.add_argument("--keep", action="store_true", help="keep the runs' folders (printed)")
    a = parser.parse_args()
    apply_training_defaults(a, gpu={"epochs": 20, "images": 2048, "imgsz": 640, "batch": 32, "workers": 8},
                            cpu={"epochs": 6, "images": 128, "imgsz": 64, "batch": 8, "workers": 2})
    if a.epochs < 2:
        parser.error("--epochs: at least 2 (the steady epoch time is measured between the first and the last)")

    from worker.startup.demo_data import ensure_demo_dataset

    data = str(ensure_demo_dataset(train_images=a.images, val_images=max(8, a.images // 8), size=a.imgsz))
    root = Path(tempfile.mkdtemp(prefix="quiet-night-"))
    warm = root / "warm-up"
    warm.mkdir()
    print(f"bench: {a.pairs} pairs, {a.epochs} epochs, {a.images} images at {a.imgsz} px, batch {a.batch}, "
          f"workers {a.workers}, {'GPU 0' if a.gpu else 'CPU'}; a plain warm-up first (label caches, bytecode)",
          flush=True)
    run_plain(argparse.Namespace(**{**vars(a), "epochs": 2}), data, warm)

    pairs: list[tuple[Run, Run]] = []
    for i in range(a.pairs):
        runs = {}
        for kind in (("plain", "supervised") if i % 2 == 0 else ("supervised", "plain")):
            out = root / f"pair{i}-{kind}"
            out.mkdir()
            runs[kind] = (run_plain if kind == "plain" else run_supervised)(a, data, out)
        plain, supervised = runs["plain"], runs["supervised"]
        pairs.append((plain, supervised))
        print(f"pair {i}: plain {plain.wall_s:.1f} s (epoch {plain.epoch_s:.3f} s, outside {plain.outside_s:.1f} s,"
              f" exit {plain.exit_code}); supervised {supervised.wall_s:.1f} s (epoch {supervised.epoch_s:.3f} s, "
              f"outside {supervised.outside_s:.1f} s, exit {supervised.exit_code}); {json.dumps(supervised.parts)}",
              flush=True)

    epochs = [s.epoch_s / p.epoch_s for p, s in pairs]
    walls = [s.wall_s / p.wall_s for p, s in pairs]
    extra = [s.wall_s - p.wall_s for p, s in pairs]
    outside = [s.outside_s - p.outside_s for p, s in pairs]
    print(f"epochs, supervised / plain (min / median / max): {spread(epochs)}  (goal <= 1.01)")
    print(f"start to exit, supervised / plain: {spread(walls)}; supervised - plain: {spread(extra)} s "
          f"(goal <= 3 s)")
    print(f"outside the epochs, supervised - plain: {spread(outside)} s; supervisor's own start "
          f"{spread([s.parts['supervisor_start_s'] or 0.0 for _, s in pairs])} s")
    if a.keep:
        print(f"bench: runs kept in {root}")
    else:
        subprocess.run(["rm", "-rf", str(root)])
    return 0 if all(p.exit_code == 0 and s.exit_code == 0 for p, s in pairs) else 1


if __name__ == "__main__":
    sys.exit(main())
