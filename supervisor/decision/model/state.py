"""The decision core's records: what the supervisor knows, as ``core.decide`` reads and updates it.

``Supervision`` is the whole of it, composed of records that each change for one reason:

- ``Attempt``: everything that belongs to one worker attempt (its pid, its progress, its intervals, its throughput,
  the signatures and kernel lines seen while it ran); replaced whole by a fresh one when the next worker is spawned;
- ``Goodput``: the work kept and lost over the whole training, and the time the supervisors ran (goodput.py);
- ``Probe``: probing back down the ladder: how long the current rung has held, where a failed probe returns;
- ``RungRecord``: what each rung has shown (rung_record.py), read by the ladder's choices (choices.py);
- ``StopPlan``: why the worker's tree is going away and what follows (stopping.py), set while STOPPING.

The fields declared ``kept(...)`` are what a restarted supervisor gets back from the state file
(persistence.py): ``persistent``/``restore`` are derived from them, so a field added to a kept record persists.
"""

from __future__ import annotations

import math
from collections import Counter, deque
from dataclasses import dataclass, field, replace
from typing import Any

from supervisor.config import Config, RestartConfig
from supervisor.decision.model import checkpoint_interval, persistence, rung_choice, rung_record
from supervisor.decision.model.actions import Exit, IncidentResumed, RecordIncident
from supervisor.decision.model.events import KernelMessage, SignatureSeen
from supervisor.decision.model.hang_history import HangHistory, HangPoint
from supervisor.decision.model.incident import Devcoredump, Incident, Stacks
from supervisor.decision.model.ladder import Ladder
from supervisor.decision.model.miopen_modes import MiopenRun
from supervisor.decision.model.pace import PACE_BATCHES, Paces
from supervisor.decision.model.persistence import kept
from supervisor.decision.model.persistence import span
from supervisor.decision.model.rung_record import RungRecord
from supervisor.decision.model.survivors import Survivor
from supervisor.decision.model.worker_kind import WorkerKind
from supervisor.vocabulary import After, KernelKind, Reason, State, Tier, WorkerStart
from worker.wire.contract import InForce, Phase, StartupStep, WaitReport

INCIDENTS_KEPT = 20
THROUGHPUT_WINDOW = 20  # training beats behind it/s



@dataclass(frozen=True)
class WaitSeen:
    """A report as the supervisor received it: from which rank (None outside DDP), and when (monotonic)."""
    report: WaitReport
    at: float
    rank: int | None = None
    # where every word of this sender in this stall put its main thread, each ``ELSEWHERE`` ("file:function", the
    # line left out: a spin loop of a few lines moves between them); None: a word of another kind or place
    place: str | None = None


@dataclass
class Progress:
    """What the last heartbeats said, for status and metrics."""
    phase: str = Phase.SETUP.value
    epoch: int = 0
    epochs: int = 0
    batch: int = 0
    batches: int = 0
    losses: dict[str, float] = field(default_factory=dict)
    lr: float | None = None

    def batches_done(self) -> int | None:
        """Training batches done in the run so far; None before the worker said how many an epoch has."""
        return (max(0, self.epoch - 1) * self.batches + self.batch) if self.batches else None


@dataclass
class StopPlan:
    """Why the worker's tree is going away, and what follows once it is gone."""
    reason: Reason
    then: After
    incident: Incident | None  # None: a planned stop (a finished run, a probe)
    climb: bool = False  # one rung safer before the next attempt
    failure: str | None = None  # names the failure, so a repeat can be told from a first time
    remedy: dict[str, Any] | None = None  # settings added on top of the rung from the next attempt on
    advice: str | None = None  # After.CONFIG_ERROR: what the user should change
    save_until: float | None = None  # monotonic: the worker was asked to save and exit by then
    saved: bool = False  # the checkpoint asked for came (our worker's word), or a command exited 0 on SIGTERM
    at_risk: tuple[float, int] = (0.0, 0)  # seconds and batches after the newest checkpoint: lost if the save fails
    point: HangPoint | None = None  # a hang: where it sat
    choice: rung_choice.Choice | None = None  # a hang that climbs: the rung it moves to, decided at the verdict
    survivors: tuple[Survivor, ...] = ()  # survivors of SIGKILL waited for before what follows (survivors.py)
    survivors_until: float | None = None  # monotonic: ... until then (survivor_timeout)


@dataclass(frozen=True)
class JobRung:
    """Several hosts: where another host moved the job, for this host's next attempt (the running one, if any,
    stays at the rung it was spawned at: its hang, seconds and speed are that rung's)."""
    rung: int
    remedies: dict[str, Any]


@dataclass
class Recovery:
    """A recovery under way, from the verdict to its proof (the next batch, for the in-place tier)."""
    tier: Any  # the tier.RecoveryTier under way (in_place.TIER)
    incident: Incident  # the hang's one incident, as last amended
    phase: str
    epoch: int
    batch: int  # the last batch trained before the stall
    verdict_at: float  # monotonic
    stall: float  # seconds from the last progress to the verdict
    acted_at: float | None = None  # its action confirmed; None while it is being taken (the shell answers at once)
    bound: float | None = None  # seconds from acted_at for its proof
    rebuilt_at: float | None = None  # the rebuilt loader's new workers reported (in place): the bound counts from here
    inspecting: bool = False  # its stacks are being read: progress meanwhile drops the verdict (in_place.progressed)

    def shift(self, gap: float) -> None:
        """The supervisor itself did not run for ``gap`` seconds: the tier's clock moves by as much."""
        self.verdict_at += gap
        self.acted_at, self.rebuilt_at = later(self.acted_at, gap), later(self.rebuilt_at, gap)


def later(clock: float | None, gap: float) -> float | None:
    """A monotonic clock moved by ``gap`` seconds the supervisor did not run; None (unset) stays None."""
    return None if clock is None else clock + gap


@dataclass
class StacksAhead:
    """The stacks of a stall read ahead of its verdict (Stall.stacks_at): the stall they are of, from when,
    and what they showed; kept only while that stall goes on (no progress, news or startup step since)."""
    since: float  # monotonic: the stall's clock (watchdog.Stall.since) when they were asked for
    at: float  # monotonic: when the reading began (when it was asked, until the shell tells)
    stacks: Stacks | None = None  # None: asked for, not told yet


@dataclass
class Suspicion:
    """A kernel line that needs confirming: the worker must show progress within the confirm window."""
    event: KernelMessage
    since: float  # monotonic


@dataclass
class OomKill:
    """The OOM killer took a process of the worker's tree: names the crash that follows soon after."""
    event: KernelMessage
    at: float  # monotonic


@dataclass(frozen=True)
class CheckpointMark:
    """The newest complete checkpoint of this training: where a restarted worker resumes."""
    path: str
    epoch: int  # resumes at this epoch (1-based) ...
    batch: int  # ... after this many of its batches
    wall: float
    mono: float  # when the training it holds was done (its batch's beat), not when its write was said
    seconds: float  # how long the training loop waited for the save

    @classmethod
    def from_dict(cls, record: dict[str, Any]) -> CheckpointMark:
        """From the state file: an earlier supervisor's monotonic time means nothing here; its age is read from the
        wall clock, and it counts as older than any attempt of this supervisor."""
        return persistence.record_from(cls, record, mono=-math.inf)


@dataclass
class RankView:
    """One rank of a distributed worker, as its own heartbeats show it."""
    pid: int
    device: str | None = None
    local_rank: int | None = None  # its rank on this host, where hosts are several
    progress: int = -1
    last_progress_at: float | None = None  # monotonic
    # its own start (heartbeats.rank_starts): its first word (monotonic), the startup step it is in and since when,
    # and each step's seconds as it ended
    first_word_at: float | None = None
    step: StartupStep | None = None
    step_entered: float | None = None
    step_seconds: dict[str, float] = field(default_factory=dict)


@dataclass(frozen=True)
class SearchSeen:
    """The latest news of a kernel search (MIOpen's) in a startup step: which step, from when that step's stretch
    began before the search's first line (the stretch this run keeps of it is measured from there), the count the
    search said last, and when it said it (monotonic)."""
    step: StartupStep
    stretch_since: float
    library: str
    runs_left: int | None
    at: float
    lines: int = 1


@dataclass
class TrainingClock:
    """An attempt's training, timed by its beats (when each was sent, on the sender's monotonic clock), not by when the
    supervisor read them: a supervisor stopped alone (Ctrl-Z in its terminal) reads its worker's beats late, and the
    training they tell of was done all the same. Only a pause of the supervisor in which nothing was sent (the worker
    stopped with it) is taken out, judged by the first progress after it."""
    first: float  # the first training batch
    last: float  # the last progress
    untrained: float = 0.0  # pauses the worker sat through too
    pause: tuple[float, float] | None = None  # the supervisor's last pause (from, to), until the next progress

    def progressed(self, sent: float) -> None:
        if self.pause is not None:
            start, end = self.pause
            if sent >= end:  # nothing sent while the supervisor was away: the worker was stopped too
                self.untrained += max(0.0, min(sent, end) - max(self.last, start))
            self.pause = None
        self.last = max(self.last, sent)

    def seconds(self) -> float:
        return max(0.0, self.last - self.first - self.untrained)


@dataclass
class Attempt:
    """One worker attempt, from its spawn (``Spawned``) until the next: what its heartbeats, its output and the
    kernel said of it. Nothing here outlives the attempt."""
    worker_pid: int | None = None
    spawned_at: float | None = None  # monotonic
    spawned_wall: float | None = None
    startup_seconds: float | None = None  # spawn to the first training batch
    startup_step: StartupStep = StartupStep.IMPORTS  # the step of its startup the worker said it is in
    step_since: float | None = None  # monotonic: the step's clock, from its entry or its last progress
    step_entered: float | None = None  # monotonic: when the current step was entered (progress does not reset it)
    step_seconds: dict[str, float] = field(default_factory=dict)  # each startup step's seconds, as they ended
    start: WorkerStart = WorkerStart.COLD  # how its process came: new, or a standby of which kind
    start_why: str | None = None  # a cold start where a standby waited: why it was not taken
    step_done: int | None = None  # the step's progress as last said: items done (labels scanned, images cached) ...
    step_total: int | None = None  # ... of how many
    search: SearchSeen | None = None  # a kernel search's news in the current startup step (kernel_search.py)
    resumed_from: str | None = None
    job_seq: int = 0  # several hosts: the job-wide decision this attempt started under (a newer one ends it)
    resumed_at: tuple[int, int] | None = None  # the (epoch, batch) of the checkpoint it resumed from, where known
    trained_through: bool = False  # the command's training reached its last batch of its last epoch: its exit is due
    progress_counter: int = -1
    progress_pid: int | None = None  # whose counter progress_counter is: the worker, or rank 0 under DDP
    ranks: dict[int, RankView] = field(default_factory=dict)
    last_progress_at: float | None = None  # monotonic
    progress: Progress = field(default_factory=Progress)
    in_force: InForce | None = None  # what the worker reports really in force; None before its report
    intervals: dict[str, deque] = field(default_factory=dict)
    throughput: deque = field(default_factory=lambda: deque(maxlen=THROUGHPUT_WINDOW))  # (monotonic time sent, samples)
    # the newest training batches' times (model/pace.py: the pace before a stall) and the last training beat's sending
    # time, None after any other progress (a phase said, a recovery): a gap across those is no batch's
    batch_times: deque = field(default_factory=lambda: deque(maxlen=PACE_BATCHES))
    last_beat_sent: float | None = None
    last_error: str | None = None  # the worker's own last words ("RuntimeError: ...")
    first_error: str | None = None  # the first error any of its ranks reported: with several ranks a host, the one
    # whose crash the others then met (core._own_error_first)
    suspicion: Suspicion | None = None
    oom: OomKill | None = None
    gpu_resets: list[str] = field(default_factory=list)  # what reset the GPU, each reset while it ran (kernel.py)
    devcoredumps: list[Devcoredump] = field(default_factory=list)  # the GPU's dumps copied while it ran (kernel.py)
    # a GPU reset or page fault while it trained, as the kernel line's pattern or ROCr's signature named it: the one
    # evidence that weighs the hipBLASLt rung (hang_evidence.py)
    gpu_fault: str | None = None
    peer_cause: dict[str, Any] | None = None  # another host's decision in this attempt: why this host's ranks fail
    signatures: dict[str, SignatureSeen] = field(default_factory=dict)  # seen in this attempt's output
    nan_beats: int = 0  # consecutive training beats with a NaN or inf loss
    healthy_since: float | None = None  # monotonic: the first training batch
    training: TrainingClock | None = None  # from the first training batch: its training, timed by the beats
    batches_since_checkpoint: int = 0  # training batches after the newest checkpoint
    train_beats: int = 0  # training batches
    save_gap: float = 0.0  # the longest gap between two progress events of the save stretch in progress
    save_mid_epoch: bool = False  # that stretch is a mid-epoch checkpoint's (entered before the epoch's last batch)
    train_resuming: bool = False  # training re-entered after an epoch end or a save, its first batch still to come
    loaders: dict[int, tuple[int | None, str]] = field(default_factory=dict)  # loader worker pid -> (rank, loader)
    # the longest a loader of this attempt took from its iterator's making to its first batch: the start method and
    # worker count in force here (a forkserver's or spawn's start is not a fork's), never another rung's
    loader_start_seen: float | None = None
    recovery: Recovery | None = None  # a hang's recovery under way, by a tier before the restart (tier.py)
    stacks_ahead: StacksAhead | None = None  # the current stall's stacks, read ahead of its verdict (stacks_ahead.py)
    idle_since: float | None = None  # monotonic: since when its whole process tree has done nothing (TreeActivity)
    waits_outside: frozenset[int] = frozenset()  # its processes that wait on a socket or a remote file (TreeActivity)
    stopped: frozenset[int] = frozenset()  # its processes /proc shows stopped (state T or t) (TreeActivity)
    thread_idle_since: float | None = None  # since when its training thread alone has done nothing (TreeActivity)
    spun_beside: tuple[str, ...] = ()  # the threads that count for nothing and spun meanwhile (TreeActivity)
    witness_heard: bool = False  # the training process's witness spoke in this attempt (witness.silent_from)
    training_tid: int | None = None  # the native id of the thread it watches, as it last said (TreeActivity)
    waits: dict[int | None, WaitSeen] = field(default_factory=dict)  # the witness's word by rank (None: no DDP),
    # each since that sender's last progress (witness.py)
    standby_settings: dict[str, Any] | None = None  # the rung settings a standby was last asked for (standby.py)
    standby_held: dict[str, Any] | None = None  # the settings its held loader was asked for (standby.py)
    standby_reviewed_at: float = 0.0  # monotonic: the last review of them

    def shift(self, gap: float) -> None:
        """The supervisor itself did not run for ``gap`` seconds: every deadline's clock moves by as much."""
        self.last_progress_at, self.spawned_at, self.step_since = (
            later(clock, gap) for clock in (self.last_progress_at, self.spawned_at, self.step_since))
        if self.suspicion is not None:
            self.suspicion.since += gap
        if self.recovery is not None:
            self.recovery.shift(gap)

    def in_force_shown(self) -> dict[str, Any]:
        """What the worker reported in force, as status and incidents show it ("settings"): {} before its report."""
        return self.in_force.to_wire() if self.in_force else {}

    def batches_per_second(self) -> float | None:
        """Over the recent training beats: the speed each rung is measured by."""
        if len(self.throughput) < 2:
            return None
        span = self.throughput[-1][0] - self.throughput[0][0]
        return (len(self.throughput) - 1) / span if span > 0 else None


@dataclass
class Goodput:
    """Work kept and lost over the whole training, and the time its supervisors ran (goodput.py keeps the account).

    Goodput's denominator is monotonic time, which a wall clock's jump cannot bend but which does not survive a
    supervisor restart: the earlier supervisors' share is kept as a duration, this one's is counted from its Boot.
    Time with no supervisor running (stopped, the machine down) is nobody's training time."""
    run_started_wall: float | None = kept(default=None)  # the first boot of this training
    earlier_run_seconds: float = kept(default=0.0, key="run_seconds")
    booted_at: float | None = None  # monotonic: this supervisor's Boot
    trained_seconds: float = kept(default=0.0)  # time spent progressing in earlier attempts (first batch to last)
    lost_seconds: float = kept(default=0.0)  # the part of it after the checkpoint each failed attempt resumed from
    lost_batches: int = kept(default=0)
    lost_from: int | None = None  # batches done when a command's attempt failed: lost down to where the next resumes

    def run_seconds(self, mono: float) -> float | None:
        """Seconds the supervisors of this training have run, this one up to ``mono``."""
        return None if self.booted_at is None else self.earlier_run_seconds + max(0.0, mono - self.booted_at)

    def ratio(self, trained: float, mono: float) -> float | None:
        """Training time kept (progress not thrown away by a restart) over the time the supervisors ran."""
        elapsed = self.run_seconds(mono)
        if not elapsed:
            return None
        return max(0.0, trained - self.lost_seconds) / elapsed


@dataclass
class Probe:
    """Probing back down the ladder once a safer rung has held (probe.py)."""
    rung_entered_trained: float = kept(default=0.0)  # trained() when the current rung was entered
    probing_from: int | None = kept(default=None)  # the rung left to probe the current one; a hang here returns to it


def _finished_only(state: str) -> State:
    """A restarted supervisor starts over unless the training had finished."""
    return State.SUCCEEDED if state == State.SUCCEEDED.value else State.STARTING


def _unwritten_and_newest(incidents: list[Incident]) -> list[dict[str, Any]]:
    """The newest and any not written yet: the rest are in incidents.jsonl, not rewritten every second."""
    return [{**i.to_dict(), "recorded": i.recorded} for i in incidents if not i.recorded or i is incidents[-1]]


def _incidents_from(saved: list[dict[str, Any]]) -> list[Incident]:
    return [Incident.from_dict(i) for i in saved][-INCIDENTS_KEPT:]


@dataclass
class Supervision:
    """Everything the core knows of one training: the life cycle, the ladder's position and what each rung has shown,
    the restart budget, the incidents, the current attempt and the account of the work kept."""
    config: Config
    ladder: Ladder
    kind: WorkerKind = field(init=False)  # what the worker can do: ours or a [worker] command (worker_kind.py)
    miopen: MiopenRun | None = None  # a ROCm build's torch version and inherited MIOPEN_ variables (miopen_modes.py)
    state: State = kept(default=State.STARTING, load=_finished_only)
    rung: int = kept(default=0)
    attempt: int = kept(default=0)  # attempts spawned so far
    current: Attempt = field(default_factory=Attempt)  # the attempt running, or the last one until the next spawn
    stop: StopPlan | None = None  # set while STOPPING
    backoff_until: float | None = None
    consecutive_crashes: int = 0
    last_failure: str | None = kept(default=None)
    restart_times: list[float] = kept(default_factory=list)  # wall clock, every restart after a failure
    budget_times: list[float] = kept(default_factory=list)  # wall clock, the restarts that spent the budget
    # -- counts by the vocabulary's words: a new member is counted, saved and shown without a field of its own --
    restarts_by_reason: Counter[Reason] = kept(default_factory=Counter)
    hangs_by_phase: Counter[str] = kept(default_factory=Counter)  # vocabulary.HANG_PHASES
    incidents: list[Incident] = kept(default_factory=list, save=_unwritten_and_newest, load=_incidents_from)
    messages_ignored: int = 0  # from pids other than the worker's main process
    kernel_events: Counter[KernelKind] = kept(default_factory=Counter)  # every classified message
    reboot_needed: bool = False
    remedies: dict[str, Any] = kept(default_factory=dict)  # settings signatures added on top of the rung
    exit: Exit | None = None
    goodput: Goodput = kept(default_factory=Goodput, flat=True)
    checkpoint: CheckpointMark | None = kept(default=None)
    verified_copy_problem: str | None = None  # why the newest checkpoint has no verified copy (last.good.pt), if so
    # -- what this run has observed, to bound the phases that have no batch rhythm --
    # startup step (watchdog.step_key) -> the longest stretch without news seen in it (watchdog.startup_step_timeout)
    startup_steps_seen: dict[str, float] = kept(default_factory=dict)
    epoch_end_seen: float | None = kept(default=None)  # the longest gap between two progress events of an epoch end
    checkpoint_seen: float | None = kept(default=None)  # the same of a mid-epoch checkpoint: its hold, its next batch
    startup_failure: str | None = kept(default=None)  # the last attempt's failure and last words, before a batch
    training_fingerprint: str | None = kept(default=None)  # the [train] table and ladder the rung was climbed under
    # -- what each rung has shown: the ladder's choices and the probes read it (choices.py) --
    probe: Probe = kept(default_factory=Probe, flat=True)
    rungs: dict[int, RungRecord] = kept(default_factory=dict)  # rung -> its record, from its first fact
    # -- what the hangs taught: the ladder's choices and the checkpoint interval (hang_history.py) --
    hang_history: HangHistory = kept(default_factory=HangHistory)
    checkpoint_interval: checkpoint_interval.Interval | None = None  # the current attempt's, chosen at its spawn
    job_seq: int = kept(default=0)  # several hosts: the newest job-wide ladder decision this host knows
    job_next: JobRung | None = None  # ... made by another host, for this host's next attempt
    # -- the recovery tiers (recovery/__init__.py) --
    recoveries: Counter[Tier] = kept(default_factory=Counter)  # recoveries by tier (status --json, the metric)
    # wall clock of each recovery short of a restart that escalated (a rebuild that brought no batch): what the
    # tier's own budget counts (in_place_max)
    escalations: list[float] = kept(default_factory=list, was="in_place_failures")
    # the longest stall the witness put on a batch owed by a named loader worker whose iterator had given batches,
    # that then ended, by phase: the loader's own rhythm (watchdog.loader_wait_bound)
    loader_waits_seen: dict[str, float] = kept(default_factory=dict)
    # the longest stall the witness put in a device wait that then ended, by phase ("train", "val"): the device's own
    # rhythm, which bounds the next device wait of that phase (watchdog.device_wait_bound)
    device_waits_seen: dict[str, float] = kept(default_factory=dict)
    # the same of a stall the witness put at one place (``ELSEWHERE`` at one file and function, every word of it) that
    # then ended: a loop's own rhythm, which bounds the next such stall of that phase (watchdog.one_place_bound)
    one_place_seen: dict[str, float] = kept(default_factory=dict)
    amp_passed: bool = False  # an attempt trained with AMP on after its check (heartbeats._first_batch)
    # what the last decision left the shell to watch (the stall judged, its deadline, the wake-up, the tree's and the
    # stacks' readings): a watchdog.Watch, set at the end of every ``decide`` and at a restore; never persisted
    watch: Any = None
    paces: Paces = field(default_factory=Paces)  # the incidents' windows of batches after their recovery

    def __post_init__(self) -> None:
        self.kind = WorkerKind.of(self.config)

    @property
    def progress(self) -> Progress:
        """What the current attempt's heartbeats said (the agent's systemd status reads it)."""
        return self.current.progress

    # -- derived values, for the agent, status and metrics --
    def saving(self) -> bool:
        """The worker was asked to save a checkpoint and exit, and has not yet."""
        return self.state == State.STOPPING and self.stop is not None and self.stop.save_until is not None

    def trained(self) -> float:
        """Seconds of progress so far: earlier attempts plus this one up to its last progress."""
        training = self.current.training
        return self.goodput.trained_seconds + (training.seconds() if training is not None else 0.0)

    def budget_left(self, wall: float) -> int:
        return budget_left(self.budget_times, wall, self.config.restart)

    # -- changes that keep the records consistent --
    def move_to(self, rung: int) -> None:
        self.rung, self.probe.rung_entered_trained = rung, self.trained()

    def rung_record(self, rung: int) -> RungRecord:
        """Rung ``rung``'s record, to add a fact to (made at its first)."""
        return self.rungs.setdefault(rung, RungRecord())

    def record_rung_speed(self) -> None:
        speed = self.current.batches_per_second()
        if speed:
            self.rung_record(self.rung).measured(speed)

    def amend(self, incident: Incident, **changes: Any) -> Incident:
        """The one way an incident changes: a new record in the list (and in the stop plan) for the old."""
        amended = replace(incident, **changes)
        self.incidents = [amended if i is incident else i for i in self.incidents]
        if self.stop is not None and self.stop.incident is incident:
            self.stop.incident = amended
        return amended

    def open_incident(self, now: Any, reason: Reason, phase: str, detail: str, **fields: Any) -> Incident:
        """A new incident at the verdict's moment (``now``: events.Now), where the attempt stood; the newest
        ``INCIDENTS_KEPT`` are kept. Every tier opens its hang's incident here and the later ones amend it."""
        a = self.current
        incident = Incident(
            id=f"{self.attempt}-{len(self.incidents) + 1}-{int(now.wall)}", time=now.wall, reason=reason, phase=phase,
            detail=detail, attempt=self.attempt, rung=self.rung, rung_label=self.ladder.label(self.rung),
            worker_pid=a.worker_pid, epoch=a.progress.epoch, batch=a.progress.batch,
            seconds_since_progress=span(a.last_progress_at, now.mono),
            last_progress_wall=None if a.last_progress_at is None else now.wall - (now.mono - a.last_progress_at),
            **fields)
        self.incidents = (self.incidents + [incident])[-INCIDENTS_KEPT:]
        self.paces.opened(incident.id, list(a.batch_times))
        return incident

    def record_complete(self, still_open: Incident | None = None) -> list[RecordIncident]:
        """Ask for every incident not written yet to be written: called once nothing more can be learnt of them
        (``still_open``: a hang's incident that escalates to the next recovery tier, not complete yet)."""
        self.paces.kept_for({i.id for i in self.incidents})
        complete = [i for i in self.incidents if not i.recorded and (still_open is None or i.id != still_open.id)]
        return [self._written(i) for i in complete]

    def resumed_after(self, incident: Incident) -> list[RecordIncident | IncidentResumed]:
        """Training resumed after ``incident`` (its restart's first batch, its in-place rebuild's next): every other
        incident not written yet is, and this one once its window of batches after is full (``paced``); one with no
        window (restored from a state file) now."""
        if not self.paces.resumed(incident.id):
            return list(self.record_complete())
        current = next(i for i in self.incidents if i.id == incident.id)
        return [*self.record_complete(still_open=current), IncidentResumed(current)]

    def paced(self, seconds: float) -> list[RecordIncident]:
        """A training batch's time: the incidents whose window after it fills are written."""
        filled = self.paces.batch(seconds)
        return [self._written(i) for i in self.incidents if i.id in filled and not i.recorded]

    def _written(self, incident: Incident) -> RecordIncident:
        """The incident complete, with its batches after as they stand: written now."""
        after = self.paces.closed(incident.id) or incident.after
        return RecordIncident(self.amend(incident, recorded=True, after=after))

    # -- persistence: what a restarted supervisor needs to continue where it was --
    def persistent(self, mono: float) -> dict[str, Any]:
        """The kept fields, with this supervisor's time and its attempt's training closed into the totals."""
        g = self.goodput
        settled = replace(g, trained_seconds=self.trained(), earlier_run_seconds=g.run_seconds(mono))
        return persistence.dump(replace(self, goodput=settled))

    def restore(self, record: dict[str, Any]) -> None:
        """The kept fields from a state file's ``record``; persistence.Unreadable (naming the key) where one is not of
        its type. Rungs are clamped to the ladder: it may have fewer rungs now."""
        persistence.load(self, record)
        if "rungs" not in record:  # a state file from before the rung records: each fact in a map of its own
            self.rungs = rung_record.from_maps(record)
        self.rung = max(0, min(self.rung, len(self.ladder) - 1))
        if self.probe.probing_from is not None and not 0 <= self.probe.probing_from < len(self.ladder):
            self.probe.probing_from = None
        if "budget_times" not in record:  # a state file from before the budget kept its own times
            self.budget_times = list(self.restart_times)
        if not record.get("run_seconds"):  # ... from before run_seconds: its training time is the one lower bound
            self.goodput.earlier_run_seconds = self.goodput.trained_seconds


# The restart budget and the crash backoff: when to stop retrying, and how long to wait before the next try.
MAX_DOUBLINGS = 64  # far past any cap; 2 ** 1024 would not fit a float


def restarts_in_window(restart_times: list[float], wall: float, cfg: RestartConfig) -> int:
    return sum(1 for t in restart_times if wall - t <= cfg.window)


def budget_left(restart_times: list[float], wall: float, cfg: RestartConfig) -> int:
    """Restarts still allowed now; 0 means the next failure ends the supervisor."""
    return max(0, cfg.max_restarts - restarts_in_window(restart_times, wall, cfg))


def backoff_delay(consecutive_crashes: int, cfg: RestartConfig) -> float:
    """initial, 2x initial, 4x initial ... capped at backoff_max, for the 1st, 2nd, 3rd crash in a row."""
    if consecutive_crashes <= 0:
        return 0.0
    return min(cfg.backoff_max, cfg.backoff_initial * 2.0 ** min(consecutive_crashes - 1, MAX_DOUBLINGS))


def trains_on_cpu(s: Supervision) -> bool:
    """The run has no GPU (``device = \"cpu\"``): no GPU of its can be lost, nor hold a process."""
    return str(s.config.train.get("device", "")).strip().lower() in ("cpu", "mps")
