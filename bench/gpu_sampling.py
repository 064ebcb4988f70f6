"""What the GPU readers see here and what one sample costs.

Prints every GpuSample the discovered readers return, then the CPU time of one ``sample_all()`` (mean over
``--repeat`` calls) and the share of one core that sampling every ``--interval`` seconds takes.

    python -m bench.gpu_sampling [--root /] [--repeat 200] [--interval 5]
"""

from __future__ import annotations

import argparse
import dataclasses
import time
from pathlib import Path

from supervisor.host.gpu_metrics import discover_gpu_readers, sample_all


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--root", type=Path, default=Path("/"))
    parser.add_argument("--repeat", type=int, default=200)
    parser.add_argument("--interval", type=float, default=5.0)
    args = parser.parse_args()

    started = time.process_time()
    readers = discover_gpu_readers(args.root)
    discovery_s = time.process_time() - started
    print(f"readers: {[type(r).__name__ for r in readers]} (discovery {discovery_s * 1e3:.1f} ms CPU)")
    for sample in sample_all(readers):
        print(dataclasses.asdict(sample))
    if not readers:
        print("no GPU found: nothing to time")
        return

    started_cpu, started_wall = time.process_time(), time.perf_counter()
    for _ in range(args.repeat):
        sample_all(readers)
    cpu_s = (time.process_time() - started_cpu) / args.repeat
    wall_s = (time.perf_counter() - started_wall) / args.repeat
    print(f"one sample_all(): {cpu_s * 1e3:.3f} ms CPU, {wall_s * 1e3:.3f} ms wall (mean of {args.repeat})")
    print(f"share of one core at one sample every {args.interval:g} s: {cpu_s / args.interval:.5%}")


if __name__ == "__main__":
    main()
