"""What the exporter costs the supervisor: CPU of serving scrapes, reading the worker tree and sampling GPUs.

A child process runs the exporter as the agent does (``start_exporter``, a status published every second)
over a real small process tree (a main process and two "DataLoader" children). The parent scrapes it every
``--every`` seconds for ``--duration`` seconds and reads the child's CPU time (user + system, psutil)
before and after; the same window without scrapes gives the idle cost of the publishing loop. Printed: CPU
seconds, the share of one core, and the CPU of one scrape measured in-process.

    python -m bench.exporter_cost [--every 15 5] [--duration 60] [--gpu-root /] [--sample-interval 5]

``--gpu-root tests/fixtures/amdgpu_sysfs`` samples the two fixture GPUs (regular files, not a driver: a
lower bound for real amdgpu sysfs reads) on a machine without a GPU.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import psutil
from prometheus_client import generate_latest

from bench.harness import ROOT
from supervisor.config import Config
from supervisor.decision.status_view import Status
from supervisor.host.gpu_metrics import sample_all
from supervisor.telemetry.metrics import start_exporter

TREE = ("import os, time\n"
        "for _ in range(2):\n"
        "    if os.fork() == 0:\n"
        "        time.sleep(3600); os._exit(0)\n"
        "time.sleep(3600)\n")


def status(worker_pid: int, started: float) -> Status:
    """A mid-run status as Agent.status() gives it."""
    now = time.time()
    return Status.from_dict({
        "state": "healthy", "phase": "train", "epoch": 3, "epochs": 100, "batch": 120, "batches": 500,
        "losses": {"box_loss": 1.2, "cls_loss": 2.1, "dfl_loss": 1.1}, "lr": 0.00125, "it_s": 7.5,
        "samples_s": 120.0, "eta_seconds": 6500.0, "progress": 0.0124, "rung": 1, "rungs": 6,
        "rung_label": "workers=4", "attempt": 2, "restarts": 1, "restarts_by_reason": {"hang": 1},
        "hangs_by_phase": {"train": 1}, "budget_left": 9, "kernel_events": {"stall": 1}, "reboot_needed": False,
        "worker_pid": worker_pid, "settings": {"versions": {"python": "3.11.2", "ultralytics": "8.3", "torch": "2"}},
        "seconds_since_progress": 0.1, "worker_uptime": now - started, "last_restart": started,
        "heartbeats": {"malformed": 0, "oversized": 0, "dropped": 0}, "updated": now,
    })


def serve(gpu_root: Path, sample_interval: float) -> None:
    """The child: the exporter and a publish every second until SIGTERM."""
    tree = subprocess.Popen([sys.executable, "-c", TREE], start_new_session=True)
    config = Config(path=None, name="bench", state_dir=Path("/nonexistent"), train={},
                    metrics_listen="127.0.0.1:0", deadline="2030-01-01T00:00:00Z")
    exporter = start_exporter(config, gpu_root=gpu_root, sample_interval=sample_interval)
    started = time.time()
    exporter.publish(status(tree.pid, started))

    # In-process figures first (before the parent starts measuring): one scrape's CPU, one GPU sample's CPU.
    repeat = 50
    t = time.process_time()
    for _ in range(repeat):
        exporter.collector.gpus.taken_at = None  # a scrape that samples the GPUs too: the worst case
        generate_latest(exporter.registry)
    scrape_ms = (time.process_time() - t) / repeat * 1e3
    t = time.process_time()
    for _ in range(repeat):
        sample_all(exporter.gpu_readers)
    gpu_ms = (time.process_time() - t) / repeat * 1e3
    print(json.dumps({"port": exporter.port, "scrape_ms": scrape_ms, "gpu_sample_ms": gpu_ms,
                      "gpus": len(sample_all(exporter.gpu_readers)),
                      "readers": [type(r).__name__ for r in exporter.gpu_readers]}), flush=True)

    stop = []
    signal.signal(signal.SIGTERM, lambda *_: stop.append(1))
    while not stop:
        time.sleep(1.0)
        exporter.publish(status(tree.pid, started))
    exporter.close()
    os.killpg(tree.pid, signal.SIGKILL)
    tree.wait()


def cpu_seconds(process: psutil.Process) -> float:
    times = process.cpu_times()
    return times.user + times.system


def measure(child: psutil.Process, port: int, every: float | None, duration: float) -> tuple[float, int]:
    """CPU seconds the child used over ``duration`` while scraped every ``every`` seconds (None: never)."""
    before = cpu_seconds(child)
    start = time.monotonic()
    scrapes = 0
    next_scrape = start
    while time.monotonic() - start < duration:
        if every is not None and time.monotonic() >= next_scrape:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as response:
                response.read()
            scrapes += 1
            next_scrape += every
        time.sleep(0.05)
    return cpu_seconds(child) - before, scrapes


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--every", type=float, nargs="+", default=[15.0, 5.0], help="scrape intervals, seconds")
    parser.add_argument("--duration", type=float, default=60.0)
    parser.add_argument("--gpu-root", type=Path, default=Path("/"))
    parser.add_argument("--sample-interval", type=float, default=5.0)
    parser.add_argument("--serve", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve:
        serve(args.gpu_root, args.sample_interval)
        return

    child = subprocess.Popen([sys.executable, "-m", "bench.exporter_cost", "--serve", "--gpu-root", str(args.gpu_root),
                              "--sample-interval", str(args.sample_interval)], cwd=ROOT, stdout=subprocess.PIPE,
                             text=True)
    try:
        info = json.loads(child.stdout.readline())
        process = psutil.Process(child.pid)
        print(f"GPU readers: {info['readers'] or 'none'} ({info['gpus']} device(s)); GPU sample interval "
              f"{args.sample_interval:g} s")
        print(f"one scrape (collect + render, GPUs sampled): {info['scrape_ms']:.2f} ms CPU; "
              f"one GPU sample: {info['gpu_sample_ms']:.3f} ms CPU")
        tick = 1 / os.sysconf("SC_CLK_TCK")  # the kernel counts CPU time in ticks: the figures' resolution
        print(f"resolution: {tick * 1e3:g} ms CPU = {tick / args.duration:.3%} of one core over {args.duration:g} s")
        idle, _ = measure(process, info["port"], None, args.duration)
        print(f"not scraped, publishing every 1 s: {idle:.3f} CPU s in {args.duration:g} s = "
              f"{idle / args.duration:.3%} of one core")
        for every in args.every:
            used, scrapes = measure(process, info["port"], every, args.duration)
            print(f"scraped every {every:g} s ({scrapes} scrapes): {used:.3f} CPU s in {args.duration:g} s = "
                  f"{used / args.duration:.3%} of one core ({(used - idle) / args.duration:.3%} above idle)")
    finally:
        child.send_signal(signal.SIGTERM)
        child.wait(timeout=10)


if __name__ == "__main__":
    main()
