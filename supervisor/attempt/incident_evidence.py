"""What the worker's tree shows at an incident, read in the moment before its kill, the only one that can: its
processes, its output's last lines and, for a hung tree ([incidents] stacks), where each process waits: read ahead
of the verdict where the core asked for them (``read_ahead``, decision/recovery/stacks_ahead.py), else before the kill.

Nothing here raises or decides: the agent hands the result to the core as ``IncidentEnriched`` (``StacksReadAhead``).
"""

from __future__ import annotations

import logging
import os
import shutil
import socket
import time
from dataclasses import asdict, replace
from pathlib import Path
from typing import Collection

from supervisor import decision
from supervisor.attempt.worker_process import WorkerProcess
from supervisor.config import Config
from supervisor.decision import StallInspected, Incident, Stacks, judge, as_incident_stacks
from supervisor.host import devcoredump, flight_recorder, process_tree, stacks
from supervisor.host.gpu_metrics import sample_all
from supervisor.state.paths import StatePaths
from supervisor.vocabulary import STARTUP_PHASE, Reason

log = logging.getLogger("yolo-train")


# How old the inspection's CPU window may be for the kill's snapshot to close it: an inspection that escalates at
# once is a stacks' capture old (a second or two at most); one followed by an in-place recovery is not.
CPU_WINDOW_KEPT = 5.0


def what_the_tree_shows(config: Config, worker: WorkerProcess | None, incident: Incident, spare: Collection[int],
                        gpu_readers: list, loader_pids: Collection[int] = (),
                        rank_pids: dict[int, int] | None = None) -> decision.IncidentEnriched:
    """The processes, the output tail and, for a hung tree, the stacks (``gpu_readers`` sampled alongside). With
    no worker (it is gone already), only the orphans left behind; ``spare``: the standby, not part of the tree.
    The processes' CPU% is taken over the stacks' capture (or the stall inspection's just before), not a wait of
    its own. ``loader_pids``: the loader worker processes the worker reported, named so in the stacks; ``rank_pids``:
    each DDP rank's pid, pid -> rank (the stacks name the ranks by them, the incident's ``hung_rank`` the culprit)."""
    members = worker.tree_members(spare) if worker else process_tree.tree(spare=spare)
    dumps = devcoredump.move_into(Path(config.state_dir), incident.devcoredumps,
                                  StatePaths(config.state_dir).incident_dir(incident.id))
    if worker is None:
        return decision.IncidentEnriched(incident.id, tuple(process_tree.snapshot(members)), devcoredumps=dumps)
    since, worker.cpu_since = worker.cpu_since, None
    ahead = incident.stacks.ahead if incident.stacks is not None else None
    if since is None or time.monotonic() - since.at > max(CPU_WINDOW_KEPT, (ahead or 0.0) + 1.0):
        since = process_tree.cpu_sample(members)  # (stacks read ahead: their capture is the window, as at a kill)
    never = worker.output_progress.never_seen() if worker.output_progress is not None else None
    if never and incident.phase == STARTUP_PHASE:
        log.error(f"{never}; its last lines: {' | '.join(list(worker.output_tail)[-3:])}")
    found = None
    if ahead is not None:  # read ahead of the verdict, into the attempt's directory: now the incident's
        found = _moved_in(config, incident, incident.stacks)
    elif config.incidents.stacks and incident.reason in (Reason.HANG, Reason.KERNEL) and incident.stacks is None:
        # (an escalated in-place recovery's were taken already, moments ago)
        found = capture_stacks(config, worker, incident, [p.pid for p in members], gpu_readers, loader_pids,
                               rank_pids)
    processes = process_tree.snapshot(members, since=since)
    host = socket.gethostname() if config.distributed.several_hosts else None
    recorder = flight_recorder.collect(worker.env, incident.last_progress_wall,
                                       StatePaths(config.state_dir).incident_dir(incident.id)) \
        if rank_pids and incident.last_progress_wall is not None else ()
    return decision.IncidentEnriched(incident.id, tuple(processes), tuple(worker.output_tail), never, found, host,
                                     recorder, dumps)


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
    return _capture(config, worker, StatePaths(config.state_dir).incident_dir(incident.id), pids, gpu_readers,
                    loader_pids, rank_pids, _pid_of(incident.hung_rank, rank_pids))


def _capture(config: Config, worker: WorkerProcess, dest: Path, pids: list[int], gpu_readers: list,
             loader_pids: Collection[int], rank_pids: dict[int, int] | None, hung_pid: int | None) -> Stacks:
    capture = stacks.capture_tree(
        worker.pid, pids, dest, budget=config.incidents.stacks_budget,
        gpu_sample=(lambda: [asdict(s) for s in sample_all(gpu_readers)]) if gpu_readers else None,
        loader_pids=loader_pids, rank_pids=rank_pids, hung_pid=hung_pid)
    return as_incident_stacks(capture, config.state_dir)


def read_ahead(config: Config, worker: WorkerProcess | None, action: decision.ReadStacksAhead, spare: Collection[int],
               gpu_readers: list) -> decision.StacksReadAhead | None:
    """The stacks of a stall near its verdict, the tree left running: the same capture as a kill's (``capture_stacks``,
    its budget, its stacks.json), into this attempt's own directory (the incident has no id yet); the CPU window of
    the kill that may follow starts here, as a kill's starts at its capture. None: no worker to read."""
    if worker is None:
        return None
    at = time.monotonic()
    members = worker.tree_members(spare)
    worker.cpu_since = process_tree.cpu_sample(members)
    dest = StatePaths(config.state_dir).stacks_ahead_dir(action.attempt)
    shutil.rmtree(dest, ignore_errors=True)  # an earlier stall's, or a reading of this one before its bound grew
    found = _capture(config, worker, dest, [p.pid for p in members], gpu_readers, action.loader_pids,
                     action.rank_pids, _pid_of(action.hung_rank, action.rank_pids))
    return decision.StacksReadAhead(action.since, at, found)


def drop_ahead(config: Config, worker: WorkerProcess | None, action: decision.DropStacksAhead) -> None:
    """The stall they were read for is over: their file goes, and so does the CPU window they began."""
    if worker is not None:
        worker.cpu_since = None
    folder = Path(config.state_dir, action.path).parent if action.path is not None else None
    if folder is not None and folder.name.startswith("ahead-"):  # (never an incident's own)
        shutil.rmtree(folder, ignore_errors=True)


def _moved_in(config: Config, incident: Incident, found: Stacks) -> Stacks:
    """Stacks read ahead of the verdict, their stacks.json moved into the incident's directory, where every reader
    (``yolo-train incidents``, the report) looks for it."""
    if found.path is None:
        return found
    paths = StatePaths(config.state_dir)
    source, target = Path(config.state_dir, found.path), paths.stacks(incident.id)
    if source == target:
        return found
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        os.replace(source, target)
    except OSError as e:
        log.warning(f"cannot move the stacks read ahead ({source}) into {target.parent}: {e.strerror}")
        return found
    shutil.rmtree(source.parent, ignore_errors=True)
    return replace(found, path=str(target.relative_to(config.state_dir)))


def keep_devcoredumps(config: Config, action: decision.KeepDevcoredumps) -> decision.DevcoredumpsKept | None:
    """The GPU's devcoredumps kept in the incident's directory (the attempt's, with none); None: there were none."""
    paths = StatePaths(config.state_dir)
    dest = paths.incident_dir(action.incident) if action.incident else paths.devcoredumps_dir(action.attempt)
    dumps = devcoredump.keep(devcoredump.sysfs_root(), dest, Path(config.state_dir), action.kept)
    return decision.DevcoredumpsKept(action.attempt, dumps) if dumps else None
