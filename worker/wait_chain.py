"""The chain of waits inside the training process: where its main thread waits on something another thread of the
process will end, which thread that is and what it does, followed to the end of the chain.

The witness (worker/witness.py) calls ``follow`` when the main thread's own wait is a lock's (``WaitKind.LOCK``: a
join, a queue, a future, an event or a condition, a lock). The next thread is known where the wait names it:

- ``Thread.join`` (threading.py's ``join``/``_wait_for_tstate_lock``, ``self`` the thread);
- a ``concurrent.futures`` future's ``result`` (``self`` the future): the executor thread whose ``_WorkItem.run``
  holds that future;
- an ``RLock`` on the waiting line: its owner (the C lock's repr says it; no Python code runs to read it).

Elsewhere (a queue any thread may feed, an event, a condition, a bare lock) the other end cannot be known: a thread of
the process's own that waits outside (I/O), makes progress (used a CPU since the last look) or sleeps stands for it.
A device runtime's spinning thread (``contract.RUNTIME_THREADS``, by its kernel name) never does, nor a loader's
pin-memory thread (``PIN_MEMORY_THREAD``). Each thread met is
classified by the witness's own rules; a lock wait goes on to its next thread, anything else ends the chain, and so
does a thread met twice (a cycle: a deadlock) or ``MAX_CHAIN`` links.

Per thread, /proc/self/task/TID/stat gives its kernel name, state and CPU time: a file read, never a call on a
pthread that may have ended meanwhile (``pthread_getcpuclockid`` on an ended detached thread is undefined). The
threads are listed from ``sys._current_frames()`` and ``threading._active`` copied under the GIL: no lock of
threading's (``threading.enumerate`` takes the lock that starting and ending a thread takes) is shared with training.
"""

from __future__ import annotations

import os
import re
import socket
import threading
from dataclasses import dataclass
from typing import Any, Callable

from worker.wire.contract import MAX_CHAIN, RUNTIME_THREADS, WHERE_CHARS, ChainLink, Via, WaitKind, WaitReport

_STDLIB = os.path.dirname(os.__file__)
_THREADING = os.path.join(_STDLIB, "threading.py")
_FUTURES = os.path.join(_STDLIB, "concurrent", "futures")
_TICK = os.sysconf("SC_CLK_TCK")
BUSY_SHARE = 0.1  # of a core since the last look: a thread that used more makes progress
_OWNER = re.compile(r"\bowner=(\d+)")
PEER_FRAMES = 8  # innermost frames searched for the socket a thread waits on
# A loader's pin-memory thread, by the kernel name torch gives it: it polls the loader workers' results all through
# training and feeds the training thread only through its loader (a wait of its own kind), never an Event or a queue.
PIN_MEMORY_THREAD = "pt_data_pin"


@dataclass(frozen=True)
class Task:
    """One thread as /proc/self/task/TID/stat shows it."""
    comm: str
    state: str
    cpu: float  # seconds, user and system


def task(tid: int | None) -> Task | None:
    if tid is None:
        return None
    try:
        with open(f"/proc/self/task/{tid}/stat", "rb") as f:
            stat = f.read()
    except OSError:
        return None
    start, end = stat.find(b"("), stat.rfind(b")")
    fields = stat[end + 2:].split()
    return Task(stat[start + 1:end].decode(errors="replace"), fields[0].decode(), (int(fields[11]) + int(fields[12]))
                / _TICK)


class Clocks:
    """The threads' CPU time at the witness's last look, to tell which made progress since."""

    def __init__(self) -> None:
        self._seen: dict[int, tuple[float, float, bool, Task]] = {}  # tid -> (when, cpu, busy, task) at that look

    def busy(self, tid: int | None, now: float) -> tuple[bool, Task | None]:
        """Whether thread ``tid`` used more than ``BUSY_SHARE`` of a core since the last look (at the first: whether
        it is running now), and what /proc says of it; once per look (``now``)."""
        before = self._seen.get(tid) if tid is not None else None
        if before is not None and before[0] == now:
            return before[2], before[3]
        t = task(tid)
        if t is None:
            return False, None
        busy = t.state == "R" if before is None else t.cpu - before[1] > BUSY_SHARE * (now - before[0])
        self._seen[tid] = (now, t.cpu, busy, t)
        return busy, t

    def forget(self, alive: set[int | None]) -> None:
        for tid in [t for t in self._seen if t not in alive]:
            del self._seen[tid]


Classify = Callable[[Any], WaitReport]  # a thread's innermost frame -> its wait (the witness's rules)


def follow(frame: Any, frames: dict[int, Any], skip: set[int], classify: Classify, clocks: Clocks,
           now: float) -> tuple[ChainLink, ...]:
    """The chain from the waiting thread whose innermost frame is ``frame``; ``frames``: every thread's, by ident
    (``sys._current_frames()``); ``skip``: the idents never on it (the waiting thread's, the witness's)."""
    threads = dict(threading._active)  # one C call under the GIL (see the module's doc)
    clocks.forget({getattr(t, "native_id", None) for t in threads.values()})
    links: list[ChainLink] = []
    met = set(skip)
    while len(links) < MAX_CHAIN:
        via, ident = next_thread(frame, frames, threads)
        if ident is None:
            ident = stand_in(frames, threads, met, classify, clocks, now, outside=in_stdlib(frame))
            via = Via.STANDS_IN
        if ident is None or ident in met or ident not in frames:
            break
        met.add(ident)
        thread = threads.get(ident)
        tid = getattr(thread, "native_id", None)
        report = classify(frames[ident])
        busy, _ = clocks.busy(tid, now)
        links.append(ChainLink(via, getattr(thread, "name", f"thread {ident}"), tid, report.kind,
                               report.where[:WHERE_CHARS], report.function,
                               peer_of(frames[ident]) if report.kind == WaitKind.IO else None, busy))
        if report.kind != WaitKind.LOCK:
            break
        frame = frames[ident]
    return tuple(links)


def next_thread(frame: Any, frames: dict[int, Any], threads: dict[int, Any]) -> tuple[Via | None, int | None]:
    """The thread that the wait at ``frame`` names, and how; (None, None): it names none."""
    f = frame
    while f is not None:
        code, local = f.f_code, f.f_locals
        me = local.get("self")
        if code.co_filename == _THREADING and code.co_name in ("join", "_wait_for_tstate_lock") \
                and isinstance(me, threading.Thread):
            return Via.JOIN, me.ident
        if code.co_filename.startswith(_FUTURES) and code.co_name == "result" and hasattr(me, "_condition"):
            return Via.FUTURE, running(me, frames)
        if not code.co_filename.startswith(_STDLIB + os.sep) or "-packages" in code.co_filename:
            break  # the program's own frame: what its line names
        f = f.f_back
    if f is not None:
        for value in _named(f):
            if type(value).__name__ in ("RLock", "_RLock"):
                owner = getattr(value, "_owner", None)  # threading's Python RLock
                match = _OWNER.search(repr(value)) if owner is None else None
                owner = int(match[1]) if match else owner
                if owner in threads and owner in frames:
                    return Via.HOLDER, owner
    return None, None


def running(future: Any, frames: dict[int, Any]) -> int | None:
    """The executor thread whose ``_WorkItem.run`` runs ``future``."""
    for ident, f in frames.items():
        while f is not None:
            if f.f_code.co_filename.startswith(_FUTURES) and f.f_code.co_name == "run" \
                    and getattr(f.f_locals.get("self"), "future", None) is future:
                return ident
            f = f.f_back
    return None


def in_stdlib(frame: Any) -> bool:
    """The wait's innermost frame is the standard library's (a queue's get, an Event's or a Condition's wait), not the
    program's own ``lock.acquire()``."""
    name = frame.f_code.co_filename
    return name.startswith(_STDLIB + os.sep) and "-packages" not in name


def stand_in(frames: dict[int, Any], threads: dict[int, Any], met: set[int], classify: Classify, clocks: Clocks,
             now: float, outside: bool) -> int | None:
    """A thread not met yet that stands for an unknown other end: one that waits outside (``outside``: for a queue,
    an Event or a Condition, which such a thread may feed), else one that made progress. A thread asleep stands for
    nothing, nor does a waiter outside for a bare lock: a loader's pin-memory thread polling its queue, or a monitor
    that sleeps in a loop, would make a training thread's deadlock on its own lock a wait, judged at the phase's bound
    where the idle floor was due."""
    best = None
    for ident, f in frames.items():
        if ident in met:
            continue
        busy, t = clocks.busy(getattr(threads.get(ident), "native_id", None), now)
        if t is not None and (t.comm in RUNTIME_THREADS or t.comm == PIN_MEMORY_THREAD):
            continue
        order = 0 if outside and classify(f).kind == WaitKind.IO else 1 if busy else None
        if order is not None and (best is None or order < best[0]):
            best = (order, ident)
    return best[1] if best else None


def _named(frame: Any) -> list[Any]:
    """The values of a frame's locals, and the ``lock``/``_lock`` each holds."""
    local = list(frame.f_locals.values())
    return local + [_dict_of(v).get(a) for v in local for a in ("lock", "_lock")]


def peer_of(frame: Any) -> str | None:
    """The other end of the socket a thread waits on ("127.0.0.1:18765", a Unix socket's path), from its innermost
    frames' locals (a socket, or an object holding one as ``sock``/``_sock``: socket.SocketIO, http.client)."""
    f, depth = frame, 0
    while f is not None and depth < PEER_FRAMES:
        for value in list(f.f_locals.values()):
            held = _dict_of(value)
            for s in (value, held.get("sock"), held.get("_sock")):
                if isinstance(s, socket.socket):
                    try:
                        peer = s.getpeername()
                    except OSError:
                        continue
                    return f"{peer[0]}:{peer[1]}" if isinstance(peer, tuple) else str(peer) or None
        f, depth = f.f_back, depth + 1
    return None


def _dict_of(value: Any) -> dict[str, Any]:
    """An object's own attributes, read so that no ``__getattr__`` runs in the witness."""
    try:
        held = object.__getattribute__(value, "__dict__")
    except (AttributeError, TypeError):
        return {}
    return held if isinstance(held, dict) else {}
