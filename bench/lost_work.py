"""Lost work per hang (issue 10): mid-epoch checkpoints against epoch-only checkpoints, hangs at random points.

A hang throws away the training done since the checkpoint the next worker resumes from. With checkpoints only at
epoch ends that is up to a whole epoch; with ``[checkpoint] every`` it is at most the interval (plus the save
itself). This bench runs the real CLI (``python -m supervisor run``) on the CPU demo made long (a generated set
of ``--images`` training images: under a minute per epoch on a quiet 2-core VM), once with ``every = --every``
seconds and once with ``every = "epoch"``, one after the other, and freezes the worker's main process with
SIGSTOP (a real hang: no exception, nothing printed) at a random point after each attempt's first training
batch. The supervisor detects the stall (the ``auto`` timeout, 10 s floor), kills the tree and resumes; the bench
waits for the next attempt's first batch and freezes it again, ``--hangs`` times per variant. Both variants get
the same seeded hang points, shares of an epoch's length as measured in the first 10 s of training (a point
earlier than that fires at 10 s in the first variant only).

Per hang it reports the lost training seconds two ways: the bench's own (SIGSTOP time minus the later of the
newest checkpoint file's mtime and the attempt's first batch as the bench saw the supervisor log it) and the
supervisor's (the incident's ``lost_seconds``), with the incident's detection (``seconds_since_progress``) and
restart (hang declared -> first batch of the resumed worker, ``restart_seconds``). Goal: the worst lost work is
at most the interval plus detection plus restart.

    .venv/bin/python -m bench.lost_work [--hangs 5] [--every 10] [--images 3000] [--seed 1]

The default took 16 minutes on the shared 2-core VM (its speed varies with the load); ``--hangs 20`` for a
tighter worst case (four times as long).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from bench.harness import ROOT, checkout_env, write_config

FIRST_BATCH = "first training batch"  # the supervisor's line when an attempt trains (supervisor/decision/heartbeats.py)
SPEED_WINDOW = (3.0, 10.0)  # seconds after the first batch between which the first attempt's speed is taken
START_LIMIT = 180.0  # seconds an attempt may take to reach its first batch before the bench gives up


class BenchError(RuntimeError):
    pass


@dataclass
class Hang:
    """One frozen worker, as the bench saw it and as the supervisor accounted it."""
    attempt: int
    position: float  # seconds from the attempt's first batch to the SIGSTOP (bench clock)
    lost_bench: float  # SIGSTOP - max(newest checkpoint mtime, attempt's first batch)
    lost: float  # the incident's lost_seconds
    detection: float  # the incident's seconds_since_progress
    restart: float  # the incident's restart_seconds: declared -> resumed worker's first batch

    @property
    def cost(self) -> float:
        """Wall time the hang cost: training redone, the stall until detection, kill and restart."""
        return self.lost + self.detection + self.restart


def checkpointed_config(path: Path, data: str, every: float | str, epochs: int) -> Path:
    """The demo's training on ``data`` (CPU, imgsz 64, batch 4, 2 loader workers), checkpoints every ``every``."""
    return write_config(path, {"data": data, "epochs": epochs}, name=path.stem,
                        sections={"checkpoint": {"every": every if isinstance(every, str) else f"{every:g}s"}})


class SupervisedRun:
    """``python -m supervisor run`` on a config, its log lines timestamped as they arrive, its state file read."""

    def __init__(self, config: Path, state_dir: Path, log: Path, root: Path = ROOT):
        """``root``: the checkout whose supervisor runs (another commit's, for a side-by-side bench)."""
        self.state_dir = state_dir
        self.log = log.open("w")
        env = {**checkout_env(root), "PYTHONUNBUFFERED": "1"}
        self.proc = subprocess.Popen([sys.executable, "-m", "supervisor", "run", "--config", str(config),
                                      "--state-dir", str(state_dir)], cwd=root, stdout=subprocess.PIPE,
                                     stderr=subprocess.STDOUT, env=env)
        self.started = time.time()
        self.first_batches: list[float] = []  # wall time the bench read each attempt's first-batch line
        self.changed = threading.Condition()
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def _read(self) -> None:
        for raw in self.proc.stdout:
            now = time.time()
            line = raw.decode(errors="replace").rsplit("\r", 1)[-1]
            self.log.write(line)
            if line.startswith("yolo-train: attempt ") and FIRST_BATCH in line:
                with self.changed:
                    self.first_batches.append(now)
                    self.changed.notify_all()
        with self.changed:
            self.changed.notify_all()

    def state(self) -> dict:
        for _ in range(50):  # written by rename, but the first write may not be there yet
            try:
                return json.loads((self.state_dir / "supervisor.json").read_text())
            except (FileNotFoundError, json.JSONDecodeError):
                time.sleep(0.1)
        raise BenchError(f"no readable {self.state_dir / 'supervisor.json'}")

    def wait_training(self, attempts_seen: int, limit: float = START_LIMIT) -> tuple[int, float]:
        """The worker pid and first-batch time of the next attempt that reaches its first batch."""
        deadline = time.monotonic() + limit
        with self.changed:
            while len(self.first_batches) <= attempts_seen:
                if self.proc.poll() is not None or time.monotonic() > deadline:
                    raise BenchError(f"no attempt {attempts_seen + 1} trained; see {self.log.name}")
                self.changed.wait(1.0)
            first = self.first_batches[attempts_seen]
        while time.monotonic() < deadline:  # the state file follows the log line within STATUS_INTERVAL
            status = self.state().get("status", {})
            if status.get("attempt") == attempts_seen + 1 and status.get("worker_pid"):
                return status["worker_pid"], first
            time.sleep(0.1)
        raise BenchError(f"attempt {attempts_seen + 1} has no worker pid in the state file")

    def freeze(self, pid: int, first_batch: float) -> tuple[float, float]:
        """SIGSTOP the worker's main process: (stop time, training lost by the bench's own clock)."""
        checkpoint = Path(self.state().get("status", {}).get("checkpoint") or self.state_dir / "train/weights/last.pt")
        os.kill(pid, signal.SIGSTOP)
        stopped = time.time()
        try:
            saved = checkpoint.stat().st_mtime  # the worker is frozen: no save can land after this
        except FileNotFoundError:
            saved = 0.0
        return stopped, stopped - max(saved, first_batch)

    def incidents(self) -> list[dict]:
        return [i for i in self.state().get("incidents", []) if i.get("reason") == "hang"]

    def stop(self) -> dict:
        """SIGTERM (the worker saves and exits), then the final state file."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(120)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.reader.join(10)
        self.log.close()
        return self.state()


def hang_incident(run: SupervisedRun, attempt: int) -> dict:
    """The supervisor's record of the hang of ``attempt``, once the next attempt has its restart_seconds (the state
    file catches up with the log line within STATUS_INTERVAL)."""
    deadline = time.monotonic() + 10.0
    while time.monotonic() < deadline:
        for incident in run.incidents():
            if incident.get("attempt") == attempt and "restart_seconds" in incident:
                return incident
        time.sleep(0.2)
    raise BenchError(f"no hang incident with restart_seconds for attempt {attempt} in {run.state_dir}")


def epoch_seconds(run: SupervisedRun, first_batch: float) -> float:
    """An epoch's length at the speed of the first attempt between SPEED_WINDOW seconds after its first batch
    (batch numbers from the state file; the first seconds are warm-up, slower)."""
    marks = []
    for at in SPEED_WINDOW:
        time.sleep(max(0.0, first_batch + at - time.time()))
        status = run.state().get("status", {})
        marks.append((time.time(), status.get("batch") or 0, status.get("batches") or 0))
    (t0, b0, _), (t1, b1, batches) = marks
    if b1 <= b0 or not batches:
        raise BenchError(f"no progress in the state file {SPEED_WINDOW} s into training; see {run.log.name}")
    return batches * (t1 - t0) / (b1 - b0)


def measure(tmp: Path, label: str, data: str, every: float | str, points: list[float],
            epoch: float | None) -> tuple[list[Hang], float]:
    """One supervised run of the variant, frozen at each point (a share of an epoch's length after an attempt's
    first batch); the epoch's length is measured here when not given."""
    config = checkpointed_config(tmp / f"{label}.toml", data, every, epochs=1000)
    run = SupervisedRun(config, tmp / f"state-{label}", tmp / f"{label}.log")
    hangs: list[Hang] = []
    try:
        pid, first = run.wait_training(0)
        if epoch is None:
            epoch = epoch_seconds(run, first)
            print(f"  an epoch takes about {epoch:.0f} s here; hangs at "
                  f"{', '.join(f'{p * epoch:.0f}' for p in points)} s after each attempt's first batch", flush=True)
        for attempt, delay in enumerate((p * epoch for p in points), start=1):
            time.sleep(max(0.0, first + delay - time.time()))
            stopped, lost_bench = run.freeze(pid, first)
            pid, first = run.wait_training(attempt)  # detected, killed, resumed
            incident = hang_incident(run, attempt)
            hangs.append(Hang(attempt, stopped - run.first_batches[attempt - 1], lost_bench,
                              incident.get("lost_seconds", 0.0), incident["seconds_since_progress"],
                              incident["restart_seconds"]))
            h = hangs[-1]
            print(f"  {label} hang {attempt}: at {h.position:5.1f} s, lost {h.lost:5.1f} s (bench {h.lost_bench:5.1f})"
                  f", detection {h.detection:4.1f} s, restart {h.restart:4.1f} s", flush=True)
    finally:
        run.stop()
    return hangs, epoch


def summary(label: str, hangs: list[Hang]) -> dict[str, float]:
    lost = [h.lost for h in hangs]
    figures = {"lost_median": statistics.median(lost), "lost_worst": max(lost),
               "bench_median": statistics.median(h.lost_bench for h in hangs),
               "bench_worst": max(h.lost_bench for h in hangs),
               "detection": statistics.median(h.detection for h in hangs),
               "restart": statistics.median(h.restart for h in hangs),
               "cost_median": statistics.median(h.cost for h in hangs), "cost_worst": max(h.cost for h in hangs)}
    print(f"{label:<22} {figures['lost_median']:6.1f} {figures['lost_worst']:6.1f} "
          f"{figures['bench_median']:6.1f} {figures['bench_worst']:6.1f} {figures['detection']:6.1f} "
          f"{figures['restart']:6.1f} {figures['cost_median']:6.1f} {figures['cost_worst']:6.1f}")
    return figures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--hangs", type=int, default=5, help="hangs per variant")
    parser.add_argument("--every", type=float, default=10.0, help="[checkpoint] every of the interval variant, s")
    parser.add_argument("--images", type=int, default=3000, help="training images of the generated set")
    parser.add_argument("--seed", type=int, default=1)
    options = parser.parse_args()

    from worker.startup.demo_data import ensure_demo_dataset

    data = str(ensure_demo_dataset(train_images=options.images, val_images=8, size=64))
    with tempfile.TemporaryDirectory(prefix="lost-work-") as tmp_name:
        tmp = Path(tmp_name)
        rng = random.Random(options.seed)
        points = [rng.uniform(0.05, 1.0) for _ in range(options.hangs)]  # the same for both variants
        print(f"{options.images} training images ({options.images // 4} batches an epoch), {options.hangs} hangs "
              f"per variant", flush=True)
        results, epoch = {}, None
        for label, every in ((f"every {options.every:g} s", options.every), ("epoch only", "epoch")):
            results[label], epoch = measure(tmp, label.replace(" ", "-"), data, every, points, epoch)
    print(f"\n{'lost work per hang, s':<22} {'median':>6} {'worst':>6} {'bench':>6} {'bench':>6} {'detect':>6} "
          f"{'restrt':>6} {'cost':>6} {'cost':>6}")
    print(f"{'':<22} {'':>6} {'':>6} {'median':>6} {'worst':>6} {'median':>6} {'median':>6} {'median':>6} "
          f"{'worst':>6}")
    figures = {label: summary(label, hangs) for label, hangs in results.items()}
    interval, epoch_only = figures[f"every {options.every:g} s"], figures["epoch only"]
    bound = options.every + interval["detection"] + interval["restart"]
    print(f"\ngoal: worst lost {interval['lost_worst']:.1f} s <= every + detection + restart = {options.every:g} + "
          f"{interval['detection']:.1f} + {interval['restart']:.1f} = {bound:.1f} s: ratio "
          f"{interval['lost_worst'] / bound:.2f} (bench clock: {interval['bench_worst'] / bound:.2f}); "
          f"worst lost against the interval alone: {interval['lost_worst'] / options.every:.2f}")
    print(f"against epoch-only checkpoints: median lost {interval['lost_median']:.1f} / "
          f"{epoch_only['lost_median']:.1f} s = {interval['lost_median'] / epoch_only['lost_median']:.2f}, worst "
          f"{interval['lost_worst']:.1f} / {epoch_only['lost_worst']:.1f} s = "
          f"{interval['lost_worst'] / epoch_only['lost_worst']:.2f}; wall cost per hang median "
          f"{interval['cost_median']:.1f} / {epoch_only['cost_median']:.1f} s = "
          f"{interval['cost_median'] / epoch_only['cost_median']:.2f}")


if __name__ == "__main__":
    main()
