"""The in-place tier: a hung DataLoader worker is replaced without restarting training; the restart is behind it.

Where the verdict on a stall in ``train`` or ``val`` would kill the tree, this tier comes first when it can apply
(``applies``): the worker reported its loader worker processes (our Ultralytics worker with a process loader: not
the threads rung, not ``workers = 0``, not a ``[worker] command``), and ``[recovery] in_place`` is on. Steps::

    verdict --InspectStall--> the shell reads the stacks, the tree untouched --StallInspected-->
      the training process waits for a batch and loader workers are stuck --ReplaceLoaderWorkers-->
        the shell says so on the command pipe, SIGKILLs them --LoaderWorkersKilled--> the next batch within the
        bound --> recovered: the incident is complete, tier "in_place", with its cost
      anything else --> ``escalate``: today's restart (kill, rung choice), the reason recorded

Escalation, never a hole: the stacks show something else (a hang not the loader's restarts as before); a loader
worker survives SIGKILL (D state: the restart's kill then finds it too, and "reboot needed" holds); the command
cannot be sent; the worker exits; no batch within ``bound`` (a rebuilt loader that hangs again, a pin-memory
thread that never joins); more than ``in_place_max`` in-place recoveries within ``in_place_window``.
"""

from __future__ import annotations

from typing import Any

from supervisor.decision import stopping
from supervisor.decision.actions import InspectStall, Log, ReplaceLoaderWorkers
from supervisor.decision.events import LoaderWorkersKilled, Now, StallInspected
from supervisor.decision.incident import Incident, InPlaceCost, Tier
from supervisor.decision.state import INCIDENTS_KEPT, InPlace, Supervision
from supervisor.vocabulary import Reason, State
from worker.contract import HeartbeatMessage, MessageKind, Phase

BOUND_FLOOR = 10.0  # seconds: the least a rebuilt loader gets for its first batch
BOUND_FACTOR = 2.0  # x the longest loader start of this run: what a new iterator may take for its first batch
PHASES = (Phase.TRAIN.value, Phase.VAL.value)


def applies(s: Supervision, phase: str) -> bool:
    a = s.current
    return (s.config.recovery.in_place and s.kind.reports_loader_workers and s.state == State.HEALTHY
            and phase in PHASES and bool(a.loaders) and a.in_place is None)


def recent(s: Supervision, wall: float) -> int:
    """In-place recoveries within ``in_place_window`` of ``wall``."""
    return sum(1 for t in s.in_place_times if wall - t <= s.config.recovery.in_place_window)


def begin(s: Supervision, now: Now, phase: str, detail: str) -> list[Any]:
    """The verdict on a stall the in-place tier may recover: look at the stacks first, kill nothing yet."""
    a, cfg = s.current, s.config.recovery
    if recent(s, now.wall) >= cfg.in_place_max:
        return restart(s, now, phase, detail, f"more than in_place_max ({cfg.in_place_max}) in-place recoveries "
                                              f"within in_place_window ({cfg.in_place_window:g} s)")
    stall = now.mono - (a.last_progress_at or now.mono)
    incident = Incident(
        id=f"{s.attempt}-{len(s.incidents) + 1}-{int(now.wall)}", time=now.wall, reason=Reason.HANG, phase=phase,
        detail=detail, attempt=s.attempt, rung=s.rung, rung_label=s.ladder.label(s.rung), worker_pid=a.worker_pid,
        epoch=a.progress.epoch, batch=a.progress.batch, seconds_since_progress=round(stall, 3),
        last_progress_wall=now.wall - stall, tier=Tier.IN_PLACE, settings=a.in_force_shown())
    s.incidents = (s.incidents + [incident])[-INCIDENTS_KEPT:]
    a.in_place = InPlace(incident, phase, a.progress.epoch, a.progress.batch, now.mono, stall)
    return [Log("warning", f"hang in {phase}: {detail}; reading the stacks before killing anything (in-place tier)"),
            InspectStall(incident, {pid: rank for pid, (rank, _) in a.loaders.items()})]


def inspected(s: Supervision, event: StallInspected, now: Now) -> list[Any]:
    r = s.current.in_place
    if r is None or r.incident.id != event.incident_id or r.acted_at is not None:
        return []
    r.stacks = event.stacks
    r.incident = s.amend(r.incident, stacks=event.stacks)
    if not (event.loader_wait and event.culprits):
        return escalate(s, now, event.why)
    rank = f" of rank {event.rank}" if event.rank is not None else ""
    return [Log("warning", f"{event.why}: replacing loader worker(s){rank} {', '.join(map(str, event.culprits))} "
                           f"in place"), ReplaceLoaderWorkers(tuple(event.culprits), event.rank)]


def killed(s: Supervision, event: LoaderWorkersKilled, now: Now) -> list[Any]:
    r = s.current.in_place
    if r is None or r.acted_at is not None:
        return []
    if not event.sent:
        return escalate(s, now, "the command could not be written to the worker's pipe")
    if event.survivors:
        return escalate(s, now, f"loader worker(s) survived SIGKILL ({'; '.join(event.survivors)})")
    r.acted_at = now.mono
    r.bound = max(BOUND_FLOOR, BOUND_FACTOR * (s.loader_start_seen or 0.0))
    return [Log("info", f"loader worker(s) {', '.join(map(str, event.pids))} killed in {event.seconds:.2f} s; the "
                        f"next batch is due within {r.bound:.0f} s")]


def progressed(s: Supervision, m: HeartbeatMessage, now: Now) -> list[Any]:
    """A batch after the action: the recovery worked. Its cost is recorded, and the incident is complete."""
    r = s.current.in_place
    if r is None or r.acted_at is None or m.kind != MessageKind.BEAT or m.phase.value not in PHASES:
        return []
    s.current.in_place = None
    same_pass = m.phase.value == r.phase and (m.epoch or r.epoch) == r.epoch and m.batch is not None
    cost = InPlaceCost(stall=round(r.stall, 3), action=round(r.acted_at - r.verdict_at, 3),
                       to_next_batch=round(now.mono - r.acted_at, 3),
                       batches_lost=max(0, m.batch - (r.batch + 1)) if same_pass else 0)
    s.amend(r.incident, cost=cost, restart_seconds=None)
    s.recoveries[Tier.IN_PLACE] += 1
    s.hangs_by_phase[r.phase] += 1  # (an escalated one counts as the restart's)
    # The stall lies inside the attempt's trained span (its first batch to its last progress), yet trained nothing.
    s.goodput.lost_seconds += cost.seconds
    s.in_place_times = [t for t in s.in_place_times if now.wall - t <= s.config.recovery.in_place_window] + [now.wall]
    record = s.rung_record(r.incident.rung)
    record.in_place_seconds = round(record.in_place_seconds + cost.seconds, 3)
    return [Log("info", f"recovered in place: the next batch {cost.to_next_batch:.2f} s after the loader workers were "
                        f"replaced ({cost.seconds:.1f} s from the last progress), {cost.batches_lost} batches lost"),
            *s.record_complete()]


def escalate(s: Supervision, now: Now, why: str) -> list[Any]:
    """The in-place tier failed or does not apply: today's restart, its incident the same hang's, with the reason."""
    r = s.current.in_place
    s.current.in_place = None
    s.incidents = [i for i in s.incidents if i.id != r.incident.id]  # one hang, one incident: the restart's
    detail = r.incident.detail
    return [Log("warning", f"in-place recovery not possible: {why}; restarting"),
            *restart(s, now, r.phase, detail, why, stacks=r.stacks)]


def restart(s: Supervision, now: Now, phase: str, detail: str, why: str, stacks: Any = None) -> list[Any]:
    """A hang's restart as the verdict makes it without this tier (core._tick), with why this tier did not serve."""
    return stopping.begin(s, now, Reason.HANG, phase, detail=detail, climb=True, failure=f"hang:{phase}",
                          escalation=why, stacks=stacks)


def loader_started(s: Supervision, m: HeartbeatMessage) -> list[Any]:
    """A loader's worker processes, as the worker reports them at each start: the ones this tier may replace."""
    if m.pids is None:
        return []
    a = s.current
    a.loaders = {pid: owner for pid, owner in a.loaders.items() if owner != (m.rank, m.loader)}  # its old ones
    a.loaders.update({pid: (m.rank, m.loader) for pid in m.pids})
    if m.seconds is not None:
        s.loader_start_seen = max(s.loader_start_seen or 0.0, m.seconds)
    return []
