"""Whether the worker's whole process tree does anything: a stall's second witness (``watchdog.current_stall``).

A training that makes progress runs: its processes decode images, launch kernels and spin on them, write checkpoints.
A tree in which, for seconds, no process used more than a sliver of CPU, read or wrote the disk, slept
uninterruptibly in the kernel (a disk, a driver) or started a process waits for something that is not coming: the
seeds' DataLoader deadlock, a tree frozen from outside. Each reading also names the processes that wait on a socket
or a remote file (host/outside_waits.py): a loader worker that owes a batch and waits so is not hung; and the
processes stopped (state T or t): under DDP, a rank stopped is named so, every rank stopped is the whole tree frozen. It is read from /proc once a second while a stall lasts
(``watchdog.tree_reading_from``: never while batches come), comparing each thread with itself; the core hears only
the changes. Threads, not processes, are idle or busy (/proc/PID/task/TID/stat): a device runtime's thread that spins
on a core for ever (ROCm's ``AsyncEventsLoop``) made every idle hang late; it counts for nothing, nor does a thread of
the training process off its training thread's chain of waits, and one that spun is said beside the hang.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass

import psutil

from supervisor import decision
from supervisor.host.outside_waits import waits_outside
from worker.wire.contract import RUNTIME_THREADS

SAMPLE_INTERVAL = 1.0  # seconds between two readings of the tree
IDLE_CPU_SHARE = 0.05  # of one core over a window: a heartbeat thread and a queue's timed waits stay well under it
SPUN_SHARE = 0.1  # of one core over a window: a thread that counts for nothing and used more spun beside the stall
LATE = 3.0  # a window longer than this many intervals (the supervisor itself did not run) says nothing


@dataclass(frozen=True)
class Task:
    """One thread as /proc/PID/task/TID/stat shows it: its kernel name, state and CPU seconds (user and system)."""
    comm: str
    state: str
    cpu: float


@dataclass(frozen=True)
class Usage:
    """What one process has done so far: each thread's CPU (``threads``) and the bytes it read from or wrote to
    storage."""
    threads: dict[int, Task]
    disk: int


_TICK = os.sysconf("SC_CLK_TCK")


def tasks(pid: int) -> dict[int, Task]:
    """Every thread of ``pid`` ({} when none can be read)."""
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return {}
    found = {}
    for tid in tids:
        try:
            with open(f"/proc/{pid}/task/{tid}/stat", "rb") as f:
                stat = f.read()
        except OSError:
            continue
        start, end = stat.find(b"("), stat.rfind(b")")
        fields = stat[end + 2:].split()  # the state first: utime and stime are the 12th and 13th after it
        found[int(tid)] = Task(stat[start + 1:end].decode(errors="replace"), state(stat),
                               (int(fields[11]) + int(fields[12])) / _TICK)
    return found


def usage(p: psutil.Process) -> Usage | None:
    """None: gone, or its counters cannot be read (then the tree cannot be called idle)."""
    try:
        io = p.io_counters()
    except (psutil.Error, AttributeError):  # AttributeError: no io_counters on this platform
        return None
    threads = tasks(p.pid)
    return Usage(threads, io.read_bytes + io.write_bytes) if threads else None


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


class ActivitySampler:
    """Reads the tree's usage every ``SAMPLE_INTERVAL`` and says when it went idle or busy again. Threads, not
    processes, are idle or busy: a device runtime's spinning thread (``RUNTIME_THREADS``) counts nowhere, and in a
    process whose threads that count the core names (``decision.counted_threads``: the training thread and those on
    its chain of waits) only those do."""

    def __init__(self, interval: float = SAMPLE_INTERVAL):
        self.interval = interval
        self._worker: int | None = None
        self._at: float | None = None
        self._usage: dict[int, Usage | None] = {}
        self._idle_since: float | None = None
        self._thread_idle_since: float | None = None
        self._reported: decision.TreeActivity | None = None

    def forget(self) -> None:
        """No stall to judge: the next reading starts a new window (the core forgot the last idleness itself)."""
        self._at, self._usage, self._idle_since, self._thread_idle_since = None, {}, None, None
        self._reported = None

    def due(self, worker_pid: int, now: float) -> bool:
        return worker_pid != self._worker or now >= self.next_at()

    def next_at(self) -> float:
        """When the next reading is due (monotonic): the agent's loop wakes for it, so a frozen tree, which sends
        nothing that would wake it, is read every interval and not every second one."""
        return -math.inf if self._at is None else self._at + self.interval

    def sample(self, worker_pid: int, processes: list[psutil.Process], now: float,
               counted: dict[int, tuple[int, frozenset[int]]] | None = None) -> decision.TreeActivity | None:
        """``processes``: the worker's tree now; ``counted``: by pid, the training thread and the threads that count
        (``decision.counted_threads``). The event when its activity changed since the last one; None when unchanged.
        A new worker starts afresh (its Spawned already told the core nothing is known of it)."""
        if worker_pid != self._worker:
            self._worker = worker_pid
            self.forget()
        counted = counted or {}
        readings = {p.pid: usage(p) for p in processes}
        spun: tuple[str, ...] = ()
        if self._at is not None:
            window = now - self._at
            on_time = window <= LATE * self.interval
            if on_time and self._idle(readings, window, counted):
                self._idle_since = self._at if self._idle_since is None else self._idle_since
            else:
                self._idle_since = None
            training = [(pid, tid) for pid, (tid, _) in counted.items()]
            if on_time and training and all(self._quiet(pid, {tid}, readings, window) for pid, tid in training):
                self._thread_idle_since = self._at if self._thread_idle_since is None else self._thread_idle_since
            else:
                self._thread_idle_since = None
            spun = self._spun(readings, window, counted) if on_time else ()
        self._at, self._usage = now, readings
        # A process waiting on a socket or a remote file: a loader worker owing a batch so is no deadlock.
        outside = frozenset(pid for pid in readings if pid != worker_pid and waits_outside(pid))
        halted = frozenset(pid for pid in readings if stopped(pid))
        event = decision.TreeActivity(self._idle_since, outside, halted, self._thread_idle_since, spun)
        if event == self._reported or self._reported is None and event == decision.TreeActivity(None):
            return None
        self._reported = event
        return event

    def _idle(self, readings: dict[int, Usage | None], window: float,
              counted: dict[int, tuple[int, frozenset[int]]]) -> bool:
        if not readings or any(pid not in self._usage or u is None or self._usage[pid] is None
                               for pid, u in readings.items()):
            return False  # a process started, or one cannot be read
        cpu = 0.0
        for pid, u in readings.items():
            before = self._usage[pid]
            for tid in _counting(u, counted.get(pid)):
                if tid not in before.threads:
                    return False  # a thread started
                cpu += u.threads[tid].cpu - before.threads[tid].cpu
        disk = sum(u.disk - self._usage[pid].disk for pid, u in readings.items())
        if cpu > IDLE_CPU_SHARE * window or disk > 0:
            return False
        return not any(t.state == "D" for u in readings.values() for t in u.threads.values())

    def _quiet(self, pid: int, tids: set[int], readings: dict[int, Usage | None], window: float) -> bool:
        """Whether threads ``tids`` of ``pid`` used no CPU to speak of over the window, none in the disk's sleep."""
        now, before = readings.get(pid), self._usage.get(pid)
        if now is None or before is None or any(t not in now.threads or t not in before.threads for t in tids):
            return False
        cpu = sum(now.threads[t].cpu - before.threads[t].cpu for t in tids)
        return cpu <= IDLE_CPU_SHARE * window and not any(now.threads[t].state == "D" for t in tids)

    def _spun(self, readings: dict[int, Usage | None], window: float,
              counted: dict[int, tuple[int, frozenset[int]]]) -> tuple[str, ...]:
        """The threads that count for nothing and used over ``SPUN_SHARE`` of a core over the window."""
        spun = []
        for pid, u in readings.items():
            before = self._usage.get(pid)
            if u is None or before is None:
                continue
            counting = _counting(u, counted.get(pid))
            for tid, t in u.threads.items():
                if tid not in counting and tid in before.threads \
                        and t.cpu - before.threads[tid].cpu > SPUN_SHARE * window:
                    spun.append(f"'{t.comm}' (tid {tid} of pid {pid})")
        return tuple(sorted(spun))


def _counting(u: Usage, counted: tuple[int, frozenset[int]] | None) -> set[int]:
    """The threads of a process that count: those the core names where they are there, else every thread; never a
    device runtime's spinning one."""
    named = {tid for tid in counted[1] if tid in u.threads} if counted is not None else set()
    return {tid for tid in (named or u.threads) if u.threads[tid].comm not in RUNTIME_THREADS}
