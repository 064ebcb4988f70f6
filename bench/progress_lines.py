"""The supervisor's CPU while it reads a chatty progress bar from a script's output (goal: under 1% of a core at
50 updates/s).

Two measurements in one run:

1. Per update: the bytes of a real tqdm bar (tqdm itself, ``mininterval=0``, a ``loss=`` postfix, one redraw per
   step) and of the captured Ultralytics run, fed one redraw per ``feed()`` as the supervisor reads them, through
   the parser and the counter; CPU seconds per update, and that cost at 50 updates/s as % of a core.
2. Live: a child process draws a real tqdm bar at 50 updates/s on a pipe; this process reads the pipe with a
   selector as the agent does, once only reading, once reading and parsing, for the same time each. The CPU of
   this process over the wall time is the % of a core; the difference is the parser's.

    .venv/bin/python -m bench.progress_lines [--seconds 5]
"""

from __future__ import annotations

import argparse
import io
import os
import re
import selectors
import subprocess
import sys
import time

from bench.harness import ROOT
from supervisor.attempt.progress_lines import ProgressCounter, ProgressParser

RATE = 50  # updates per second: a fast bar (tqdm redraws at most every 0.1 s by default: this is 5x that)
CHILD = f"""
import sys, time
from tqdm import tqdm
bar = tqdm(total=10**9, desc="Epoch 3/50", mininterval=0, file=sys.stderr)
t = time.monotonic()
while True:
    bar.update(1)
    bar.set_postfix(loss=f"{{1 / (bar.n + 1):.4f}}", refresh=False)
    t += 1 / {RATE}
    time.sleep(max(0.0, t - time.monotonic()))
"""


def tqdm_redraws(updates: int) -> list[bytes]:
    from tqdm import tqdm

    out = io.StringIO()
    bar = tqdm(total=updates, desc="Epoch 3/50", mininterval=0, file=out)
    for i in range(updates):
        bar.update(1)
        bar.set_postfix(loss=f"{1 / (i + 1):.4f}", refresh=False)
    bar.close()
    return [b"\r" + part for part in out.getvalue().encode().split(b"\r") if part]


def ultralytics_redraws() -> list[bytes]:
    data = (ROOT / "tests" / "fixtures" / "progress" / "ultralytics_train.bin").read_bytes()
    return [part + b"\r" for part in re.split(rb"(?<=[\r\n])", data) if part]


def per_update(chunks: list[bytes], repeat: int) -> tuple[float, int]:
    """CPU seconds per chunk fed (parser and counter), and the readings per pass."""
    readings = 0
    start = time.process_time()
    for _ in range(repeat):
        parser, counter = ProgressParser(), ProgressCounter()
        for chunk in chunks:
            for reading in parser.feed(chunk):
                counter.observe(reading)
        readings = parser.readings
    return (time.process_time() - start) / (repeat * len(chunks)), readings


def live(seconds: float, parse: bool) -> tuple[float, int, int]:
    """% of a core this process used reading (and parsing) the child's bar, updates read, readings."""
    child = subprocess.Popen([sys.executable, "-c", CHILD], stderr=subprocess.PIPE, stdout=subprocess.DEVNULL)
    fd = child.stderr.fileno()
    os.set_blocking(fd, False)
    sel = selectors.DefaultSelector()
    sel.register(fd, selectors.EVENT_READ)
    parser, counter = ProgressParser(), ProgressCounter()
    got = 0
    time.sleep(1.5)  # past the child's imports
    while os.read(fd, 1 << 16) if sel.select(0) else b"":
        pass
    cpu, wall = time.process_time(), time.monotonic()
    end = wall + seconds
    while (now := time.monotonic()) < end:
        if not sel.select(end - now):
            continue
        data = os.read(fd, 1 << 16)
        got += data.count(b"\r")
        if parse:
            for reading in parser.feed(data):
                counter.observe(reading)
    cpu, wall = time.process_time() - cpu, time.monotonic() - wall
    child.kill()
    child.wait()
    sel.close()
    return 100 * cpu / wall, got, counter.progress


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seconds", type=float, default=5.0)
    args = ap.parse_args()
    print(f"1. per update, parser + counter, fed one redraw at a time (% of a core at {RATE} updates/s)")
    for name, chunks in (("tqdm bar", tqdm_redraws(5000)), ("Ultralytics run", ultralytics_redraws())):
        seconds, readings = per_update(chunks, max(1, 20000 // len(chunks)))
        print(f"   {name:16s} {seconds * 1e6:7.1f} us/update  {100 * seconds * RATE:6.3f} % of a core"
              f"  ({readings} readings in {len(chunks)} chunks)")
    print(f"2. live: a real tqdm bar at {RATE} updates/s on a pipe, {args.seconds:.0f} s each, side by side")
    read_only, got_a, _ = live(args.seconds, parse=False)
    parsed, got_b, progress = live(args.seconds, parse=True)
    print(f"   read only       {read_only:6.3f} % of a core  ({got_a / args.seconds:.0f} updates/s read)")
    print(f"   read and parse  {parsed:6.3f} % of a core  ({got_b / args.seconds:.0f} updates/s, "
          f"{progress} counted as progress)")
    print(f"   the parser's share: {parsed - read_only:+.3f} % of a core; goal: read and parse under 1 %: "
          f"{'met' if parsed < 1 else 'NOT met'}")


if __name__ == "__main__":
    main()
