"""Goodput soak (issue 10): long training with a hang every 10 minutes, against no faults and epoch-only checkpoints.

Three runs of the real CLI (``python -m supervisor run``) on the CPU demo made long (a generated set of
``--images`` training images, several minutes an epoch here), one after the other, never at once:

- faults, ``[checkpoint] every = --every`` (30 s): in each ``--hang-every`` window (10 minutes) of wall time since
  the run started the worker's main process is frozen with SIGSTOP at a seeded random point (a real hang: nothing
  raised, nothing printed); the supervisor detects it (``auto`` stall timeout), kills the tree, resumes;
- no faults, the same training and interval (the ceiling: startup and checkpoint saves are its only losses);
- faults, ``every = "epoch"`` (today's epoch-end checkpoints), the same hang points.

Each runs ``--minutes`` (30) of wall time; the baselines ``--baseline-minutes`` (default the same). At the end the
bench reads the supervisor's ``goodput`` (kept training time over wall time, docs/design.md "Goodput"), ``trained_seconds``
and ``lost_seconds``, then stops it with SIGTERM. Its own measure, which trusts no supervisor arithmetic: how far
training got (epoch and batch from the state file, sampled every few seconds), against the no-fault run at the
same wall time. Goal: goodput at least 0.95 with faults and 30 s checkpoints.

    .venv/bin/python -m bench.goodput                       # the issue's soak: 3 x 30 min, about 95 minutes
    .venv/bin/python -m bench.goodput --minutes 3 --hang-every 1 --every 10 --images 4000   # a quick check
"""

from __future__ import annotations

import argparse
import random
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from bench.lost_work import SupervisedRun, checkpointed_config, hang_incident

SAMPLE_EVERY = 5.0  # seconds between progress samples read from the state file


@dataclass
class Soak:
    """One variant's outcome."""
    label: str
    minutes: float
    status: dict = field(default_factory=dict)  # the state file's status at the end, before the stop
    progress: list[tuple[float, int, float]] = field(default_factory=list)  # (s since start, batches, goodput)
    hangs: list[dict] = field(default_factory=list)  # the supervisor's hang incidents

    def position_at(self, seconds: float) -> int:
        """Batches trained to (epochs x batches + batch) at ``seconds`` of wall time since the run started: the
        newest sample by then (a restart goes back to its checkpoint)."""
        return ([b for t, b, _ in self.progress if t <= seconds] or [0])[-1]

    def goodput_at(self, seconds: float) -> float:
        """The supervisor's goodput in the newest sample by ``seconds`` since the run started."""
        return ([g for t, _, g in self.progress if t <= seconds] or [0.0])[-1]


def position(status: dict) -> int | None:
    if not status.get("batches") or not status.get("epoch"):
        return None
    return (status["epoch"] - 1) * status["batches"] + (status.get("batch") or 0)


def soak(tmp: Path, label: str, data: str, every: float | str, minutes: float, hang_points: list[float]) -> Soak:
    """Run ``minutes`` of supervised training, freezing the worker at each hang point (seconds since the start)."""
    slug = label.replace(" ", "-").replace(",", "")
    run = SupervisedRun(checkpointed_config(tmp / f"{slug}.toml", data, every, epochs=1000), tmp / f"state-{slug}",
                        tmp / f"{slug}.log")
    result = Soak(label, minutes)
    end = run.started + minutes * 60
    pending = [run.started + p for p in hang_points if p < minutes * 60]
    attempt, pid, first = 0, None, None
    try:
        while (now := time.time()) < end:
            if pid is None and len(run.first_batches) > attempt:  # the next attempt trains: its pid is there
                pid, first = run.wait_training(attempt)
            if pending and pending[0] <= now and pid is not None:
                pending.pop(0)
                stopped, _ = run.freeze(pid, first)
                attempt, pid = attempt + 1, None
                print(f"  {label}: froze attempt {attempt} at {(stopped - run.started) / 60:.1f} min", flush=True)
            status = run.state().get("status", {})
            if (at := position(status)) is not None:
                result.progress.append((time.time() - run.started, at, status.get("goodput") or 0.0))
            if run.proc.poll() is not None:
                raise SystemExit(f"the supervisor exited early ({run.proc.returncode}); see {run.log.name}")
            wake = min(end, now + (0.5 if pid is None else SAMPLE_EVERY))  # a restart is watched closely
            if pending and pid is not None:
                wake = min(wake, pending[0])
            time.sleep(max(0.0, wake - time.time()))
        result.status = run.state().get("status", {})
        if pid is None and attempt:  # frozen and not yet resumed at the end: its incident has no restart yet
            attempt -= 1
        result.hangs = [hang_incident(run, a) for a in range(1, attempt + 1)]
    finally:
        run.stop()
    s = result.status
    print(f"  {label}: goodput {s.get('goodput') or 0:.3f}, trained {s.get('trained_seconds') or 0:.0f} s, lost "
          f"{s.get('lost_seconds') or 0:.0f} s, at epoch {s.get('epoch')} batch {s.get('batch')}/{s.get('batches')}",
          flush=True)
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--minutes", type=float, default=30.0, help="wall time of the faulted 30 s-checkpoint run")
    parser.add_argument("--baseline-minutes", type=float, default=None,
                        help="wall time of the no-fault and epoch-only runs (default: --minutes)")
    parser.add_argument("--every", type=float, default=30.0, help="[checkpoint] every, seconds")
    parser.add_argument("--hang-every", type=float, default=10.0, help="minutes: one hang at a random point of each")
    parser.add_argument("--images", type=int, default=12000, help="training images of the generated set")
    parser.add_argument("--seed", type=int, default=1)
    options = parser.parse_args()
    baseline = options.baseline_minutes or options.minutes

    from worker.startup.demo_data import ensure_demo_dataset

    data = str(ensure_demo_dataset(train_images=options.images, val_images=8, size=64))
    window = options.hang_every * 60
    rng = random.Random(options.seed)
    hang_points = [k * window + rng.uniform(0, window) for k in range(int(options.minutes * 60 // window))]
    print(f"{options.images} training images ({options.images // 4} batches an epoch); hangs at "
          f"{', '.join(f'{p / 60:.1f}' for p in hang_points)} min; checkpoints every {options.every:g} s", flush=True)
    with tempfile.TemporaryDirectory(prefix="goodput-") as tmp_name:
        tmp = Path(tmp_name)
        faulted = soak(tmp, f"faults, every {options.every:g} s", data, options.every, options.minutes, hang_points)
        clean = soak(tmp, f"no faults, every {options.every:g} s", data, options.every, baseline, [])
        epoch_only = soak(tmp, "faults, epoch only", data, "epoch", baseline, hang_points)

    print(f"\n{'variant':<26} {'minutes':>7} {'hangs':>5} {'goodput':>7} {'trained':>7} {'lost':>6} {'lost/hang':>9} "
          f"{'detect':>6} {'restart':>7}")
    for r in (faulted, clean, epoch_only):
        n = len(r.hangs)
        mean = (lambda key: sum(h.get(key) or 0 for h in r.hangs) / n if n else 0.0)
        print(f"{r.label:<26} {r.minutes:7g} {n:5d} {r.status.get('goodput') or 0:7.3f} "
              f"{r.status.get('trained_seconds') or 0:7.0f} {r.status.get('lost_seconds') or 0:6.0f} "
              f"{mean('lost_seconds'):9.1f} {mean('seconds_since_progress'):6.1f} {mean('restart_seconds'):7.1f}")
    goodput = faulted.status.get("goodput") or 0.0
    print(f"\ngoal: goodput {goodput:.3f} >= 0.95: ratio {goodput / 0.95:.3f}")
    for other in (clean, epoch_only):
        print(f"goodput against {other.label}: {goodput:.3f} / {other.status.get('goodput') or 0:.3f} = "
              f"{goodput / (other.status.get('goodput') or float('nan')):.3f}")
    common = min(options.minutes, baseline) * 60
    reference = clean.position_at(common)
    for r in (faulted, epoch_only):
        print(f"progress after {common / 60:.0f} min, against no faults: {r.label} {r.position_at(common)} / "
              f"{reference} batches = {r.position_at(common) / reference:.3f}" if reference else "no progress")
    if options.minutes > baseline:
        print(f"{faulted.label} after {common / 60:g} min: goodput {faulted.goodput_at(common):.3f} against "
              f"{clean.status.get('goodput') or 0:.3f} without faults and {epoch_only.status.get('goodput') or 0:.3f} "
              f"epoch only; after {options.minutes:g} min: {faulted.position_at(options.minutes * 60)} batches")


if __name__ == "__main__":
    main()
