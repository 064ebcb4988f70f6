"""bench/native_spin.py: a real native thread, named as HIP's runtime thread, that spins on a core without the GIL."""

import os
import time
from pathlib import Path

from bench.native_spin import NAME, spinning_native_thread


def _threads() -> dict[int, str]:
    return {int(t): Path(f"/proc/self/task/{t}/comm").read_text().strip() for t in os.listdir("/proc/self/task")}


def _cpu(tid: int) -> float:
    fields = Path(f"/proc/self/task/{tid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def test_it_spins_named_without_the_gil_and_stops():
    before = set(_threads())
    stop = spinning_native_thread()
    try:
        spinner = [t for t, name in _threads().items() if t not in before and name == NAME]
        assert len(spinner) == 1
        start, busy = _cpu(spinner[0]), time.monotonic()
        while _cpu(spinner[0]) - start < 0.2:  # it burns CPU while this thread holds the GIL in a loop of Python
            assert time.monotonic() - busy < 30, "the native thread never ran"
    finally:
        stop()
    assert spinner[0] not in _threads()
    stop()  # a second stop is none
