"""One DataLoader worker frozen mid-epoch: recovered in place against the restart (issue 28), side by side in one run.

The real CLI (``python -m supervisor run``), default settings but the training, two runs one after the other, the same
freeze in each: once a chosen batch of the first epoch is fed to the model, one loader worker process of the training
process gets SIGSTOP (a real hang, no fault flag: the training process waits for that worker's batch). One run has
``[recovery] in_place = true`` (the default), the other ``false`` (the restart as before). Printed per run, from the
supervisor's own incident record: the stall (the last batch to the verdict: detection), the time from the verdict to
the next trained batch, and the batches trained twice (a restart's lost work, counted from the images each batch fed
to the model); and the run's wall time. With ``--night SECONDS``: a compressed night as well, a loader worker frozen
every ``--hang-every`` seconds (seeded) for that long, each mode, and the batches per second each kept.

With ``--kinds``: issue 38's hang kinds instead (bench/hangs.py: a loader worker blocked on a lock, spinning or
stopped, the training process spinning or blocked, the whole tree), each made once the chosen batch is fed, with the
default settings (in place on), and with ``--baseline DIR`` the same with the code in DIR (a checkout of an earlier
commit): each kind's tier, detection and last batch to the next one, side by side.

    .venv/bin/python -m bench.in_place                          # the CPU demo (2 workers, 64 px)
    python3 -m bench.in_place --gpu                             # YOLOv8n 640 px, batch 32, 8 workers on GPU 0
    python3 -m bench.in_place --gpu --night 300 --hang-every 20-40
    python3 -m bench.in_place --gpu --kinds loader_blocked,loader_spinning,loader_stopped,main_spinning,main_blocked,tree \\
        --baseline /tmp/before
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shlex
import signal
import sys
import tempfile
import time
from pathlib import Path

from bench.burst import burst_config
from bench.hangs import Hangs, parse_kinds
from bench.harness import ROOT, add_training_args, apply_training_defaults
from bench.lost_work import BenchError, SupervisedRun
from worker.training.trainer import RECORD_FED_ENV

POLL = 0.01


def config(path: Path, args: argparse.Namespace, in_place: bool) -> Path:
    return burst_config(path, args, sections={"recovery": {"in_place": in_place}})


def fed_batches(path: Path) -> list[tuple[int, int]]:
    """(epoch, batch) of every batch fed to the model, in order (one line per image in the file)."""
    if not path.exists():
        return []
    seen: list[tuple[int, int]] = []
    for line in path.read_text().splitlines():
        parts = line.split()
        if len(parts) == 3 and (not seen or seen[-1] != (int(parts[0]), int(parts[1]))):
            seen.append((int(parts[0]), int(parts[1])))
    return seen


def freeze_a_loader_worker(worker_pid: int) -> int | None:
    import psutil

    try:
        children = sorted(psutil.Process(worker_pid).children(), key=lambda p: p.pid)
    except psutil.NoSuchProcess:
        return None
    if not children:
        return None
    os.kill(children[0].pid, signal.SIGSTOP)
    return children[0].pid


def one_freeze(tmp: Path, label: str, args: argparse.Namespace, in_place: bool, kind: str | None = None,
               hangs: Hangs | None = None, root: Path = ROOT) -> dict:
    """One run, one hang once batch ``--freeze-at`` of epoch 1 is fed: a loader worker frozen, or (``kind``) a hang
    of that kind made by ``hangs``."""
    fed = tmp / f"{label}.fed"
    os.environ[RECORD_FED_ENV] = str(fed)
    run = SupervisedRun(config(tmp / f"{label}.toml", args, in_place), tmp / f"state-{label}", tmp / f"{label}.log",
                        root=root)
    try:
        pid, _ = run.wait_training(0)
        while run.proc.poll() is None and not any(b >= args.freeze_at for e, b in fed_batches(fed) if e == 0):
            time.sleep(POLL)
        frozen = freeze_a_loader_worker(pid) if kind is None else hangs.make(kind, pid)
        if not frozen:
            raise BenchError(f"{label}: nothing to hang")
        run.proc.wait(timeout=args.limit)
    finally:
        run.stop()
    incidents = [json.loads(line) for line in (run.state_dir / "incidents.jsonl").read_text().splitlines()]
    hang = next(i for i in incidents if i.get("reason") == "hang")
    stall = hang["seconds_since_progress"]
    if hang.get("tier") == "in_place":
        cost = hang["tier_cost"]
        after = cost["action"] + cost["to_next_batch"]
    else:
        after = hang.get("restart_seconds")
    batches = fed_batches(fed)
    return {"label": label, "tier": hang.get("tier"), "stall": stall, "after": after,
            "twice": len(batches) - len(set(batches)),
            "seconds": time.time() - run.started, "exit": run.proc.returncode, "frozen": frozen,
            "escalation": hang.get("escalation")}


def night(tmp: Path, label: str, args: argparse.Namespace, in_place: bool, low: float, high: float) -> dict:
    """A loader worker frozen every LO-HI s for ``--night`` seconds: the batches trained per second of it."""
    fed = tmp / f"{label}.fed"
    os.environ[RECORD_FED_ENV] = str(fed)
    night_args = argparse.Namespace(**{**vars(args), "epochs": 1000})
    run = SupervisedRun(config(tmp / f"{label}.toml", night_args, in_place), tmp / f"state-{label}",
                        tmp / f"{label}.log")
    rng, freezes = random.Random(args.seed), 0
    try:
        run.wait_training(0)
        start = time.time()
        next_at = start + rng.uniform(low, high)
        while time.time() - start < args.night and run.proc.poll() is None:
            if time.time() >= next_at:
                status = run.state().get("status", {})
                if status.get("state") == "healthy" and freeze_a_loader_worker(status.get("worker_pid") or 0):
                    freezes += 1
                next_at = time.time() + rng.uniform(low, high)
            time.sleep(0.2)
        batches = fed_batches(fed)
    finally:
        run.stop()
    status = run.state().get("status", {})
    unique = len(set(batches))
    return {"label": label, "freezes": freezes, "kept_per_second": unique / args.night,
            "recoveries": status.get("recoveries"), "twice": len(batches) - unique}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_training_args(parser)
    parser.add_argument("--freeze-at", type=int, help="freeze once this batch of epoch 1 is fed (0-based)")
    parser.add_argument("--limit", type=float, default=900.0, help="seconds a run may take")
    parser.add_argument("--night", type=float, default=0.0, help="seconds of a compressed night per mode (0: none)")
    parser.add_argument("--hang-every", default="20-40", help="LO-HI seconds between freezes in the night")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--kinds", help="issue 38's hang kinds, comma-separated (bench/hangs.py KINDS)")
    parser.add_argument("--baseline", type=Path, help="with --kinds: a checkout of earlier code to run them with too")
    args = parser.parse_args()
    gpu = {"epochs": 2, "images": 1024, "imgsz": 640, "batch": 32, "workers": 8, "freeze_at": 14}
    cpu = {"epochs": 2, "images": 200, "imgsz": 64, "batch": 4, "workers": 2, "freeze_at": 10}
    apply_training_defaults(args, gpu, cpu)
    print("command: " + shlex.join([sys.executable, *sys.argv]), flush=True)
    print(f"{args.model} {args.imgsz} px, batch {args.batch}, workers {args.workers}, {args.images} images "
          f"({args.images // args.batch} batches an epoch), {args.epochs} epochs; one loader worker frozen once "
          f"batch {args.freeze_at} of epoch 1 is fed", flush=True)
    if args.kinds:
        return by_kind(args, parse_kinds(args.kinds, args.gpu))
    with tempfile.TemporaryDirectory(prefix="in-place-") as tmp_name:
        tmp = Path(tmp_name)
        rows = [one_freeze(tmp, "in_place", args, True), one_freeze(tmp, "restart", args, False)]
        print(f"{'':10} {'tier':>9} {'detect s':>9} {'to next batch s':>16} {'trained twice':>14} {'run s':>7}")
        for r in rows:
            print(f"{r['label']:10} {r['tier']!s:>9} {r['stall']:>9.1f} {r['after'] or float('nan'):>16.2f} "
                  f"{r['twice']:>14} {r['seconds']:>7.0f}   exit {r['exit']}"
                  + (f"  (escalated: {r['escalation']})" if r["escalation"] else ""))
        fast, slow = rows
        if fast["after"] and slow["after"]:
            print(f"after detection, the next batch came {slow['after'] / fast['after']:.1f}x sooner in place; "
                  f"from the last batch {(slow['stall'] + slow['after']) / (fast['stall'] + fast['after']):.2f}x")
        if args.night:
            low, high = (float(x) for x in args.hang_every.split("-"))
            nights = [night(tmp, "night-in_place", args, True, low, high),
                      night(tmp, "night-restart", args, False, low, high)]
            for n in nights:
                print(f"{n['label']:15} {n['freezes']} freezes in {args.night:.0f} s: {n['kept_per_second']:.2f} "
                      f"batches/s kept, {n['twice']} trained twice, recoveries {n['recoveries']}")
            if nights[1]["kept_per_second"]:
                print(f"in place keeps {nights[0]['kept_per_second'] / nights[1]['kept_per_second']:.2f}x the "
                      f"restart's batches per second")
    return 0


def by_kind(args: argparse.Namespace, kinds: list[str]) -> int:
    """Each kind once with this code (default settings: in place on), and with ``--baseline``'s."""
    codes = [("now", ROOT)] + ([("baseline", args.baseline)] if args.baseline else [])
    print(f"{'kind':16} {'code':9} {'tier':>9} {'detect s':>9} {'last batch -> next s':>21} {'twice':>6} {'run s':>6}")
    with tempfile.TemporaryDirectory(prefix="in-place-kinds-") as tmp_name:
        tmp = Path(tmp_name)
        hangs = Hangs.install(tmp)
        for kind in kinds:
            for code, root in codes:
                try:
                    r = one_freeze(tmp, f"{kind}-{code}", args, True, kind, hangs, root)
                except (BenchError, StopIteration, OSError) as e:
                    print(f"{kind:16} {code:9} failed: {e}", flush=True)
                    continue
                total = r["stall"] + r["after"] if r["after"] is not None else float("nan")
                print(f"{kind:16} {code:9} {r['tier']!s:>9} {r['stall']:>9.1f} {total:>21.2f} {r['twice']:>6} "
                      f"{r['seconds']:>6.0f}   exit {r['exit']}"
                      + (f"  (escalated: {r['escalation']})" if r["escalation"] else ""), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
