"""What one heartbeat costs the training loop.

Times ``Heartbeat.beat(...)`` with the fields the worker sends after each training batch (epoch, batch,
samples, three losses, lr), per call, in microseconds (goal: under 20 us):

- into a pipe that a reader process drains as the supervisor does (Decoder and all), beats 0.2 ms apart;
- into a full pipe (a supervisor that does not read): the message is dropped, never waited for;
- unsupervised (no pipe): the call is a no-op.

Then trains the demo under the real supervisor with the worker's ``Heartbeat.beat`` timed in place, and
prints the beat's cost inside real training, the median training step (from one training beat to the next
within an epoch: data, forward, backward, optimizer step, callbacks) and the beat as a fraction of a step
(goal: under 0.1%). Medians, since the machine is shared.

The witness (worker/witness.py): a loop of batches (a fixed piece of Python work, about 1 ms, then the beat into a
drained pipe), timed in alternating blocks without and with the witness running, and the ratio of the mean and of
the median batch time with it to without (goal: 1.00 within the noise; a first block discarded, then ABBA turns); with the witness thread's own CPU time
(from /proc/self/task/TID/schedstat) and the reports it sent (0: progress never stopped).

    .venv/bin/python -m bench.heartbeat [--beats 20000] [--epochs 10] [--witness-only]
"""

from __future__ import annotations

import argparse
import json
import os
import threading
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench.harness import ROOT, checkout_env, write_config
from worker.heartbeat import Heartbeat
from worker.wire.heartbeat_protocol import encode
GOAL_US = 20.0
GOAL_STEP_FRACTION = 0.001
PACE_SECONDS = 0.0002  # between beats into the drained pipe: the reader keeps up, as it does in training

# The worker's fields after a training batch (worker/training/trainer.py, on_train_batch_end).
FIELDS = {"epoch": 3, "epochs": 50, "batch": 5, "batches": 8, "samples": 4,
          "losses": {"box_loss": 3.14159, "cls_loss": 4.26535, "dfl_loss": 1.89793}, "lr": 0.0016670000000000001}

READER = """
import os, sys
from worker.wire.heartbeat_protocol import Decoder
fd, decoder, messages = int(sys.argv[1]), Decoder(), 0
while data := os.read(fd, 65536):
    messages += len(decoder.feed(data))
print(messages, decoder.malformed + decoder.oversized)
"""

# Runs the worker (python -m worker SETTINGS) with Heartbeat.beat timed in place and every message's send time
# recorded (time.perf_counter is CLOCK_MONOTONIC: comparable across processes); writes them at exit.
TIMED_WORKER = """
import atexit, json, runpy, sys, time
from worker import heartbeat

beats = []  # (start ns, duration ns, phase, epoch, batch, sent, thread CPU ns)
sends = []  # (monotonic s, kind, sent)
encodes = []  # thread CPU ns of each message's JSON encoding
beat, send, encode = heartbeat.Heartbeat.beat, heartbeat.Heartbeat._send, heartbeat.encode


def timed_beat(self, **fields):
    start, cpu = time.perf_counter_ns(), time.thread_time_ns()
    sent = beat(self, **fields)
    end, cpu_end = time.perf_counter_ns(), time.thread_time_ns()
    beats.append((start, end - start, self.current_phase, fields.get("epoch"), fields.get("batch"), sent,
                  cpu_end - cpu))
    return sent


def recorded_send(self, kind, fields):
    sent = send(self, kind, fields)
    sends.append((time.perf_counter(), kind, sent))
    return sent


def timed_encode(message):
    cpu = time.thread_time_ns()
    data = encode(message)
    encodes.append(time.thread_time_ns() - cpu)
    return data


heartbeat.Heartbeat.beat, heartbeat.Heartbeat._send = timed_beat, recorded_send
heartbeat.encode = timed_encode  # _send looks it up at each call
atexit.register(lambda: open({out!r}, "w").write(json.dumps({{"beats": beats, "sends": sends, "encodes": encodes}})))
assert sys.argv[1:3] == ["-m", "worker"], sys.argv
sys.argv = ["worker", *sys.argv[3:]]
runpy.run_module("worker", run_name="__main__", alter_sys=True)
"""


def timed_worker(work: Path) -> tuple[Path, Path]:
    """A ``[worker] python`` that runs the real worker with its heartbeats recorded; (executable, records)."""
    out = work / "beats.json"
    timed = work / "timed_worker.py"
    timed.write_text(TIMED_WORKER.format(out=str(out)))
    python = work / "python-timed"
    python.write_text(f'#!/bin/sh\nexec "{sys.executable}" "{timed}" "$@"\n')
    python.chmod(0o755)
    return python, out


def per_call_us(hb: Heartbeat, n: int, pace: float = 0.0) -> tuple[list[float], list[float]]:
    """Wall time and CPU time of this thread (kernel time of the write included) of each call."""
    wall, cpu = [], []
    for _ in range(n):
        start, cpu_start = time.perf_counter_ns(), time.thread_time_ns()
        hb.beat(**FIELDS)
        end, cpu_end = time.perf_counter_ns(), time.thread_time_ns()
        wall.append((end - start) / 1000)
        cpu.append((cpu_end - cpu_start) / 1000)
        if pace:
            time.sleep(pace)
    return wall, cpu


def drained_pipe(n: int) -> tuple[tuple[list[float], list[float]], int, int, int]:
    """Per-call times into a pipe a reader process drains; (times, dropped, received, garbage)."""
    r, w = os.pipe()
    reader = subprocess.Popen([sys.executable, "-c", READER, str(r)], pass_fds=(r,), cwd=ROOT,
                              stdout=subprocess.PIPE, text=True)
    os.close(r)
    hb = Heartbeat(w)
    per_call_us(hb, 200, PACE_SECONDS)  # warm-up
    times = per_call_us(hb, n, PACE_SECONDS)
    os.close(w)
    received, garbage = map(int, reader.communicate(timeout=60)[0].split())
    return times, hb.dropped, received, garbage


def full_pipe(n: int) -> tuple[tuple[list[float], list[float]], int]:
    r, w = os.pipe()
    os.set_blocking(w, False)
    try:
        while True:
            os.write(w, b"x" * 4096)
    except BlockingIOError:
        pass
    hb = Heartbeat(w)
    per_call_us(hb, 200)
    times = per_call_us(hb, n)
    dropped = hb.dropped
    os.close(w)
    os.close(r)
    return times, dropped


def in_training(epochs: int, work: Path) -> dict:
    """Train the demo under the supervisor with the worker's beats timed; the worker's beat records."""
    python, out = timed_worker(work)
    config = write_config(work / "demo.toml", train={"epochs": epochs}, worker={"python": str(python)})
    result = subprocess.run([sys.executable, "-m", "supervisor", "run", "--config", str(config),
                             "--state-dir", str(work / "state")], cwd=ROOT, env=checkout_env(),
                            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                            timeout=600)
    if result.returncode != 0 or not out.exists():
        raise SystemExit(f"demo training under the supervisor failed (exit {result.returncode}):\n"
                         + "\n".join(result.stderr.splitlines()[-15:]))
    records = json.loads(out.read_text())
    calls = records["beats"]
    train = [c for c in calls if c[2] == "train"]
    steps = [(b[0] - a[0]) / 1e6 for a, b in zip(train, train[1:]) if b[3] == a[3] and b[4] == a[4] + 1]
    return {"train_beats": ([c[1] / 1000 for c in train], [c[6] / 1000 for c in train]),
            "steps_ms": steps, "sent": sum(1 for c in calls if c[5]), "calls": len(calls),
            "encode_cpu_us": statistics.median(records["encodes"]) / 1000}


def batch_work(n: int) -> int:
    total = 0
    for i in range(n):
        total += i * i % 7
    return total


def thread_cpu_ns(native_id: int) -> int:
    """A thread's time on a CPU so far, in ns (0 where the kernel keeps no schedstat)."""
    try:
        return int(Path(f"/proc/self/task/{native_id}/schedstat").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 0


def witness_overhead(block_seconds: float, blocks: int) -> dict:
    """Batches timed without and with the witness, blocks taking turns; per-batch times in us of each case."""
    r, w = os.pipe()
    reader = subprocess.Popen([sys.executable, "-c", READER, str(r)], pass_fds=(r,), cwd=ROOT,
                              stdout=subprocess.PIPE, text=True)
    os.close(r)
    hb = Heartbeat(w)
    n, started = 1000, time.perf_counter()
    batch_work(n)
    n = max(100, int(n * 0.001 / (time.perf_counter() - started)))  # about 1 ms of work a batch
    times: dict[bool, list[float]] = {False: [], True: []}
    cpu_ns, reports = 0, 0
    # A block discarded first (the reader process's start competes with it), then ABBA turns: a drift of the shared
    # machine's load over the run weighs on both cases alike.
    order = [False] + [on for pair in range(blocks) for on in ((False, True) if pair % 2 == 0 else (True, False))]
    for block, on in enumerate(order):
        witness = hb.start_witness() if on else None
        end = time.perf_counter() + block_seconds
        while (start := time.perf_counter_ns()) < end * 1e9:
            batch_work(n)
            hb.beat(**FIELDS)
            if block:
                times[on].append((time.perf_counter_ns() - start) / 1000)
        if witness is not None:
            cpu_ns += thread_cpu_ns(witness._thread.native_id)
            reports += witness.reports + witness.lost
            hb.stop_witness()
    os.close(w)
    reader.communicate(timeout=60)
    return {"times": times, "cpu_ms": cpu_ns / 1e6, "reports": reports, "seconds_on": blocks * block_seconds,
            "threads": threading.active_count()}


def summary(times: tuple[list[float], list[float]]) -> str:
    wall, cpu = times
    p99 = statistics.quantiles(wall, n=100)[98]
    return (f"wall median {statistics.median(wall):7.2f} us (p99 {p99:7.2f}), "
            f"CPU median {statistics.median(cpu):6.2f} us; wall/goal = {statistics.median(wall) / GOAL_US:.2f}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--beats", type=int, default=20000, help="beats timed per case (default 20000)")
    parser.add_argument("--epochs", type=int, default=10, help="demo epochs trained for the in-place figures")
    parser.add_argument("--witness-only", action="store_true", help="only the witness's cost to a loop of batches")
    parser.add_argument("--witness-blocks", type=int, default=6, help="blocks of 2 s each, without and with")
    args = parser.parse_args()

    o = witness_overhead(2.0, args.witness_blocks)
    off, on = o["times"][False], o["times"][True]
    mean_ratio = statistics.fmean(on) / statistics.fmean(off)
    median_ratio = statistics.median(on) / statistics.median(off)
    print(f"The witness, {args.witness_blocks} blocks of 2 s without and with it, a batch of about 1 ms of Python "
          f"work and a beat into a drained pipe ({len(off)} and {len(on)} batches):")
    print(f"  batch without: mean {statistics.fmean(off):.1f} us, median {statistics.median(off):.1f} us; with: mean "
          f"{statistics.fmean(on):.1f} us, median {statistics.median(on):.1f} us")
    print(f"  with/without: mean {mean_ratio:.4f}, median {median_ratio:.4f}; the witness thread's CPU "
          f"{o['cpu_ms']:.2f} ms in {o['seconds_on']:.0f} s ({o['cpu_ms'] / 10 / o['seconds_on']:.4f}% of a core), "
          f"{o['reports']} reports")
    if args.witness_only:
        return 0

    size = len(encode({"v": 1, "pid": os.getpid(), "kind": "beat", "phase": "train", "progress": 12345,
                       "dropped": 0, "t": round(time.time(), 3), **FIELDS}))
    print(f"Heartbeat.beat(...) with the worker's per-batch fields ({size}-byte message), {args.beats} calls each "
          f"(goal < {GOAL_US:.0f} us):")
    drained, dropped, received, garbage = drained_pipe(args.beats)
    print(f"  drained pipe, reader process, {PACE_SECONDS * 1e3:.1f} ms apart: {summary(drained)}  "
          f"[{received} received, {dropped} dropped, {garbage} garbage]")
    full, full_dropped = full_pipe(args.beats)
    print(f"  full pipe (dropped), back to back:          {summary(full)}  "
          f"[{full_dropped} of {args.beats + 200} dropped]")
    print(f"  unsupervised (no pipe), back to back:       {summary(per_call_us(Heartbeat(None), args.beats))}")

    work = Path(tempfile.mkdtemp(prefix="yolo-train-bench-heartbeat-"))
    try:
        t = in_training(args.epochs, work)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    wall, cpu = (statistics.median(x) for x in t["train_beats"])
    step = statistics.median(t["steps_ms"]) * 1000
    print(f"\nIn a real demo training under the supervisor (yolov8n, 64 px, batch 4, workers 2, CPU, "
          f"{args.epochs} epochs; {t['calls']} beats, {t['sent']} sent):")
    print(f"  beat after a training batch:  {summary(t['train_beats'])}; of its CPU, JSON encoding "
          f"{t['encode_cpu_us']:.1f} us (median of all messages)")
    print(f"  training step (beat to beat in an epoch): median {step / 1000:.1f} ms over {len(t['steps_ms'])} "
          f"steps ({1e6 / step:.1f} it/s)")
    for name, cost in (("wall", wall), ("CPU", cpu)):
        fraction = cost / step
        print(f"  beat {name} / step = {fraction * 100:.4f}% (goal < {GOAL_STEP_FRACTION * 100:.1f}%): "
              f"measured/goal = {fraction / GOAL_STEP_FRACTION:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
