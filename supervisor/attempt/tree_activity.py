"""Whether the worker's whole process tree does anything: a stall's second witness (``watchdog.current_stall``).

A training that makes progress runs: its processes decode images, launch kernels and spin on them, write checkpoints.
A tree in which, for seconds, no process used more than a sliver of CPU, read or wrote the disk, slept
uninterruptibly in the kernel (a disk, a driver) or started a process waits for something that is not coming: the
seeds' DataLoader deadlock, a tree frozen from outside. Each reading also names the processes that wait on a socket
or a remote file (host/outside_waits.py): a loader worker that owes a batch and waits so is not hung; and the
processes stopped (state T or t): under DDP, a rank stopped is named so, every rank stopped is the whole tree frozen. It is read from /proc once a second while a stall lasts
(``watchdog.tree_reading_from``: never while batches come), comparing each process with itself; the core hears only
the changes.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass

import psutil

from supervisor import decision
from supervisor.host import process_tree
from supervisor.host.outside_waits import waits_outside

SAMPLE_INTERVAL = 1.0  # seconds between two readings of the tree
IDLE_CPU_SHARE = 0.05  # of one core over a window: a heartbeat thread and a queue's timed waits stay well under it
LATE = 3.0  # a window longer than this many intervals (the supervisor itself did not run) says nothing


@dataclass(frozen=True)
class Usage:
    """What one process has done so far: CPU seconds (user and system) and bytes it read from or wrote to storage."""
    cpu: float
    disk: int


def usage(p: psutil.Process) -> Usage | None:
    """None: gone, or its counters cannot be read (then the tree cannot be called idle)."""
    try:
        with p.oneshot():
            io = p.io_counters()
            return Usage(process_tree.cpu_seconds(p), io.read_bytes + io.write_bytes)
    except (psutil.Error, AttributeError):  # AttributeError: no io_counters on this platform
        return None


def state(stat: bytes) -> str:
    """The state letter of a /proc/PID/stat line: the field after the command, whose own ")" may come earlier."""
    end = stat.rfind(b")")
    return stat[end + 2:end + 3].decode()


def stopped(pid: int) -> bool:
    """Whether ``pid`` is stopped (state T: SIGSTOP, SIGTSTP; t: a tracer), as its /proc/PID/stat says. A tracer that
    is py-spy reading its stacks does not count: the supervisor's own reading (ahead of a verdict, or the in-place
    tier's) holds each process for a second or so, and a process held so has not stopped (its last word still
    holds, witness.still_said)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            letter = state(f.read())
    except OSError:
        return False
    return letter == "T" or letter == "t" and not traced_by_py_spy(pid)


def traced_by_py_spy(pid: int) -> bool:
    """Whether the tracer of ``pid`` (/proc/PID/status's TracerPid) is a py-spy (its /proc/PID/comm)."""
    try:
        with open(f"/proc/{pid}/status") as f:
            tracer = next((int(line.split()[1]) for line in f if line.startswith("TracerPid:")), 0)
        if not tracer:
            return False
        with open(f"/proc/{tracer}/comm") as f:
            return f.read().strip().startswith("py-spy")
    except (OSError, ValueError, IndexError):
        return False


def in_uninterruptible_sleep(pid: int) -> bool:
    """Whether any thread of ``pid`` sleeps uninterruptibly (state D: a disk, a network file system, a driver)."""
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return False
    for tid in tids:
        try:
            with open(f"/proc/{pid}/task/{tid}/stat", "rb") as f:
                if state(f.read()) == "D":
                    return True
        except OSError:
            continue
    return False


class ActivitySampler:
    """Reads the tree's usage every ``SAMPLE_INTERVAL`` and says when it went idle or busy again."""

    def __init__(self, interval: float = SAMPLE_INTERVAL):
        self.interval = interval
        self._worker: int | None = None
        self._at: float | None = None
        self._usage: dict[int, Usage | None] = {}
        self._idle_since: float | None = None
        self._reported: tuple[float | None, frozenset[int], frozenset[int]] = (None, frozenset(), frozenset())

    def forget(self) -> None:
        """No stall to judge: the next reading starts a new window (the core forgot the last idleness itself)."""
        self._at, self._usage, self._idle_since, self._reported = None, {}, None, (None, frozenset(), frozenset())

    def due(self, worker_pid: int, now: float) -> bool:
        return worker_pid != self._worker or now >= self.next_at()

    def next_at(self) -> float:
        """When the next reading is due (monotonic): the agent's loop wakes for it, so a frozen tree, which sends
        nothing that would wake it, is read every interval and not every second one."""
        return -math.inf if self._at is None else self._at + self.interval

    def sample(self, worker_pid: int, processes: list[psutil.Process], now: float) -> decision.TreeActivity | None:
        """``processes``: the worker's tree now. The event when its activity changed since the last one; None when
        unchanged. A new worker starts afresh (its Spawned already told the core nothing is known of it)."""
        if worker_pid != self._worker:
            self._worker = worker_pid
            self.forget()
        readings = {p.pid: usage(p) for p in processes}
        if self._at is not None:
            window = now - self._at
            if window <= LATE * self.interval and self._idle(readings, window):
                self._idle_since = self._at if self._idle_since is None else self._idle_since
            else:
                self._idle_since = None
        self._at, self._usage = now, readings
        # A process waiting on a socket or a remote file: a loader worker owing a batch so is no deadlock.
        outside = frozenset(pid for pid in readings if pid != worker_pid and waits_outside(pid))
        halted = frozenset(pid for pid in readings if stopped(pid))
        if (self._idle_since, outside, halted) == self._reported:
            return None
        self._reported = (self._idle_since, outside, halted)
        return decision.TreeActivity(self._idle_since, outside, halted)

    def _idle(self, readings: dict[int, Usage | None], window: float) -> bool:
        if not readings or any(pid not in self._usage or u is None or self._usage[pid] is None
                               for pid, u in readings.items()):
            return False  # a process started, or one cannot be read
        cpu = sum(u.cpu - self._usage[pid].cpu for pid, u in readings.items())
        disk = sum(u.disk - self._usage[pid].disk for pid, u in readings.items())
        if cpu > IDLE_CPU_SHARE * window or disk > 0:
            return False
        return not any(in_uninterruptible_sleep(pid) for pid in readings)
