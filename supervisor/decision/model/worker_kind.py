"""The kind of worker a training runs, decided once from its configuration: what the worker can do.

Two kinds: ours (the patched Ultralytics worker, ``python -m worker``, which reads a launch record and speaks the
whole contract of worker/wire/contract.py) and a ``[worker] command`` (any training script, which may know nothing of
yolo-train). ``WorkerKind.of(config)`` is the one place that tells them apart; everything else, the core and the
shell alike, asks the record what the kind can do instead of asking whether the worker is a command.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from supervisor.config import Config


@dataclass(frozen=True)
class WorkerKind:
    name: str  # "ultralytics" or "command", for people
    # Started as ``python -m worker FILE`` with a launch record (the rung's worker options, its forkserver); False: the
    # command's own argv for the rung, resumed from its newest checkpoint.
    reads_launch_record: bool
    # Asked on its command pipe, it saves a checkpoint, says so, then exits. False: it reads no pipe (and SIGUSR1 would
    # kill it), so it gets SIGTERM, and its exit 0 is its word that it saved.
    saves_on_request: bool
    # It reports its DataLoader worker processes at each loader's start: the in-place tier can replace them.
    reports_loader_workers: bool
    # Its exit status 0 is its word that training is done (ours says "done" first, and exits 0 after a failed save).
    exit_0_finishes: bool
    # It says when a checkpoint is complete; a command's checkpoints are its own: what a failure lost is known only once
    # its next attempt shows where it resumed (goodput.py).
    reports_checkpoints: bool
    # A worker is started ahead of the next attempt (``python -m worker --standby``): ours, with [worker] standby on.
    standby: bool
    # Its progress may be read from its output (``progress_regex``), until it sends heartbeats of its own.
    progress_from_output: bool
    # Unconfigured, its ladder is the default one (the loader's rungs); a command's is rung 0 alone: what would make an
    # unknown script safer is for its author to say (env and args rungs).
    default_ladder: bool

    @classmethod
    def of(cls, config: Config) -> WorkerKind:
        """The kind ``config`` runs: the one place that asks whether the worker is a ``[worker] command``."""
        if config.command is not None:
            return COMMAND
        return OURS if config.standby else NO_STANDBY


OURS = WorkerKind("ultralytics", reads_launch_record=True, saves_on_request=True, reports_loader_workers=True,
                  exit_0_finishes=False, reports_checkpoints=True, standby=True, progress_from_output=False,
                  default_ladder=True)
NO_STANDBY = replace(OURS, standby=False)  # ours with [worker] standby = false
COMMAND = WorkerKind("command", reads_launch_record=False, saves_on_request=False, reports_loader_workers=False,
                     exit_0_finishes=True, reports_checkpoints=False, standby=False, progress_from_output=True,
                     default_ladder=False)
