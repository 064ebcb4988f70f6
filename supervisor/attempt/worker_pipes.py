"""The attempt's worker as the loop reads it: its three descriptors registered, what its heartbeat pipe and its
output say turned into the core's events (its last words before its death), and its tree's activity read while the
core watches a stall.

It owns which worker is current (``worker``); the agent hands each event to the core (``handle``) and reads the
kernel's lines before an exit is judged (``before_exit``).
"""

from __future__ import annotations

import logging
import math
import selectors
from pathlib import Path
from typing import Any, Callable, Collection

from supervisor import decision
from supervisor.attempt import search_lines
from supervisor.attempt.read_throttle import ReadThrottle
from supervisor.attempt.tree_activity import ActivitySampler
from supervisor.attempt.worker_process import HeartbeatCounts, WorkerProcess, forward
from supervisor.decision import scan
from supervisor.host import process_tree
from supervisor.state import checkpoints

log = logging.getLogger("yolo-train")


class WorkerPipes:
    def __init__(self, selector: selectors.BaseSelector, reads: ReadThrottle, handle: Callable[[Any], None],
                 before_exit: Callable[[], None], run_dir: Path, reads_launch_record: bool):
        self.selector, self.reads, self.handle, self.before_exit = selector, reads, handle, before_exit
        self.run_dir, self.reads_launch_record = run_dir, reads_launch_record
        self.worker: WorkerProcess | None = None
        self.heartbeats = HeartbeatCounts()
        self.activity = ActivitySampler()

    def attach(self, worker: WorkerProcess) -> None:
        self.worker = worker
        self.selector.register(worker.heartbeat_fd, selectors.EVENT_READ, self._on_heartbeat)
        self.selector.register(worker.output_fd, selectors.EVENT_READ, self._on_output)
        self.selector.register(worker.pidfd, selectors.EVENT_READ, self._on_exit)

    def detach(self) -> WorkerProcess | None:
        """The worker, no longer read (its tree is about to be killed)."""
        worker, self.worker = self.worker, None
        for fd in worker.fds if worker is not None else ():
            self.reads.forget(fd)
        return worker

    def drain(self) -> None:
        """What the worker has queued, decided now: before anyone is judged."""
        worker = self.worker
        if worker is not None:
            self._on_heartbeat(worker.heartbeat_fd, rest=False)
        if self.worker is not None and self.worker is worker:
            self._on_output(worker.output_fd, rest=False)

    def _on_heartbeat(self, fd: int, rest: bool = True) -> None:
        worker = self.worker
        if worker is None or worker.closed:
            return
        messages, ended = worker.read_heartbeats(self.heartbeats)
        for message in messages:
            # A rank is known by its rank; any other sender may be the script a wrapper (./run.sh) started.
            in_tree = message.rank is None and message.pid != worker.pid and worker.in_tree(message.pid)
            if worker.output_progress is not None and (message.pid == worker.pid or in_tree):
                worker.output_progress = None  # the script speaks for itself: the precise path wins over its output
                log.info("the command sends heartbeats: progress is read from them, no longer from its output")
            self.handle(decision.HeartbeatReceived(message, from_worker_tree=in_tree))
            if self.worker is not worker:
                return
        if ended:  # every writer is gone; the pidfd reports the exit
            self.reads.forget(worker.heartbeat_fd)
        elif rest:
            self.reads.rest(fd, self._on_heartbeat)

    def _on_output(self, fd: int, rest: bool = True) -> None:
        worker = self.worker
        if worker is None or worker.closed:
            return
        lines, progress, ended = worker.read_output()
        if ended:
            self.reads.forget(worker.output_fd)
        elif rest:
            self.reads.rest(fd, self._on_output)
        forward(lines)
        for line in lines:
            found = scan(line)
            if found is not None:
                self.handle(decision.SignatureSeen(found.name, found.remedy, found.advice, line))
            news = search_lines.read(line)
            if news is not None:
                self.handle(news)
        for message in progress:
            self.handle(decision.HeartbeatReceived(message))
            if self.worker is not worker:
                return

    def _on_exit(self, _fd: int) -> None:
        worker = self.worker
        returncode = worker.wait()
        self._on_heartbeat(worker.heartbeat_fd, rest=False)  # its last words arrive before its death is judged,
        self._on_output(worker.output_fd, rest=False)
        self.before_exit()  # and so does the OOM killer's note on why it died
        self.reads.forget(worker.pidfd)
        # Our worker's exit 0 ends the training: what it leaves of its weights says whether that is a success.
        weights = checkpoints.weights_kept(self.run_dir) if returncode == 0 and self.reads_launch_record else None
        self.handle(decision.WorkerExited(returncode, worker.output_tail[-1] if worker.output_tail else None, weights))

    # -- its tree's activity, read from ``start`` (the core's watch; None: not in this stall) every interval --
    def next_sample(self, start: float | None) -> float:
        return math.inf if start is None or self.worker is None else max(start, self.activity.next_at())

    def sample_tree(self, start: float | None, now: float, spare: Callable[[], Collection[int]],
                    counted: Callable[[], dict[int, tuple[int, frozenset[int]]]]) -> None:
        """``counted``: the threads that count in each process named (``decision.counted_threads``)."""
        if start is None or self.worker is None or now < start:
            self.activity.forget()  # the next stall's first reading starts its window
        elif self.activity.due(self.worker.pid, now):
            event = self.activity.sample(self.worker.pid, process_tree.tree(spare=spare()), now, counted())
            if event is not None:
                self.handle(event)
