"""The in-place tier's actions carried out (supervisor/decision/recovery/in_place.py decides them): the stacks of the hung
tree, left running, and the stuck loader workers replaced. Each action's outcome goes back to the core as the
tier's own event; nothing here decides.
"""

from __future__ import annotations

import time
from typing import Any, Callable, Collection

from supervisor.attempt.incident_evidence import inspect_stall
from supervisor.attempt.worker_process import WorkerProcess
from supervisor.config import Config
from supervisor.decision import InspectStall, LoaderWorkersKilled, ReplaceLoaderWorkers
from supervisor.host import process_tree
from worker.wire.contract import Command, CommandKind

ACTIONS = (InspectStall, ReplaceLoaderWorkers)


def carry_out(action: Any, config: Config, worker: WorkerProcess, spare: Collection[int], gpu_readers: list,
              keepalive: Callable[[], None]) -> Any:
    """One of ``ACTIONS``, and the event that says how it went."""
    if isinstance(action, InspectStall):
        return inspect_stall(config, worker, action.incident, action.loader_pids, spare, gpu_readers,
                             action.rank_pids)
    # The command first (the worker must know the deaths are ours), then SIGKILL.
    started = time.monotonic()
    sent = worker.send(Command(CommandKind.REPLACE_LOADER_WORKERS, action.rank, action.pids))
    survivors = process_tree.kill_processes(action.pids, config.watchdog.kill_timeout, keepalive=keepalive) \
        if sent else []
    return LoaderWorkersKilled(action.pids, tuple(survivors), time.monotonic() - started, sent)
