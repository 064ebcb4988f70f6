"""The worker's process tree: who is in it, what each process is doing, and killing all of it.

The supervisor makes itself a child subreaper (PR_SET_CHILD_SUBREAPER), so a DataLoader worker or any
grandchild orphaned by the death of the training process is re-parented to the supervisor instead of init:
"every process the worker started" is then simply every descendant of the supervisor, found again after
each signal round, including processes forked while we were killing.
"""

from __future__ import annotations

import ctypes
import os
import signal
import time
from dataclasses import dataclass, field
from typing import Callable, Collection

import psutil

from supervisor.decision import Survivor

PR_SET_CHILD_SUBREAPER = 36
PR_SET_PDEATHSIG = 1


def become_subreaper() -> bool:
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0
    except OSError:
        return False


def dies_with(parent: int) -> Callable[[], None]:
    """A ``preexec_fn`` for a child of ``parent``: the kernel SIGKILLs it when the thread that forked it dies (the
    supervisor's main thread, whose loop spawns every worker), so a supervisor killed with SIGKILL leaves no command
    training beside the next one; it exits at once when ``parent`` died before the signal was armed."""
    prctl = ctypes.CDLL(None, use_errno=True).prctl  # looked up before the fork: the child only calls it

    def arm() -> None:
        prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
        if os.getppid() != parent:
            os._exit(1)
    return arm


def tree(root_pid: int | None = None, spare: Collection[int] = ()) -> list[psutil.Process]:
    """Every live descendant of the supervisor (or of ``root_pid``), zombies excluded, and none of ``spare`` or
    below it (the standby worker: a child of the supervisor, never part of the worker's tree)."""
    try:
        root = psutil.Process(root_pid or os.getpid())
        if spare:
            members = [c for c in root.children() if c.pid not in spare]
            members += [d for c in members for d in _descendants(c)]
        else:
            members = root.children(recursive=True)
        if root_pid:
            members.insert(0, root)
    except psutil.Error:
        return []
    return [p for p in members if _alive(p)]


def children_marked(variable: str, value: str) -> list[int]:
    """The supervisor's children started with ``variable=value`` in their environment: a notify command's daemon
    (``setsid ... &``) re-parented to the supervisor, the subreaper, is found by its mark, not mistaken for an orphan
    of the worker's tree. Read from /proc/PID/environ (the environment it was started with)."""
    mark = f"{variable}={value}".encode()
    found = []
    try:
        children = psutil.Process().children()
    except psutil.Error:
        return []
    for c in children:
        try:
            with open(f"/proc/{c.pid}/environ", "rb") as f:
                if mark in f.read().split(b"\0"):
                    found.append(c.pid)
        except OSError:
            continue
    return found


def stopped(pid: int) -> bool:
    """Whether ``pid`` is stopped (SIGSTOP, a debugger): alive, yet it would run nothing it is given."""
    try:
        return psutil.Process(pid).status() in (psutil.STATUS_STOPPED, psutil.STATUS_TRACING_STOP)
    except psutil.Error:
        return False


def descends_from(pid: int, ancestor: int) -> bool:
    """Whether ``pid`` lives and ``ancestor`` is among its parents."""
    try:
        return any(p.pid == ancestor for p in psutil.Process(pid).parents())
    except psutil.Error:
        return False


def _descendants(p: psutil.Process) -> list[psutil.Process]:
    try:
        return p.children(recursive=True)
    except psutil.Error:
        return []


def _alive(p: psutil.Process) -> bool:
    try:
        return p.is_running() and p.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


@dataclass(frozen=True)
class CpuSample:
    """Each process's CPU seconds (user and system) at ``at`` (monotonic): where a CPU% window starts."""
    at: float
    seconds: dict[int, float]


def cpu_seconds(p: psutil.Process) -> float:
    """The CPU time a process has used so far, user and system (not its children's)."""
    return sum(p.cpu_times()[:2])


def cpu_sample(processes: list[psutil.Process]) -> CpuSample:
    seconds = {}
    for p in processes:
        try:
            seconds[p.pid] = cpu_seconds(p)
        except psutil.Error:
            pass
    return CpuSample(time.monotonic(), seconds)


def snapshot(processes: list[psutil.Process], sample_seconds: float = 0.2, since: CpuSample | None = None
             ) -> list[dict]:
    """pid, parent, name, state and CPU% of each process, for the incident record. The CPU% is taken over the
    window from ``since`` (a sample taken before the stacks were read: their capture is the window, no wait of its
    own), at least ``sample_seconds`` long; a process not in that sample has none (``cpu_percent`` None)."""
    since = since or cpu_sample(processes)
    time.sleep(max(0.0, since.at + sample_seconds - time.monotonic()))
    window = time.monotonic() - since.at
    rows = []
    for p in processes:
        try:
            with p.oneshot():
                before = since.seconds.get(p.pid)
                cpu = None if before is None else round((cpu_seconds(p) - before) / window * 100, 1)
                rows.append({"pid": p.pid, "ppid": p.ppid(), "name": p.name(), "state": p.status(),
                             "cpu_percent": cpu, "rss_bytes": p.memory_info().rss,
                             "cmdline": " ".join(p.cmdline())[:200]})
        except psutil.Error:
            continue
    return rows


@dataclass
class KillReport:
    killed: list[int] = field(default_factory=list)
    survivors: list[Survivor] = field(default_factory=list)  # each with where the kernel holds it (its wchan)
    seconds: float = 0.0


def _signal(processes: list[psutil.Process], sig: int) -> None:
    for p in processes:
        try:
            p.send_signal(sig)
            if sig == signal.SIGTERM:
                p.send_signal(signal.SIGCONT)  # a stopped process only acts on SIGTERM once continued
        except psutil.Error:
            pass


def reap() -> None:
    """Collect exit statuses of children re-parented to us, so they do not linger as zombies."""
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return


def kill_tree(root_pid: int | None, grace: float, timeout: float, adopt_orphans: bool = False,
              keepalive: Callable[[], None] | None = None, spare: Collection[int] = ()) -> KillReport:
    """SIGTERM every process of the tree, SIGKILL what is left after ``grace``, and confirm none remain.

    ``root_pid`` None means every descendant of the supervisor; ``adopt_orphans`` adds those to the tree of
    ``root_pid`` (right when the supervisor is a subreaper with no other children). Processes still there
    ``timeout`` seconds after SIGKILL (uninterruptible sleep in a driver) are reported as survivors.
    ``keepalive`` is called at least every half second while waiting (the agent pings systemd's watchdog).
    ``spare``: children of the supervisor left alive with everything below them (the standby worker).
    """
    keepalive = keepalive or (lambda: None)
    start = time.monotonic()
    report = KillReport()
    seen: dict[int, psutil.Process] = {}

    def members() -> list[psutil.Process]:
        # Everything seen so far that still lives (psutil notices pid reuse), plus a fresh scan: once the
        # root is dead its children can no longer be found through it.
        for p in tree(root_pid) + (tree(spare=spare) if root_pid is None or adopt_orphans else []):
            seen.setdefault(p.pid, p)
        return [p for p in seen.values() if _alive(p)]

    processes = members()
    _signal(processes, signal.SIGTERM)
    grace_over = time.monotonic() + grace
    while processes and time.monotonic() < grace_over:
        keepalive()
        _, processes = psutil.wait_procs(processes, timeout=min(0.5, max(0.0, grace_over - time.monotonic())))
    reap()
    deadline = time.monotonic() + timeout
    while True:
        processes = members()  # again: orphans re-parented to us and processes forked meanwhile
        if not processes:
            break
        _signal(processes, signal.SIGKILL)
        keepalive()
        psutil.wait_procs(processes, timeout=min(0.5, max(0.0, deadline - time.monotonic())))
        reap()
        if time.monotonic() >= deadline:
            for p in members():
                try:
                    report.survivors.append(Survivor(p.pid, p.name(), p.status(), kernel_waits(p.pid)))
                except psutil.Error:
                    continue
            break
    report.killed = sorted(seen)
    report.seconds = time.monotonic() - start
    return report


def kernel_waits(pid: int) -> tuple[str, ...]:
    """The kernel functions the threads of ``pid`` sleep in (/proc/PID/task/TID/wchan), each once, in thread order:
    ("request_wait_answer",) for a FUSE request its daemon holds. A thread that runs or has exited shows "0" and
    is left out; () where none sleeps or /proc says nothing (another user's process without the right to read)."""
    waits: list[str] = []
    try:
        tids = sorted(int(t) for t in os.listdir(f"/proc/{pid}/task"))
    except (OSError, ValueError):
        return ()
    for tid in tids:
        try:
            with open(f"/proc/{pid}/task/{tid}/wchan") as f:
                wchan = f.read().strip()
        except OSError:
            continue
        if wchan and wchan != "0" and wchan not in waits:
            waits.append(wchan)
    return tuple(waits)


def kill_processes(pids: Collection[int], timeout: float, keepalive: Callable[[], None] | None = None
                   ) -> list[str]:
    """SIGKILL ``pids`` (not their tree) and wait up to ``timeout`` for each to be gone or a zombie: the ones that
    are not, described ("pid 123 (python, disk-sleep)")."""
    processes = []
    for pid in pids:
        try:
            p = psutil.Process(pid)
            p.send_signal(signal.SIGKILL)
            processes.append(p)
        except psutil.NoSuchProcess:
            pass
    deadline = time.monotonic() + timeout
    while True:
        left = [p for p in processes if _alive(p)]
        if not left or time.monotonic() >= deadline:
            break
        if keepalive is not None:
            keepalive()
        time.sleep(0.01)
    return [f"pid {p.pid} ({_describe(p)})" for p in left]


def _describe(p: psutil.Process) -> str:
    try:
        waits = kernel_waits(p.pid)
        return f"{p.name()}, {p.status()}" + (f", in {', '.join(waits)}" if waits else "")
    except psutil.Error:
        return "gone"


def exit_fds(pids: Collection[int]) -> dict[int, int]:
    """fd -> pid: a pidfd for each of ``pids`` still there, readable once it exits (pidfd_open(2)); the loop waits
    on them as on any descriptor, so survivors of SIGKILL are awaited without polling."""
    fds = {}
    for pid in pids:
        try:
            fds[os.pidfd_open(pid)] = pid
        except ProcessLookupError:
            pass
    return fds
