"""A bad night compressed (issue 23): the whole worker tree frozen every 20-40 s, against the same training undisturbed.

The real CLI (``python -m supervisor run``), default settings but the training, one run after the other:

- undisturbed: the training to its end; its wall time is the reference;
- a burst: the same training; ``--hang-every LO-HI`` seconds (seeded, uniform) after each attempt's first training
  batch, every process of the worker's tree gets SIGSTOP (a real hang: nothing raised, nothing printed, the loader
  workers frozen too). The supervisor detects it, kills the tree and resumes; the bench waits for the next attempt's
  first batch and draws the next point;
- with ``--whatever-phase``, the compressed bad night of issue 29: each freeze ``--hang-every`` seconds after the
  previous one (the first after the run's start), whatever the phase: before an attempt's first batch (its startup,
  a resume's), in training, validation or at an epoch's end. A freeze that falls due while the tree frozen last is
  not yet replaced waits for the next worker and freezes it at once;
- with ``--kinds K1,K2,...``, issue 38's compressed night: hangs of those kinds in turn (bench/hangs.py: a loader
  worker blocked, spinning or stopped, the training process spinning or blocked, the whole tree), each
  ``--hang-every`` seconds after the last was recovered (in place or by a restart), whatever the phase; each hang's
  cost by its incident (in place: the stall, the action and the wait for the next batch);
- with ``--night climbs``, issue 48's night that climbs: its kinds in turn (a loader worker blocked, one whose
  rebuilt loader blocks too: a hang the loader's rungs cure, the restart climbs; a loader worker spinning, the
  training process spinning, the whole tree frozen, the training process blocked, a validation loader worker
  spinning), each 8-14 s after the last recovery; on the CPU the ladder is CUDA's default (the forkserver rung
  first), so the in-place tier is tried at a climbed rung. Printed beside the goodput: the batches each restart
  replayed (its incident's ``lost_batches``) and the rungs the hangs met;
- with ``--baseline DIR``, the burst again with the code in DIR (a checkout of an earlier commit, e.g. ``git worktree
  add /tmp/before fe7f68b``): what the run did before, with the same hang points.

A one-epoch warm-up runs first, uncounted (a fresh machine's first training builds the label cache and bytecode).
Goodput here is the undisturbed wall time over the burst's (a run that does not finish within ``--limit`` seconds
has none: its progress is printed instead); beside it, each hang's cost as its incident records it (stall, kill,
restart, work lost), which the machine's speed drifting from one run to the next does not move. Printed beside it: hangs, the rungs the run visited, the checkpoint
interval of its last attempt, and the supervisor's exit.

    .venv/bin/python -m bench.burst                                    # the CPU demo (2 workers, 64 px)
    python3 -m bench.burst --gpu --hang-every 20-40 --baseline /tmp/before      # YOLOv8n 640 px on a GPU
    python3 -m bench.burst --gpu --epochs 28 --hang-every 270-330 --baseline /tmp/before --limit 1000  # every 5 min
    python3 -m bench.burst --gpu --whatever-phase --hang-every 20-40 --limit 1200   # issue 29's compressed night
    python3 -m bench.burst --gpu --hang-every 10-20 --baseline /tmp/before \\
        --kinds loader_blocked,loader_spinning,loader_stopped,main_spinning,main_blocked,tree   # issue 38's night
    .venv/bin/python -m bench.burst --epochs 12 --night climbs --runs undisturbed,burst --limit 600  # issue 48's
"""

from __future__ import annotations

import argparse
import os
import random
import signal
import shlex
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from bench.hangs import Hangs, parse_kinds
from bench.harness import ROOT, add_training_args, apply_training_defaults, quiet_sections, write_config
from bench.lost_work import BenchError, SupervisedRun

POLL = 0.2  # seconds between looks at the run


@dataclass
class Night:
    label: str
    seconds: float | None = None  # wall time to the supervisor's exit; None: not finished within the limit
    exit_code: int | None = None
    hangs: int = 0
    hang_costs: list[float | None] = field(default_factory=list)  # each hang's cost by its incident, in seconds
    replayed: list[int] = field(default_factory=list)  # batches each restart trained again (its lost_batches)
    after: list[dict] = field(default_factory=list)  # each recovery's batches after it, against those before (59.2)
    rungs: list[int] = field(default_factory=list)  # rung of each attempt (--whatever-phase: of each freeze)
    phases: list[str] = field(default_factory=list)  # --whatever-phase: the phase each freeze landed in
    status: dict = field(default_factory=dict)


def burst_config(path: Path, args: argparse.Namespace, sections: dict | None = None) -> Path:
    from worker.startup.demo_data import ensure_demo_dataset

    data = str(ensure_demo_dataset(train_images=args.images, val_images=8, size=args.imgsz))
    train = {"data": data, "model": args.model, "epochs": args.epochs, "imgsz": args.imgsz, "batch": args.batch,
             "workers": args.workers, "device": "0" if args.gpu else "cpu", "plots": False}
    quiet = {"kernel_log": quiet_sections()["kernel_log"]}  # its metrics are served: write_config's free port
    return write_config(path, train, sections={**quiet, **(sections or {})}, name=path.stem)


def freeze_tree(pid: int) -> int:
    """SIGSTOP the worker and every process it started: how a driver hang leaves a training."""
    import psutil

    try:
        processes = [psutil.Process(pid)] + psutil.Process(pid).children(recursive=True)
    except psutil.NoSuchProcess:
        return 0
    frozen = 0
    for process in processes:
        try:
            os.kill(process.pid, signal.SIGSTOP)
            frozen += 1
        except ProcessLookupError:
            pass
    return frozen


class Burst:
    """Freezes each attempt at a seeded point after its first training batch, or (``anywhere``) a seeded time after
    the previous freeze, whatever the phase."""

    def __init__(self, low: float, high: float, seed: int, anywhere: bool = False, kinds: list[str] | None = None,
                 hangs: Hangs | None = None, target=None):
        """``target(status)``: the pid whose tree a hang of ``kinds`` goes to (default the worker's; bench/ddp.py: one
        rank's), None while it is not known."""
        self.low, self.high, self.rng, self.anywhere = low, high, random.Random(seed), anywhere
        self.kinds, self.hangs = kinds or [], hangs
        self.target = target or (lambda status: status.get("worker_pid"))

    def delay(self) -> float:
        return self.rng.uniform(self.low, self.high)


def night(tmp: Path, label: str, config: Path, args: argparse.Namespace, burst: Burst | None,
          root: Path = ROOT) -> Night:
    slug = label.replace(",", "").replace(" ", "-")
    run = SupervisedRun(config, tmp / f"state-{slug}", tmp / f"{slug}.log", root=root)
    result = Night(label)
    attempts = 0
    try:
        if burst is not None and burst.kinds:
            hang_after_each_recovery(run, burst, result, args.limit)
        elif burst is not None and burst.anywhere:
            freeze_whatever_the_phase(run, burst, result, args.limit)
        while run.proc.poll() is None and time.time() - run.started < args.limit and not (burst and burst.anywhere) \
                and not (burst and burst.kinds):
            try:
                pid, first = run.wait_training(attempts, limit=args.limit - (time.time() - run.started))
            except BenchError:
                break  # finished, or out of time
            attempts += 1
            result.rungs.append(run.state().get("status", {}).get("rung", -1))
            if burst is None:
                continue
            at = first + burst.delay()
            while run.proc.poll() is None and time.time() < at:
                time.sleep(POLL)
            status = run.state().get("status", {})
            if run.proc.poll() is None and status.get("worker_pid") == pid and status.get("state") == "healthy":
                if freeze_tree(pid):
                    result.hangs += 1
        if run.proc.poll() is not None:
            result.seconds, result.exit_code = time.time() - run.started, run.proc.returncode
        result.status = run.state().get("status", {})
        result.hang_costs = hang_costs(run.state_dir / "incidents.jsonl")
        result.replayed = replayed(run.state_dir / "incidents.jsonl")
        result.after = afters(run.state_dir / "incidents.jsonl")
    finally:
        run.stop()
        if args.keep:
            keep(run, slug, args.keep)
    s = result.status
    done = "not finished" if result.seconds is None else f"{result.seconds:.0f} s, exit {result.exit_code}"
    landed = f"; phases {result.phases}" if result.phases else ""
    print(f"  {label}: {done}; {result.hangs} hangs; rungs {result.rungs}{landed}; "
          f"epoch {s.get('epoch')}/{s.get('epochs')}; "
          f"checkpoint every {s.get('checkpoint_every')} s at the end", flush=True)
    if result.exit_code:
        print(f"    its exit: {(s.get('exit') or {}).get('text')}", flush=True)
    return result


def freeze_whatever_the_phase(run: SupervisedRun, burst: Burst, result: Night, limit: float) -> None:
    """Freeze the worker's tree a seeded delay after the previous freeze, in whatever phase it is; the rung and
    phase of each freeze are recorded."""
    frozen_pid, due = None, run.started + burst.delay()
    while run.proc.poll() is None and time.time() - run.started < limit:
        time.sleep(POLL)
        status = run.state().get("status", {})
        pid = status.get("worker_pid")
        if time.time() < due or not pid or pid == frozen_pid or status.get("state") not in ("starting", "healthy"):
            continue
        if freeze_tree(pid):
            frozen_pid, due = pid, time.time() + burst.delay()
            result.hangs += 1
            result.rungs.append(status.get("rung", -1))
            result.phases.append(status.get("phase") or status.get("state"))


def hang_after_each_recovery(run: SupervisedRun, burst: Burst, result: Night, limit: float) -> None:
    """Issue 38's night: a hang of the next kind in turn a seeded delay after the last one was recovered (the worker
    healthy again, its recoveries counted), in training or validation."""
    due = None
    while run.proc.poll() is None and time.time() - run.started < limit:
        time.sleep(POLL)
        if not burst.hangs.again():
            continue  # loader_twice: its rebuilt loader is to hang too
        if not (run.state_dir / "supervisor.json").exists():
            continue  # not written yet: `run` checks the config's device before it takes the state directory
        status = run.state().get("status", {})
        recovered = sum((status.get("recoveries") or {}).values()) >= result.hangs
        if not recovered or status.get("state") != "healthy":
            due = None  # the last hang is not recovered yet: its delay starts once it is
            continue
        if due is None:
            due = time.time() + burst.delay()
        pid = burst.target(status)
        if time.time() < due or status.get("phase") not in ("train", "val") or not pid:
            continue  # (an epoch's end or a save: the hang comes at the next batch)
        kind = burst.kinds[result.hangs % len(burst.kinds)]
        if burst.hangs.make(kind, pid):
            result.hangs += 1
            result.rungs.append(status.get("rung", -1))
            result.phases.append(f"{kind}@{status.get('phase')}")
        due = None


def steady_goodput(cost: float, every: float, wall_cadence: bool) -> float:
    """The goodput of a night that goes on with a hang costing ``cost`` s every ``every`` s: of training (each hang
    adds its cost), or of wall time (each takes its cost out of the interval: 0.5 needs a hang to cost at most
    half of it)."""
    cost = max(cost, 0.0)
    return max(0.0, 1.0 - cost / every) if wall_cadence else every / (every + cost)


def hang_records(incidents: Path) -> list[dict]:
    """The hangs' lines of an incidents.jsonl (none where it is missing)."""
    import json

    lines = incidents.read_text().splitlines() if incidents.exists() else []
    return [r for r in (json.loads(line) for line in lines if line.strip()) if r.get("reason") == "hang"]


def hang_costs(incidents: Path) -> list[float | None]:
    """What each hang cost by the supervisor's own record: the stall before it was called a hang, the restart from
    the verdict to the next first batch (the stacks and the kill are inside it) and the work thrown away. Unlike
    wall times compared across runs, this does not move with the machine's speed from one run to the next. None
    where the record lacks a part (earlier code kept no restart_seconds)."""
    costs: list[float | None] = []
    for record in hang_records(incidents):
        if record.get("tier") == "in_place":  # nothing thrown away: the stall, the action, the wait for the batch
            cost = record.get("tier_cost") or {}
            parts = (record.get("seconds_since_progress"), cost.get("action"), cost.get("to_next_batch"))
            costs.append(None if None in parts else sum(parts))
            continue
        parts = (record.get("seconds_since_progress"), record.get("restart_seconds"), record.get("lost_seconds"))
        costs.append(None if None in parts else sum(parts))
    return costs


def afters(incidents: Path) -> list[dict]:
    """Each hang's ``after``: its recovery's first batches timed against those before its stall."""
    return [r["after"] for r in hang_records(incidents) if isinstance(r.get("after"), dict)]


def replayed(incidents: Path) -> list[int]:
    """The batches each hang's restart trained again: its training after the checkpoint it resumed from."""
    return [r["lost_batches"] for r in hang_records(incidents) if r.get("tier") != "in_place"
            and isinstance(r.get("lost_batches"), int)]


# Issue 48's night that climbs: its kinds in turn, each 8-14 s after the last recovery
CLIMBS = ("loader_blocked", "loader_twice", "loader_spinning", "main_spinning", "tree", "main_blocked",
          "val_loader_spinning")


def keep(run: SupervisedRun, slug: str, folder: Path) -> None:
    """The run's incidents and the supervisor's own lines (not the worker's), for a look after the bench."""
    import shutil

    folder.mkdir(parents=True, exist_ok=True)
    incidents = run.state_dir / "incidents.jsonl"
    if incidents.exists():
        shutil.copy(incidents, folder / f"{slug}-incidents.jsonl")
    lines = [line for line in Path(run.log.name).read_text(errors="replace").splitlines(True)
             if line.startswith("yolo-train")]
    (folder / f"{slug}-supervisor.log").write_text("".join(lines[-3000:]))
    tail = Path(run.log.name).read_text(errors="replace").splitlines(True)[-400:]
    (folder / f"{slug}-tail.log").write_text("".join(tail))  # the worker's own last words too


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_training_args(parser)
    parser.add_argument("--hang-every", default="20-40", help="LO-HI seconds after each first training batch")
    parser.add_argument("--whatever-phase", action="store_true",
                        help="each freeze LO-HI seconds after the previous one, in whatever phase (issue 29)")
    parser.add_argument("--baseline", type=Path, help="a checkout of earlier code to run the same burst with")
    parser.add_argument("--limit", type=float, default=None, help="seconds a run may take (default 6x undisturbed)")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--runs", default="undisturbed,burst,baseline", help="which runs, of these three")
    parser.add_argument("--reference", type=float, help="the undisturbed run's seconds, measured earlier on the same "
                        "machine: it is not run again")
    parser.add_argument("--keep", type=Path, help="a folder for each run's incidents and supervisor lines")
    parser.add_argument("--kinds", help="issue 38's hang kinds in turn, each --hang-every s after the last was "
                        "recovered (bench/hangs.py KINDS)")
    parser.add_argument("--night", choices=("climbs",), help="climbs: issue 48's night (its kinds each 8-14 s after "
                        "the last recovery; on the CPU, CUDA's default ladder)")
    args = parser.parse_args()
    if args.night == "climbs":
        args.kinds = args.kinds or ",".join(CLIMBS)
        if "--hang-every" not in sys.argv:
            args.hang_every = "8-14"
    gpu = {"epochs": 10, "images": 4096, "imgsz": 640, "batch": 32, "workers": 8}
    cpu = {"epochs": 6, "images": 800, "imgsz": 64, "batch": 4, "workers": 2}
    apply_training_defaults(args, gpu, cpu)
    low, high = (float(x) for x in args.hang_every.split("-"))
    kinds = parse_kinds(args.kinds, args.gpu) if args.kinds else None
    print("command: " + shlex.join([sys.executable, *sys.argv]), flush=True)
    when = "after the previous freeze, whatever the phase" if args.whatever_phase else "after each first training batch"
    if kinds:
        when = f"after the last recovery, whatever the phase; hangs of {', '.join(kinds)} in turn"
    print(f"{args.model} {args.imgsz} px, batch {args.batch}, workers {args.workers}, {args.images} images "
          f"({args.images // args.batch} batches an epoch), {args.epochs} epochs; the tree frozen {low:g}-{high:g} s "
          f"{when}", flush=True)
    with tempfile.TemporaryDirectory(prefix="burst-") as tmp_name:
        tmp = Path(tmp_name)
        hangs = Hangs.install(tmp) if kinds else None
        ladder = None
        if args.night == "climbs" and not args.gpu:  # the CPU demo climbs as a CUDA machine would: forkserver first
            from supervisor.decision.model.ladder import default_ladder
            ladder = {"ladder": {"rungs": list(default_ladder(args.workers, cuda=True).rungs[1:])}}
        config = burst_config(tmp / "burst.toml", args, ladder)
        runs = args.runs.split(",")
        limit, args.limit = args.limit, args.limit or 3600.0
        # The first training on a fresh machine builds the dataset's label cache and compiles the imports: a cost
        # no later run pays, so a one-epoch run pays it here, uncounted.
        night(tmp, "warm-up", burst_config(tmp / "warm-up.toml", argparse.Namespace(**{**vars(args), "epochs": 1})),
              args, None)
        if args.reference is None:
            calm = night(tmp, "undisturbed", config, args, None)
            if calm.seconds is None or calm.exit_code != 0:
                raise SystemExit(f"burst.py: the undisturbed run did not finish ({calm.exit_code})")
        else:
            calm = Night("undisturbed (earlier)", seconds=args.reference, exit_code=0)
        args.limit = limit or 6 * calm.seconds
        rows = [calm]
        if "burst" in runs:
            rows.append(night(tmp, "burst", config, args, Burst(low, high, args.seed, args.whatever_phase, kinds,
                                                                 hangs)))
        if args.baseline and "baseline" in runs:
            rows.append(night(tmp, "burst, baseline", config, args, Burst(low, high, args.seed, args.whatever_phase,
                                                                          kinds, hangs), root=args.baseline))
    print(f"\n{'run':<16} {'seconds':>8} {'goodput':>8} {'hangs':>5} {'exit':>4}  rungs; checkpoint interval at the end")
    for r in rows:
        goodput = "-" if r.seconds is None or r.exit_code else f"{calm.seconds / r.seconds:.3f}"
        seconds = f"> {args.limit:.0f}" if r.seconds is None else f"{r.seconds:.0f}"
        print(f"{r.label:<16} {seconds:>8} {goodput:>8} {r.hangs:5d} {str(r.exit_code):>4}  {r.rungs}; "
              f"{r.status.get('checkpoint_every')} s; epoch {r.status.get('epoch')}/{r.status.get('epochs')}")
    every = (low + high) / 2
    # After each first batch, a hang comes every ``every`` s of training: each costs its own time on top. Whatever
    # the phase, a freeze comes every ``every`` s of wall time, its recovery inside: each takes its cost out of them.
    cadence = "s of wall time, its recovery inside," if args.whatever_phase else "s of training"
    for burst in rows[1:]:
        if burst.seconds is not None and burst.exit_code == 0:
            line = f"{burst.label}: goodput {calm.seconds / burst.seconds:.3f}"
            if burst.hangs:
                # A short run holds few hangs: what each cost, spread over the interval, is the goodput of a
                # night that goes on like this.
                cost = (burst.seconds - calm.seconds) / burst.hangs
                line += (f"; {cost:.1f} s lost a hang, so at one hang every {every:g} {cadence} a steady "
                         f"goodput of {steady_goodput(cost, every, args.whatever_phase):.3f}")
            print(line, flush=True)
        if burst.replayed:
            print(f"{burst.label}: {sum(burst.replayed)} batches replayed over {len(burst.replayed)} restarts "
                  f"({burst.replayed}); rungs the hangs met {burst.rungs}", flush=True)
        timed = [a for a in burst.after if a.get("extra_seconds") is not None]
        if timed:
            print(f"{burst.label}: the batches after each recovery against those before its stall: "
                  + ", ".join(f"{a['batches']} at {a['ratio']:.2f}x ({a['extra_seconds']:+.1f} s)" for a in timed)
                  + f"; {sum(a['extra_seconds'] for a in timed):+.1f} s in all", flush=True)
        measured = [c for c in burst.hang_costs if c is not None]
        if measured:
            cost = sum(measured) / len(measured)
            print(f"{burst.label}: by its incidents, {cost:.1f} s a hang (stall + restart, the kill in it, + work "
                  f"lost, {len(measured)} hangs): at one hang every {every:g} {cadence} a goodput of "
                  f"{steady_goodput(cost, every, args.whatever_phase):.3f}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
