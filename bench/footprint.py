"""What the supervisor costs while it supervises: its memory and its CPU, without its children.

1. Runs ``yolo-train run`` on the embedded demo (its config as shipped, on a free metrics port) ``--repeat``
   times and samples the supervisor process every ``--interval`` seconds: RSS and USS (the pages only it
   holds), and its own CPU time (all its threads, in nanoseconds from /proc/PID/task/*/schedstat; its
   children are not counted). Prints RSS (goal: under 60 MB) and CPU as a percentage of one core over the
   training, from the first training batch to the end (goal: under 1%), and that CPU divided by the heartbeat
   messages of the same window. The worker runs with its messages recorded (bench/heartbeat.py's timed
   worker; the supervisor is unchanged), so the messages are counted, not estimated.
2. Isolates the supervisor's CPU per heartbeat: a stand-in worker (``[worker] python``) sends nothing for
   a few seconds (the supervisor's idle cost: status writes, ticks), then the worker's per-batch beats at
   the demo's rate, with no output to forward; per beat = (CPU while beating - idle rate x time) / beats.

Medians over the runs; the machine is shared, so expect noise.

    .venv/bin/python -m bench.footprint [--repeat 3] [--interval 0.25] [--rate 25]
"""

from __future__ import annotations

import argparse
import glob
import json
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil

from bench.harness import ROOT, checkout_env, write_config
from bench.heartbeat import FIELDS, timed_worker

GOAL_RSS_MB = 60.0
GOAL_CPU_PERCENT = 1.0
MB = 1e6
IDLE_SECONDS = 6.0
BEAT_SECONDS = 20.0

# Stands in for the worker: idle, then beats at a steady rate; prints CLOCK_MONOTONIC marks (forwarded to the
# supervisor's log) so the bench knows the windows.
BEATING_WORKER = """
import sys, time
from worker.heartbeat import Heartbeat

hb = Heartbeat.from_env()
hb.phase("setup")
print(f"mark idle {{time.monotonic():.6f}}", flush=True)
time.sleep({idle})
count = int({seconds} * {rate})
hb.phase("train", epoch=1, epochs=1, batch=0, batches=count)
start = time.monotonic()
print(f"mark beats {{start:.6f}}", flush=True)
for i in range(count):
    hb.beat(**{{**{fields!r}, "epoch": 1, "epochs": 1, "batch": i + 1, "batches": count}})
    time.sleep(max(0.0, start + (i + 1) / {rate} - time.monotonic()))
print(f"mark end {{time.monotonic():.6f}} {{hb.sent}} {{hb.dropped}}", flush=True)
hb.phase("done")
"""
MARK = re.compile(r"mark (idle|beats|end) ([\d.]+)(?: (\d+) (\d+))?")


def cpu_seconds(pid: int) -> float:
    """CPU time of every live thread of ``pid`` (schedstat: nanoseconds, where /proc/PID/stat counts ticks)."""
    total = 0
    for path in glob.glob(f"/proc/{pid}/task/*/schedstat"):
        try:
            with open(path) as f:
                total += int(f.read().split()[0])
        except (OSError, ValueError, IndexError):
            pass
    return total / 1e9


def supervise(work: Path, config: Path, interval: float) -> tuple[list[tuple[float, float, int, int]], str]:
    """Run the supervisor on ``config`` to its end, sampling it: [(monotonic, CPU s, RSS, USS)], its log."""
    log_path = work / "supervisor.log"
    with open(log_path, "wb") as log:  # a file, as journald would be: the supervisor forwards worker output
        supervisor = subprocess.Popen([sys.executable, "-m", "supervisor", "run", "--config", str(config),
                                       "--state-dir", str(work / "state")], cwd=ROOT, env=checkout_env(),
                                      stdin=subprocess.DEVNULL, stdout=log, stderr=log)
    proc = psutil.Process(supervisor.pid)
    samples = []
    try:
        while supervisor.poll() is None:
            try:
                with proc.oneshot():
                    rss, uss = proc.memory_info().rss, proc.memory_full_info().uss
                samples.append((time.monotonic(), cpu_seconds(supervisor.pid), rss, uss))
            except psutil.Error:
                break
            time.sleep(interval)
    finally:
        if supervisor.poll() is None:
            supervisor.terminate()
        supervisor.wait(timeout=60)
    log_text = log_path.read_text(errors="replace")
    if supervisor.returncode != 0:
        raise SystemExit(f"the supervised run failed (exit {supervisor.returncode}):\n"
                         + "\n".join(log_text.splitlines()[-15:]))
    return samples, log_text


def between(samples: list, start: float, end: float) -> tuple[float, float]:
    """(seconds, supervisor CPU seconds) between the first and last samples inside [start, end]."""
    inside = [s for s in samples if start <= s[0] <= end]
    if len(inside) < 2:
        raise SystemExit(f"too few samples in a {end - start:.1f} s window: lower --interval")
    return inside[-1][0] - inside[0][0], inside[-1][1] - inside[0][1]


def demo_run(work: Path, interval: float) -> dict:
    python, records = timed_worker(work)
    config = write_config(work / "demo.toml", worker={"python": str(python)})
    samples, _ = supervise(work, config, interval)
    recorded = json.loads(records.read_text())
    train = [b for b in recorded["beats"] if b[2] == "train"]
    first_batch, last_batch = train[0][0] / 1e9, train[-1][0] / 1e9  # the worker's clock: CLOCK_MONOTONIC too
    training = [s for s in samples if first_batch <= s[0] <= last_batch]
    seconds, cpu = between(samples, first_batch, last_batch)
    t0, t1 = training[0][0], training[-1][0]
    messages = sum(1 for at, _, sent in recorded["sends"] if sent and t0 <= at <= t1)
    return {"rss": statistics.median(s[2] for s in training) / MB, "peak": max(s[2] for s in samples) / MB,
            "uss": statistics.median(s[3] for s in training) / MB, "seconds": seconds, "cpu": cpu,
            "percent": 100 * cpu / seconds, "messages": messages}


def beating_run(work: Path, interval: float, rate: float) -> dict:
    script = work / "beating_worker.py"
    script.write_text(BEATING_WORKER.format(idle=IDLE_SECONDS, seconds=BEAT_SECONDS, rate=rate,
                                            fields=FIELDS))
    python = work / "python-beating"
    python.write_text(f'#!/bin/sh\nexec "{sys.executable}" "{script}"\n')
    python.chmod(0o755)
    config = write_config(work / "demo.toml", worker={"python": str(python)})
    samples, log_text = supervise(work, config, interval)
    marks = {m[1]: m for m in MARK.finditer(log_text)}
    if set(marks) != {"idle", "beats", "end"}:
        raise SystemExit("the stand-in worker did not print its marks:\n" + "\n".join(log_text.splitlines()[-15:]))
    idle_s, idle_cpu = between(samples, float(marks["idle"][2]) + 1.0, float(marks["beats"][2]))
    beat_s, beat_cpu = between(samples, float(marks["beats"][2]), float(marks["end"][2]))
    sent = int(marks["end"][3])
    beats = sent * beat_s / (float(marks["end"][2]) - float(marks["beats"][2]))  # those inside the sampled span
    return {"idle_percent": 100 * idle_cpu / idle_s, "beat_percent": 100 * beat_cpu / beat_s,
            "per_beat_us": (beat_cpu - idle_cpu / idle_s * beat_s) / beats * 1e6, "sent": sent,
            "dropped": int(marks["end"][4])}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repeat", type=int, default=3, help="demo runs (default 3)")
    parser.add_argument("--interval", type=float, default=0.25, help="seconds between samples (default 0.25)")
    parser.add_argument("--rate", type=float, default=25.0, help="beats per second of the stand-in worker")
    args = parser.parse_args()
    runs = []
    for i in range(args.repeat):
        work = Path(tempfile.mkdtemp(prefix="yolo-train-bench-footprint-"))
        try:
            r = demo_run(work, args.interval)
        finally:
            shutil.rmtree(work, ignore_errors=True)
        runs.append(r)
        print(f"  run {i + 1}: RSS {r['rss']:.1f} MB (peak {r['peak']:.1f}), CPU {r['cpu']:.3f} s in "
              f"{r['seconds']:.1f} s = {r['percent']:.2f}%, {r['messages']} messages", flush=True)
    work = Path(tempfile.mkdtemp(prefix="yolo-train-bench-footprint-"))
    try:
        b = beating_run(work, args.interval, args.rate)
    finally:
        shutil.rmtree(work, ignore_errors=True)

    def med(key: str) -> float:
        return statistics.median(r[key] for r in runs)

    print(f"\nSupervisor footprint while it supervises the demo (yolov8n, 64 px, batch 4, workers 2, CPU; metrics "
          f"exporter, kernel log and GPU events on), median of {args.repeat} runs, {med('seconds'):.0f} s of "
          f"training each:")
    print(f"  RSS {med('rss'):.1f} MB, peak {max(r['peak'] for r in runs):.1f} MB (goal < {GOAL_RSS_MB:.0f} MB: "
          f"measured/goal = {med('rss') / GOAL_RSS_MB:.2f}); USS (pages only it holds) {med('uss'):.1f} MB")
    print(f"  CPU {med('percent'):.2f}% of one core (goal < {GOAL_CPU_PERCENT:.0f}%: measured/goal = "
          f"{med('percent') / GOAL_CPU_PERCENT:.2f})")
    per_message = statistics.median(r["cpu"] / r["messages"] for r in runs)
    rate = statistics.median(r["messages"] / r["seconds"] for r in runs)
    print(f"  {rate:.1f} heartbeat messages/s: {per_message * 1e6:.0f} us of supervisor CPU per message, "
          f"everything included (Ultralytics' progress output forwarded line by line, status writes, ticks)")
    print(f"Heartbeats alone (stand-in worker, {args.rate:.0f} beats/s, no output): {b['per_beat_us']:.0f} us of "
          f"supervisor CPU per beat; supervisor idle {b['idle_percent']:.2f}%, beating {b['beat_percent']:.2f}% "
          f"of one core [{b['sent']} sent, {b['dropped']} dropped]")
    return 0


if __name__ == "__main__":
    sys.exit(main())
