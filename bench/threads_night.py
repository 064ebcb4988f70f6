"""Issue 58's nights: what the training process's other threads do to the judgement, each beside its twin in one call.

- ``--night spin``: issue 48's night that climbs (bench/burst.py ``--night climbs``: a loader worker blocked, one whose
  rebuilt loader blocks too, a loader worker spinning, the training process spinning, the whole tree frozen, the
  training process blocked on a lock, a validation loader worker spinning, each 8-14 s after the last recovery),
  once as it is and once with a native thread spinning without the GIL in the training process
  (bench/native_spin.py: ``AsyncEventsLoop``, as ROCm 7's HIP runtime thread spins, TheRock #7051). Printed: each
  hang's kind, its tier and when it was found (its incident's stall), side by side. The issue: a training process
  blocked on a lock found at 10.0-15.1 s with the thread, 3.5-3.6 s without.
- ``--night waits``: healthy epoch ends: an ``on_train_epoch_end`` callback (added to Ultralytics' default callbacks
  in the training process, as a logger or tracker is) that waits, epoch after epoch in turn: a joined thread that
  sleeps 6 s, a loopback socket answered after 6 s, ``queue.get()`` of a thread's upload to that server, a future's
  result (6 s), a ``pickle.dumps`` that holds the GIL for about 4 s; beside its undisturbed twin. Printed: the kills
  (goal 0) and the wall time ratio (goal: within the noise, the waits' own seconds aside).

Both on the CPU demo by default (``--gpu``: YOLOv8n 640 px on device 0, as burst.py); the standby is off in the spin
night, so that every attempt is a process started cold, the spinning thread in each and only there.

    .venv/bin/python -m bench.threads_night --night spin --epochs 4 --limit 600
    .venv/bin/python -m bench.threads_night --night waits --epochs 5
    python3 -m bench.threads_night --gpu --night spin --epochs 10 --limit 900
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import sys
import tempfile
from pathlib import Path

from bench.burst import CLIMBS, Burst, burst_config, night
from bench.harness import add_training_args, apply_training_defaults
from bench.hangs import Hangs, parse_kinds

# In the training process only (``python -m worker``, a standby too: it becomes one), never a loader worker.
WORKER_ONLY = 'sys.orig_argv[1:3] == ["-m", "worker"]'

SPIN_HOOK = f'''
import sys
if os.environ.get("BENCH_NATIVE_SPIN") and {WORKER_ONLY} and "--standby" not in sys.orig_argv:
    from bench.native_spin import spinning_native_thread  # (the checkout is on the run's PYTHONPATH)
    _bench_spin = spinning_native_thread()
'''

WAITS = ("join", "socket", "queue", "future", "pickle")
WAIT_SECONDS = 6.0
PICKLE_SECONDS = 4.0

# The callback, added to Ultralytics' default callbacks as its module is imported (the worker imports Ultralytics
# after its own set-up: nothing is imported here before it).
EPOCH_END_HOOK = f'''
import importlib.abc, importlib.util, sys
if os.environ.get("BENCH_EPOCH_END_WAITS") and {WORKER_ONLY}:
    def _bench_epoch_end(trainer):
        import decimal, pickle, queue, socket, threading, time
        from concurrent.futures import ThreadPoolExecutor
        waits = os.environ["BENCH_EPOCH_END_WAITS"].split(",")
        kind = waits[trainer.epoch % len(waits)]
        print(f"bench: epoch {{trainer.epoch + 1}} ends in a wait: {{kind}}", flush=True)
        if kind == "join":
            worker = threading.Thread(target=time.sleep, args=({WAIT_SECONDS},), name="upload")
            worker.start()
            worker.join()
        elif kind in ("socket", "queue"):
            server = socket.create_server(("127.0.0.1", 0))
            def answer():
                peer, _ = server.accept()
                time.sleep({WAIT_SECONDS})
                peer.sendall(b"ok")
                peer.close()
            threading.Thread(target=answer, name="loopback server", daemon=True).start()
            def upload():
                with socket.create_connection(server.getsockname()) as s:
                    return s.recv(2)
            if kind == "socket":
                upload()
            else:
                done = queue.Queue()
                threading.Thread(target=lambda: done.put(upload()), name="upload", daemon=True).start()
                done.get()
            server.close()
        elif kind == "future":
            with ThreadPoolExecutor(1) as pool:
                pool.submit(time.sleep, {WAIT_SECONDS}).result()
        elif kind == "pickle":
            sample = [decimal.Decimal(i) / 7 for i in range(20000)]
            start = time.perf_counter()
            pickle.dumps(sample)
            per_item = (time.perf_counter() - start) / len(sample)
            pickle.dumps(sample * max(1, int({PICKLE_SECONDS} / per_item / len(sample))))  # the GIL held throughout

    class _AddCallback(importlib.abc.MetaPathFinder):
        def find_spec(self, name, path, target=None):
            if name != "ultralytics.utils.callbacks.base":
                return None
            sys.meta_path.remove(self)
            spec = importlib.util.find_spec(name)
            run = spec.loader.exec_module
            def exec_module(module):
                run(module)
                module.default_callbacks["on_train_epoch_end"].append(_bench_epoch_end)
            spec.loader.exec_module = exec_module
            return spec

    sys.meta_path.insert(0, _AddCallback())
'''


def incidents(state_dir: Path) -> list[dict]:
    path = state_dir / "incidents.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()] if path.exists() else []


def found_at(tmp: Path, label: str) -> list[tuple[str, str, float | None]]:
    """Each hang's (tier, the verdict's bound label, its stall) from the night's incidents."""
    slug = label.replace(",", "").replace(" ", "-")
    out = []
    for i in incidents(tmp / f"state-{slug}"):
        if i.get("reason") == "hang":
            bound = i["detail"].split("(", 1)[1].split(")", 1)[0] if "(" in i["detail"] else ""
            out.append((i.get("tier") or "-", bound, i.get("seconds_since_progress")))
    return out


def spin_night(tmp: Path, args: argparse.Namespace) -> None:
    kinds = parse_kinds(args.kinds or ",".join(CLIMBS), args.gpu)
    low, high = (float(x) for x in args.hang_every.split("-"))
    hangs = Hangs.install(tmp, extra=SPIN_HOOK)
    ladder = None
    if not args.gpu:  # the CPU demo climbs as a CUDA machine would: the forkserver first (as burst.py's climbs)
        from supervisor.decision.model.ladder import default_ladder
        ladder = {"ladder": {"rungs": list(default_ladder(args.workers, cuda=True).rungs[1:])}}
    config = burst_config(tmp / "spin.toml", args, {**(ladder or {}), "worker": {"standby": False}})
    rows = []
    for label, spinning in (("climbs", False), ("climbs, AsyncEventsLoop spinning", True)):
        if spinning:
            os.environ["BENCH_NATIVE_SPIN"] = "1"
        try:
            result = night(tmp, label, config, args, Burst(low, high, args.seed, False, kinds, hangs))
        finally:
            os.environ.pop("BENCH_NATIVE_SPIN", None)
        rows.append((result, found_at(tmp, label)))
    # Each night's hangs as they were made, then its incidents in order (a hang recovered in place that escalated
    # is one incident; the kinds and the incidents need not pair one to one)
    for result, found in rows:
        print(f"\n{result.label}: made {', '.join(result.phases) or 'none'}")
        for tier, bound, stall in found:
            print(f"  {tier:<9} found at {'?' if stall is None else f'{stall:.1f}'} s ({bound})")
    for result, _ in rows:
        done = "not finished" if result.seconds is None else f"{result.seconds:.0f} s, exit {result.exit_code}"
        print(f"{result.label}: {done}, {result.hangs} hangs, rungs {result.rungs}", flush=True)


def waits_night(tmp: Path, args: argparse.Namespace) -> None:
    waits = [w.strip() for w in args.waits.split(",") if w.strip()]
    if unknown := [w for w in waits if w not in WAITS]:
        raise SystemExit(f"--waits: unknown {', '.join(unknown)}; the waits are {', '.join(WAITS)}")
    Hangs.install(tmp, extra=EPOCH_END_HOOK)  # (its SIGUSR2 handler is never signalled here)
    config = burst_config(tmp / "waits.toml", args)
    rows = []
    for label, env in (("undisturbed", None), ("epoch-end waits", ",".join(waits))):
        if env:
            os.environ["BENCH_EPOCH_END_WAITS"] = env
        try:
            rows.append((night(tmp, label, config, args, None), found_at(tmp, label)))
        finally:
            os.environ.pop("BENCH_EPOCH_END_WAITS", None)
    (calm, _), (waited, kills) = rows
    print(f"\nepoch-end waits in turn: {', '.join(waits)} ({WAIT_SECONDS:g} s each; pickle about {PICKLE_SECONDS:g} s), "
          f"{args.epochs} epochs")
    print(f"kills: {len(kills)} (goal 0)" + "".join(f"\n  {tier} at {stall} s ({bound})" for tier, bound, stall in kills))
    if calm.seconds and waited.seconds:
        own = sum(PICKLE_SECONDS if waits[e % len(waits)] == "pickle" else WAIT_SECONDS for e in range(args.epochs))
        print(f"wall: {waited.seconds:.0f} s against {calm.seconds:.0f} s undisturbed: ratio "
              f"{waited.seconds / calm.seconds:.2f}; the waits' own {own:.0f} s aside "
              f"{(waited.seconds - own) / calm.seconds:.2f}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_training_args(parser)
    parser.add_argument("--night", choices=("spin", "waits"), required=True)
    parser.add_argument("--hang-every", default="8-14", help="spin: LO-HI seconds after each recovery")
    parser.add_argument("--kinds", help="spin: the hang kinds in turn (default issue 48's climbs)")
    parser.add_argument("--waits", default=",".join(WAITS), help="waits: the epoch-end waits in turn")
    parser.add_argument("--limit", type=float, default=900.0, help="seconds a run may take")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--keep", type=Path, help="a folder for each run's incidents and supervisor lines")
    args = parser.parse_args()
    apply_training_defaults(args, {"epochs": 10, "images": 4096, "imgsz": 640, "batch": 32, "workers": 8},
                           {"epochs": 5, "images": 400, "imgsz": 64, "batch": 4, "workers": 2})
    print("command: " + shlex.join([sys.executable, *sys.argv]), flush=True)
    print(f"{args.model} {args.imgsz} px, batch {args.batch}, workers {args.workers}, {args.images} images, "
          f"{args.epochs} epochs", flush=True)
    with tempfile.TemporaryDirectory(prefix=f"threads-{args.night}-") as name:
        tmp = Path(name)
        # A fresh machine's first training builds the label cache and compiles the imports: paid here, uncounted
        night(tmp, "warm-up", burst_config(tmp / "warm-up.toml", argparse.Namespace(**{**vars(args), "epochs": 1})),
              args, None)
        (spin_night if args.night == "spin" else waits_night)(tmp, args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
