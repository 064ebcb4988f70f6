"""Where a restart's time goes: a hang injected into a real run under the supervisor, then the resumed worker's own
account of its start (interpreter and imports, trainer, model/dataset/loaders, first batch) beside the
supervisor's detection and kill figures (issue: lose minutes, not epochs; restart in seconds).

With ``[worker] standby`` off and on, one after the other, and their ratio.

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
from worker.demo_data import ensure_demo_dataset


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--imgsz", type=int, default=64)
    parser.add_argument("--images", type=int, default=32)
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--hang-after", type=int, default=10, help="batch of attempt 1 after which it hangs")
    parser.add_argument("--standby", choices=("both", "on", "off"), default="both",
                        help="[worker] standby: both runs one after the other (off first), or one of them")
    args = parser.parse_args()
    data = ensure_demo_dataset(train_images=args.images, val_images=8, size=args.imgsz)
    print(f"{args.device}, imgsz {args.imgsz}, {args.images} images, batch {args.batch}, workers {args.workers}")
    freezes = {}
    for standby in ((False, True) if args.standby == "both" else (args.standby == "on",)):
        freezes[standby] = run_once(args, data, standby)
    if len(freezes) == 2:
        print(f"freeze to first resumed batch, standby on / off: {freezes[True]:.1f} / {freezes[False]:.1f} s "
              f"= {freezes[True] / freezes[False]:.2f}")


def run_once(args: argparse.Namespace, data: Path, standby: bool) -> float:
    with tempfile.TemporaryDirectory() as tmp:
        config = Path(tmp) / "config.toml"
        config.write_text(f'[train]\ndata = "{data}"\nmodel = "yolov8n.yaml"\nepochs = 3\nimgsz = {args.imgsz}\n'
                          f'batch = {args.batch}\nworkers = {args.workers}\ndevice = "{args.device}"\nplots = false\n'
                          f'[worker]\nstandby = {str(standby).lower()}\n' + quiet_config())
        state = Path(tmp) / "state"
        result = subprocess.run([sys.executable, "-m", "supervisor", "run", "--config", str(config), "--state-dir",
                                 str(state), "--fault", f"main_hang,at_batch={args.hang_after},attempt=1"],
                                cwd=ROOT, capture_output=True, text=True, timeout=900)
        if result.returncode != 0:
            raise SystemExit(result.stderr[-3000:])
        incident = json.loads((state / "incidents.jsonl").read_text().splitlines()[0])
        core_incident = json.loads((state / "supervisor.json").read_text())["incidents"][0]
    starts = re.findall(r"yolo-train worker: ((?:spawn|standby launch) to first batch .*)", result.stderr + result.stdout)
    freeze = incident["seconds_since_progress"] + core_incident.get("restart_seconds", float("nan"))
    print(f"[worker] standby = {str(standby).lower()}")
    print(f"  first attempt:   {starts[0] if starts else '?'}")
    print(f"  resumed attempt: {starts[1] if len(starts) > 1 else '?'}")
    print(f"  hang: detected after {incident['seconds_since_progress']:.1f} s without progress; tree of "
          f"{incident['kill']['processes']} killed in {incident['kill']['seconds']:.2f} s; detection to the first "
          f"resumed batch {core_incident.get('restart_seconds', float('nan')):.1f} s; freeze to first resumed batch "
          f"{freeze:.1f} s")
    return freeze


if __name__ == "__main__":
    main()
