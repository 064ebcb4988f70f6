"""What the run's history (STATE_DIR/history.db) costs: the time of one sample written by the supervisor.

The supervisor writes a sample at most every 5 s (history.SAMPLE_INTERVAL), from its own loop, never from the training
process: training pays nothing directly; the supervisor's loop pays one write per sample, and a heartbeat read late
by that much. Times ``History.record`` with a live status as the agent passes it (a ``Status``'s JSON form), each
call a sample (the clock is moved by the interval), on a real file in a temporary directory: median, 99th percentile
and maximum, the WAL checkpoints (every ~1000 pages) and the thinning passes (every 10 minutes of samples) included;
then the share of the supervisor's time (mean write / interval) and the CPU it takes per hour. ``--gpu`` adds a
reading of each GPU (NVML or amdgpu sysfs) to every sample, as the agent does, and times that reading on its own.

    .venv/bin/python -m bench.history [--samples 5000] [--gpu] [--dir /var/lib/yolo-train]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

from supervisor.decision.model.state import Progress
from supervisor.decision.status_view import CheckpointView, Status, Supervisor
from supervisor.state import history

STATUS = Status(state="healthy", reported=Progress(phase="train", epoch=12, epochs=300, batch=1834, batches=3665),
                rung=1, attempt=3,
                progress=0.0381, it_s=15.07, eta_seconds=71234.5, goodput=0.934, trained_seconds=7012.3,
                lost_seconds=12.1, restarts=2, last_checkpoint=CheckpointView(epoch=12, batch=1800),
                supervisor=Supervisor()).to_dict()


class Clock:
    def __init__(self):
        self.t = 1_800_000_000.0

    def __call__(self):
        return self.t


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--samples", type=int, default=5000)
    parser.add_argument("--gpu", action="store_true", help="read the GPUs into every sample")
    parser.add_argument("--dir", type=Path, help="where to write (default: a temporary directory)")
    args = parser.parse_args()
    readers = []
    if args.gpu:
        from supervisor.host.gpu_metrics import discover_gpu_readers

        readers = discover_gpu_readers(Path("/"))
        print(f"GPUs: {len(readers)} reader(s)")
    with tempfile.TemporaryDirectory(dir=args.dir) as where:
        clock = Clock()
        h = history.History(Path(where), clock=clock)
        wall, cpu, reading, first = [], [], [], None
        for k in range(args.samples):
            clock.t += history.SAMPLE_INTERVAL
            status = {**STATUS, "batch": k % 3665, "progress": k / args.samples}
            t0, c0 = time.perf_counter(), time.thread_time()
            gpus = history.gpu_readings(readers)
            t1 = time.perf_counter()
            assert h.record(status, gpus)
            if first is None:  # opens and creates the file: once a supervisor
                first = time.perf_counter() - t0
                continue
            wall.append(time.perf_counter() - t0)
            cpu.append(time.thread_time() - c0)
            reading.append(t1 - t0)
        h.close()
        size = sum(p.stat().st_size for p in Path(where).iterdir())
    wall.sort()
    us = 1e6
    mean = statistics.fmean(wall)
    hours = args.samples * history.SAMPLE_INTERVAL / 3600
    print(f"{args.samples} samples ({hours:.1f} h of a run), file {size / 1e6:.2f} MB")
    print(f"the first sample (opens and creates the file, once per supervisor): {first * us:.0f} us")
    print(f"one sample written{' with the GPU reading' if readers else ''}: "
          f"median {statistics.median(wall) * us:.0f} us, p99 {wall[int(0.99 * len(wall))] * us:.0f} us, "
          f"max {wall[-1] * us:.0f} us, mean {mean * us:.0f} us")
    if readers:
        print(f"  of which the GPU reading: median {statistics.median(reading) * us:.0f} us")
    per_hour = statistics.fmean(cpu) * 3600 / history.SAMPLE_INTERVAL
    print(f"share of the supervisor's time: {mean / history.SAMPLE_INTERVAL:.2e} (mean write / "
          f"{history.SAMPLE_INTERVAL:g} s); CPU per hour of training: {per_hour:.3f} s")
    print(f"the longest write against the 1 s status interval of the loop: {wall[-1] / 1.0:.4f}")


if __name__ == "__main__":
    main()
