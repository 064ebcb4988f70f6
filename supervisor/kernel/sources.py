"""The kernel's sources the agent watches: the kernel log (/dev/kmsg or the journal) and udev's GPU events, opened
where the last supervisor of this state directory stopped reading; and their events as the core's ``KernelMessage``:
whether the pid named is the worker's, and trusted only when the kernel itself wrote the line after this supervisor
started.
"""

from __future__ import annotations

import logging
import os
import time
from typing import Any, Collection

from supervisor import decision
from supervisor.config import KernelLogConfig
from supervisor.host import process_tree
from supervisor.kernel.catalogue import KernelEvent
from supervisor.kernel.reader import KernelLogSource
from supervisor.vocabulary import KernelKind

log = logging.getLogger("yolo-train")

# Fault drills and tests write GPU-lost lines to /dev/kmsg from user space; only with this set to 1 may such a
# line end a run, even one on the CPU (documented in docs/design.md). The kernel's own records need no switch.
KERNEL_DRILL = "YOLO_TRAIN_KERNEL_DRILL"
STALE_MARGIN = 5.0  # seconds: the kernel's printk clock and CLOCK_MONOTONIC drift apart a little


class KernelSources:
    def __init__(self, cfg: KernelLogConfig):
        self.cfg = cfg
        self.sources: list[KernelLogSource] = []
        # Pids of the worker's tree as last seen (refreshed with the state file): the kernel names an OOM victim
        # once it is dead, so "is this pid ours" must also look a little into the past.
        self.tree_pids: set[int] = set()
        self.started_mono = time.monotonic()  # kernel lines older than this are from before this supervisor

    def open(self, position: dict[str, Any]) -> list[KernelLogSource]:
        """Open what ``[kernel_log]`` asks for, after ``position`` (the state file's ``kernel_log_position``),
        saying which source and why; the ones that opened, to be watched."""
        from supervisor.kernel.gpu_events import open_gpu_events
        from supervisor.kernel.reader import open_kernel_log
        from supervisor.kernel.catalogue import Catalogue

        kernel_log, report = open_kernel_log(self.cfg.source, after_seq=position.get("seq"),
                                             catalogue=Catalogue(self.cfg.patterns), boot_id=position.get("boot_id"),
                                             after_cursor=position.get("cursor"))
        log.log(logging.WARNING if kernel_log is None and self.cfg.source != "off" else logging.INFO, report)
        gpu_events, report = open_gpu_events(self.cfg.gpu_events)
        log.info(report)
        self.sources += [source for source in (kernel_log, gpu_events) if source is not None]
        return self.sources

    def polled(self) -> list[KernelLogSource]:
        """The sources whose descriptor may not wake the loop (a journal on a network file system): read each turn."""
        return [source for source in self.sources if source.needs_polling]

    def remember_tree(self, worker_running: bool, spare: Collection[int]) -> None:
        """``spare``: the supervisor's children that are not the worker's (the standby)."""
        self.tree_pids = {p.pid for p in process_tree.tree(spare=spare)} if worker_running else set()

    def message(self, event: KernelEvent, spare: Collection[int]) -> decision.KernelMessage:
        in_tree = None
        if event.pid is not None:  # we are the tree's subreaper: every descendant is ours
            in_tree = event.pid in self.tree_pids or event.pid in {p.pid for p in process_tree.tree(spare=spare)}
        stale = event.monotonic_us is not None and event.monotonic_us / 1e6 < self.started_mono - STALE_MARGIN
        return decision.KernelMessage(kind=KernelKind(event.kind), message=event.message, source=event.source,
                                  pattern=event.pattern, pid=event.pid, in_worker_tree=in_tree,
                                  trusted=event.from_kernel and not stale, drill=os.environ.get(KERNEL_DRILL) == "1",
                                  reset_source=event.reset_source, devcoredump=event.devcoredump)

    def position(self) -> dict[str, Any]:
        """Where a restarted supervisor continues reading: the first source that can say."""
        for source in self.sources:
            position = source.position()
            if position:
                return position
        return {}

    def close(self) -> None:
        for source in self.sources:
            source.close()
