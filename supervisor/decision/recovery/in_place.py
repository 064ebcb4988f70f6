"""The in-place tier: a hung DataLoader worker is replaced without restarting training; the restart is behind it.

Where the verdict on a stall in ``train`` or ``val`` would kill the tree, this tier comes first when it can apply
(``InPlaceTier.applies``; the interface is tier.py's, the walk recovery/__init__.py's): the worker reported its loader
worker processes (our Ultralytics worker with a process loader: not the threads rung, not ``workers = 0``, not a
``[worker] command``), and ``[recovery] in_place`` is on. Steps::

    verdict --InspectStall--> the shell reads the stacks, the tree untouched --StallInspected-->
      the training process waits for a batch and loader workers are stuck --ReplaceLoaderWorkers-->
        the shell says so on the command pipe, SIGKILLs them --LoaderWorkersKilled--> the next batch within the
        bound --> recovered: the incident is complete, tier "in_place", with its cost
      anything else --> ``Escalate``: the next tier, the restart (kill, rung choice), amends the same incident
        with the reason

Escalation, never a hole: the stacks show something else (a hang not the loader's goes to the restart); a loader
worker survives SIGKILL (D state: the restart's kill then finds it too, and "reboot needed" holds); the command
cannot be sent; the worker exits; no batch within ``bound`` (a rebuilt loader that hangs again, a pin-memory
thread that never joins: ``witness.loader_start_bound``, learned from this attempt's own loader starts, the start
method and worker count in force, never another rung's), counted from the kill, or from the rebuilt loader's new
workers once the worker reports them; more than ``in_place_max`` in-place recoveries that escalated within
``in_place_window``.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from supervisor.decision.model.actions import Log
from supervisor.decision.model.events import Now
from supervisor.decision.model.incident import Incident, Stacks
from supervisor.decision.model.state import Recovery, Supervision
from supervisor.decision.recovery import tier
from supervisor.decision.recovery.tier import Escalate, Verdict, recovered, stall_word
from supervisor.decision.stall import witness
from supervisor.vocabulary import Reason, State, Tier
from worker.wire.contract import HeartbeatMessage, MessageKind, Phase

# The tier's own actions and events: what the core asks of its shell part (supervisor/attempt/loader_workers.py), and
# what that part says back.


@dataclass(frozen=True)
class InspectStall:
    """Take the stacks of the hung tree (it is not killed) and say whether the in-place tier applies
    (``StallInspected``): ``loader_pids`` are the loader worker processes the worker reported, pid -> rank;
    ``rank_pids`` each DDP rank's pid as its heartbeats say, pid -> rank (the stacks' roles: host/stacks.py)."""
    incident: Incident
    loader_pids: dict[int, int | None]
    rank_pids: dict[int, int] = field(default_factory=dict)


@dataclass(frozen=True)
class ReplaceLoaderWorkers:
    """Tell the worker (the rank) that these loader workers are being replaced, then SIGKILL them and confirm them
    gone (``LoaderWorkersKilled``)."""
    pids: tuple[int, ...]
    rank: int | None = None



@dataclass(frozen=True)
class StallInspected:
    """What the stacks taken for an in-place recovery show (decision/stall/loader_judgement.py): whether the training process
    waits for a batch from its DataLoader, and which of its loader worker processes are stuck."""
    incident_id: str
    loader_wait: bool
    culprits: tuple[int, ...]  # loader worker pids to replace; () when the tier does not apply
    why: str  # what the stacks show, in a sentence (the escalation's reason when the tier does not apply)
    rank: int | None = None  # under DDP: the rank whose loader it is
    stacks: Stacks | None = None


@dataclass(frozen=True)
class LoaderWorkersKilled:
    """The shell sent the replacement command and SIGKILLed the loader workers; ``survivors`` did not die (D state)."""
    pids: tuple[int, ...]
    survivors: tuple[str, ...] = ()
    seconds: float = 0.0
    sent: bool = True  # the command reached the worker's pipe


@dataclass(frozen=True)
class InPlaceCost:
    """What an in-place recovery cost, in seconds: the stall (last progress to the verdict), the action (the stacks,
    the command, the loader workers killed and confirmed dead), the wait for the next batch; and batches lost (the
    next batch's index past the one waited for: 0 when the loader went on where it stopped)."""
    stall: float
    action: float
    to_next_batch: float | None = None
    batches_lost: int | None = None

    @property
    def seconds(self) -> float:
        return self.stall + self.action + (self.to_next_batch or 0.0)


PHASES = (Phase.TRAIN.value, Phase.VAL.value)


class InPlaceTier:
    """The recovery tier before the restart (tier.RecoveryTier): the stacks, then the stuck loader workers."""
    name = Tier.IN_PLACE
    events = (StallInspected, LoaderWorkersKilled, HeartbeatMessage)

    def applies(self, s: Supervision, phase: str) -> bool:
        a = s.current
        return (s.config.recovery.in_place and s.state == State.HEALTHY and phase in PHASES and a.recovery is None
                and s.kind.reports_loader_workers)

    def begin(self, s: Supervision, now: Now, verdict: Verdict) -> list[Any] | Escalate:
        return begin(s, now, verdict)

    def reads_own_stacks(self, s: Supervision, phase: str, word: witness.Word) -> bool:
        """A verdict now in ``phase``, the witness saying ``word`` of the stall, would begin this tier (its own
        stacks, or the loader workers replaced without any), not go straight to the restart: as ``begin`` judges.
        ``in_place_max`` spent, the restart takes it (and its stacks are read ahead: read at the kill, they would
        delay that restart by their capture)."""
        return self.applies(s, phase) and not spent(s) and _declines(s, word) is None

    def on_event(self, s: Supervision, r: Recovery, event: Any, now: Now) -> list[Any] | Escalate:
        if isinstance(event, StallInspected):
            return inspected(s, r, event)
        if isinstance(event, LoaderWorkersKilled):
            return killed(s, r, event, now)
        return progressed(s, r, event, now)

    def deadline(self, s: Supervision, r: Recovery) -> tuple[float, str] | None:
        """The rebuild's bound (``r.bound``) from the kill, or from the rebuilt loader's new workers once reported;
        while its tree is busy (``TreeActivity``: new workers importing, forking, making their first batches) the
        busy bound, ``auto_factor`` x this attempt's longest loader start: a spawned worker is an interpreter
        importing torch, and a loaded machine starts it many times slower than the attempt's first start (CI: 6 s
        ran out under load). Once the tree idles, the rebuild's own bound holds again."""
        if r.acted_at is None:
            return None  # the stacks are being read: the shell answers at once
        start, after = (r.rebuilt_at, "after the rebuilt loader's new workers") if r.rebuilt_at is not None else \
            (r.acted_at, "after the loader workers were replaced")
        if s.current.idle_since is None:  # busy, or not yet read since the kill
            busy = max(r.bound, s.config.watchdog.auto_factor * (s.current.loader_start_seen or 0.0))
            if busy > r.bound:
                return start + busy, f"no batch within {busy:.0f} s {after}, its tree busy"
        return start + r.bound, f"no batch within {r.bound:.0f} s {after}"

    def reads_tree_from(self, r: Recovery) -> float | None:
        return r.acted_at  # from the kill: is the rebuild busy starting its workers, or idle (hung again)?

    def recovered(self, i: Incident, where: str) -> str | None:
        if i.tier != Tier.IN_PLACE or i.cost is None:
            return None
        # Read by key, not rebuilt as an InPlaceCost: a state file written by hand or by another version may lack one
        to_next_batch, lost = i.cost.get("to_next_batch") or 0.0, i.cost.get("batches_lost")
        return (f"recovered in place from {where}: training again {to_next_batch:.0f} s after the loader "
                f"workers were replaced, {'?' if lost is None else lost} batches lost")  # the same process trains on

    def escalate(self, s: Supervision, r: Recovery, now: Now, why: str) -> list[Any]:
        if r.acted_at is not None:  # its workers were replaced and no batch came: what in_place_max counts
            window = s.config.recovery.in_place_window
            s.escalations = [t for t in s.escalations if now.wall - t <= window] + [now.wall]
            s.rung_record(r.incident.rung).tier_escalated += 1
            # The loader workers the first look blamed are gone and the hang is still there: what that look saw is
            # said in the detail, and the restart reads the tree as it is now (its stacks, its culprit).
            stacks = r.incident.stacks
            first = (stacks.culprit or stacks.where) if stacks else r.incident.witness
            r.incident = s.amend(r.incident, stacks=None, detail=(
                f"{r.incident.detail}; its loader worker(s) were replaced in place"
                + (f" (the first look: {first})" if first else "") + f", then {why}"))
        return [Log("warning", f"in-place recovery not possible: {why}; restarting")]


TIER = InPlaceTier()
TIER.reports = {MessageKind.LOADER: lambda s, m, now: loader_started(s, m, now)}
NO_WORKERS = ("in place does not apply: the loader has no worker processes to replace (the threads loader, whose "
              "threads cannot be killed, or workers = 0, which loads in the training loop itself): restart")


def recent(s: Supervision, wall: float) -> int:
    """In-place recoveries that escalated within ``in_place_window`` of ``wall``."""
    return sum(1 for t in s.escalations if wall - t <= s.config.recovery.in_place_window)


def spent(s: Supervision, wall: float | None = None) -> bool:
    """``in_place_max`` in-place recoveries that escalated (a rebuild that brought no batch) within
    ``in_place_window`` of ``wall``; None: of the last one, which no later count exceeds (ahead of a verdict, whose
    time is not known yet). Those that worked never count: each cost seconds and lost nothing."""
    if wall is None:
        if not s.escalations:
            return False
        wall = max(s.escalations)
    return recent(s, wall) >= s.config.recovery.in_place_max


def begin(s: Supervision, now: Now, verdict: Verdict) -> list[Any] | Escalate:
    """The verdict on a stall the in-place tier may recover: look at the stacks first, kill nothing yet."""
    a, cfg, phase, detail = s.current, s.config.recovery, verdict.phase, verdict.detail
    word = stall_word(s, verdict.stall)
    declined = _declines(s, word)  # first: a hang that is not this tier's says why, whatever the count
    if declined is not None:
        return Escalate(declined)
    if spent(s, now.wall):
        return Escalate(f"more than in_place_max ({cfg.in_place_max}) in-place recoveries that escalated within "
                        f"in_place_window ({cfg.in_place_window:g} s)")
    seen, culprit = word.seen, word.culprit
    stall = now.mono - (a.last_progress_at or now.mono)
    if verdict.incident is None:
        incident = s.open_incident(now, Reason.HANG, phase, detail, tier=Tier.IN_PLACE, tiers=(Tier.IN_PLACE,),
                                   settings=a.in_force_shown(), escalation=verdict.why)
    else:
        incident = s.amend(verdict.incident, tier=Tier.IN_PLACE, tiers=verdict.incident.tiers + (Tier.IN_PLACE,),
                           escalation=verdict.why)
    said = tier.witness_fields(s, verdict.stall, now, silence=False)
    if said:
        incident = s.amend(incident, **said)
    a.recovery = Recovery(TIER, incident, phase, a.progress.epoch, a.progress.batch, now.mono, stall)
    if culprit is not None:  # the training process's own word: no stacks to read, whatever the worker's state
        # Every worker of that loader goes: the rebuilt iterator replaces them all anyway, and a sibling stopped while
        # it held the result queue's write lock keeps the named worker's batch from coming.
        owner = a.loaders[culprit]
        pids = tuple(sorted(pid for pid, o in a.loaders.items() if o == owner))
        of_rank = f" of rank {owner[0]}" if owner[0] is not None else ""
        return [Log("warning", f"hang in {phase}: {detail}; the training process {witness.describe(seen)}: "
                               f"replacing loader worker(s){of_rank} {', '.join(map(str, pids))} in place"),
                ReplaceLoaderWorkers(pids, owner[0])]
    a.recovery.inspecting = True
    return [Log("warning", f"hang in {phase}: {detail}; reading the stacks before killing anything (in-place tier)"),
            InspectStall(incident, {pid: rank for pid, (rank, _) in a.loaders.items()},
                         {view.pid: rank for rank, view in a.ranks.items()})]


def _declines(s: Supervision, word: witness.Word) -> str | None:
    """Why the tree as the core knows it is not this tier's (``Escalate``'s reason), by the witness's ``word`` on the
    stall; None: it may be."""
    a = s.current
    if not a.loaders:  # nothing this tier can replace: a thread cannot be killed, and workers = 0 loads in the loop
        return NO_WORKERS
    seen, culprit = word.seen, word.culprit
    if witness.all_stopped(a.ranks, a.stopped):  # /proc shows each rank stopped: whatever one said before, not a hang
        return f"{witness.FROZEN}: restart"
    if not a.ranks and a.progress_pid is not None and a.progress_pid in a.stopped:
        # the training process itself stopped (the tree frozen): its word is from before, and no rebuilt loader can
        # bring it a batch
        return f"the training process (pid {a.progress_pid}) is stopped: restart"
    if seen is not None and culprit is None and not witness.WAITS[seen.report.kind].names_loader:
        return f"the hang is not the loader's: the training process {witness.describe(seen)}"
    return None



def inspected(s: Supervision, r: Recovery, event: StallInspected) -> list[Any] | Escalate:
    if r.incident.id != event.incident_id or r.acted_at is not None:
        return []
    r.inspecting = False
    r.incident = s.amend(r.incident, stacks=event.stacks)
    if not (event.loader_wait and event.culprits):
        return Escalate(event.why)
    if event.rank is not None:  # the stacks named the rank whose loader workers are stuck
        r.incident = s.amend(r.incident, hung_rank=event.rank)
    rank = f" of rank {event.rank}" if event.rank is not None else ""
    return [Log("warning", f"{event.why}: replacing loader worker(s){rank} {', '.join(map(str, event.culprits))} "
                           f"in place"), ReplaceLoaderWorkers(tuple(event.culprits), event.rank)]


def killed(s: Supervision, r: Recovery, event: LoaderWorkersKilled, now: Now) -> list[Any] | Escalate:
    if r.acted_at is not None:
        return []
    if not event.sent:
        return Escalate("the command could not be written to the worker's pipe")
    if event.survivors:
        return Escalate(f"loader worker(s) survived SIGKILL ({'; '.join(event.survivors)})")
    r.acted_at = now.mono
    s.current.idle_since = None  # news: the rebuild's tree is judged afresh (reads_tree_from)
    w = s.config.watchdog
    r.bound = witness.loader_start_bound(s.current.loader_start_seen, w.idle_floor, w.startup_timeout)
    return [Log("info", f"loader worker(s) {', '.join(map(str, event.pids))} killed in {event.seconds:.2f} s; the "
                        f"next batch is due within {r.bound:.0f} s")]


def progressed(s: Supervision, r: Recovery, m: HeartbeatMessage, now: Now) -> list[Any]:
    """A batch after the action: the recovery worked. Its cost is recorded, and the incident is complete. Progress
    before any action (it came while the stacks were read: the shell hands it over before their answer) drops the
    verdict: the stall is over, nothing is killed and no incident is kept."""
    if r.acted_at is None and r.inspecting:
        s.current.recovery = None
        s.incidents = [i for i in s.incidents if i is not r.incident]
        return [Log("info", f"the stall ended while its stacks were read ({now.mono - r.verdict_at:.1f} s after its "
                            f"verdict): no hang, nothing killed")]
    if r.acted_at is None or m.kind != MessageKind.BEAT or m.phase.value not in PHASES:
        return []
    s.current.recovery = None
    same_pass = m.phase.value == r.phase and (m.epoch or r.epoch) == r.epoch and m.batch is not None
    cost = InPlaceCost(stall=round(r.stall, 3), action=round(r.acted_at - r.verdict_at, 3),
                       to_next_batch=round(now.mono - r.acted_at, 3),
                       batches_lost=max(0, m.batch - (r.batch + 1)) if same_pass else 0)
    s.amend(r.incident, cost=asdict(cost), restart_seconds=None)
    recovered(s, Tier.IN_PLACE)
    s.hangs_by_phase[r.phase] += 1  # (an escalated one counts as the restart's)
    # The stall lies inside the attempt's trained span (its first batch to its last progress), yet trained nothing.
    s.goodput.lost_seconds += cost.seconds
    record = s.rung_record(r.incident.rung)
    record.tier_recovered += 1
    record.tier_seconds = round(record.tier_seconds + cost.seconds, 3)
    s.current.last_beat_sent = None  # the gap to this batch is the stall's, no batch's
    return [Log("info", f"recovered in place: the next batch {cost.to_next_batch:.2f} s after the loader workers were "
                        f"replaced ({cost.seconds:.1f} s from the last progress), {cost.batches_lost} batches lost"),
            *s.resumed_after(r.incident)]


def loader_started(s: Supervision, m: HeartbeatMessage, now: Now) -> list[Any]:
    """A loader's worker processes, as the worker reports them at each start: the ones this tier may replace. Made
    while this tier waits for its proof, they are the rebuilt loader's: the rebuild is done, and the bound for their
    first batch counts from here (a busy machine forks slowly: that is no hang of the new workers)."""
    if m.pids is None:
        return []
    a = s.current
    a.loaders = {pid: owner for pid, owner in a.loaders.items() if owner != (m.rank, m.loader)}  # its old ones
    a.loaders.update({pid: (m.rank, m.loader) for pid in m.pids})
    if m.seconds is not None:
        a.loader_start_seen = max(a.loader_start_seen or 0.0, m.seconds)
    elif a.recovery is not None and a.recovery.tier is TIER and a.recovery.acted_at is not None:
        a.recovery.rebuilt_at = now.mono
    return []
