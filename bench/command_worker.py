"""A training script as the worker: detection from its output against the heartbeat client, and the supervisor's
CPU while it parses a chatty progress bar (issue: supervise any training script).

    .venv/bin/python -m bench.command_worker [--repeat 3] [--seconds 20]

The same loop (a tqdm bar, 20 ms steps, redrawn at every step: 50 updates/s) runs under the real supervisor as a
`[worker] command`, once reading only its output, once also sending heartbeats; each is frozen with SIGSTOP after
a few seconds, and the time from the freeze to the incident is the detection. Then the loop runs unfrozen for
``--seconds`` and the supervisor's own CPU time over that span is its cost, in % of one core (goal: under 1%).
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

import psutil

from bench.harness import ROOT, quiet_config

LOOP = r'''
import os, sys, time
from tqdm import tqdm
beats = os.environ.get("BENCH_HEARTBEAT") == "1"
if beats:
    from worker.heartbeat import Heartbeat
    hb = Heartbeat.from_env()
    hb.phase("train")
steps = int(sys.argv[1])
for i in tqdm(range(steps), desc="Epoch 1/1", mininterval=0, miniters=1):
    time.sleep(0.02)
    if beats:
        hb.beat(epoch=1, epochs=1, batch=i + 1, batches=steps)
if beats:
    hb.phase("done")
'''


def detection(tmp: Path, name: str, steps: int, heartbeat: bool, freeze_after: float) -> float:
    script = tmp / "loop.py"
    script.write_text(LOOP)
    config = tmp / f"{name}.toml"
    config.write_text(f'[worker]\ncommand = ["python", "{script}", "{steps}"]\n'
                      f'env = {{ BENCH_HEARTBEAT = "{int(heartbeat)}", PYTHONPATH = "{ROOT}" }}\n'
                      '[restart]\nmax_restarts = 1\n' + quiet_config())
    state = tmp / f"state-{name}"
    proc = subprocess.Popen([sys.executable, "-m", "supervisor", "run", "--config", str(config), "--state-dir",
                             str(state)], cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        status = None
        while status is None or status.get("state") != "healthy":
            time.sleep(0.1)
            try:
                status = json.loads((state / "supervisor.json").read_text())["status"]
            except (OSError, ValueError, KeyError):
                status = None
        time.sleep(freeze_after)
        frozen_at = time.time()
        os.kill(status["worker_pid"], signal.SIGSTOP)
        incident = None  # the live status's: incidents.jsonl has it only once its batches after are counted
        while incident is None:
            time.sleep(0.05)
            try:
                incident = json.loads((state / "supervisor.json").read_text())["status"].get("last_incident")
            except (OSError, ValueError, KeyError):
                pass
        return incident["time"] - frozen_at
    finally:
        proc.terminate()  # the supervisor takes its tree with it
        proc.wait(timeout=30)


def supervisor_cpu(tmp: Path, seconds: float) -> float:
    """% of one core the supervisor spends while the bar redraws 50 times a second."""
    script = tmp / "loop.py"
    script.write_text(LOOP)
    steps = int((seconds + 30) / 0.02)
    config = tmp / "cpu.toml"
    config.write_text(f'[worker]\ncommand = ["python", "{script}", "{steps}"]\n' + quiet_config())
    state = tmp / "state-cpu"
    proc = subprocess.Popen([sys.executable, "-m", "supervisor", "run", "--config", str(config), "--state-dir",
                             str(state)], cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    supervisor = psutil.Process(proc.pid)
    try:
        time.sleep(5)  # past imports and startup
        cpu0, t0 = sum(supervisor.cpu_times()[:2]), time.monotonic()
        time.sleep(seconds)
        cpu1, t1 = sum(supervisor.cpu_times()[:2]), time.monotonic()
        status = json.loads((state / "supervisor.json").read_text())["status"]
        assert status["state"] == "healthy", status["state"]
        return 100 * (cpu1 - cpu0) / (t1 - t0)
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=20.0)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as name:
        tmp = Path(name)
        detect = {"output": [], "heartbeat": []}
        for i in range(args.repeat):
            for way in detect:
                detect[way].append(detection(tmp, f"{way}-{i}", 3000, way == "heartbeat", 4.0))
        cpu = [supervisor_cpu(tmp, args.seconds) for _ in range(max(1, args.repeat - 1))]
    out, hb = statistics.median(detect["output"]), statistics.median(detect["heartbeat"])
    print(f"freeze to detection, median of {args.repeat}: output parsing {out:.2f} s "
          f"({', '.join(f'{x:.2f}' for x in detect['output'])}), heartbeat client {hb:.2f} s "
          f"({', '.join(f'{x:.2f}' for x in detect['heartbeat'])}); ratio {out / hb:.2f}")
    print(f"supervisor CPU while parsing a bar at 50 updates/s: {statistics.median(cpu):.2f}% of one core "
          f"({', '.join(f'{c:.2f}' for c in cpu)}); goal 1%: ratio {statistics.median(cpu) / 1.0:.2f}")


if __name__ == "__main__":
    main()
