"""Cost of mid-epoch checkpoints (issue 10): how long the training loop is held by one save, as a share of training
time at the default interval (``[checkpoint] every = "10m"``) and at the short interval this run used.

Runs the real worker on the demo (yolov8n, CPU) as the supervisor does (launch record, heartbeat pipe), one after the
other: with per-epoch checkpoints only, with mid-epoch checkpoints every ``--every`` seconds written inline (the loop
waits for the whole write), and the same written from a thread (the loop waits for a copy to host memory only, the
worker's default); it reads the hold times the worker reports in its checkpoint messages and compares the training
times.

    .venv/bin/python -m bench.checkpoint_cost [--every 0.2] [--epochs 4]
    python3 -m bench.checkpoint_cost --model yolov8x.yaml --imgsz 640 --batch 16 --images 512 --device 0 --every 5
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench.harness import ROOT
from worker.wire.contract import LaunchRecord, MessageKind
from worker.wire.heartbeat_protocol import Decoder

DEFAULT_EVERY = 600.0  # CheckpointConfig.every


def run(tmp: Path, every: float | None, epochs: int, options: argparse.Namespace, in_thread: bool = True
        ) -> tuple[float, list, list]:
    """Wall time of the train phase, mid-epoch checkpoint messages, end-of-epoch checkpoint messages."""
    name = f"every-{every}-{'thread' if in_thread else 'inline'}"
    record = LaunchRecord(attempt=1, rung=0, train={
        "data": options.data, "model": options.model, "epochs": epochs, "imgsz": options.imgsz, "batch": options.batch,
        "workers": 2, "device": options.device, "plots": False, "val": False, "project": str(tmp),
        "name": name, "exist_ok": True}, trainer_args={}, checkpoint_every=every, checkpoint_in_thread=in_thread)
    launch = tmp / f"launch-{name}.json"
    launch.write_text(record.to_json())
    read, write = os.pipe()
    proc = subprocess.Popen([sys.executable, "-m", "worker", str(launch)], pass_fds=(write,), cwd=ROOT,
                            env={**os.environ, "YOLO_TRAIN_HEARTBEAT_FD": str(write)},
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    os.close(write)
    decoder, mid, end, first, last, batches = Decoder(), [], [], None, None, 1 << 30
    while data := os.read(read, 65536):
        for m in decoder.feed(data):
            if m.kind == MessageKind.BEAT and m.phase.value == "train":
                first = first or time.monotonic()
                last = time.monotonic()
            if m.kind == MessageKind.BEAT and m.batches:
                batches = m.batches
            if m.kind == MessageKind.CHECKPOINT:
                (end if m.batch >= batches else mid).append(m)
    if proc.wait() != 0:
        raise SystemExit(f"worker failed with status {proc.returncode}")
    return (last or 0) - (first or 0), mid, end


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--every", type=float, default=0.2)
    parser.add_argument("--epochs", type=int, default=4)
    parser.add_argument("--model", default="yolov8n.yaml")
    parser.add_argument("--imgsz", type=int, default=64)
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--images", type=int, default=0, help="a generated demo set of this many training images")
    options = parser.parse_args()
    options.data = "demo"
    if options.images:
        from worker.startup.demo_data import ensure_demo_dataset

        options.data = str(ensure_demo_dataset(train_images=options.images, val_images=8, size=options.imgsz))
    print(f"{options.model}, imgsz {options.imgsz}, batch {options.batch}, device {options.device}")
    with tempfile.TemporaryDirectory() as tmp:
        base_s, _, base_end = run(Path(tmp), None, options.epochs, options)
        variants = {}
        for in_thread in (False, True):  # the whole write on the loop, then only the host copy
            seconds, mid, end = run(Path(tmp), options.every, options.epochs, options, in_thread)
            if not mid:
                raise SystemExit(f"no mid-epoch checkpoint at every={options.every}; pass a smaller --every")
            variants["written from a thread" if in_thread else "written inline"] = (seconds, mid)
            base_end += end
        size = Path(mid[-1].path).stat().st_size if Path(mid[-1].path).exists() else 0
    print(f"checkpoint {size / 1e6:.0f} MB; end-of-epoch saves (Ultralytics', inline) median "
          f"{statistics.median(m.seconds for m in base_end) * 1000:.0f} ms")
    print(f"first to last training batch with per-epoch checkpoints only: {base_s:.2f} s")
    for label, (seconds, mid) in variants.items():
        hold = statistics.median(m.seconds for m in mid)
        print(f"every {options.every} s, {label}: {len(mid)} mid-epoch checkpoints, loop held median "
              f"{hold * 1000:.0f} ms (max {max(m.seconds for m in mid) * 1000:.0f} ms); training {seconds:.2f} s, "
              f"{seconds / base_s:.3f} of per-epoch only; share at the default every={DEFAULT_EVERY:.0f} s: "
              f"{hold / (DEFAULT_EVERY + hold):.6f} (goal: under 0.01)")
    (inline_s, inline_mid), (thread_s, thread_mid) = variants.values()
    print(f"thread / inline: loop held {statistics.median(m.seconds for m in thread_mid) / statistics.median(m.seconds for m in inline_mid):.2f}, "
          f"training time {thread_s / inline_s:.3f}")


if __name__ == "__main__":
    main()
