"""How fast a kernel line becomes an event, and what the kernel-log sources cost the supervisor.

Prints, for the real /dev/kmsg (needs root): the latency from writing the seeds' line to /dev/kmsg to
KmsgReader returning its event through a selectors loop (median and worst of N), the cost of
classifying one line (built-in catalogue, a line that matches nothing: the common case), the time to
open a reader (it reads the whole ring buffer once), and the supervisor's RSS growth from importing
the three modules with pyudev and systemd-python. Figures, not pass/fail: the goals are set in the issue.

    .venv/bin/python -m bench.kernel_log [N]
"""

from __future__ import annotations

import os
import resource
import selectors
import statistics
import sys
import time
import uuid

SEEDS_LINE = (
    "workqueue: amdgpu_amdkfd_restore_userptr_worker [amdgpu] hogged CPU for >10000us 4 times, "
    "consider switching to WQ_UNBOUND"
)


def rss_kib() -> int:
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return 0


def main() -> None:
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 50
    before = rss_kib()
    from supervisor.kernel.gpu_events import GpuEventMonitor
    from supervisor.kernel.reader import JournalReader, KmsgReader  # noqa: F401
    from supervisor.kernel.catalogue import classify

    import systemd.journal  # noqa: F401  (what JournalReader imports when used)

    monitor = GpuEventMonitor()
    grown = (rss_kib() - before) / 1024
    print(f"RSS growth from the three modules + pyudev + systemd-python + a netlink monitor: {grown:.1f} MiB")
    monitor.close()

    unmatched = "amdgpu 0000:03:00.0: amdgpu: ring gfx_0.0.0 uses VM inv eng 0 on hub 0"
    loops = 20000
    t = time.perf_counter()
    for _ in range(loops):
        classify(unmatched)
    per_line = (time.perf_counter() - t) / loops
    t = time.perf_counter()
    for _ in range(loops):
        classify(SEEDS_LINE)
    per_hit = (time.perf_counter() - t) / loops
    print(f"classify: {per_line * 1e6:.1f} us per unmatched line, {per_hit * 1e6:.1f} us per seeds' line")

    if os.geteuid() != 0:
        print("not root: skipping the /dev/kmsg latency")
        return
    t = time.perf_counter()
    reader = KmsgReader()
    print(f"KmsgReader open (reads the ring buffer once): {(time.perf_counter() - t) * 1e3:.1f} ms")
    latencies = []
    with selectors.DefaultSelector() as sel:
        sel.register(reader.fileno(), selectors.EVENT_READ)
        for _ in range(n):
            nonce = uuid.uuid4().hex
            with open("/dev/kmsg", "w") as kmsg:  # a fresh open: writes are rate-limited per open file
                start = time.perf_counter()
                kmsg.write(f"<4>{SEEDS_LINE} [{nonce}]\n")
            found = False
            while not found:
                if not sel.select(timeout=5.0):
                    raise SystemExit("no event within 5 s")
                found = any(nonce in e.message for e in reader.read())
            latencies.append(time.perf_counter() - start)
            time.sleep(0.01)
    reader.close()
    ms = sorted(x * 1e3 for x in latencies)
    print(f"/dev/kmsg write -> KernelEvent, {n} lines: median {statistics.median(ms):.3f} ms, max {ms[-1]:.3f} ms")
    print(f"max RSS of this process: {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024:.1f} MiB")


if __name__ == "__main__":
    main()
