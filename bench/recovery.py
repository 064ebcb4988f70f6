"""Hang to resumed training: yolo-train on the embedded demo, against what people have today.

For each hang kind (a DataLoader worker that hangs, a main loop that sleeps, a main loop that spins at
100% CPU) it runs ``yolo-train run`` on the demo with default settings (no timeout tuned by hand), injects
the hang after training batch 10 of the first attempt (epoch 2: a last.pt exists) and splits the time
from the last progress to the first training batch of the resumed worker into:

- detection: last progress -> hang declared (the incident's ``seconds_since_progress``, supervisor clock);
- kill: hang declared -> whole tree killed and confirmed gone (includes the incident's process snapshot);
- restart: tree gone -> next worker spawned -> its first training batch after resuming from last.pt.

Side by side, the baseline: a plain PyTorch loop whose DataLoader worker hangs, with
``DataLoader(timeout=10)``, restarted from scratch as soon as it dies (systemd ``Restart=on-failure``):
last batch -> exception -> process gone -> restarted script's first batch. And, hung in the background for
the whole bench (its processes sleep), the same loop without a DataLoader timeout under
``torchrun --max-restarts=3``: at the end the bench says whether torchrun ever restarted it.

Timestamps are CLOCK_MONOTONIC (system-wide on Linux), taken by this script as it reads each log line or
printed by the plain loop itself. Figures are medians over ``--repeat`` runs; the machine is shared, so
expect noise.

    .venv/bin/python -m bench.recovery [--repeat 3] [--kinds dataloader_hang,main_hang,spin] [--no-torchrun]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import selectors
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

from bench.harness import ROOT, write_config
from worker.wire import heartbeat_protocol
HANG_AFTER_BATCH = 10  # the demo has 8 batches per epoch: epoch 1's last.pt exists when the hang starts
GOAL_SECONDS = 20.0  # issue 2: a DataLoader-worker hang resumed within 20 s
BASELINE_TIMEOUT = 10.0  # DataLoader(timeout=10), the baseline's only hang detection
RUN_LIMIT = 150.0  # seconds one measured run may take before the bench gives up on it

# The supervisor's own log lines (supervisor/decision/, supervisor/agent.py) this bench times.
DECLARED = re.compile(r"yolo-train: hang in (\w+): ")
KILLED = re.compile(r"yolo-train: killed (\d+) process\(es\) in ([\d.]+) s")
RESUMED = re.compile(r"yolo-train: attempt 2: first training batch ([\d.]+) s after spawn")

PLAIN_LOOP = '''\
"""A plain PyTorch training loop as people write it today: its only hang detection is DataLoader(timeout)."""
import os, sys, time
import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset

hang_flag, hang_after, timeout = sys.argv[1], int(sys.argv[2]), float(sys.argv[3])
run = int(os.environ.get("BENCH_RUN", "1")) + int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))


class Images(Dataset):
    def __len__(self):
        return 32

    def __getitem__(self, i):
        while os.path.exists(hang_flag):  # the injected fault: the DataLoader worker hangs
            time.sleep(3600)
        g = torch.Generator().manual_seed(i)
        return torch.rand(3, 64, 64, generator=g), torch.randint(0, 2, (), generator=g)


model = nn.Sequential(nn.Conv2d(3, 16, 3, 2, 1), nn.ReLU(), nn.Conv2d(16, 32, 3, 2, 1), nn.ReLU(),
                      nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(32, 2))
optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
loader = DataLoader(Images(), batch_size=4, shuffle=True, num_workers=2, persistent_workers=True, timeout=timeout)
step = 0
try:
    for epoch in range(1000):
        for x, y in loader:
            loss = nn.functional.cross_entropy(model(x), y)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            step += 1
            print(f"batch {step} run {run} at {time.monotonic():.6f}", flush=True)
            if run == 1 and step == hang_after:
                open(hang_flag, "w").close()
except RuntimeError as e:
    print(f"error run {run} at {time.monotonic():.6f}: {e}", flush=True)
    raise
'''
PLAIN_BATCH = re.compile(r"batch (\d+) run (\d+) at ([\d.]+)")
PLAIN_ERROR = re.compile(r"error run (\d+) at ([\d.]+)")


@dataclass
class Recovery:
    """One hang, from the last progress to the first training batch after the restart (seconds)."""
    detection: float
    kill: float
    restart: float
    batches_lost: int  # training batches done before the hang that the restarted run does again
    signals: float | None = None  # of kill: SIGTERM -> none left (the incident's kill.seconds)
    spawn_to_batch: float | None = None  # of restart: spawn -> first batch (the supervisor's own figure)

    @property
    def total(self) -> float:
        return self.detection + self.kill + self.restart


class BenchError(RuntimeError):
    pass


@dataclass
class Deadline:
    at: float  # monotonic; the reader may move it while lines arrive


def timestamped_lines(stream, deadline: Deadline, extra_fds: tuple[int, ...] = ()) -> Iterator[tuple[float, str]]:
    """(monotonic time of arrival, line) for each line of ``stream``, and (time, "") once for each extra fd when it
    becomes readable (a pidfd: the process exited); ends when the stream is at EOF and every extra fd fired."""
    selector = selectors.DefaultSelector()
    fd = stream.fileno()
    os.set_blocking(fd, False)
    selector.register(fd, selectors.EVENT_READ)
    for extra in extra_fds:
        selector.register(extra, selectors.EVENT_READ)
    partial = b""
    try:
        while True:
            left = deadline.at - time.monotonic()
            if left <= 0:
                raise TimeoutError
            for key, _ in selector.select(left):
                now = time.monotonic()
                if key.fd != fd:
                    selector.unregister(key.fd)  # fires once: a pidfd stays readable
                    yield now, ""
                    continue
                try:
                    data = os.read(fd, 65536)
                except BlockingIOError:
                    continue
                if not data:
                    selector.unregister(fd)
                    if partial:
                        yield now, partial.decode(errors="replace")
                    if not selector.get_map():
                        return
                    continue
                partial += data
                *lines, partial = partial.split(b"\n")
                for line in lines:
                    yield now, line.rsplit(b"\r", 1)[-1].decode(errors="replace")
    finally:
        selector.close()


# -- yolo-train --------------------------------------------------------------------------------------------

STACKS_GOAL = 3.0  # seconds the stack capture may add to a recovery (issue: an incident says where it hung)


def measure_supervised(kind: str, state_dir: Path, stacks: bool = True) -> Recovery:
    """Run the demo under the supervisor with ``kind`` injected; stop it once the resumed worker trains."""
    state_dir.mkdir(parents=True)
    config = write_config(state_dir / "demo.toml", sections={"incidents": {"stacks": stacks},
                                                             "recovery": {"in_place": False}})  # the restart path's
    command = [sys.executable, "-m", "supervisor", "run", "--config", str(config), "--state-dir", str(state_dir),
               "--fault", f"{kind},at_batch={HANG_AFTER_BATCH},attempt=1"]
    proc = subprocess.Popen(command, cwd=ROOT, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, start_new_session=True)
    marks: dict[str, float] = {}
    tail: list[str] = []
    try:
        for now, line in timestamped_lines(proc.stderr, Deadline(time.monotonic() + RUN_LIMIT)):
            tail = (tail + [line])[-15:]
            for name, pattern in (("declared", DECLARED), ("killed", KILLED), ("resumed", RESUMED)):
                if name not in marks and (m := pattern.search(line)):
                    marks[name] = now
                    if name == "resumed":
                        marks["spawn_to_batch"] = float(m[1])
            if "resumed" in marks:
                break
    except TimeoutError:
        pass
    finally:
        stop(proc)
    if "resumed" not in marks:
        raise BenchError(f"{kind}: the supervisor exited or took over {RUN_LIMIT:.0f} s without resuming; it said:\n  "
                         + "\n  ".join(tail))
    incidents = [json.loads(line) for line in (state_dir / "incidents.jsonl").read_text().splitlines()]
    hang = incidents[0]
    if hang["reason"] != "hang":
        raise BenchError(f"{kind}: first incident is a {hang['reason']} ({hang['detail']}), not a hang")
    return Recovery(detection=hang["seconds_since_progress"], kill=marks["killed"] - marks["declared"],
                    restart=marks["resumed"] - marks["killed"], batches_lost=hang["batch"],
                    signals=hang["kill"]["seconds"], spawn_to_batch=float(marks["spawn_to_batch"]))


def stop(proc: subprocess.Popen) -> None:
    """Stop the supervisor we started: a second SIGTERM makes it kill its worker tree at once instead of letting
    the worker save; whatever is left after 15 s is SIGKILLed, supervisor and descendants."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        time.sleep(0.2)
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            kill_tree(proc.pid)
            proc.wait()
    if proc.stderr:
        proc.stderr.close()


# -- the baseline: a plain loop with DataLoader(timeout=10), restarted from scratch ---------------------------

def measure_plain_loop(work: Path) -> Recovery:
    script, flag = work / "plain_loop.py", work / "hang.flag"
    script.write_text(PLAIN_LOOP)
    flag.unlink(missing_ok=True)
    first, exited = run_plain(script, flag, 1)
    flag.unlink()  # the cause is gone for the restarted run, as it is for yolo-train's resumed worker
    second, _ = run_plain(script, flag, 2, stop_after_first_batch=True)
    last_batch_at = first["batches"][-1]
    return Recovery(detection=first["error"] - last_batch_at, kill=exited - first["error"],
                    restart=second["batches"][0] - exited, batches_lost=len(first["batches"]))


def run_plain(script: Path, flag: Path, run: int, stop_after_first_batch: bool = False) -> tuple[dict, float]:
    """One run of the plain loop until it dies (or trains its first batch): its batch and error times, and
    when its process was gone."""
    env = {**os.environ, "BENCH_RUN": str(run)}
    proc = subprocess.Popen([sys.executable, str(script), str(flag), str(HANG_AFTER_BATCH), str(BASELINE_TIMEOUT)],
                            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, env=env,
                            start_new_session=True)
    pidfd = os.pidfd_open(proc.pid)
    seen: dict = {"batches": [], "error": None}
    exited = None

    def note(line: str) -> None:
        if m := PLAIN_BATCH.search(line):
            seen["batches"].append(float(m[3]))
        elif m := PLAIN_ERROR.search(line):
            seen["error"] = float(m[2])

    try:
        for now, line in timestamped_lines(proc.stdout, Deadline(time.monotonic() + RUN_LIMIT), (pidfd,)):
            if not line and proc.poll() is not None:
                exited = now
                for rest in (heartbeat_protocol.read_available(proc.stdout.fileno()) or b"").decode(errors="replace").splitlines():
                    note(rest)  # its last words, already in the pipe when it died
                break
            note(line)
            if stop_after_first_batch and seen["batches"]:
                break
    except TimeoutError:
        raise BenchError(f"plain loop run {run}: no exit within {RUN_LIMIT:.0f} s") from None
    finally:
        os.close(pidfd)
        if proc.poll() is None:
            kill_tree(proc.pid)
        proc.wait()
        proc.stdout.close()
    if not stop_after_first_batch and (seen["error"] is None or exited is None):
        raise BenchError(f"plain loop run {run}: ended without the DataLoader timeout error")
    return seen, exited or time.monotonic()


def kill_tree(pid: int) -> None:
    """SIGKILL a process we started and every descendant of it, by pid."""
    import psutil

    try:
        root = psutil.Process(pid)
        members = root.children(recursive=True) + [root]
    except psutil.Error:
        return
    for p in members:
        try:
            p.kill()
        except psutil.Error:
            pass
    psutil.wait_procs(members, timeout=5)


class TorchrunHang:
    """The plain loop without a DataLoader timeout under ``torchrun --max-restarts=3``, hung in the background
    while the other runs are measured (its processes sleep: no CPU taken from them), judged at the end."""

    def __init__(self, work: Path):
        self.torchrun = Path(sys.executable).parent / "torchrun"
        self.proc: subprocess.Popen | None = None
        self.last_batch: float | None = None
        self.note = ""
        if not self.torchrun.exists():
            self.note = f"torchrun: not run ({self.torchrun} not found)"
            return
        script, flag = work / "torchrun_loop.py", work / "torchrun-hang.flag"
        script.write_text(PLAIN_LOOP)
        command = [str(self.torchrun), "--standalone", "--nnodes=1", "--nproc-per-node=1", "--max-restarts=3",
                   str(script), str(flag), str(HANG_AFTER_BATCH), "0"]
        self.proc = subprocess.Popen(command, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                     stderr=subprocess.STDOUT, start_new_session=True)
        deadline = Deadline(time.monotonic() + RUN_LIMIT)
        try:  # until the prefetched batches are drained: 2 s without a batch once the hang was injected
            for now, line in timestamped_lines(self.proc.stdout, deadline):
                if m := PLAIN_BATCH.search(line):
                    self.last_batch = now
                    if int(m[1]) >= HANG_AFTER_BATCH:
                        deadline.at = now + 2.0
        except TimeoutError:
            pass
        if self.last_batch is None:
            self.note = "torchrun: the loop never trained a batch (rendezvous failed?); no verdict"

    def verdict(self) -> str:
        """Whether torchrun restarted the hung run by now; then ends its whole tree."""
        import psutil

        if self.proc is None or self.last_batch is None:
            self.close()
            return self.note
        waited = time.monotonic() - self.last_batch
        restarted = [m[2] for m in PLAIN_BATCH.finditer((heartbeat_protocol.read_available(self.proc.stdout.fileno()) or b"").decode(
            errors="replace")) if m[2] != "1"]
        alive = self.proc.poll() is None
        states = []
        for p in psutil.Process(self.proc.pid).children(recursive=True) if alive else []:
            try:
                states.append(p.status())
            except psutil.Error:
                pass
        self.close()
        if restarted:
            return f"torchrun --max-restarts=3: recovered (run {restarted[0]} trained) within {waited:.0f} s"
        return (f"torchrun --max-restarts=3, DataLoader(timeout=0): not recovered within {waited:.0f} s after the "
                f"last batch (no exception; torchrun {'alive' if alive else 'gone'}, {len(states)} process(es) "
                f"under it: {', '.join(sorted(set(states))) or '-'})")

    def close(self) -> None:
        if self.proc is not None:
            if self.proc.poll() is None:
                kill_tree(self.proc.pid)
            self.proc.wait()
            self.proc.stdout.close()
            self.proc = None


# -- report -------------------------------------------------------------------------------------------------

def median(values: list[float]) -> float:
    return statistics.median(values)


def print_table(rows: dict[str, list[Recovery]]) -> None:
    print(f"{'hang':<42} {'runs':>4} {'detect':>7} {'kill':>6} {'restart':>8} {'total':>7} {'worst':>7} "
          f"{'lost batches':>12}")
    for name, runs in rows.items():
        if not runs:
            print(f"{name:<42} {0:>4}  (no successful run)")
            continue
        print(f"{name:<42} {len(runs):>4} {median([r.detection for r in runs]):>7.2f} "
              f"{median([r.kill for r in runs]):>6.2f} {median([r.restart for r in runs]):>8.2f} "
              f"{median([r.total for r in runs]):>7.2f} {max(r.total for r in runs):>7.2f} "
              f"{median([r.batches_lost for r in runs]):>12.0f}")


def describe(r: Recovery) -> str:
    text = f"detect {r.detection:.2f} kill {r.kill:.2f} restart {r.restart:.2f} total {r.total:.2f} s"
    if r.signals is not None:
        text += f" (kill_tree {r.signals:.2f} s, spawn -> first batch {r.spawn_to_batch:.2f} s)"
    return text


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repeat", type=int, default=3, help="runs per hang kind (default 3)")
    parser.add_argument("--kinds", default="dataloader_hang,main_hang,spin", help="comma-separated fault kinds")
    parser.add_argument("--no-torchrun", action="store_true", help="skip the torchrun comparison")
    parser.add_argument("--stacks-off", action="store_true",
                        help="also measure each kind with [incidents] stacks = false, side by side")
    args = parser.parse_args()
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # clean up (finally blocks) when stopped
    kinds = [k.strip() for k in args.kinds.split(",") if k.strip()]
    baseline = f"plain loop, DataLoader(timeout={BASELINE_TIMEOUT:.0f})"
    rows: dict[str, list[Recovery]] = {**{f"yolo-train {k}": [] for k in kinds}, baseline: []}
    if args.stacks_off:
        rows.update({f"yolo-train {k}, stacks off": [] for k in kinds})
    work = Path(tempfile.mkdtemp(prefix="yolo-train-bench-recovery-"))
    started = time.monotonic()
    torchrun = None
    try:
        torchrun = None if args.no_torchrun else TorchrunHang(work)
        for rep in range(args.repeat):
            for kind in kinds:
                state_dir = work / f"{kind}-{rep}"
                try:
                    r = measure_supervised(kind, state_dir)
                    rows[f"yolo-train {kind}"].append(r)
                    print(f"  run {rep + 1} yolo-train {kind}: {describe(r)}", flush=True)
                except BenchError as e:
                    print(f"  run {rep + 1} yolo-train {kind}: FAILED: {e}", flush=True)
                shutil.rmtree(state_dir, ignore_errors=True)
                if args.stacks_off:
                    label = f"yolo-train {kind}, stacks off"
                    try:
                        r = measure_supervised(kind, state_dir, stacks=False)
                        rows[label].append(r)
                        print(f"  run {rep + 1} {label}: {describe(r)}", flush=True)
                    except BenchError as e:
                        print(f"  run {rep + 1} {label}: FAILED: {e}", flush=True)
                    shutil.rmtree(state_dir, ignore_errors=True)
            try:
                r = measure_plain_loop(work)
                rows[baseline].append(r)
                print(f"  run {rep + 1} {baseline}: {describe(r)}", flush=True)
            except BenchError as e:
                print(f"  run {rep + 1} {baseline}: FAILED: {e}", flush=True)
        verdict = torchrun.verdict() if torchrun else None
    finally:
        if torchrun:
            torchrun.close()
        shutil.rmtree(work, ignore_errors=True)

    print(f"\nHang -> first training batch after the restart, seconds, median of {args.repeat} (demo: yolov8n, "
          f"64 px, batch 4, workers 2, CPU; hang after batch {HANG_AFTER_BATCH}; default watchdog)")
    print_table(rows)
    dataloader = rows.get("yolo-train dataloader_hang")
    if dataloader:
        total = median([r.total for r in dataloader])
        print(f"\ngoal: DataLoader hang resumed within {GOAL_SECONDS:.0f} s: measured {total:.2f} s, "
              f"measured/goal = {total / GOAL_SECONDS:.2f} ({'met' if total <= GOAL_SECONDS else 'NOT met'})")
        if rows[baseline]:
            base = median([r.total for r in rows[baseline]])
            print(f"yolo-train / plain loop with DataLoader(timeout={BASELINE_TIMEOUT:.0f}): {total:.2f} / {base:.2f} s "
                  f"= {total / base:.2f}; the plain loop starts again from scratch (all batches lost), yolo-train "
                  f"from its newest checkpoint (the batches after it lost), and DataLoader(timeout) never sees a "
                  f"main-loop hang or a spin")
    for kind in kinds if args.stacks_off else []:
        on, off = rows[f"yolo-train {kind}"], rows[f"yolo-train {kind}, stacks off"]
        if on and off:
            extra = median([r.total for r in on]) - median([r.total for r in off])
            print(f"{kind}: stacks captured before the kill add {extra:+.2f} s to the recovery (goal: at most "
                  f"{STACKS_GOAL:.0f} s): {'met' if extra <= STACKS_GOAL else 'NOT met'}")
    if verdict:
        print(verdict)
    print(f"(bench took {time.monotonic() - started:.0f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
