"""Kernel line to kill, and a soak of stall lines during healthy training (root: writes to /dev/kmsg).

1. The worker is frozen (SIGSTOP) and the seeds' amdgpu line is written to /dev/kmsg: time from the write to
   the incident (the kill), against the goal of the confirm window + 1 s. The stall timeout is set to 300 s,
   and so is the validation one, so only the kernel line can explain a kill within the window.
2. Soak: while training progresses, the same line every --soak-interval seconds for --soak seconds: kills
   must stay at zero.

    .venv/bin/python -m bench.kernel_kill [--repeat 3] [--soak 60]
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench.harness import ROOT, quiet_config

SEEDS_LINE = ("workqueue: amdgpu_amdkfd_restore_userptr_worker [amdgpu] hogged CPU for >10000us 4 times, "
              "consider switching to WQ_UNBOUND")
CONFIG = """
[train]
data = "demo"
model = "yolov8n.yaml"
epochs = {epochs}
imgsz = 64
batch = 4
workers = 2
device = "cpu"
plots = false
{quiet}
[watchdog]
stall_timeout = 300
val_timeout = 300
"""


def status(state_dir: Path) -> dict:
    try:
        return json.loads((state_dir / "supervisor.json").read_text())["status"]
    except (OSError, ValueError, KeyError):
        return {}


def incidents(state_dir: Path) -> list[dict]:
    path = state_dir / "incidents.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def wait(predicate, timeout: float):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.05)
    raise SystemExit("timed out")


def supervise(tmp: Path, epochs: int, confirm: float) -> tuple[subprocess.Popen, Path]:
    config = tmp / "config.toml"
    config.write_text(CONFIG.format(epochs=epochs, quiet=quiet_config("kmsg", confirm_window=confirm)))
    state_dir = tmp / "state"
    proc = subprocess.Popen([sys.executable, "-m", "supervisor", "run", "--config", str(config), "--state-dir",
                             str(state_dir)], cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    wait(lambda: status(state_dir).get("state") == "healthy", 120)
    return proc, state_dir


def write_kmsg(line: str) -> None:
    with open("/dev/kmsg", "w") as kmsg:
        kmsg.write(f"<4>{line}\n")


def line_to_kill(confirm: float) -> float:
    with tempfile.TemporaryDirectory() as tmp:
        proc, state_dir = supervise(Path(tmp), epochs=50, confirm=confirm)
        try:
            os.kill(status(state_dir)["worker_pid"], signal.SIGSTOP)
            written = time.time()
            write_kmsg(SEEDS_LINE)
            # the live status's (incidents.jsonl has it once its batches after are counted), once its kill is known
            incident = wait(lambda: [i for i in [status(state_dir).get("last_incident")] if i and i.get("kill")], 60)[0]
            assert incident["reason"] == "kernel", incident
            return incident["time"] + incident["kill"]["seconds"] - written
        finally:
            proc.send_signal(signal.SIGINT)
            proc.send_signal(signal.SIGINT)
            proc.wait(60)


def soak(seconds: float, interval: float, confirm: float) -> tuple[int, int, int]:
    with tempfile.TemporaryDirectory() as tmp:
        proc, state_dir = supervise(Path(tmp), epochs=400, confirm=confirm)
        lines = 0
        try:
            end = time.monotonic() + seconds
            while time.monotonic() < end:
                write_kmsg(SEEDS_LINE)
                lines += 1
                time.sleep(interval)
            time.sleep(confirm + 1)  # let the last line's window close
            final = status(state_dir)
            return lines, final.get("kernel_events", {}).get("stall", 0), len(incidents(state_dir))
        finally:
            proc.send_signal(signal.SIGINT)
            proc.send_signal(signal.SIGINT)
            proc.wait(60)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--confirm", type=float, default=10.0)
    parser.add_argument("--soak", type=float, default=60.0)
    parser.add_argument("--soak-interval", type=float, default=2.0)
    args = parser.parse_args()
    if os.geteuid() != 0:
        raise SystemExit("needs root: it writes kernel log lines to /dev/kmsg")
    times = [line_to_kill(args.confirm) for _ in range(args.repeat)]
    goal = args.confirm + 1.0
    print(f"kernel line to kill (frozen worker, confirm window {args.confirm:.0f} s, stall timeout 300 s):")
    print(f"  runs: {', '.join(f'{t:.2f} s' for t in times)}; median {statistics.median(times):.2f} s; "
          f"goal <= {goal:.1f} s; ratio to goal {statistics.median(times) / goal:.2f}")
    lines, counted, kills = soak(args.soak, args.soak_interval, args.confirm)
    print(f"soak: {lines} stall lines over {args.soak:.0f} s of healthy training: {counted} counted, {kills} kills "
          f"(goal 0)")


if __name__ == "__main__":
    main()
