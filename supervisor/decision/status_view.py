"""The live status: one typed record of what the supervisor knows, and its one JSON form.

``Status`` is the public schema: ``to_dict()`` is what the state file's "status" holds, what ``status --json`` and
the hosts view show and what users' scripts read; the metrics exporter reads the record itself
(supervisor/telemetry/metric_table.py). The JSON names are the fields' (a ``json`` name in a field's metadata where
Python's differs), nested records are JSON objects, and ``Progress`` (the worker's word) and ``Supervisor`` (what
only the agent knows) sit flat beside the core's fields. A field added here is in the JSON and readable by a metric row at once.

``snapshot`` builds it from the decision core's state (supervisor/decision/model/state.py), which it only reads.
"""

from __future__ import annotations

import dataclasses
import functools
import typing
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from supervisor.decision.learning import choices
from supervisor.decision.model import persistence, rung_choice
from supervisor.decision.model.actions import Exit
from supervisor.decision.model.events import Now
from supervisor.decision.model.state import Attempt, Progress, Supervision
from supervisor.decision.recovery import probe
from supervisor.decision.stall import kernel_search, watchdog, witness
from supervisor.vocabulary import State, Tier

FLAT = "flat"  # a field's metadata: its record's keys sit beside the holder's
JSON = "json"  # a field's metadata: its JSON name, where not the field's name


class View:
    """A record of the status: ``to_dict`` and ``from_dict`` derived from its fields."""

    def to_dict(self) -> dict[str, Any]:
        return _as_dict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Any:
        """From a status as ``to_dict`` wrote it (the state file's); a key it lacks gives the field's default."""
        return _from_dict(cls, d)


def _as_dict(record: Any) -> dict[str, Any]:
    """A view's fields, or a flat record's (a view or the core's own, as ``Progress``), by their JSON names."""
    out: dict[str, Any] = {}
    for f in dataclasses.fields(record):
        value = getattr(record, f.name)
        if f.metadata.get(FLAT):
            out.update(_as_dict(value) if value is not None else {})
        else:
            out[f.metadata.get(JSON, f.name)] = persistence.to_json(value)
    return out


def _from_dict(cls: type, d: dict[str, Any]) -> Any:
    values: dict[str, Any] = {}
    for f, hint in _fields(cls):
        if f.metadata.get(FLAT):
            record = typing.get_args(hint)[0] if typing.get_args(hint) else hint
            present = any(g.metadata.get(JSON, g.name) in d for g in dataclasses.fields(record))
            values[f.name] = _from_dict(record, d) if present else persistence.default(f)
            continue
        value = d.get(f.metadata.get(JSON, f.name))
        values[f.name] = persistence.default(f) if value is None else persistence.from_json(hint, value)
    return cls(**values)


@functools.cache
def _fields(cls: type) -> list[tuple[dataclasses.Field, Any]]:
    hints = typing.get_type_hints(cls)
    return [(f, hints[f.name]) for f in dataclasses.fields(cls)]


@dataclass(frozen=True)
class RankWaitView(View):
    rank: int = 0
    pid: int | None = None
    waiting: str | None = None
    waiting_kind: str | None = None


@dataclass(frozen=True)
class Watchdog(View):
    timeout: str = ""  # which timeout the next deadline is ("train auto", "startup_timeout", ...)
    fires_in: float | None = None
    tree_idle_seconds: float | None = None  # how long the worker's whole tree has done nothing; None: busy, unknown
    waiting: str | None = None  # where the training process says it waits in this stall (witness.py); None: no word
    waiting_kind: str | None = None  # that wait's kind: loader, collective, device, lock, io, sleep, elsewhere; stopped (a rank /proc shows stopped that said nothing)
    # under DDP: where each rank waits in this stall ({rank, pid, waiting, waiting_kind}; waiting None: no word) and
    # the rank the others wait for (witness.hung_rank); [] and None on one process
    ranks: list[RankWaitView] = field(default_factory=list)
    hung_rank: int | None = None


@dataclass(frozen=True)
class CheckpointView(View):
    path: str = ""
    epoch: int = 0
    batch: int = 0
    age_seconds: float | None = None
    seconds: float | None = None  # how long the training loop waited for it


@dataclass(frozen=True)
class IntervalView(View):
    """How the current checkpoint interval was chosen ([checkpoint] every = "auto")."""
    auto: bool = False
    max: float | None = None
    hold_seconds: float | None = None
    mean_time_between_hangs: float | None = None


@dataclass(frozen=True)
class Recoveries(View):
    """Recoveries from a failure by tier: one count per vocabulary.Tier member, named by its value ("in_place",
    "restart"), 0 before its first. Derived from the enum: a tier added there is here, and in the metric."""
    by_tier: dict[Tier, int] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {tier.value: self.by_tier.get(tier, 0) for tier in Tier}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Recoveries:
        return cls({tier: int(d.get(tier.value) or 0) for tier in Tier})

    @classmethod
    def of(cls, counts: Counter[Tier]) -> Recoveries:
        """From the core's counts (``Supervision.recoveries``)."""
        return cls({tier: counts[tier] for tier in Tier})


@dataclass(frozen=True)
class StepProgress(View):
    done: int | None = None
    total: int | None = None


@dataclass(frozen=True)
class RankStatus(View):
    rank: int = 0
    local_rank: int | None = None
    pid: int | None = None
    device: str | None = None
    seconds_since_progress: float | None = None


@dataclass(frozen=True)
class ProbeView(View):
    in_seconds: float | None = None
    probing_from: int | None = field(default=None, metadata={JSON: "from"})
    probation: dict[str, float] = field(default_factory=dict)
    hangs_by_rung: dict[str, int] = field(default_factory=dict)
    target: int | None = None


@dataclass(frozen=True)
class RungView(View):
    """One tried rung's record and expected goodput, as the ladder's next choice reads them (rung_choice.py)."""
    speed: float | None = None
    seconds: float = 0.0
    hangs: int = 0
    start: float | None = None
    expected_goodput: float | None = None
    between_hangs: float | None = None  # its mean training seconds between hangs, the prior included


@dataclass(frozen=True)
class LadderView(View):
    stall_cost_seconds: float | None = None
    rungs: dict[str, RungView] = field(default_factory=dict)


@dataclass(frozen=True)
class Heartbeats(View):
    received: int = 0
    malformed: int = 0
    oversized: int = 0
    dropped: int = 0  # the worker's own count of beats it dropped because the pipe was full
    ignored: int = 0  # from processes other than the worker's main one: never progress (the core's count)


@dataclass(frozen=True)
class Supervisor(View):
    """What only the agent knows: this supervisor, its files and the heartbeat pipe's counts."""
    supervisor_pid: int | None = None
    config: str | None = None
    state_dir: str | None = None
    updated: float | None = None  # wall clock of this status
    heartbeats: Heartbeats = field(default_factory=Heartbeats)
    metrics_bind_failures: int = 0
    standby_pid: int | None = None
    standby_kind: str | None = None  # a WorkerStart: "ready" or "imported" (attempt/ready_room.py); None: none waits
    standby_why: str | None = None  # why that kind: the room found on the device, or what rules a ready one out
    # A ready one's report (worker/wire/contract.py's StandbyReport), None until it says: what it holds ("model", "train
    # dataset", "val dataset", "image cache", "training loader workers"; [] while it builds them), its line (what it
    # holds, and what it left out for want of host memory), the host memory it holds beyond its imports (MiB: its RSS
    # growth, its loader workers' private memory) and its allowance ([worker] standby_host_percent of MemAvailable)
    standby_holds: list[str] | None = None
    standby_holds_why: str | None = None
    standby_host_mib: int | None = None
    standby_host_allowance_mib: int | None = None
    run_dir: str | None = None  # several hosts: the shared run directory (status --state-dir alone finds the hosts)
    checkpoint: str | None = None  # where the newest checkpoint is written


@dataclass(frozen=True)
class Status(View):
    """The live status, field by field as ``status --json`` names it."""
    state: str = State.STARTING.value
    reported: Progress = field(default_factory=Progress, metadata={FLAT: True})  # what the last heartbeats said
    it_s: float | None = None
    samples_s: float | None = None
    eta_seconds: float | None = None
    progress: float | None = None  # the share of the run's batches done, 0 to 1
    rung: int = 0
    rungs: int = 0
    rung_label: str = ""
    attempt: int = 0
    remedies: dict[str, Any] = field(default_factory=dict)
    restarts: int = 0
    restarts_by_reason: dict[str, int] = field(default_factory=dict)
    hangs_by_phase: dict[str, int] = field(default_factory=dict)
    budget_left: int | None = None
    recoveries: Recoveries = field(default_factory=Recoveries)
    kernel_events: dict[str, int] = field(default_factory=dict)
    reboot_needed: bool = False
    suspicion: str | None = None  # the kernel line the worker is suspected by
    worker_pid: int | None = None
    resumed_from: str | None = None
    settings: dict[str, Any] = field(default_factory=dict)  # what the worker reported in force
    seconds_since_progress: float | None = None
    worker_uptime: float | None = None
    worker_spawned: float | None = None
    startup_seconds: float | None = None
    startup_step: str | None = None  # before the first batch: the step the worker is in
    startup_step_bound: float | None = None  # seconds that step may go without news
    startup_step_progress: StepProgress | None = None  # a dataset scan's progress
    startup_step_search: str | None = None  # a kernel search's news in that step: "MIOpen search, 243 runs left"
    startup_steps_seen: dict[str, float] = field(default_factory=dict)  # the longest stretch of each step seen
    watchdog: Watchdog = field(default_factory=Watchdog)
    last_restart: float | None = None
    last_incident: dict[str, Any] | None = None  # Incident.to_dict(): the incident's own schema
    exit: Exit | None = None
    last_checkpoint: CheckpointView | None = None
    verified_copy_problem: str | None = None  # why the newest checkpoint has no verified copy (last.good.pt), if so
    checkpoint_every: float | None = None
    checkpoint_interval: IntervalView = field(default_factory=IntervalView)
    trained_seconds: float = 0.0
    lost_seconds: float = 0.0
    lost_batches: int = 0
    goodput: float | None = None
    run_started: float | None = None
    rung_speed: float | None = None
    rung0_speed: float | None = None
    rung_speeds: dict[str, float | None] = field(default_factory=dict)
    node_rank: int | None = None  # several hosts: this host's
    ranks: list[RankStatus] = field(default_factory=list)
    probe: ProbeView = field(default_factory=ProbeView)
    ladder: LadderView = field(default_factory=LadderView)
    supervisor: Supervisor | None = field(default=None, metadata={FLAT: True})  # the agent's: None in the core's


def snapshot(s: Supervision, now: Now) -> Status:
    """The core's part of the live status (``Agent.status`` adds the ``supervisor`` part)."""
    a, p = s.current, s.current.progress
    due = s.watch.deadline if s.watch is not None else watchdog.Deadline(None)  # none before a first decision
    done_batches = p.batches_done() or 0
    total_batches = p.epochs * p.batches
    it_s = a.batches_per_second()
    return Status(
        state=s.state.value, reported=dataclasses.replace(p, losses=dict(p.losses)), it_s=it_s,
        samples_s=samples_per_second(a),
        eta_seconds=(total_batches - done_batches) / it_s if it_s and total_batches else None,
        progress=(done_batches / total_batches) if total_batches else None,
        rung=s.rung, rungs=len(s.ladder), rung_label=s.ladder.label(s.rung), attempt=s.attempt,
        remedies=dict(s.remedies), restarts=sum(s.restarts_by_reason.values()),
        restarts_by_reason=_counts(s.restarts_by_reason), hangs_by_phase=_counts(s.hangs_by_phase),
        budget_left=s.budget_left(now.wall), recoveries=Recoveries.of(s.recoveries),
        kernel_events=_counts(s.kernel_events), reboot_needed=s.reboot_needed,
        suspicion=None if a.suspicion is None else a.suspicion.event.message[:200],
        worker_pid=a.worker_pid, resumed_from=a.resumed_from, settings=a.in_force_shown(),
        seconds_since_progress=None if a.last_progress_at is None else now.mono - a.last_progress_at,
        worker_uptime=None if a.spawned_at is None or a.worker_pid is None else now.mono - a.spawned_at,
        worker_spawned=a.spawned_wall, startup_seconds=a.startup_seconds, **_startup_step_view(s),
        watchdog=Watchdog(due.label, None if due.at is None else due.at - now.mono,
                          None if a.idle_since is None else now.mono - a.idle_since,
                          *_waiting(a), *_ranks_waiting(a)),
        last_restart=s.restart_times[-1] if s.restart_times else None,
        last_incident=s.incidents[-1].to_dict() if s.incidents else None,
        exit=s.exit,
        last_checkpoint=None if s.checkpoint is None else CheckpointView(
            s.checkpoint.path, s.checkpoint.epoch, s.checkpoint.batch, now.wall - s.checkpoint.wall,
            s.checkpoint.seconds),
        verified_copy_problem=s.verified_copy_problem,
        checkpoint_every=None if s.checkpoint_interval is None else s.checkpoint_interval.seconds,
        checkpoint_interval=_interval_view(s),
        trained_seconds=s.trained(), lost_seconds=s.goodput.lost_seconds, lost_batches=s.goodput.lost_batches,
        goodput=s.goodput.ratio(s.trained(), now.mono), run_started=s.goodput.run_started_wall,
        rung_speed=_speed(s, s.rung), rung0_speed=_speed(s, 0),
        rung_speeds={str(k): r.speed() for k, r in sorted(s.rungs.items()) if r.speeds},
        node_rank=s.config.distributed.node_rank if s.config.distributed.several_hosts else None,
        ranks=[RankStatus(r, v.local_rank, v.pid, v.device,
                          None if v.last_progress_at is None else now.mono - v.last_progress_at)
               for r, v in sorted(a.ranks.items())],
        probe=ProbeView(probe.probe_in(s), s.probe.probing_from,
                        {str(k): r.probation for k, r in sorted(s.rungs.items()) if r.probation is not None},
                        {str(k): r.hangs for k, r in sorted(s.rungs.items()) if r.hangs},
                        choices.probe_target(s) if s.rung else None),
        ladder=_ladder_view(s))


def _waiting(a: Attempt) -> tuple[str | None, str | None]:
    said = witness.telling(a.waits, a.loaders)[0]
    return (None, None) if said is None else (witness.describe(said), said.report.kind.value)


def _ranks_waiting(a: Attempt) -> tuple[list[RankWaitView], int | None]:
    if not a.ranks:
        return [], None
    stalled = bool(a.waits) or bool(witness.stopped_ranks(a.ranks, a.stopped))
    return ([RankWaitView(w.rank, w.pid, w.waiting, w.waiting_kind)
             for w in witness.by_rank(a.ranks, a.waits, a.stopped)],
            witness.hung_rank(a.ranks, a.waits, a.loaders, a.stopped) if stalled else None)


def _counts(counter: Counter[Any]) -> dict[str, int]:
    """A count by the vocabulary's words, as status --json spells them."""
    return {persistence.to_json(k): n for k, n in counter.items()}


def _startup_step_view(s: Supervision) -> dict[str, Any]:
    """Before the first batch: the step the worker is in, its bound, its progress; and what this run has seen."""
    a, starting = s.current, s.state == State.STARTING and s.current.step_since is not None
    return {"startup_step": a.startup_step.value if starting else None,
            "startup_step_bound": watchdog.startup_step_bound(s)[0] if starting else None,
            "startup_step_progress": StepProgress(a.step_done, a.step_total)
            if starting and a.step_done is not None else None,
            "startup_step_search": kernel_search.describe(search)
            if starting and (search := kernel_search.of_step(a)) is not None else None,
            "startup_steps_seen": dict(s.startup_steps_seen)}


def _speed(s: Supervision, rung: int) -> float | None:
    return s.rungs[rung].speed() if rung in s.rungs else None


def samples_per_second(a: Attempt) -> float | None:
    """Images per second over the attempt's recent training beats (its batches per second: ``Attempt``)."""
    if len(a.throughput) < 2:
        return None
    span = a.throughput[-1][0] - a.throughput[0][0]
    return sum(n for _, n in list(a.throughput)[1:]) / span if span > 0 else None


def _interval_view(s: Supervision) -> IntervalView:
    chosen = s.checkpoint_interval
    return IntervalView(s.config.checkpoint.every == "auto", s.config.checkpoint.max,
                        None if chosen is None else chosen.hold,
                        None if chosen is None else chosen.mean_time_between_hangs)


def _ladder_view(s: Supervision) -> LadderView:
    """What the ladder's next choice is made from (rung_choice.py): each tried rung's record and expected goodput."""
    stall = choices.stall_cost(s)
    facts = choices.rung_facts(s)
    used = rung_choice.DEFAULT_STALL_COST if stall is None else stall
    prior = s.config.probe.prior_between_hangs
    return LadderView(stall, {str(k): RungView(f.speed, round(f.seconds, 3), f.hangs, f.start,
                                               rung_choice.expected_goodput(f, rung_choice.hang_cost(f, used, facts),
                                                                            rung_choice.prior_of(k, facts, prior)),
                                               rung_choice.between_hangs(f, rung_choice.prior_of(k, facts, prior)))
                              for k, f in enumerate(facts) if f.tried})
