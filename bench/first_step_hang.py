"""A first batch that never runs after a resume (issue 29; goal: found within 30 s on the H100, before: 142 s).

The real CLI (``python -m supervisor run``), default settings but the training: attempt 1 hangs in its main loop at
batch ``--hang-at`` (a restart, and this run has seen every startup step once); attempt 2, the resume, loads its
first batch and never runs its step on the device (the ``before_first_batch`` fault: the seeds' "the first batch
never runs", in the startup's ``first_step``). Printed from the supervisor's own incidents: each hang's step, the
bound it met (10 x that step's slowest stretch seen, floor 10 s), the stretch seen, the stall and the restart.

    .venv/bin/python -m bench.first_step_hang          # the CPU demo: 64 px, 2 workers
    python3 -m bench.first_step_hang --gpu             # cuda:0: YOLOv8n 640 px, batch 32, 8 workers, 1,024 images
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import tempfile
from pathlib import Path

from bench.harness import ROOT, quiet_sections, write_config

SHOWN = ("reason", "phase", "attempt", "rung", "startup_step", "startup_step_bound", "startup_step_seen",
         "seconds_since_progress", "restart_seconds")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gpu", action="store_true", help="device 0, YOLOv8n at 640 px, batch 32, 8 workers")
    parser.add_argument("--hang-at", type=int, default=20, help="attempt 1's main loop hangs after this batch")
    parser.add_argument("--limit", type=float, default=300.0, help="seconds the run may take")
    args = parser.parse_args()
    from worker.startup.demo_data import ensure_demo_dataset

    with tempfile.TemporaryDirectory() as tmp:
        train = {"epochs": 3, "plots": False}
        if args.gpu:
            data = ensure_demo_dataset(train_images=1024, val_images=8, size=640)
            train.update(data=str(data), model="yolov8n.yaml", imgsz=640, batch=32, workers=8, device="0")
        config = write_config(Path(tmp) / "config.toml", train, name="first-step-hang",
                              sections={"kernel_log": quiet_sections()["kernel_log"]})
        state = Path(tmp) / "state"
        run = subprocess.run([sys.executable, "-m", "supervisor", "run", "--config", str(config), "--state-dir",
                              str(state), "--fault", f"main_hang,at_batch={args.hang_at},attempt=1",
                              "--fault", "before_first_batch,attempt=2"],
                             cwd=ROOT, capture_output=True, text=True, timeout=args.limit)
        print(f"exit {run.returncode}")
        if run.returncode != 0:
            print(run.stderr[-2000:])
        for line in (state / "incidents.jsonl").read_text().splitlines():
            incident = json.loads(line)
            print("  ".join(f"{k}={incident.get(k)}" for k in SHOWN))
        # How each attempt started: the standby or cold, the AMP check, each startup step's seconds.
        for line in (run.stdout + run.stderr).splitlines():
            if re.search(r"standby worker pid \d+ (takes|not used)|starting cold|to first batch|AMP check", line):
                print(" ", line.strip()[:400])
    return run.returncode


if __name__ == "__main__":
    sys.exit(main())
