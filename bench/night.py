"""A night compressed: does probing give the speed back after a transient hang, and at what risk?

The real supervisor (``yolo-train run``) trains the CPU demo made long (``--epochs``) on the default ladder for
``workers = 2``. One transient hang early at rung 0 (``dataloader_hang`` on attempt 1 only) climbs to rung 1;
then the same run twice, side by side: with ``[ladder] probe_after`` short (the supervisor tries rung 0 again at
a checkpoint once rung 1 has trained that long) and with probing off (rung 1 for the rest of the night).
``[checkpoint] every`` is short too. The supervisor's state file is read every ``--poll`` seconds for the progress.

Printed per run: throughput over the rest of the run (batches from the restart to the end, over that time,
restart and probe included) and its ratio to rung 0's median it/s (``rung_speeds``, as ``yolo-train status
--json`` shows it), the seconds from the restart until the run is back on rung 0, until a window of
``--window`` seconds first trains at >= 0.95 of rung 0's speed (goal: within ``probe_after`` plus one
checkpoint interval), and the hangs counted (goal: 1, the probe caused none).

    .venv/bin/python -m bench.night [--epochs 60] [--imgsz 128] [--probe-after 20] [--every 10]
"""

from __future__ import annotations

import argparse
import json
import shlex
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

from bench.harness import ROOT, quiet_config

CONFIG = """
name = "night"
[train]
data = "demo"
model = "yolov8n.yaml"
epochs = {epochs}
imgsz = {imgsz}
batch = 4
workers = 2
device = "cpu"
plots = false
val = false
[recovery]
in_place = false
""" + quiet_config() + """
[restart]
backoff_initial = 0.5
[checkpoint]
every = "{every}s"
[ladder]
probe_after = {probe_after}
"""


def night(probe_after: str, args: argparse.Namespace, workdir: Path) -> dict:
    """One supervised run; the progress samples (monotonic time, rung, batches done) and the final status."""
    config = workdir / "config.toml"
    config.write_text(textwrap.dedent(CONFIG.format(epochs=args.epochs, imgsz=args.imgsz, every=args.every,
                                                    probe_after=probe_after)))
    state_dir = workdir / "state"
    command = [sys.executable, "-m", "supervisor", "run", "--config", str(config), "--state-dir", str(state_dir),
               "--fault", f"dataloader_hang,at_batch={args.hang_at},attempt=1"]
    samples: list[tuple[float, int, int]] = []
    with subprocess.Popen(command, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True) as run:
        while run.poll() is None:
            status = read_status(state_dir)
            if status and status.get("batches"):
                done = (status["epoch"] - 1) * status["batches"] + status["batch"]
                samples.append((time.monotonic(), status["rung"], done))
            time.sleep(args.poll)
        stderr = run.stderr.read()
    status = read_status(state_dir)
    if run.returncode != 0 or not status:
        raise SystemExit(f"night.py: the run with probe_after = {probe_after} failed ({run.returncode}):\n"
                         f"{stderr[-2000:]}")
    incidents = (state_dir / "incidents.jsonl").read_text().splitlines()
    return {"samples": samples, "status": status, "hangs": len(incidents)}


def read_status(state_dir: Path) -> dict | None:
    try:
        return json.loads((state_dir / "supervisor.json").read_text())["status"]
    except (OSError, ValueError, KeyError):
        return None  # not written yet, or being replaced


def summary(result: dict, args: argparse.Namespace) -> dict:
    samples, status = result["samples"], result["status"]
    rung0 = status["rung_speeds"].get("0")
    climbed = next(i for i, (_, rung, _) in enumerate(samples) if rung > 0)
    start, _, done_at_start = samples[climbed]
    # The restart's first progress: the last sample with the climbed-from count, the first with more after it.
    restart = next((t for t, _, done in samples[climbed:] if done != done_at_start), start)
    end, _, done_end = samples[-1]
    back = next((t - restart for t, rung, done in samples[climbed:] if rung == 0 and done > done_at_start), None)
    recovered = None
    for i, (t, _, done) in enumerate(samples):
        if t < restart:
            continue
        later = [s for s in samples[i:] if s[0] - t >= args.window]
        if later and rung0 and (later[0][2] - done) / (later[0][0] - t) >= 0.95 * rung0 and samples[i][1] == 0:
            recovered = t - restart
            break
    rest = (done_end - done_at_start) / (end - start)
    return {"rest": rest, "rung0": rung0, "ratio": rest / rung0 if rung0 else None, "back": back,
            "recovered": recovered, "hangs": result["hangs"], "speeds": status["rung_speeds"]}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--epochs", type=int, default=60, help="epochs of the demo's 8 batches: the run must outlast "
                        "probe_after + every by minutes")
    parser.add_argument("--imgsz", type=int, default=128, help="bigger images: more loader work per batch")
    parser.add_argument("--probe-after", type=float, default=20.0, help="seconds; the probing run's probe_after")
    parser.add_argument("--every", type=float, default=10.0, help="[checkpoint] every, seconds")
    parser.add_argument("--hang-at", type=int, default=5, help="the transient hang: after this batch of attempt 1")
    parser.add_argument("--window", type=float, default=5.0, help="seconds of the throughput window")
    parser.add_argument("--poll", type=float, default=0.25)
    args = parser.parse_args()
    print("command: " + shlex.join([sys.executable, *sys.argv]))
    rows = {}
    for name, probe_after in (("probing", f'"{args.probe_after:g}s"'), ("no probing", '"off"')):
        with tempfile.TemporaryDirectory(prefix="night-") as workdir:
            rows[name] = summary(night(probe_after, args, Path(workdir)), args)
    goal = args.probe_after + args.every
    print(f"\ndemo x {args.epochs} epochs at {args.imgsz} px, workers 2, one dataloader hang after batch "
          f"{args.hang_at} of attempt 1; probe_after {args.probe_after:g} s, checkpoint every {args.every:g} s")
    print(f"  {'run':<11} {'rest it/s':>9} {'rung 0 it/s':>11} {'ratio':>6} {'on rung 0 after':>15} "
          f"{'>=0.95 after':>12} {'hangs':>5}  rung speeds")
    for name, r in rows.items():
        fmt = lambda v, spec: "never" if v is None else format(v, spec)  # noqa: E731
        print(f"  {name:<11} {r['rest']:9.2f} {fmt(r['rung0'], '11.2f')} {fmt(r['ratio'], '6.2f')} "
              f"{fmt(r['back'], '15.1f')} {fmt(r['recovered'], '12.1f')} {r['hangs']:5d}  "
              f"{ {k: round(v, 2) for k, v in r['speeds'].items() if v} }")
    recovered = rows["probing"]["recovered"]
    print(f"goal: back to >= 0.95 of rung 0 within probe_after + every = {goal:g} s: "
          f"{'never' if recovered is None else f'{recovered:.1f} s ({recovered / goal:.2f} of the goal)'}; "
          f"hangs with probing {rows['probing']['hangs']} (goal 1)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
