"""How long the stacks capture of a real hung Ultralytics tree takes, against its 3 s budget.

Runs ``yolo-train run`` on the embedded demo (2 DataLoader workers) with a DataLoader hang injected after
training batch 3 and the stall timeout raised, so the tree stays hung while this script captures it with
``supervisor.host.stacks.capture_tree`` ``--repeat`` times, as the agent would just before its kill.
Side by side, in the same run on the same tree: the /proc-only capture (no py-spy), the floor of the cost.
Prints the medians, their ratio to the budget, and the summary lines and grouping key of the last capture.

    .venv/bin/python -m bench.stacks [--repeat 5]
"""

from __future__ import annotations

import argparse
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil

from bench.harness import ROOT, write_config
from supervisor.host.stacks import capture_tree
from worker.wire.contract import STANDBY_FLAG

HANG_AFTER_BATCH = 3
BUDGET = 3.0
RUN_LIMIT = 180.0


def hung_demo(state_dir: Path) -> tuple[subprocess.Popen, int]:
    """The supervisor, and the pid of its worker once the DataLoader hang has started."""
    config = write_config(state_dir / "demo.toml", sections={
        "watchdog": {"stall_timeout": 600.0},  # keep it hung while we look
        "kernel_log": {"source": "off"}})  # the capture is measured, not the kernel watch
    proc = subprocess.Popen([sys.executable, "-m", "supervisor", "run", "--config", str(config), "--state-dir",
                             str(state_dir), "--fault", f"dataloader_hang,at_batch={HANG_AFTER_BATCH},attempt=1"],
                            cwd=ROOT, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, start_new_session=True)
    deadline = time.monotonic() + RUN_LIMIT
    tail: list[str] = []
    for line in proc.stdout:
        tail = (tail + [line.rstrip()])[-15:]
        if "fault injection: dataloader_hang" in line:
            break
        if time.monotonic() > deadline:
            break
    else:
        raise SystemExit("the demo ended before the hang:\n  " + "\n  ".join(tail))
    time.sleep(3)  # the loop drains the prefetched batches, then every process of the tree waits
    # the training worker, not the standby that waits to be the next attempt's
    [worker] = [p for p in psutil.Process(proc.pid).children() if STANDBY_FLAG not in p.cmdline()]
    return proc, worker.pid


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-stacks-") as tmp:
        proc, worker = hung_demo(Path(tmp))
        try:
            pids = [worker] + [p.pid for p in psutil.Process(worker).children(recursive=True)]
            full, proc_only = [], []
            for i in range(args.repeat):
                capture = capture_tree(worker, pids, Path(tmp) / f"full{i}", budget=BUDGET)
                full.append(capture.seconds)
                floor = capture_tree(worker, pids, Path(tmp) / f"proc{i}", budget=BUDGET,
                                     py_spy=str(Path(tmp) / "no-py-spy"))
                proc_only.append(floor.seconds)
        finally:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    median, floor_median = statistics.median(full), statistics.median(proc_only)
    print(f"capture of a hung Ultralytics tree ({len(pids)} processes), median of {args.repeat}:")
    print(f"  py-spy + /proc  {median:.3f} s  ({median / BUDGET:.0%} of the {BUDGET:g} s budget; "
          f"max {max(full):.3f} s)")
    print(f"  /proc only      {floor_median:.3f} s  (py-spy costs {median / max(floor_median, 1e-6):.0f}x the floor)")
    print(f"  notes: {capture.notes or 'none'}; per process: "
          + ("; ".join(p.note for p in capture.processes if p.note) or "none"))
    print("where:", capture.where())
    for line in capture.summary_lines():
        print("  " + line)
    return 0


if __name__ == "__main__":
    sys.exit(main())
