"""The worker's tree killed, and the survivors of SIGKILL the core waits for: each one's exit read from its pidfd.

Each outcome is the core's event (``TreeKilled``, ``SurvivorsGone``), handed to it through ``handle``.
"""

from __future__ import annotations

import logging
import os
import selectors
import time
from typing import Any, Callable, Collection

from supervisor import decision
from supervisor.attempt.worker_process import WorkerProcess
from supervisor.config import Config
from supervisor.decision import Incident
from supervisor.host import process_tree

log = logging.getLogger("yolo-train")


class TreeKill:
    def __init__(self, config: Config, selector: selectors.BaseSelector, handle: Callable[[Any], None],
                 keepalive: Callable[[], None]):
        self.config, self.selector, self.handle, self.keepalive = config, selector, handle, keepalive
        self.survivors: dict[int, int] = {}  # pidfd -> pid

    def kill(self, worker: WorkerProcess | None, incident: Incident | None, spare: Collection[int]) -> None:
        """Kill ``worker``'s tree (None: what is left of one, its orphans); ``spare``: children of ours to leave."""
        w = self.config.watchdog
        if worker is not None:
            report = worker.kill(w.kill_grace, w.kill_timeout, keepalive=self.keepalive, spare=spare)
        else:
            report = process_tree.kill_tree(None, w.kill_grace, w.kill_timeout, keepalive=self.keepalive, spare=spare)
        if incident is not None:
            log.info(f"killed {len(report.killed)} process(es) in {report.seconds:.2f} s",
                     extra={"INCIDENT_ID": incident.id, "RUNG": incident.rung, "EPOCH": incident.epoch,
                            "BATCH": incident.batch})
        self.handle(decision.TreeKilled(len(report.killed), tuple(report.survivors), report.seconds, time.time()))

    def await_survivors(self, pids: tuple[int, ...]) -> None:
        self.survivors = process_tree.exit_fds(pids)
        for fd in self.survivors:
            self.selector.register(fd, selectors.EVENT_READ, self._on_survivor_exit)
        if not self.survivors:
            self.handle(decision.SurvivorsGone())

    def _on_survivor_exit(self, fd: int) -> None:
        self.selector.unregister(fd)
        os.close(fd)
        self.survivors.pop(fd, None)
        process_tree.reap()  # re-parented to us (the subreaper): no zombie left
        if not self.survivors:
            self.handle(decision.SurvivorsGone())
