"""Where a restart's time goes: a hang injected into a real run under the supervisor, then the resumed worker's own
account of its start (interpreter and imports, trainer, model/dataset/loaders, first batch) beside the
supervisor's detection and kill figures (issue: lose minutes, not epochs; restart in seconds).

Three restarts side by side: cold (``[worker] standby = false``), from the imported standby (``standby_ready =
"off"``) and from the ready standby (``"auto"``, the default: device context, model, datasets and the training
loader's workers held), each incident's ``restart_parts`` (kill, to_spawn, then each startup step of the next worker;
``model_load`` and ``first_batch_held``, or ``first_batch_primed`` where its workers were fed at the verdict, where the ready
one held them) in a column; ``--repeat N`` runs each N times
and prints each part's range.

    .venv/bin/python -m bench.restart_breakdown                                   # the CPU demo
    python3 -m bench.restart_breakdown --imgsz 640 --images 1024 --batch 32 --workers 8 --device 0   # a GPU
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import tempfile
from pathlib import Path

from bench.harness import ROOT, quiet_config
from worker.startup.demo_data import ensure_demo_dataset


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--imgsz", type=int, default=64)
    parser.add_argument("--images", type=int, default=32)
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--hang-after", type=int, default=10, help="batch of attempt 1 after which it hangs: late "
                        "enough for the standby to be ready (its line says so), which it waits for on a GPU")
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--starts", default=",".join(STARTS), help=f"which of {', '.join(STARTS)}, in order")
    parser.add_argument("--repeat", type=int, default=1, help="runs of each start")
    args = parser.parse_args()
    data = ensure_demo_dataset(train_images=args.images, val_images=8, size=args.imgsz)
    print(f"{args.device}, imgsz {args.imgsz}, {args.images} images, batch {args.batch}, workers {args.workers}")
    starts = [s for s in args.starts.split(",") if s]
    parts: dict[str, list[dict[str, float]]] = {s: [] for s in starts}
    for _ in range(args.repeat):
        for start in starts:
            parts[start].append(run_once(args, data, start))
    print_side_by_side(parts)


STARTS = {"cold": "standby = false", "imported": 'standby_ready = "off"', "ready": 'standby_ready = "auto"',
          # room for the standby's first step at the training's batch (a GPU's kernels chosen there, not at one image)
          "ready-16g": 'standby_ready = "auto"\nstandby_memory_mib = 16384'}
# The parts' order: the supervisor's, then the next worker's startup steps (worker/wire/contract.py StartupStep).
ORDER = ("kill", "to_spawn", "imports", "checkpoint", "model", "model_load", "amp_check", "dataset", "loaders",
         "first_batch", "first_batch_held", "first_batch_primed", "first_step", "restart_seconds", "freeze", "it/s after", "it/s next epoch")
# Ultralytics' progress line at an epoch's end: "  2/3   0G  ...  64: 100% ━━━ 8/8 1.8it/s 4.5s"
EPOCH_LINE = re.compile(r"^(?:\x1b\[K)?\s*(\d+)/\d+\s+\S+G\s.*?100%.*?\s(\d+)/\d+\s+([\d.]+)(it/s|s/it)", re.M)


def print_side_by_side(parts: dict[str, list[dict[str, float]]]) -> None:
    """Each part's seconds per start (min-max over the runs), the restart's total and the freeze's below, then the
    slow batches after it: the rate of the epoch that held the restart (its batches after the resume, the first
    included) beside the next epoch's."""
    names = [n for n in ORDER if any(n in run for runs in parts.values() for run in runs)]

    def cell(runs: list[dict[str, float]], name: str) -> str:
        values = [run[name] for run in runs if name in run]
        if not values:
            return "-"
        low, high = min(values), max(values)
        return f"{low:.2f}" if high - low < 0.005 else f"{low:.2f}-{high:.2f}"

    print(f"\nseconds (it/s: rates), {max(len(r) for r in parts.values())} run(s) each (min-max)")
    print(f"{'part':<16}" + "".join(f"{start:>14}" for start in parts))
    for name in names:
        print(f"{name:<16}" + "".join(f"{cell(runs, name):>14}" for runs in parts.values()))


def run_once(args: argparse.Namespace, data: Path, start: str) -> dict[str, float]:
    with tempfile.TemporaryDirectory() as tmp:
        config = Path(tmp) / "config.toml"
        config.write_text(f'[train]\ndata = "{data}"\nmodel = "yolov8n.yaml"\nepochs = {args.epochs}\nimgsz = {args.imgsz}\n'
                          f'batch = {args.batch}\nworkers = {args.workers}\ndevice = "{args.device}"\nplots = false\n'
                          f'[worker]\n{STARTS[start]}\n' + quiet_config())
        state = Path(tmp) / "state"
        result = subprocess.run([sys.executable, "-m", "supervisor", "run", "--config", str(config), "--state-dir",
                                 str(state), "--fault", f"main_hang,at_batch={args.hang_after},attempt=1"],
                                cwd=ROOT, capture_output=True, text=True, timeout=900)
        if result.returncode != 0:
            raise SystemExit(result.stderr[-3000:])
        incident = json.loads((state / "incidents.jsonl").read_text().splitlines()[0])
        core_incident = json.loads((state / "supervisor.json").read_text())["incidents"][0]
    lines = re.findall(r"yolo-train worker: ((?:spawn|standby launch) to first batch .*)", result.stderr + result.stdout)
    restart = core_incident.get("restart_seconds", float("nan"))
    print(f"{start} ({STARTS[start]}): the restart came from {core_incident.get('restart_start', '?')}")
    print(f"  resumed attempt: {lines[1] if len(lines) > 1 else '?'}")
    for line in re.findall(r"yolo-train standby: (ready in .*)", result.stderr + result.stdout)[:1]:
        print(f"  its standby: {line}")
    for line in re.findall(r"yolo-train standby: ((?:its|no) training loader.*)", result.stderr + result.stdout)[:1]:
        print(f"  at the verdict: {line}")  # the prime: its loader fed, its first step at the training's batch
    for line in re.findall(r"yolo-train worker: (device warm-up .*)", result.stderr + result.stdout)[-1:]:
        print(f"  the resumed attempt's {line}")
    rates = {int(e): float(r) if unit == "it/s" else 1 / float(r)
             for e, _, r, unit in EPOCH_LINE.findall(result.stderr + result.stdout)}  # the last line of each epoch
    held = args.hang_after // max(1, args.images // args.batch) + 1  # the epoch the hang came in, resumed after it
    slow = {"it/s after": rates[held]} if held in rates else {}
    if held + 1 in rates:
        slow["it/s next epoch"] = rates[held + 1]
    return {**core_incident.get("restart_parts", {}), "restart_seconds": restart,
            "freeze": incident["seconds_since_progress"] + restart, **slow}


if __name__ == "__main__":
    main()
