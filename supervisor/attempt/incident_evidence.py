"""What the worker's tree shows at an incident, read in the moment before its kill, the only one that can: its
processes, its output's last lines and, for a hung tree ([incidents] stacks), where each process waits.

Nothing here raises or decides: the agent hands the result to the core as ``IncidentEnriched``.
"""

from __future__ import annotations

import logging
import socket
import time
from dataclasses import asdict
from typing import Collection

from supervisor.attempt.worker_process import WorkerProcess
from supervisor.config import Config
from supervisor.decision import core
from supervisor.decision.in_place import StallInspected
from supervisor.decision.incident import Incident, Stacks
from supervisor.decision.loader_judgement import judge
from supervisor.decision.stack_reading import as_incident_stacks
from supervisor.host import flight_recorder, process_tree, stacks
from supervisor.host.gpu_metrics import sample_all
from supervisor.state.paths import StatePaths
from supervisor.vocabulary import STARTUP_PHASE, Reason

log = logging.getLogger("yolo-train")


# How old the inspection's CPU window may be for the kill's snapshot to close it: an inspection that escalates at
# once is a stacks' capture old (a second or two at most); one followed by an in-place recovery is not.
CPU_WINDOW_KEPT = 5.0


def what_the_tree_shows(config: Config, worker: WorkerProcess | None, incident: Incident, spare: Collection[int],
                        gpu_readers: list, loader_pids: Collection[int] = (),
                        rank_pids: dict[int, int] | None = None) -> core.IncidentEnriched:
    """The processes, the output tail and, for a hung tree, the stacks (``gpu_readers`` sampled alongside). With
    no worker (it is gone already), only the orphans left behind; ``spare``: the standby, not part of the tree.
    The processes' CPU% is taken over the stacks' capture (or the stall inspection's just before), not a wait of
    its own. ``loader_pids``: the loader worker processes the worker reported, named so in the stacks; ``rank_pids``:
    each DDP rank's pid, pid -> rank (the stacks name the ranks by them, the incident's ``hung_rank`` the culprit)."""
    members = worker.tree_members(spare) if worker else process_tree.tree(spare=spare)
    if worker is None:
        return core.IncidentEnriched(incident.id, tuple(process_tree.snapshot(members)))
    since, worker.cpu_since = worker.cpu_since, None
    if since is None or time.monotonic() - since.at > CPU_WINDOW_KEPT:
        since = process_tree.cpu_sample(members)
    never = worker.output_progress.never_seen() if worker.output_progress is not None else None
    if never and incident.phase == STARTUP_PHASE:
        log.error(f"{never}; its last lines: {' | '.join(list(worker.output_tail)[-3:])}")
    found = None
    if config.incidents.stacks and incident.reason in (Reason.HANG, Reason.KERNEL) and incident.stacks is None:
        # (an escalated in-place recovery's were taken already, moments ago)
        found = capture_stacks(config, worker, incident, [p.pid for p in members], gpu_readers, loader_pids,
                               rank_pids)
    processes = process_tree.snapshot(members, since=since)
    host = socket.gethostname() if config.distributed.several_hosts else None
    dumps = flight_recorder.collect(worker.env, incident.last_progress_wall,
                                    StatePaths(config.state_dir).incident_dir(incident.id)) \
        if rank_pids and incident.last_progress_wall is not None else ()
    return core.IncidentEnriched(incident.id, tuple(processes), tuple(worker.output_tail), never, found, host, dumps)


def inspect_stall(config: Config, worker: WorkerProcess, incident: Incident, loaders: dict[int, int | None],
                  spare: Collection[int], gpu_readers: list, rank_pids: dict[int, int] | None = None
                  ) -> StallInspected:
    """The stacks of the hung tree, left running, and whether the in-place tier applies (loader_evidence.py)."""
    members = process_tree.tree(worker.pid, spare=spare)
    worker.cpu_since = process_tree.cpu_sample(members)  # a kill that follows reads its CPU% from here
    capture = stacks.capture_tree(worker.pid, [p.pid for p in members],
                                  StatePaths(config.state_dir).incident_dir(incident.id),
                                  budget=config.incidents.stacks_budget,
                                  gpu_sample=(lambda: [asdict(s) for s in sample_all(gpu_readers)]) if gpu_readers
                                  else None, loader_pids=loaders, rank_pids=rank_pids,
                                  hung_pid=_pid_of(incident.hung_rank, rank_pids))
    verdict = judge(capture, loaders)
    return StallInspected(incident.id, verdict.loader_wait, verdict.culprits, verdict.why, verdict.rank,
                               as_incident_stacks(capture, config.state_dir))


def _pid_of(rank: int | None, rank_pids: dict[int, int] | None) -> int | None:
    return next((pid for pid, r in (rank_pids or {}).items() if r == rank), None) if rank is not None else None


def capture_stacks(config: Config, worker: WorkerProcess, incident: Incident, pids: list[int], gpu_readers: list,
                   loader_pids: Collection[int] = (), rank_pids: dict[int, int] | None = None) -> Stacks:
    """Where each process of the tree waits, before it is killed: bounded by [incidents] stacks_budget, never
    raises."""
    capture = stacks.capture_tree(
        worker.pid, pids, StatePaths(config.state_dir).incident_dir(incident.id),
        budget=config.incidents.stacks_budget,
        gpu_sample=(lambda: [asdict(s) for s in sample_all(gpu_readers)]) if gpu_readers else None,
        loader_pids=loader_pids, rank_pids=rank_pids, hung_pid=_pid_of(incident.hung_rank, rank_pids))
    return as_incident_stacks(capture, config.state_dir)
