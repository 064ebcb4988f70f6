"""Several GPUs: supervised DDP against plain Ultralytics DDP, and a rank frozen from outside, in one run.

1. Throughput: the same training (a generated demo dataset, the same arguments, ``device = "0,1"``) run by plain
   Ultralytics (``YOLO(...).train(...)``) and under ``yolo-train run``, one after the other. Each run's steady
   epoch time is read from its own results.csv (``time`` is Ultralytics' elapsed seconds at each epoch's end):
   (last - first) / (epochs - 1), so startup is left out of both. Ratio = plain epoch time / supervised epoch time
   (goal >= 0.99).
2. Freeze: a supervised run; once epoch 2 trains, rank 1 (pid from the state file's ``ranks``) gets SIGSTOP.
   Measured: SIGSTOP -> the supervisor's "attempt 2: first training batch" line (goal <= 30 s, default
   watchdog settings), then the run must finish and leave no process of its tree (worker, torch.distributed.run,
   ranks, DataLoader workers) behind.

    python -m bench.ddp [--devices 0,1] [--images 2048] [--imgsz 320] [--batch 64] [--epochs 4]
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import psutil

from bench.harness import ROOT, quiet_config


def train_args(a: argparse.Namespace, data: str, epochs: int) -> dict:
    return {"data": data, "model": "yolov8n.yaml", "epochs": epochs, "imgsz": a.imgsz, "batch": a.batch,
            "workers": a.workers, "device": a.devices, "plots": False}


def steady_epoch_seconds(results_csv: Path) -> float:
    rows = list(csv.DictReader(results_csv.open()))
    times = [float(r["time"]) for r in rows]
    return (times[-1] - times[0]) / (len(times) - 1)


def run_plain(a: argparse.Namespace, data: str, out: Path) -> float:
    args = {**train_args(a, data, a.epochs), "project": str(out), "name": "plain", "exist_ok": True}
    code = f"from ultralytics import YOLO; YOLO('yolov8n.yaml').train(**{args!r})"
    subprocess.run([sys.executable, "-c", code], check=True, cwd=out, env={**os.environ, "YOLO_OFFLINE": "1"})
    return steady_epoch_seconds(out / "plain" / "results.csv")


def config(a: argparse.Namespace, data: str, epochs: int, path: Path) -> Path:
    lines = ['name = "bench-ddp"', "[train]"]
    for k, v in train_args(a, data, epochs).items():
        lines.append(f"{k} = {json.dumps(v) if not isinstance(v, bool) else str(v).lower()}")
    path.write_text("\n".join(lines) + "\n" + quiet_config())
    return path


def run_supervised(a: argparse.Namespace, data: str, out: Path) -> float:
    state = out / "supervised"
    subprocess.run([sys.executable, "-m", "supervisor", "run", "--config",
                    str(config(a, data, a.epochs, out / "supervised.toml")), "--state-dir", str(state)],
                   check=True, cwd=ROOT)
    return steady_epoch_seconds(state / "train" / "results.csv")


def run_freeze(a: argparse.Namespace, data: str, out: Path) -> dict:
    state = out / "freeze"
    proc = subprocess.Popen([sys.executable, "-m", "supervisor", "run", "--config",
                             str(config(a, data, a.epochs + 2, out / "freeze.toml")), "--state-dir", str(state)],
                            cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, bufsize=1)
    resumed: list[float] = []

    def read() -> None:
        for line in proc.stdout:
            sys.stdout.write(line)
            if "attempt 2: first training batch" in line:
                resumed.append(time.monotonic())

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    stopped_at = None
    tree: set[int] = set()
    while stopped_at is None and proc.poll() is None:
        time.sleep(0.2)
        try:
            status = json.loads((state / "supervisor.json").read_text())["status"]
        except (OSError, ValueError, KeyError):
            continue
        ranks = {r["rank"]: r["pid"] for r in status.get("ranks") or []}
        if (status.get("epoch") or 0) >= 2 and status.get("state") == "healthy" and 1 in ranks:
            worker = psutil.Process(status["worker_pid"])
            tree = {worker.pid, *(p.pid for p in worker.children(recursive=True))}
            os.kill(ranks[1], signal.SIGSTOP)
            stopped_at = time.monotonic()
            print(f"bench: SIGSTOP to rank 1 (pid {ranks[1]}) at epoch {status['epoch']}", flush=True)
    code = proc.wait()
    reader.join(timeout=5)
    left = [p for p in tree if psutil.pid_exists(p) and psutil.Process(p).status() != psutil.STATUS_ZOMBIE]
    return {"exit": code, "stop_to_resumed_batch_s": round(resumed[0] - stopped_at, 2) if resumed and stopped_at
            else None, "tree": len(tree), "left": left}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--devices", default="0,1")
    p.add_argument("--images", type=int, default=2048)
    p.add_argument("--imgsz", type=int, default=320)
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--workers", type=int, default=8)
    p.add_argument("--epochs", type=int, default=4)
    p.add_argument("--skip", default="", help="comma list of: throughput, freeze")
    a = p.parse_args()
    from worker.demo_data import ensure_demo_dataset

    data = str(ensure_demo_dataset(train_images=a.images, val_images=64, size=a.imgsz))
    out = Path(tempfile.mkdtemp(prefix="bench-ddp-"))
    results = {}
    if "throughput" not in a.skip:
        plain = run_plain(a, data, out)
        supervised = run_supervised(a, data, out)
        results["throughput"] = {"plain_epoch_s": round(plain, 3), "supervised_epoch_s": round(supervised, 3),
                                 "ratio": round(plain / supervised, 4), "goal": ">= 0.99"}
    if "freeze" not in a.skip:
        freeze = run_freeze(a, data, out)
        results["freeze"] = {**freeze, "goal": "<= 30 s, exit 0, nothing left"}
    print("BENCH " + json.dumps(results), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
