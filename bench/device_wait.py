"""A GPU kernel that never ends, supervised: found by the witness's word (the training process waits for the device)
against the tree's activity alone, side by side in one run.

A plain PyTorch loop (a small convolutional net on random data, batches of tens of milliseconds on GPU 0) runs under
``python -m supervisor run`` as a ``[worker] command`` with our heartbeat client. After batch ``--hang-at`` of its
first attempt it launches a kernel that spins for ever (``torch.cuda._sleep``) and goes on: the next batch's ``.item()``
waits for the device, as a lost completion leaves the host (ROCm's ``BusyWaitSignal::WaitRelaxed``, CUDA's spin in
the runtime). Two modes, alternated: ``witness`` (``Heartbeat.from_env(witness=True)``: the training process says it
waits for the device) and ``tree`` (no witness: a host that spins in the runtime is busy, so ``auto_floor`` bounds
it). Printed per run, from the supervisor's incident: the stall (the last batch to the verdict), the restart (the
verdict to the next attempt's first batch) and their sum, the stacks' capture (``stacks``) and how long before the
verdict it began (``ahead``: None where the kill read them), the verdict to the kill's first signal (``to_kill``) and
the kill; then each mode's min/median/max. ``--ultralytics`` runs our
worker instead (YOLOv8n at 640 px, batch 32, 8 workers, 1024 images) with the fault ``device_hang`` after batch
``--hang-at`` of its first attempt: the witness's verdict, then the restart from the standby.

    python3 -m bench.device_wait --repeat 3
    python3 -m bench.device_wait --ultralytics --repeat 2 --hang-at 40
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench.harness import ROOT, checkout_env, quiet_config

LOOP = """
import os, sys, time
import torch
import torch.nn.functional as F
from worker.heartbeat import Heartbeat

hb = Heartbeat.from_env(witness=sys.argv[1] == "witness")
torch.manual_seed(0)
net = torch.nn.Sequential(torch.nn.Conv2d(3, 64, 3, padding=1), torch.nn.ReLU(), torch.nn.Conv2d(64, 64, 3, padding=1),
                          torch.nn.ReLU(), torch.nn.AdaptiveAvgPool2d(1), torch.nn.Flatten(), torch.nn.Linear(64, 10))
net = net.to("cuda")
opt = torch.optim.SGD(net.parameters(), lr=0.01)
x = torch.randn(64, 3, 128, 128, device="cuda")
y = torch.randint(0, 10, (64,), device="cuda")
hang = not os.path.exists("hung-once")
hb.phase("train")
for step in range(1, {steps} + 1):
    loss = F.cross_entropy(net(x), y)
    opt.zero_grad()
    loss.backward()
    opt.step()
    hb.beat(epoch=1, epochs=1, batch=step, batches={steps}, losses={{"loss": loss.item()}})
    if hang and step == {hang_at}:
        open("hung-once", "w").close()
        torch.cuda._sleep(1 << 46)  # a kernel that never ends: the next .item() waits for the device
hb.phase("done")
"""


def ultralytics_config(path: Path) -> str:
    from worker.startup.demo_data import ensure_demo_dataset

    data = ensure_demo_dataset(train_images=1024, val_images=8, size=640)
    return (f'[train]\ndata = "{data}"\nmodel = "yolov8n.yaml"\nepochs = 2\nimgsz = 640\nbatch = 32\nworkers = 8\n'
            f'device = "0"\nplots = false\n' + quiet_config())


def run_once(mode: str, args: argparse.Namespace) -> dict:
    with tempfile.TemporaryDirectory(prefix="device-wait-") as tmp:
        tmp_path = Path(tmp)
        config = tmp_path / "config.toml"
        extra: list[str] = []
        if mode == "ultralytics":
            config.write_text(ultralytics_config(tmp_path))
            extra = ["--fault", f"device_hang,at_batch={args.hang_at},attempt=1"]
        else:
            (tmp_path / "train.py").write_text(LOOP.format(steps=args.steps, hang_at=args.hang_at))
            config.write_text(f'[worker]\ncommand = ["{sys.executable}", "train.py", "{mode}"]\ncwd = "{tmp_path}"\n'
                              + quiet_config())
        started = time.monotonic()
        done = subprocess.run([sys.executable, "-m", "supervisor", "run", "--config", str(config), "--state-dir",
                               str(tmp_path / "state"), *extra], cwd=ROOT, env=checkout_env(),
                              capture_output=True, text=True, timeout=args.limit)
        wall = time.monotonic() - started
        if args.logs is not None:
            args.logs.mkdir(parents=True, exist_ok=True)
            incidents = tmp_path / "state" / "incidents.jsonl"
            (args.logs / f"{mode}-{time.time():.0f}.log").write_text(
                done.stdout + done.stderr + (incidents.read_text() if incidents.exists() else ""))
        lines = (tmp_path / "state" / "incidents.jsonl").read_text().splitlines() \
            if (tmp_path / "state" / "incidents.jsonl").exists() else []
        if done.returncode != 0 or len(lines) != 1:
            raise SystemExit(f"{mode}: exit {done.returncode}, {len(lines)} incidents\n{done.stderr[-3000:]}")
        incident = json.loads(lines[0])
        stall, restart = incident["seconds_since_progress"], incident.get("restart_seconds")
        kill = incident.get("kill") or {}
        stacks_s, kill_s = incident.get("stacks_seconds"), kill.get("seconds")
        launches = re.findall(r"(?:standby launch|spawn) to first batch [^\n]*", done.stdout + done.stderr)
        return {"mode": mode, "stall": stall, "restart": restart, "stacks": stacks_s,
                "ahead": incident.get("stacks_ahead_seconds"), "to_kill": verdict_to_kill(incident), "kill": kill_s,
                "launch": launches[-1][:160] if len(launches) > 1 else None,
                "total": None if restart is None else round(stall + restart, 2), "wall": round(wall, 1),
                "witness": incident.get("witness"), "detail": incident["detail"]}


def verdict_to_kill(incident: dict) -> float | None:
    """Seconds from the verdict to the kill's first signal: the kill's end (``confirmed_wall``) less its duration,
    less the verdict's time; about 0 where the stacks were read ahead of the verdict (``stacks_ahead_seconds``),
    the capture's seconds where the kill read them. None: the incident does not say."""
    kill = incident.get("kill") or {}
    if kill.get("confirmed_wall") is None or kill.get("seconds") is None or incident.get("time") is None:
        return None
    return round(kill["confirmed_wall"] - kill["seconds"] - incident["time"], 3)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeat", type=int, default=3, help="runs of each mode (alternated)")
    parser.add_argument("--steps", type=int, default=400, help="batches of the loop")
    parser.add_argument("--hang-at", type=int, default=150, help="the batch after which the kernel never ends")
    parser.add_argument("--limit", type=float, default=240.0, help="seconds a run may take")
    parser.add_argument("--ultralytics", action="store_true", help="our worker, YOLOv8n 640 px, the device_hang fault")
    parser.add_argument("--logs", type=Path, help="a directory for each run's supervisor output")
    args = parser.parse_args()
    modes = ("ultralytics",) if args.ultralytics else ("witness", "tree")
    results = []
    for _ in range(args.repeat):
        for mode in modes:
            r = run_once(mode, args)
            results.append(r)
            print(json.dumps(r), flush=True)
    for mode in modes:
        mine = [r for r in results if r["mode"] == mode]
        for key in ("stall", "to_kill", "restart", "total"):
            values = [r[key] for r in mine if r[key] is not None]
            if values:
                print(f"{mode:8s} {key:8s} min {min(values):6.2f}  median {statistics.median(values):6.2f}  "
                      f"max {max(values):6.2f} s  ({len(values)} runs)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
