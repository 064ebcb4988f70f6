"""The decision core: what the supervisor does next, as a function of its state, an event and the time.

No I/O happens here. The agent (``agent.py``) turns the world into events (a heartbeat, the worker's exit,
the tree killed, a tick of the clock, a stop request) and executes the actions returned (spawn a worker,
kill its tree, log, exit). ``decide`` updates the state it is given in place and returns it with the
actions: a reducer, cheap enough to run for every heartbeat.

Life cycle (``State``)::

    STARTING --first training batch--> HEALTHY
    STARTING | HEALTHY --stall timeout, worker exit, stop request--> STOPPING (the tree is killed)
    STOPPING --tree gone--> STARTING (a hang restarts at once, at the rung its record says: rung_choice.py)
                          | BACKOFF  (a crash waits, then restarts at the same rung)
                          | SUCCEEDED (training finished) | FAILED (budget spent, reboot needed)
                          | STOPPED (asked to stop; the next run resumes)
    BACKOFF --delay over--> STARTING
    any running state --another supervisor took the state directory--> STOPPING (no save) | FAILED (exit 78)

A crash climbs the ladder only when the same failure repeats; a hang moves to the rung of best expected goodput
(rung_choice.py), an untried safer one while that can pay. A restart after an attempt that saved no checkpoint
counts against the restart budget; a worker that survives SIGKILL ends the supervisor with "reboot needed".

Kernel messages: a stall or GPU-fault line puts the worker under suspicion; if it makes no progress
within the confirm window it is killed as hung at once (long before the stall timeout), if it does,
the line is counted and nothing is killed. A line naming a pid outside the worker's tree only counts.
A lost GPU ends the supervisor with "reboot needed"; the OOM killer taking a worker process makes the
ensuing crash an ``oom`` one.
"""

from __future__ import annotations

import math
import signal
from collections import deque
from dataclasses import asdict, dataclass, field, replace
from enum import Enum
from typing import Any

from supervisor.config import Config
from supervisor.decision import checkpoint_interval, restart_budget, rung_choice, watchdog
from supervisor.decision.hang_history import HangHistory, HangPoint
from supervisor.decision.incident import Incident, Kill, Loss, Stacks
from supervisor.decision.ladder import Ladder
from supervisor.decision.signatures import scan
from supervisor.decision.vocabulary import STARTUP_PHASE, After, KernelKind, Reason, Remedy, State
from supervisor.exit_codes import EXIT_CONFIG, EXIT_FAILED, EXIT_OK, EXIT_REBOOT_NEEDED
from worker.contract import HeartbeatMessage, InForce, MessageKind, Phase

INCIDENTS_KEPT = 20
MIN_BATCH = 1  # halving the batch after GPU OOM stops here
NAN_BEATS = 3  # training beats in a row with a non-finite loss before the run counts as diverged
THROUGHPUT_WINDOW = 20  # training beats behind it/s
RUNG_SPEED_SAMPLES = 25  # it/s measurements kept per rung, behind its median
OOM_EXIT_WINDOW = 30.0  # an OOM kill names the crash only if the worker exits within this many seconds of it
SAVE_WAIT_UNBOUNDED = 3600.0  # how long a stop waits for the worker's checkpoint when save_timeout is "off"

# Which state may follow which: ``decide`` refuses anything else, so the life cycle is data, not a habit.
TRANSITIONS: dict[State, frozenset[State]] = {
    State.STARTING: frozenset({State.STARTING, State.HEALTHY, State.STOPPING, State.SUCCEEDED}),
    State.HEALTHY: frozenset({State.HEALTHY, State.STOPPING}),
    State.STOPPING: frozenset({State.STOPPING, State.STARTING, State.BACKOFF, State.SUCCEEDED, State.FAILED,
                               State.STOPPED}),
    State.BACKOFF: frozenset({State.BACKOFF, State.STARTING, State.STOPPED, State.FAILED}),
    State.SUCCEEDED: frozenset({State.SUCCEEDED}),
    State.FAILED: frozenset({State.FAILED}),
    State.STOPPED: frozenset({State.STOPPED}),
}


class TransitionError(RuntimeError):
    pass


@dataclass(frozen=True)
class Now:
    mono: float  # for timeouts: never jumps
    wall: float  # for records that outlive the process: the restart budget, incident times


# Events ---------------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Boot:
    """The supervisor started (state possibly restored from its state file)."""


@dataclass(frozen=True)
class Spawned:
    pid: int
    resumed_from: str | None  # the checkpoint the worker resumes from, None when training from scratch
    exit_0_finishes: bool = False  # a [worker] command: its exit status 0 is its word that training is done


@dataclass(frozen=True)
class HeartbeatReceived:
    message: HeartbeatMessage
    # The sender is a descendant of the worker's main process (the shell looked): the script a wrapper started.
    from_worker_tree: bool = False


@dataclass(frozen=True)
class WorkerExited:
    returncode: int  # negative: killed by that signal
    last_words: str | None = None  # the last line of its output


@dataclass(frozen=True)
class TreeKilled:
    killed: int
    survivors: tuple[str, ...] = ()  # "pid 123 (python, disk-sleep)" for each process SIGKILL did not end
    seconds: float = 0.0  # from the first signal to the tree confirmed gone
    confirmed_wall: float | None = None


@dataclass(frozen=True)
class IncidentEnriched:
    """What the shell saw of the worker's tree just before killing it, for the incident being stopped."""
    incident_id: str
    processes: tuple[dict[str, Any], ...]
    output_tail: tuple[str, ...] = ()
    output_note: str | None = None  # a command's output parser: why no line was ever progress
    stacks: Stacks | None = None  # captured for a hang
    host: str | None = None  # this host's name, where hosts are several


@dataclass(frozen=True)
class KernelMessage:
    """A classified kernel log line or GPU device event (see sources/kernel_messages.KernelEvent)."""
    kind: KernelKind
    message: str
    source: str
    pattern: str
    pid: int | None = None
    in_worker_tree: bool | None = None  # None when the message names no pid
    trusted: bool = True  # the kernel's own record from this run; False: forgeable or stale, never ends the run
    drill: bool = False  # a fault drill (YOLO_TRAIN_KERNEL_DRILL=1): taken as the kernel's word about our GPU


@dataclass(frozen=True)
class SignatureSeen:
    """A line of the worker's output matched a failure signature (see signatures.py)."""
    name: str
    remedy: Remedy
    advice: str
    line: str


@dataclass(frozen=True)
class StopRequested:
    signal: str = "SIGTERM"


@dataclass(frozen=True)
class JobLadderRead:
    """Several hosts: the job-wide ladder decision as the shared run directory holds it (outputs/job_ladder.py),
    read before every event but heartbeats whenever the file changed."""
    seq: int  # decisions made so far, job-wide: a newer one wins
    rung: int
    remedies: dict[str, Any]
    node_rank: int  # the host that made it
    host: str = ""
    cause: dict[str, Any] = field(default_factory=dict)  # its incident: id, reason, phase, the rank that stopped first


@dataclass(frozen=True)
class Tick:
    """Time passed; deadlines are checked."""


@dataclass(frozen=True)
class SupervisorPaused:
    """The supervisor itself did not run for ``seconds`` (SIGSTOP, a frozen VM): not the worker's time to answer for."""
    seconds: float


@dataclass(frozen=True)
class StateDirTaken:
    """Another supervisor locked the state directory (this one's lock file was removed meanwhile): it trains there
    now, so this one's worker stops at once, without a save that would overwrite the other's last.pt."""
    detail: str  # one line: the config file, state_dir, and who holds it


# Actions --------------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Spawn:
    attempt: int
    rung: int
    rung_settings: dict[str, Any]  # the rung's changes and the remedies in force, as the ladder spells them
    checkpoint_every: float | None = None  # seconds of training between the worker's checkpoints; None: per epoch


@dataclass(frozen=True)
class PrepareStandby:
    """Start a standby worker: one that does its imports now and waits to be given the next attempt, so a restart
    does not pay for them. Asked for once the attempt trains (never beside a start, whose CPU it would take), with
    the settings of the rung a hang would move to: a standby serves only a launch in the environment it began in."""
    rung_settings: dict[str, Any]


@dataclass(frozen=True)
class PublishLadder:
    """Several hosts: this host decided where the job goes on the ladder; said before its tree is killed, so the
    other hosts, whose ranks fail with it, restart on the same rung."""
    seq: int
    rung: int
    remedies: dict[str, Any]
    cause: dict[str, Any] = field(default_factory=dict)  # the incident behind it, for the other hosts' incidents


@dataclass(frozen=True)
class RequestCheckpoint:
    """Ask the worker to save a checkpoint at its next batch boundary and exit (SIGUSR1)."""


@dataclass(frozen=True)
class KeepVerifiedCopy:
    """The worker reported a complete checkpoint: verify it and keep it as the fallback (outputs/checkpoints.py)."""
    path: str


@dataclass(frozen=True)
class KillTree:
    """Kill the worker's tree. For an incident, the shell first says what it sees of the tree
    (``IncidentEnriched``); the core learns the kill's outcome from ``TreeKilled``."""
    incident: Incident | None  # None: cleaning up after a normal exit


@dataclass(frozen=True)
class RecordIncident:
    """The incident is complete: append it to incidents.jsonl."""
    incident: Incident


@dataclass(frozen=True)
class Log:
    level: str  # "info" | "warning" | "error"
    text: str


@dataclass(frozen=True)
class Exit:
    code: int
    text: str


# State ----------------------------------------------------------------------------------------------------

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


class DeadlineKind(Enum):
    """Which timeout the next deadline is; the agent sleeps until it, ``_tick`` acts on its kind."""
    BACKOFF = "backoff"  # the wait after a crash is over: spawn
    STARTUP = "startup"  # spawn to the first training batch
    PHASE = "phase"  # no progress within the current phase's timeout
    KERNEL_CONFIRM = "kernel confirm"  # a kernel line's confirm window passed without progress
    SAVE = "save"  # a stop's checkpoint did not come within save_timeout
    SAVE_STALLED = "save stalled"  # while asked to save, the worker stopped progressing: it is hung


@dataclass(frozen=True)
class Deadline:
    at: float | None  # monotonic; None: nothing is due
    kind: DeadlineKind | None = None
    label: str = ""  # for display only: "train auto", "startup_timeout", ...


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
    mono: float
    seconds: float  # how long the training loop waited for the save


@dataclass
class RankView:
    """One rank of a distributed worker, as its own heartbeats show it."""
    pid: int
    device: str | None = None
    local_rank: int | None = None  # its rank on this host, where hosts are several
    progress: int = -1
    last_progress_at: float | None = None  # monotonic


@dataclass
class Supervision:
    config: Config
    ladder: Ladder
    state: State = State.STARTING
    rung: int = 0
    attempt: int = 0
    worker_pid: int | None = None
    spawned_at: float | None = None  # monotonic
    spawned_wall: float | None = None
    startup_seconds: float | None = None  # spawn to the first training batch of this attempt
    resumed_from: str | None = None
    exit_0_finishes: bool = False  # this attempt's worker is a command: exit 0 means finished
    trained_through: bool = False  # the command's training reached its last batch of its last epoch: its exit is due
    progress_counter: int = -1
    progress_pid: int | None = None  # whose counter progress_counter is: the worker, or rank 0 under DDP
    ranks: dict[int, RankView] = field(default_factory=dict)
    last_progress_at: float | None = None  # monotonic
    progress: Progress = field(default_factory=Progress)
    in_force: InForce | None = None  # what the worker reports really in force; None before its report
    intervals: dict[str, deque] = field(default_factory=dict)
    throughput: deque = field(default_factory=lambda: deque(maxlen=THROUGHPUT_WINDOW))  # (monotonic time sent, samples)
    last_error: str | None = None  # the worker's own last words ("RuntimeError: ...")
    stop: StopPlan | None = None  # set while STOPPING
    backoff_until: float | None = None
    consecutive_crashes: int = 0
    last_failure: str | None = None
    restart_times: list[float] = field(default_factory=list)  # wall clock, every restart after a failure
    budget_times: list[float] = field(default_factory=list)  # wall clock, the restarts that spent the budget
    restarts_by_reason: dict[str, int] = field(default_factory=dict)
    hangs_by_phase: dict[str, int] = field(default_factory=dict)
    incidents: list[Incident] = field(default_factory=list)
    messages_ignored: int = 0  # from pids other than the worker's main process
    kernel_events: dict[str, int] = field(default_factory=dict)  # by kind, every classified message
    suspicion: Suspicion | None = None
    oom: OomKill | None = None
    reboot_needed: bool = False
    signatures: dict[str, SignatureSeen] = field(default_factory=dict)  # seen in this attempt's output
    nan_beats: int = 0  # consecutive training beats with a NaN or inf loss
    remedies: dict[str, Any] = field(default_factory=dict)  # settings signatures added on top of the rung
    exit: Exit | None = None
    # -- work kept and lost (goodput) --
    run_started_wall: float | None = None  # the first boot of this training, kept across supervisor restarts
    # Goodput's denominator is monotonic time, which a wall clock's jump cannot bend but which does not survive a
    # supervisor restart: the earlier supervisors' share is kept as a duration (persisted), this one's is counted
    # from its Boot. Time with no supervisor running (stopped, the machine down) is nobody's training time.
    earlier_run_seconds: float = 0.0
    booted_at: float | None = None  # monotonic: this supervisor's Boot
    healthy_since: float | None = None  # monotonic: this attempt's first training batch
    trained_seconds: float = 0.0  # time spent progressing in earlier attempts (first batch to last progress)
    lost_seconds: float = 0.0  # the part of it after the checkpoint each failed attempt resumed from
    lost_batches: int = 0
    checkpoint: CheckpointMark | None = None
    batches_since_checkpoint: int = 0  # this attempt's training batches after the newest checkpoint
    lost_from: int | None = None  # batches done when a command's attempt failed: lost down to where the next resumes
    train_beats: int = 0  # this attempt's training batches
    # -- what this run has observed, to bound the phases that have no batch rhythm --
    startup_seen: float | None = None  # the longest spawn-to-first-batch of this run
    epoch_end_seen: float | None = None  # the longest gap between two progress events after an epoch's training
    epoch_end_gap: float = 0.0  # the longest such gap of the epoch end in progress
    train_resuming: bool = False  # training re-entered after an epoch end or a save, its first batch still to come
    # -- failures that no rung can change --
    # -- probing back down the ladder (issue: a ladder that gives the speed back) --
    rung_entered_trained: float = 0.0  # trained() when the current rung was entered
    probation: dict[str, float] = field(default_factory=dict)  # rung -> healthy seconds before probing the one below
    rung_hangs: dict[str, int] = field(default_factory=dict)  # rung -> hangs seen there (give_up_after)
    probing_from: int | None = None  # the rung left to probe the current one; a hang here returns to it
    rung_speeds: dict[str, list[float]] = field(default_factory=dict)  # rung -> recent it/s samples
    startup_failure: str | None = None  # the last attempt's failure and last words, when it failed before a batch
    training_fingerprint: str | None = None  # the [train] table and ladder the rung was climbed under
    # -- what the hangs taught: the ladder's choices and the checkpoint interval (hang_history.py) --
    hang_history: HangHistory = field(default_factory=HangHistory)
    checkpoint_interval: checkpoint_interval.Interval | None = None  # the current attempt's, chosen at its spawn
    job_seq: int = 0  # several hosts: the newest job-wide ladder decision this host knows (JobLadderRead)
    peer_cause: dict[str, Any] | None = None  # another host's decision in this attempt: why this host's ranks fail

    # -- derived values, for the agent, status and metrics --
    def deadline(self) -> Deadline:
        """When the watchdog fires next, and which timeout that is."""
        if self.state == State.BACKOFF:
            return Deadline(self.backoff_until, DeadlineKind.BACKOFF, "backoff")
        if self.state == State.STOPPING and self.stop is not None and self.stop.save_until is not None:
            # Waiting for the checkpoint asked for; a worker that stalls meanwhile is hung and cannot save.
            due = Deadline(self.stop.save_until, DeadlineKind.SAVE, "stop save_timeout")
            if self.last_progress_at is not None:
                t, _ = watchdog.phase_timeout(self.config.watchdog, self.progress.phase, self.intervals,
                                              self.epoch_end_seen)
                if t is not None and self.last_progress_at + t < due.at:
                    due = Deadline(self.last_progress_at + t, DeadlineKind.SAVE_STALLED, "stop stalled")
            return due
        due = Deadline(None)
        if self.state == State.STARTING and self.spawned_at is not None:
            t, label = watchdog.startup_timeout(self.config.watchdog, self.startup_seen)
            due = Deadline(None if t is None else self.spawned_at + t, DeadlineKind.STARTUP, label)
        elif self.state == State.HEALTHY and self.last_progress_at is not None:
            phase = Phase.SAVE.value if self.train_resuming else self.progress.phase  # until the first batch
            t, label = watchdog.phase_timeout(self.config.watchdog, phase, self.intervals, self.epoch_end_seen)
            due = Deadline(None if t is None else self.last_progress_at + t, DeadlineKind.PHASE, label)
        if self.suspicion is not None and self.state in (State.STARTING, State.HEALTHY):
            confirm = self.suspicion.since + self.config.kernel_log.confirm_window
            if due.at is None or confirm < due.at:
                return Deadline(confirm, DeadlineKind.KERNEL_CONFIRM, "kernel confirm window")
        return due

    def in_force_shown(self) -> dict[str, Any]:
        """What the worker reported in force, as status and incidents show it ("settings"): {} before its report."""
        return self.in_force.to_wire() if self.in_force else {}

    def batches_per_second(self) -> float | None:
        if len(self.throughput) < 2:
            return None
        span = self.throughput[-1][0] - self.throughput[0][0]
        return (len(self.throughput) - 1) / span if span > 0 else None

    def samples_per_second(self) -> float | None:
        if len(self.throughput) < 2:
            return None
        span = self.throughput[-1][0] - self.throughput[0][0]
        return sum(s for _, s in list(self.throughput)[1:]) / span if span > 0 else None

    def trained(self) -> float:
        """Seconds of progress so far: earlier attempts plus this one up to its last progress."""
        current = 0.0
        if self.healthy_since is not None and self.last_progress_at is not None:
            current = max(0.0, self.last_progress_at - self.healthy_since)
        return self.trained_seconds + current

    def run_seconds(self, mono: float) -> float | None:
        """Seconds the supervisors of this training have run, this one up to ``mono``."""
        return None if self.booted_at is None else self.earlier_run_seconds + max(0.0, mono - self.booted_at)

    def goodput(self, mono: float) -> float | None:
        """Training time kept (progress not thrown away by a restart) over the time the supervisors ran."""
        elapsed = self.run_seconds(mono)
        if not elapsed:
            return None
        return max(0.0, self.trained() - self.lost_seconds) / elapsed

    def rung_trained(self) -> float:
        """Seconds of progress at the current rung since it was entered."""
        return max(0.0, self.trained() - self.rung_entered_trained)

    def rung_speed(self, rung: int) -> float | None:
        """The median it/s measured at ``rung`` (None until measured)."""
        samples = sorted(self.rung_speeds.get(str(rung), []))
        return samples[len(samples) // 2] if samples else None

    def probe_in(self) -> float | None:
        """Seconds of healthy training left before the rung below is tried; None when it will not be."""
        cfg = self.config.probe
        if cfg.probe_after is None or self.rung == 0 or self.exit is not None or self.probe_target() is None:
            return None
        return max(0.0, self.probation.get(str(self.rung), cfg.probe_after) - self.rung_trained())

    def rung_facts(self) -> list[rung_choice.RungFacts]:
        """What each rung has shown in this run, as the ladder's choices read it."""
        h = self.hang_history
        return [rung_choice.RungFacts(self.rung_speed(k), h.rung_seconds.get(k, 0.0), self.rung_hangs.get(str(k), 0),
                                      h.start_of(k)) for k in range(len(self.ladder))]

    def probe_target(self) -> int | None:
        return rung_choice.probe_target(self.rung, self.rung_facts(), self.config.probe.give_up_after)

    def mean_time_between_hangs(self) -> float | None:
        h = self.hang_history
        return checkpoint_interval.mean_time_between_hangs(h.hang_marks, h.window_start, self.trained())

    def budget_left(self, wall: float) -> int:
        return restart_budget.budget_left(self.budget_times, wall, self.config.restart)

    # -- persistence: what a restarted supervisor needs to continue where it was --
    def persistent(self, mono: float) -> dict[str, Any]:
        return {"rung": self.rung, "attempt": self.attempt, "restart_times": self.restart_times,
                "budget_times": self.budget_times,
                "restarts_by_reason": self.restarts_by_reason, "hangs_by_phase": self.hangs_by_phase,
                "last_failure": self.last_failure, "state": self.state.value,
                # the newest and any not written yet: the rest are in incidents.jsonl, not rewritten every second
                "incidents": [{**i.to_dict(), "recorded": i.recorded} for i in self.incidents
                              if not i.recorded or i is self.incidents[-1]],
                "kernel_events": self.kernel_events, "remedies": self.remedies,
                "run_started_wall": self.run_started_wall, "run_seconds": self.run_seconds(mono),
                "trained_seconds": self.trained(),
                "lost_seconds": self.lost_seconds, "lost_batches": self.lost_batches,
                "startup_seen": self.startup_seen, "epoch_end_seen": self.epoch_end_seen,
                "startup_failure": self.startup_failure, "training_fingerprint": self.training_fingerprint,
                "rung_entered_trained": self.rung_entered_trained, "probation": self.probation,
                "rung_hangs": self.rung_hangs, "probing_from": self.probing_from, "rung_speeds": self.rung_speeds,
                "hang_history": self.hang_history.to_dict(),
                "job_seq": self.job_seq,
                "checkpoint": None if self.checkpoint is None else asdict(self.checkpoint)}

    def restore(self, record: dict[str, Any]) -> None:
        self.rung = min(int(record.get("rung", 0)), len(self.ladder) - 1)
        self.attempt = int(record.get("attempt", 0))
        self.restart_times = [float(t) for t in record.get("restart_times", [])]
        self.budget_times = [float(t) for t in record.get("budget_times", self.restart_times)]
        self.restarts_by_reason = dict(record.get("restarts_by_reason", {}))
        self.hangs_by_phase = dict(record.get("hangs_by_phase", {}))
        self.last_failure = record.get("last_failure")
        self.incidents = [Incident.from_dict(i) for i in record.get("incidents", [])][-INCIDENTS_KEPT:]
        self.kernel_events = dict(record.get("kernel_events", {}))
        self.remedies = dict(record.get("remedies", {}))
        self.run_started_wall = record.get("run_started_wall")
        self.trained_seconds = float(record.get("trained_seconds") or 0.0)
        # A state file from before run_seconds was kept: its training time is the one lower bound it holds.
        self.earlier_run_seconds = float(record.get("run_seconds") or self.trained_seconds)
        self.lost_seconds = float(record.get("lost_seconds") or 0.0)
        self.lost_batches = int(record.get("lost_batches") or 0)
        self.startup_seen, self.epoch_end_seen = record.get("startup_seen"), record.get("epoch_end_seen")
        self.startup_failure = record.get("startup_failure")
        self.rung_entered_trained = float(record.get("rung_entered_trained") or 0.0)
        self.probation = {str(k): float(v) for k, v in (record.get("probation") or {}).items()}
        self.rung_hangs = {str(k): int(v) for k, v in (record.get("rung_hangs") or {}).items()}
        self.probing_from = record.get("probing_from")
        self.rung_speeds = {str(k): [float(x) for x in v] for k, v in (record.get("rung_speeds") or {}).items()}
        self.training_fingerprint = record.get("training_fingerprint")
        self.hang_history = HangHistory.from_dict(record.get("hang_history"))
        self.job_seq = int(record.get("job_seq") or 0)
        mark = record.get("checkpoint")
        if isinstance(mark, dict):
            self.checkpoint = CheckpointMark(**{**mark, "mono": -math.inf})  # its age is read from the wall clock
        if record.get("state") == State.SUCCEEDED.value:
            self.state = State.SUCCEEDED


# The decision ---------------------------------------------------------------------------------------------

def decide(s: Supervision, event: Any, now: Now) -> tuple[Supervision, list[Any]]:
    before = s.state
    actions = _dispatch(s, event, now)
    if s.state not in TRANSITIONS[before]:
        raise TransitionError(f"{before.value} -> {s.state.value} on {type(event).__name__}")
    return s, actions


def _dispatch(s: Supervision, event: Any, now: Now) -> list[Any]:
    if isinstance(event, HeartbeatReceived):
        return _heartbeat(s, event.message, now, event.from_worker_tree)
    if isinstance(event, Tick):
        return _tick(s, now)
    if isinstance(event, Boot):
        return _boot(s, now)
    if isinstance(event, Spawned):
        return _spawned(s, event, now)
    if isinstance(event, WorkerExited):
        return _exited(s, event, now)
    if isinstance(event, TreeKilled):
        return _tree_killed(s, event, now)
    if isinstance(event, IncidentEnriched):
        return _enriched(s, event)
    if isinstance(event, StopRequested):
        return _stop(s, event, now)
    if isinstance(event, KernelMessage):
        return _kernel(s, event, now)
    if isinstance(event, SignatureSeen):
        return _signature(s, event)
    if isinstance(event, SupervisorPaused):
        return _paused(s, event)
    if isinstance(event, StateDirTaken):
        return _state_dir_taken(s, event, now)
    if isinstance(event, JobLadderRead):
        return _job_ladder(s, event)
    raise TypeError(f"unknown event {event!r}")


def _boot(s: Supervision, now: Now) -> list[Any]:
    if s.run_started_wall is None:
        s.run_started_wall = now.wall
    s.booted_at = now.mono
    if s.state == State.SUCCEEDED:
        if s.training_fingerprint not in (None, training_fingerprint(s)):
            # Another config pointed at a finished training's directory: its record stays as it is.
            return _finish(s, State.SUCCEEDED, Exit(EXIT_CONFIG, f"{s.config.state_dir} holds a finished training of "
                                                                 f"another [train] table or ladder; point state_dir "
                                                                 f"(or the top-level name) elsewhere"))
        return _finish(s, State.SUCCEEDED, Exit(EXIT_OK, "training already finished; nothing to do "
                                                         "(remove the state directory to train again)"))
    s.state = State.STARTING
    note = []
    fingerprint = training_fingerprint(s)
    if s.training_fingerprint not in (None, fingerprint) and (s.rung or s.remedies):
        note.append(Log("warning", f"[train] or the ladder changed since rung {s.rung} was reached: starting again at "
                                   f"rung 0 ({s.ladder.label(0)}) without the remedies {s.remedies or '{}'}"))
        s.remedies, s.startup_failure, s.probing_from, s.probation, s.rung_hangs = {}, None, None, {}, {}
        s.hang_history = HangHistory()
        _move_to(s, 0)
    elif s.attempt:
        note.append(Log("info", f"continuing at rung {s.rung} ({s.ladder.label(s.rung)}) after {s.attempt} attempts"))
    s.training_fingerprint = fingerprint
    return note + [_spawn(s)]


def training_fingerprint(s: Supervision) -> str:
    """What the rung and remedies were earned under: the [train] table and the ladder, in a stable spelling."""
    import hashlib
    import json

    text = json.dumps({"train": s.config.train, "ladder": list(s.ladder.rungs)}, sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def _spawn(s: Supervision) -> Spawn:
    s.attempt += 1
    s.state = State.STARTING
    s.stop = None
    s.checkpoint_interval = _next_interval(s)
    return Spawn(attempt=s.attempt, rung=s.rung, rung_settings={**s.ladder.settings(s.rung), **s.remedies},
                 checkpoint_every=s.checkpoint_interval.seconds)


def _spawned(s: Supervision, event: Spawned, now: Now) -> list[Any]:
    s.worker_pid, s.spawned_at, s.spawned_wall, s.startup_seconds = event.pid, now.mono, now.wall, None
    s.resumed_from, s.exit_0_finishes, s.trained_through = event.resumed_from, event.exit_0_finishes, False
    s.hang_history.spawned(now.mono)
    s.progress_counter, s.last_progress_at, s.progress_pid, s.ranks = -1, None, None, {}
    s.progress = Progress()
    s.intervals, s.in_force, s.last_error = {}, None, None
    s.suspicion = s.oom = s.peer_cause = None
    s.signatures, s.nan_beats = {}, 0
    s.throughput.clear()
    s.healthy_since, s.batches_since_checkpoint, s.epoch_end_gap, s.train_beats = None, 0, 0.0, 0
    s.train_resuming = False
    origin = f"resuming from {event.resumed_from}" if event.resumed_from else "from scratch"
    return [Log("info", f"attempt {s.attempt}: worker pid {event.pid} at rung {s.rung} "
                        f"({s.ladder.label(s.rung)}), {origin}")]


def _saving(s: Supervision) -> bool:
    return s.state == State.STOPPING and s.stop is not None and s.stop.save_until is not None


def _heartbeat(s: Supervision, m: HeartbeatMessage, now: Now, from_worker_tree: bool = False) -> list[Any]:
    if s.state not in (State.STARTING, State.HEALTHY) and not _saving(s):
        return []
    if m.rank is not None:
        if not _rank_alive(s, m, now):
            return []
    elif m.pid != s.worker_pid and not (from_worker_tree and s.progress_pid in (None, m.pid)):
        # A DataLoader worker or a stray writer never counts as progress. A descendant does when it is the first of
        # the tree to speak (``./run.sh`` running python): the worker's main process is then a wrapper.
        s.messages_ignored += 1
        return []
    if m.pid != s.progress_pid:  # another sender (the launcher, then rank 0): its own counter
        s.progress_pid, s.progress_counter = m.pid, -1
    if m.kind == MessageKind.ERROR:
        s.last_error = (m.error or "")[:500]
        return []
    if m.kind == MessageKind.IN_FORCE:
        s.in_force = m.in_force
        return []
    if m.kind == MessageKind.CHECKPOINT:
        return _checkpoint_saved(s, m, now)
    p = s.progress
    for key in ("epoch", "epochs", "batch", "batches"):
        value = getattr(m, key)
        if value is not None:
            setattr(p, key, value)
    if m.losses is not None:
        p.losses = dict(m.losses)
    if m.lr is not None:
        p.lr = m.lr
    if m.progress <= s.progress_counter:
        return []  # a beat without progress is not progress
    phase = m.phase.value
    gap = None if s.last_progress_at is None else now.mono - s.last_progress_at
    if gap is not None and (p.phase == Phase.SAVE.value or s.train_resuming):
        # A gap of an epoch's end (or a save's): validation's set-up, the save, the next epoch's loader start up to
        # its first batch. It has no batch rhythm: it bounds the next epoch end, not the batch intervals.
        s.epoch_end_gap = max(s.epoch_end_gap, gap)
        if m.kind == MessageKind.BEAT and phase == Phase.TRAIN.value:  # observed whole, up to the next batch
            s.epoch_end_seen, s.epoch_end_gap = max(s.epoch_end_seen or 0.0, s.epoch_end_gap), 0.0
    elif m.kind == MessageKind.BEAT and gap is not None and s.state == State.HEALTHY:
        # (the first batch of an attempt is startup: CUDA's warm-up and the loader's start are no batch interval)
        window = s.intervals.setdefault(phase, deque(maxlen=s.config.watchdog.auto_window))
        window.append(gap)
    s.train_resuming = s.state == State.HEALTHY and m.kind == MessageKind.PHASE and m.phase == Phase.TRAIN
    if s.exit_0_finishes and m.phase == Phase.TRAIN and p.epochs and p.batches and p.epoch >= p.epochs \
            and (p.batch or 0) >= p.batches:
        # A command says no "done"; its bar at its very end does. What follows is its exit, watched as our
        # worker's after "done" is: one that never comes ends the run succeeded, nothing to restart.
        s.trained_through = True
    s.progress_counter, s.last_progress_at = m.progress, now.mono
    p.phase = Phase.DONE.value if s.trained_through else phase
    actions: list[Any] = []
    if s.suspicion is not None:
        event = s.suspicion.event
        s.suspicion = None
        actions.append(Log("info", f"kernel {event.kind.value} line while training progresses: counted, nothing "
                                   f"killed ({event.message[:160]})"))
    training = m.kind == MessageKind.BEAT and m.phase == Phase.TRAIN
    if training and p.losses:
        s.nan_beats = s.nan_beats + 1 if not all(math.isfinite(v) for v in p.losses.values()) else 0
        amp = s.in_force.amp if s.in_force else None
        if s.nan_beats >= NAN_BEATS and s.state == State.HEALTHY and amp is not False:
            return actions + _begin_stop(s, now, Reason.NAN, "train", remedy={"amp": False}, failure="nan",
                                         detail=f"non-finite losses in {s.nan_beats} batches in a row ({p.losses})")
    if training:
        # Timed when sent: beats read in a burst (a backlog, the pipe's rests) arrive together but were not made so.
        s.throughput.append((now.mono if m.sent is None else m.sent, m.samples or 0))
        s.batches_since_checkpoint += 1
        s.train_beats += 1
        if s.train_beats % THROUGHPUT_WINDOW == 0:  # a fresh window of this rung's speed
            _record_rung_speed(s)
        if s.state == State.STARTING:
            s.state = State.HEALTHY
            s.consecutive_crashes = 0
            s.healthy_since = now.mono
            s.startup_failure = None
            s.startup_seconds = now.mono - (s.spawned_at or now.mono)
            s.startup_seen = max(s.startup_seen or 0.0, s.startup_seconds)
            s.hang_history.started(s.rung, s.startup_seconds)
            last = s.incidents[-1] if s.incidents else None
            if last is not None and not last.recorded and last.reason != Reason.STOP:
                last = _amend(s, last, restart_seconds=round(now.wall - last.time, 3))
            if last is not None and not last.recorded and s.lost_from is not None:
                _amend(s, last, loss=_resumed_loss(s, last.rung))
            actions += _record_complete(s)
            actions.append(Log("info", f"attempt {s.attempt}: first training batch {s.startup_seconds:.1f} s "
                                       f"after spawn"))
            if s.config.standby and s.config.command is None:
                actions.append(PrepareStandby({**s.ladder.settings(_choose_after_a_hang(s).rung), **s.remedies}))
        elif s.state == State.HEALTHY:
            actions += _probe_check(s, now)
    return actions


def _choose_after_a_hang(s: Supervision) -> rung_choice.Choice:
    """Where a hang at this rung moves the run (rung_choice.py): decided once, at the verdict, with the attempt
    closed and this hang counted; the standby is prepared for it in advance."""
    facts = s.rung_facts()
    here = facts[s.rung]
    facts[s.rung] = rung_choice.RungFacts(here.speed, here.seconds, here.hangs + 1, here.start)
    return rung_choice.after_hang(s.rung, facts, _stall_cost(s))


def _stall_cost(s: Supervision) -> float | None:
    """What a hang costs before the next worker starts, at the checkpoint interval the next spawn would choose."""
    return s.hang_history.stall_cost(_next_interval(s).seconds)


def _next_interval(s: Supervision) -> checkpoint_interval.Interval:
    cfg = s.config.checkpoint
    return checkpoint_interval.choose(cfg.every, cfg.max, s.hang_history.holds, s.mean_time_between_hangs())


def _record_rung_speed(s: Supervision) -> None:
    speed = s.batches_per_second()
    if speed:
        speeds = s.rung_speeds.setdefault(str(s.rung), [])
        speeds[:] = (speeds + [round(speed, 4)])[-RUNG_SPEED_SAMPLES:]


def _probe_check(s: Supervision, now: Now) -> list[Any]:
    """At a batch boundary: keep a probed rung that held, or try the faster rung below once probation is served."""
    cfg = s.config.probe
    if s.probing_from is not None and cfg.probe_after is not None and s.rung_trained() >= cfg.probe_after:
        kept, s.probing_from = s.probing_from, None
        return [Log("info", f"rung {s.rung} ({s.ladder.label(s.rung)}) held for {s.rung_trained():.0f} s: kept "
                            f"(rung {kept} is no longer the way back)")]
    left = s.probe_in()
    if left is None or left > 0:
        return []
    t = s.config.watchdog.save_timeout
    # A record like any stop's: the attempt's time is closed into the totals, and a save that fails is a real incident.
    target = s.probe_target()
    return _begin_stop(s, now, Reason.PROBE, s.progress.phase, then=After.RESTART,
                       detail=f"rung {s.rung} trained {s.rung_trained():.0f} s without a hang: probing rung "
                              f"{target} ({s.ladder.label(target)}) at this checkpoint",
                       save_until=now.mono + (t if t is not None else SAVE_WAIT_UNBOUNDED)) + \
        [*_publish(s, target, s.remedies, {"reason": Reason.PROBE.value}), RequestCheckpoint()]


def _rank_alive(s: Supervision, m: HeartbeatMessage, now: Now) -> bool:
    """Every rank's beats keep its own liveness; only this host's first rank's (rank 0, or local rank 0 of a host
    among several) go on to count as the run's progress. A rank is the pid that first spoke for it: its DataLoader
    workers inherit RANK and must not speak for it."""
    view = s.ranks.setdefault(m.rank, RankView(pid=m.pid, local_rank=m.local_rank))
    if view.pid != m.pid:
        s.messages_ignored += 1
        return False
    if m.kind == MessageKind.IN_FORCE and m.in_force:
        view.device = m.in_force.device or None
    if m.kind == MessageKind.ERROR and m.rank != 0:
        s.last_error = f"rank {m.rank}: {(m.error or '')[:480]}"
    if m.progress > view.progress:
        view.progress, view.last_progress_at = m.progress, now.mono
    return (m.rank if m.local_rank is None else m.local_rank) == 0


def _stopped_first(s: Supervision) -> int | None:
    """The rank whose progress is the oldest: under a collective the others wait for it, so it stopped first."""
    seen = [(v.last_progress_at, r) for r, v in s.ranks.items() if v.last_progress_at is not None]
    return min(seen)[1] if seen else None


def _checkpoint_saved(s: Supervision, m: HeartbeatMessage, now: Now) -> list[Any]:
    """A complete checkpoint: the point a restart resumes from, so the work before it is safe."""
    if not m.path:
        return []
    if _saving(s):
        s.stop.saved = True
    s.checkpoint = CheckpointMark(m.path, m.epoch or s.progress.epoch, m.batch or 0, now.wall, now.mono,
                                  m.seconds or 0.0)
    if m.seconds is not None:
        s.hang_history.checkpoint_hold(m.seconds)
    s.batches_since_checkpoint = 0
    return [KeepVerifiedCopy(m.path)]


def _tick(s: Supervision, now: Now) -> list[Any]:
    due = s.deadline()
    if due.at is None or now.mono < due.at:
        return []
    if due.kind == DeadlineKind.BACKOFF:
        return [_spawn(s)]
    if due.kind in (DeadlineKind.SAVE, DeadlineKind.SAVE_STALLED):
        why = "did not save and exit in time" if due.kind == DeadlineKind.SAVE else "makes no progress: it is hung"
        return [Log("error", f"the worker {why}; killing it without a new checkpoint"),
                *_save_failed(s, f"asked to save, the worker {why}", Reason.HANG)]
    phase = STARTUP_PHASE if s.state == State.STARTING else s.progress.phase
    if due.kind == DeadlineKind.KERNEL_CONFIRM:
        event = s.suspicion.event
        detail = (f"kernel {event.kind.value} ({event.pattern}) and no progress within "
                  f"{s.config.kernel_log.confirm_window:.0f} s: {event.message[:300]}")
        return _begin_stop(s, now, Reason.KERNEL, phase, detail=detail, climb=True,
                           failure=f"kernel:{event.kind.value}", kernel_events=[event])
    since = s.spawned_at if s.state == State.STARTING else s.last_progress_at
    quiet = now.mono - (since or now.mono)
    detail = f"no progress for {quiet:.1f} s in {phase} ({due.label} {due.at - (since or due.at):.1f} s)"
    if phase == Phase.DONE.value:
        # Training finished and its last checkpoint is written: a worker that then never exits (stuck in the GPU
        # runtime's teardown) has nothing left to lose. Its tree is killed and the run ends as it would have.
        return _begin_stop(s, now, Reason.HANG, phase, failure="hang:done", then=After.SUCCEED,
                           detail=f"{detail}: it said training was done and did not exit; nothing is lost")
    remedy = _remedy(s, Reason.HANG, phase)
    if remedy is not None:
        seen, change = remedy
        return _begin_stop(s, now, Reason.HANG, phase, failure=f"hang:{phase}", remedy=change,
                           detail=f"{detail} after {seen.name}: {seen.advice}")
    return _begin_stop(s, now, Reason.HANG, phase, detail=detail, climb=True, failure=f"hang:{phase}")


def _remedy(s: Supervision, reason: Reason, phase: str, ending: SignatureSeen | None = None
            ) -> tuple[SignatureSeen, dict[str, Any]] | None:
    """The one place a failure signature becomes a change of settings: for a hang, any seen in this attempt (a
    warning before it); for a crash, only the one of the failure that ended the worker (``ending``)."""
    for seen in s.signatures.values() if reason == Reason.HANG else [ending] if ending else []:
        if seen.remedy == Remedy.CONV_FALLBACK and reason == Reason.HANG and phase == STARTUP_PHASE \
                and s.remedies.get("conv_fallback") != "on":
            return seen, {"conv_fallback": "on"}
        if seen.remedy == Remedy.HALVE_BATCH and reason == Reason.CRASH:
            batch = (s.in_force.batch if s.in_force else None) or s.config.train.get("batch", 16)
            if isinstance(batch, (int, float)) and batch >= 1 and max(MIN_BATCH, int(batch) // 2) < batch:
                return seen, {"batch": max(MIN_BATCH, int(batch) // 2)}
            return seen, {}
    return None


def _exited(s: Supervision, event: WorkerExited, now: Now) -> list[Any]:
    code = event.returncode
    if _saving(s):
        if code == 0 and s.progress.phase == Phase.DONE.value:
            s.stop.then = After.SUCCEED  # it finished training before it got to our request
        elif not (s.stop.saved or code == 0 and s.exit_0_finishes):  # a command's exit 0 is its word it saved
            # Our worker exits 0 after a failed save too (a full disk): only its checkpoint message says it saved.
            how = describe_exit(code)
            return [Log("error", f"the worker {how} without the checkpoint asked for")] + _save_failed(
                s, f"asked to save, the worker {how} without writing a checkpoint", Reason.CRASH)
        s.stop.save_until = None  # saved and gone, as asked: clean up what is left of the tree
        s.stop.saved = True
        return [KillTree(None)]
    if s.state not in (State.STARTING, State.HEALTHY):
        return []  # an exit we caused while stopping
    if code == 0 and (s.progress.phase == Phase.DONE.value or s.exit_0_finishes):
        s.state = State.STOPPING
        s.stop = StopPlan(Reason.STOP, After.SUCCEED, incident=None)
        _close_attempt(s, lost=False)
        return [KillTree(None)]
    how = describe_exit(code)
    if code == EXIT_CONFIG:  # the worker's own verdict: restarting cannot help (a checkpoint of another training)
        return _begin_stop(s, now, Reason.CRASH, s.progress.phase, failure="worker:config", then=After.CONFIG_ERROR,
                           advice="fix the configuration or the state directory, then run again",
                           detail=f"{how}: {(event.last_words or 'the worker refused its configuration')[:300]}")
    ending = _ending_signature(s, event.last_words)
    if ending is not None and ending.remedy == Remedy.CONFIG_ERROR:
        return _begin_stop(s, now, Reason.CRASH, s.progress.phase, failure=ending.name, then=After.CONFIG_ERROR,
                           advice=ending.advice, detail=f"{how}: {ending.line.strip()[:200]}")
    reason, failure = Reason.CRASH, f"crash:{s.last_error.split(':')[0]}" if s.last_error else f"crash:{how}"
    if s.state == State.STARTING:  # before its first batch: no rung changes that, and a repeat is deterministic
        words = s.last_error or event.last_words or how
        if s.startup_failure == f"{failure}|{words}":
            return _begin_stop(s, now, Reason.CRASH, STARTUP_PHASE, failure=failure, then=After.CONFIG_ERROR,
                               advice="it failed the same way before its first batch on two attempts in a row, "
                                      "whatever the rung; fix the cause, then run again",
                               detail=f"{how}: {words[:300]}")
        s.startup_failure = f"{failure}|{words}"
    detail = "exited with status 0 before training finished" if code == 0 else \
        how + (f": {s.last_error}" if s.last_error else "")
    change = None
    remedy = _remedy(s, Reason.CRASH, s.progress.phase, ending)
    if remedy is not None:  # out of GPU memory
        seen, change = remedy
        reason, failure, detail = Reason.OOM, seen.name, f"{how}: out of GPU memory ({seen.line.strip()[:160]})"
    kernel_events = None
    if s.oom is not None and now.mono - s.oom.at <= OOM_EXIT_WINDOW:
        reason, failure, kernel_events = Reason.OOM, "oom", [s.oom.event]
        detail = f"{how} after the OOM killer took pid {s.oom.event.pid}: {s.oom.event.message[:200]}"
    return _begin_stop(s, now, reason, s.progress.phase, detail=detail, failure=failure, remedy=change or None,
                       climb=failure == s.last_failure and not change and s.state == State.HEALTHY,
                       kernel_events=kernel_events)


def _ending_signature(s: Supervision, last_words: str | None) -> SignatureSeen | None:
    """The signature of the failure that ended the worker, read from its own last error, else its last line of
    output. A line seen earlier (an optional logger's ModuleNotFoundError, one write that hit a full disk) says
    nothing about a later crash of another cause."""
    for words in (s.last_error, last_words):
        found = scan(words) if words else None
        if found is not None:
            return SignatureSeen(found.name, found.remedy, found.advice, words)
    return None


def _stop(s: Supervision, event: StopRequested, now: Now) -> list[Any]:
    """A first stop request lets the worker save a checkpoint (within save_timeout); a second one kills."""
    detail = f"{event.signal} received"
    if s.state == State.STARTING:  # no batch since the checkpoint it resumed from: nothing new to save
        return _begin_stop(s, now, Reason.STOP, STARTUP_PHASE, detail=detail, then=After.STOP)
    if s.state == State.HEALTHY:
        t = s.config.watchdog.save_timeout
        actions = _begin_stop(s, now, Reason.STOP, s.progress.phase, detail=detail, then=After.STOP,
                              save_until=now.mono + (t if t is not None else SAVE_WAIT_UNBOUNDED))
        return actions + [Log("info", "asking the worker to save a checkpoint and exit"), RequestCheckpoint()]
    if s.state == State.STOPPING and s.stop is not None:
        s.stop.then = After.STOP
        if s.stop.reason == Reason.PROBE and s.stop.save_until is not None:
            # The probe's save is under way: it serves the stop, which waits for it as a first request does.
            s.stop.reason = Reason.STOP
            _amend(s, s.stop.incident, reason=Reason.STOP, detail=f"{s.stop.incident.detail}; then {detail}")
            return [Log("info", f"stop requested ({detail}) while the worker saves for a probe: that checkpoint "
                                f"serves the stop")]
        if s.stop.save_until is not None:
            return [Log("warning", f"{event.signal} again: killing the worker without waiting for its checkpoint"),
                    *_save_failed(s, f"{event.signal} again before the checkpoint came", Reason.STOP)]
        return []
    if s.state == State.BACKOFF:
        return _finish(s, State.STOPPED, Exit(EXIT_OK, f"stopped on {event.signal}; run again to resume"))
    return []


def _paused(s: Supervision, event: SupervisorPaused) -> list[Any]:
    """Every deadline moves by the pause: the worker may well have progressed while nobody read its beats."""
    gap = event.seconds
    if s.last_progress_at is not None:
        s.last_progress_at += gap
    if s.spawned_at is not None:
        s.spawned_at += gap
    if s.healthy_since is not None:
        s.healthy_since += gap
    if s.suspicion is not None:
        s.suspicion.since += gap
    if s.backoff_until is not None:
        s.backoff_until += gap
    if s.stop is not None and s.stop.save_until is not None:
        s.stop.save_until += gap
    return [Log("warning", f"the supervisor itself did not run for {gap:.1f} s (stopped or suspended): its "
                           f"deadlines move by as much instead of blaming the worker")]


def _state_dir_taken(s: Supervision, event: StateDirTaken, now: Now) -> list[Any]:
    advice = "this one stopped its worker; stop the other, or give each supervisor its own state_dir"
    if s.state in (State.STARTING, State.HEALTHY):
        phase = STARTUP_PHASE if s.state == State.STARTING else s.progress.phase
        return _begin_stop(s, now, Reason.STOP, phase, detail=event.detail, then=After.CONFIG_ERROR, advice=advice)
    if s.state == State.STOPPING and s.stop is not None:
        s.stop.then, s.stop.advice = After.CONFIG_ERROR, advice
        if s.stop.incident is not None:
            _amend(s, s.stop.incident, detail=f"{event.detail} (while stopping: {s.stop.incident.detail})")
        if s.stop.save_until is not None:  # its save would land in the other supervisor's training
            return [Log("error", event.detail)] + _save_failed(s, "the state directory was taken", Reason.STOP)
        return [Log("error", event.detail)]
    if s.state == State.BACKOFF:
        return _finish(s, State.FAILED, Exit(EXIT_CONFIG, f"{event.detail}: {advice}; not restarting"))
    return []


def _signature(s: Supervision, event: SignatureSeen) -> list[Any]:
    """Remembered for this attempt; acted on if the worker then hangs (a crash is judged by its own last words)."""
    if s.state in (State.STARTING, State.HEALTHY) and event.name not in s.signatures:
        s.signatures[event.name] = event
        return [Log("warning", f"worker output shows {event.name}: {event.line[:200]}")]
    return []


def _kernel(s: Supervision, event: KernelMessage, now: Now) -> list[Any]:
    s.kernel_events[event.kind.value] = s.kernel_events.get(event.kind.value, 0) + 1
    running = s.state in (State.STARTING, State.HEALTHY)
    if event.kind == KernelKind.GPU_LOST and not event.drill and (not event.trusted or _trains_on_cpu(s)):
        # A line user space wrote, one from before this run, or a GPU this training does not use: it may be
        # worth a look, but "reboot needed" ends the run and needs the kernel's own word about our GPU.
        why = "not the kernel's own record of this run" if not event.trusted else "this training uses no GPU"
        if not running or _trains_on_cpu(s):
            return [Log("warning", f"GPU-lost line ignored ({why}): {event.message[:200]}")]
        event = KernelMessage(KernelKind.GPU_FAULT, event.message, event.source, event.pattern, event.pid,
                              event.in_worker_tree, trusted=False)
    if event.kind == KernelKind.GPU_LOST:
        s.reboot_needed = True
        text = f"GPU lost ({event.pattern}): {event.message[:300]}"
        if running:
            return _begin_stop(s, now, Reason.KERNEL, s.progress.phase, detail=text, failure="kernel:gpu_lost",
                               then=After.REBOOT, kernel_events=[event])
        return [Log("error", text)]
    if not running:
        return []
    if event.in_worker_tree is False:
        return [Log("info", f"kernel {event.kind.value} line about pid {event.pid}, not the worker's: counted "
                            f"({event.message[:160]})")]
    if event.kind == KernelKind.OOM:
        if event.in_worker_tree:
            s.oom = OomKill(event, now.mono)
            return [Log("error", f"the OOM killer took worker process {event.pid}")]
        return []
    if s.suspicion is None:
        s.suspicion = Suspicion(event, now.mono)
        return [Log("warning", f"kernel {event.kind.value} line ({event.pattern}); the worker must show progress "
                               f"within {s.config.kernel_log.confirm_window:.0f} s: {event.message[:160]}")]
    return []


def _trains_on_cpu(s: Supervision) -> bool:
    return str(s.config.train.get("device", "")).strip().lower() in ("cpu", "mps")


def _begin_stop(s: Supervision, now: Now, reason: Reason, phase: str, *, detail: str, climb: bool = False,
                failure: str | None = None, then: After | None = None, remedy: dict[str, Any] | None = None,
                advice: str | None = None, kernel_events: list[KernelMessage] | None = None,
                save_until: float | None = None) -> list[Any]:
    """Open the incident and plan what follows; the tree is killed at once unless the worker was asked to save."""
    earlier = _record_complete(s)  # the one before, if its restart never reached a batch
    point = HangPoint(phase, s.progress.epoch, s.progress.batch) if reason in (Reason.HANG, Reason.KERNEL) else None
    last_progress_at, lost_before = s.last_progress_at, s.lost_seconds
    # A stop or probe that saves loses nothing (unless its save fails), nor does a kill after training was done.
    loss, resumes_from, at_risk = _close_attempt(s, lost=save_until is None and then != After.SUCCEED)
    if point is not None and then in (None, After.RESTART):
        s.hang_history.hang(point, s.trained(), last_progress_at, s.lost_seconds - lost_before)
    choice = _choose_after_a_hang(s) if climb and point is not None and s.probing_from is None else None
    incident = Incident(
        id=f"{s.attempt}-{len(s.incidents) + 1}-{int(now.wall)}", time=now.wall, reason=reason, phase=phase,
        detail=detail, attempt=s.attempt, rung=s.rung, rung_label=s.ladder.label(s.rung), worker_pid=s.worker_pid,
        epoch=s.progress.epoch, batch=s.progress.batch,
        seconds_since_progress=None if s.last_progress_at is None else round(now.mono - s.last_progress_at, 3),
        last_progress_wall=None if s.last_progress_at is None else now.wall - (now.mono - s.last_progress_at),
        kernel_events=tuple({**asdict(e), "kind": e.kind.value} for e in kernel_events or ()),
        loss=loss, resumes_from=resumes_from, stopped_first_rank=_stopped_first(s) if s.ranks else None,
        node_rank=s.config.distributed.node_rank if s.config.distributed.several_hosts else None,
        caused_by=s.peer_cause if s.config.distributed.several_hosts else None)
    s.incidents = (s.incidents + [incident])[-INCIDENTS_KEPT:]
    s.state = State.STOPPING
    s.stop = StopPlan(reason, then or (After.STOP if reason == Reason.STOP else After.RESTART), incident,
                      climb=climb, failure=failure, remedy=remedy, advice=advice, save_until=save_until,
                      at_risk=at_risk if save_until is not None else (0.0, 0), point=point, choice=choice)
    if reason == Reason.HANG:
        s.hangs_by_phase[phase] = s.hangs_by_phase.get(phase, 0) + 1
    if reason == Reason.STOP:
        log = Log("info", f"stop requested ({detail})")
    elif reason == Reason.PROBE:
        log = Log("info", detail)
    else:
        log = Log("error", f"{reason.value} in {phase}: {detail}; killing the worker tree")
    cause = {"id": incident.id, "reason": incident.reason.value, "phase": incident.phase,
             "stopped_first_rank": incident.stopped_first_rank}
    publish = _publish(s, _climb_target(s, choice) if climb else s.rung, {**s.remedies, **(remedy or {})}, cause) \
        if climb or remedy else []
    return earlier + ([log, *publish] if save_until is not None else [log, *publish, KillTree(incident)])


def _climb_target(s: Supervision, choice: rung_choice.Choice | None) -> int:
    """Where a climb goes: back to the rung a failed probe left, else where a hang's choice says, else (the same
    crash again) one rung safer (the top rung stays)."""
    if s.probing_from is not None:
        return s.probing_from
    return choice.rung if choice is not None else s.ladder.next(s.rung)


def _publish(s: Supervision, rung: int, remedies: dict[str, Any], cause: dict[str, Any]) -> list[Any]:
    """Several hosts: a ladder decision of this host is the job's (PublishLadder)."""
    if not s.config.distributed.several_hosts:
        return []
    s.job_seq += 1
    return [PublishLadder(s.job_seq, rung, dict(remedies), cause)]


def _job_ladder(s: Supervision, event: JobLadderRead) -> list[Any]:
    """Another host's ladder decision: this host's next attempt goes where it says. Two decisions with the same
    number (made at once) resolve to the one the file kept, which every host reads."""
    own = event.node_rank == s.config.distributed.node_rank
    if not s.config.distributed.several_hosts or event.seq < s.job_seq or own:
        return []
    s.job_seq = event.seq
    if s.state in (State.STARTING, State.HEALTHY):
        s.peer_cause = {**event.cause, "node_rank": event.node_rank, "host": event.host}
    if (event.rung, event.remedies) == (s.rung, s.remedies) or not 0 <= event.rung < len(s.ladder):
        return []
    _move_to(s, event.rung)
    s.remedies, s.probing_from = dict(event.remedies), None
    if s.stop is not None:  # this host's own climb, decided at the same moment, is the job's decision's to replace
        s.stop.climb = False
    return [Log("warning", f"job-wide ladder: host {event.node_rank} moved the job to rung {s.rung} "
                           f"({s.ladder.label(s.rung)})" + (f" with {s.remedies}" if s.remedies else "")
                           + "; this host's next attempt starts there")]


def _close_attempt(s: Supervision, lost: bool) -> tuple[Loss | None, dict[str, Any] | None, tuple[float, int]]:
    """Move this attempt's progress into the totals; when it ends without a save, what followed the newest
    checkpoint is lost (the next worker resumes from there). Returns the loss and that checkpoint, for the incident,
    and the part after the checkpoint (seconds, batches) either way: a stop that waits for a save loses it if the
    save fails."""
    s.hang_history.trained_at(s.rung, s.trained() - s.trained_seconds)
    s.trained_seconds = s.trained()
    if s.train_beats % THROUGHPUT_WINDOW >= 2:  # the attempt's last, partial window counts too
        _record_rung_speed(s)
    loss, s.lost_from, unsaved = None, None, (0.0, 0)  # an earlier attempt's loss not resolved by now stays unknown
    if lost and s.exit_0_finishes and s.checkpoint is None and s.healthy_since is not None:
        # A command resumes from its own checkpoint, which we do not see: the next attempt's first position tells.
        s.lost_from = _batches_done(s.progress)
        loss = Loss(None, None)
    elif s.healthy_since is not None and s.last_progress_at is not None:
        saved_at = s.checkpoint.mono if s.checkpoint is not None else -math.inf
        unsaved = (max(0.0, s.last_progress_at - max(s.healthy_since, saved_at)), s.batches_since_checkpoint)
        lost_seconds, lost_batches = unsaved if lost else (0.0, 0)
        s.lost_seconds += lost_seconds
        s.lost_batches += lost_batches
        loss = Loss(round(lost_seconds, 3), lost_batches)
    s.healthy_since = None
    resumes_from = None if s.checkpoint is None else {"epoch": s.checkpoint.epoch, "batch": s.checkpoint.batch,
                                                        "path": s.checkpoint.path}
    return loss, resumes_from, unsaved


def _count_lost(s: Supervision, seconds: float, batches: int) -> None:
    """A save asked for did not come: the stop's at-risk training is lost after all, in the totals and its incident."""
    s.lost_seconds += seconds
    s.lost_batches += batches
    incident = s.stop.incident
    if incident is not None:
        before = incident.loss or Loss(0.0, 0)
        _amend(s, incident, loss=Loss(round((before.seconds or 0.0) + seconds, 3), (before.batches or 0) + batches))


def _save_failed(s: Supervision, why: str, reason: Reason) -> list[Any]:
    """The checkpoint a stop or a probe asked for did not come: what followed the newest one is lost, and a probe
    is what it turned into (a hang or crash while saving), a real incident and a restart at the rung it was to
    leave, whose probation starts over."""
    plan = s.stop
    plan.save_until = None
    _count_lost(s, *plan.at_risk)
    changes: dict[str, Any] = {"detail": f"{plan.incident.detail}; {why}"}
    actions: list[Any] = []
    if plan.reason == Reason.PROBE:
        plan.reason, plan.failure = reason, f"{reason.value}:probe save"
        changes["reason"] = reason
        if reason == Reason.HANG:
            phase = plan.incident.phase
            s.hangs_by_phase[phase] = s.hangs_by_phase.get(phase, 0) + 1
        _move_to(s, s.rung)
        actions.append(Log("warning", f"the probe is off: rung {s.rung} ({s.ladder.label(s.rung)}) goes on after the "
                                      f"restart, its probation counted again"))
    _amend(s, plan.incident, **changes)
    return actions + [KillTree(plan.incident)]
def _batches_done(p: Progress) -> int | None:
    return (max(0, p.epoch - 1) * p.batches + p.batch) if p.batches else None


def _resumed_loss(s: Supervision, rung: int) -> Loss:
    """A command's lost work, from where it was when it failed down to where its next attempt resumed: the first
    position it shows (a resumed bar draws its initial position before any batch). Unknown without positions."""
    lost_from, resumed_at, s.lost_from = s.lost_from, _batches_done(s.progress), None
    if lost_from is None or resumed_at is None:
        return Loss(None, None)
    batches = max(0, lost_from - resumed_at)
    speed = s.rung_speed(rung)  # the failed attempt's
    seconds = round(batches / speed, 3) if speed else None
    s.lost_batches += batches
    s.lost_seconds += seconds or 0.0
    return Loss(seconds, batches)


def _amend(s: Supervision, incident: Incident, **changes: Any) -> Incident:
    """The one way the core's incident changes: a new record in the list (and in the stop plan) for the old."""
    amended = replace(incident, **changes)
    s.incidents = [amended if i is incident else i for i in s.incidents]
    if s.stop is not None and s.stop.incident is incident:
        s.stop.incident = amended
    return amended


def _record_complete(s: Supervision) -> list[Any]:
    """Ask for every incident not written yet to be written: called once nothing more can be learnt of them."""
    actions = []
    for incident in [i for i in s.incidents if not i.recorded]:
        actions.append(RecordIncident(_amend(s, incident, recorded=True)))
    return actions


def _enriched(s: Supervision, event: IncidentEnriched) -> list[Any]:
    incident = s.stop.incident if s.stop is not None else None
    if incident is None or incident.id != event.incident_id:
        return []
    detail = incident.detail
    if event.output_note and incident.phase == STARTUP_PHASE:
        detail += f"; {event.output_note}"
    _amend(s, incident, processes=event.processes, output_tail=event.output_tail, stacks=event.stacks,
           detail=detail, host=event.host)
    return []


def _tree_killed(s: Supervision, event: TreeKilled, now: Now) -> list[Any]:
    if s.state != State.STOPPING or s.stop is None:
        return []
    plan = s.stop
    s.worker_pid = None
    if plan.incident is not None:
        _amend(s, plan.incident, last_error=s.last_error, settings=s.in_force_shown(),
               kill=Kill(event.killed, round(event.seconds, 3), tuple(event.survivors), event.confirmed_wall))
    if event.survivors:
        s.reboot_needed = True
        return _finish(s, State.FAILED, Exit(
            EXIT_REBOOT_NEEDED,
            f"{len(event.survivors)} worker process(es) survived SIGKILL ({'; '.join(event.survivors)}): stuck in the "
            f"GPU driver; no new worker is started on this GPU; reboot the machine, then run again to resume"))
    if plan.then == After.REBOOT:
        return _finish(s, State.FAILED, Exit(
            EXIT_REBOOT_NEEDED, f"the GPU is lost ({plan.incident.detail}); no new worker is "
                                f"started on it; reboot the machine, then run again to resume"))
    if plan.then == After.CONFIG_ERROR:
        return _finish(s, State.FAILED, Exit(EXIT_CONFIG, f"{plan.incident.detail}: {plan.advice}; not restarting"))
    if plan.then == After.SUCCEED:
        return _finish(s, State.SUCCEEDED, Exit(EXIT_OK, f"training finished after {s.attempt} attempt(s)"))
    if plan.then == After.STOP:
        saved = "after saving a checkpoint" if plan.saved else "without a new checkpoint"
        if not plan.saved and plan.at_risk[1]:
            saved += (f" (none was written: the {plan.at_risk[0]:.0f} s and {plan.at_risk[1]} batches trained after "
                      f"the newest one are trained again)")
        return _finish(s, State.STOPPED, Exit(EXIT_OK, f"stopped at rung {s.rung} {saved}; run again to resume"))
    return _restart(s, plan, now)


def _move_to(s: Supervision, rung: int) -> None:
    s.rung, s.rung_entered_trained = rung, s.trained()


def _restart(s: Supervision, plan: StopPlan, now: Now) -> list[Any]:
    """After a failure: count it against the budget, apply the remedy or climb, then spawn or back off."""
    s.restarts_by_reason[plan.reason.value] = s.restarts_by_reason.get(plan.reason.value, 0) + 1
    if plan.reason == Reason.PROBE:  # planned, saved first: no budget, no backoff
        target = s.probe_target()
        s.probing_from = s.rung
        _move_to(s, s.rung - 1 if target is None else target)
        return [Log("warning", f"faster: rung {s.rung} ({s.ladder.label(s.rung)}), probing; a hang returns "
                               f"to rung {s.probing_from}"), _spawn(s)]
    if plan.point is not None:
        s.rung_hangs[str(s.rung)] = s.rung_hangs.get(str(s.rung), 0) + 1
        repeated = s.hang_history.repeated_point()
        if repeated is not None and repeated.phase != STARTUP_PHASE:
            return _finish(s, State.FAILED, Exit(
                EXIT_CONFIG, f"the same hang {len(s.hang_history.points)} times in a row at epoch {repeated.epoch}, "
                             f"batch {repeated.batch} ({repeated.phase}), whatever the rung: a deterministic hang in "
                             f"the model or the data, which no rung changes (last: {plan.incident.detail}); "
                             f"find what that batch does (yolo-train incidents shows the stacks), then run again to "
                             f"resume"))
    s.restart_times.append(now.wall)
    if not _saved_since_spawn(s):  # a loop saves nothing; a run that checkpoints between hangs still moves on
        s.budget_times.append(now.wall)
    s.last_failure = plan.failure
    cfg = s.config.restart
    used = restart_budget.restarts_in_window(s.budget_times, now.wall, cfg)
    if used > cfg.max_restarts:
        return _finish(s, State.FAILED, Exit(
            EXIT_FAILED,
            f"restart budget spent: {used} restarts in the last {cfg.window:.0f} s, none after a new checkpoint "
            f"(restart.max_restarts = "
            f"{cfg.max_restarts}); last failure: {plan.incident.detail if plan.incident else plan.failure}; "
            f"fix the cause, then run again to resume at rung {s.rung}"))
    actions: list[Any] = []
    if plan.remedy:
        s.remedies.update(plan.remedy)
        actions.append(Log("warning", "from now on: " + ", ".join(f"{k}={v}" for k, v in plan.remedy.items())))
    if plan.climb and s.probing_from is not None:  # the probed rung failed: back to where it was safe, for longer
        back, s.probing_from = s.probing_from, None
        key = str(back)
        s.probation[key] = 2 * s.probation.get(key, s.config.probe.probe_after or 0.0)
        gave_up = s.rung_hangs.get(str(s.rung), 0) >= s.config.probe.give_up_after
        _move_to(s, back)
        actions.append(Log("warning", f"the probed rung hung: back to rung {back} ({s.ladder.label(back)}), next probe "
                                      f"after {s.probation[key]:.0f} s" + (f"; rung {back - 1} hung "
                                      f"{s.config.probe.give_up_after} times and is not probed again" if gave_up else "")))
    elif plan.climb and plan.choice is not None:  # a hang: the rung its record says, chosen at the verdict
        step = plan.choice.rung - s.rung
        move = "staying" if step == 0 else "one rung safer" if step == 1 else f"{step} rungs safer" if step > 0 \
            else "faster"
        if step:
            _move_to(s, plan.choice.rung)
        actions.append(Log("warning", f"{move}: rung {s.rung} ({s.ladder.label(s.rung)}): {plan.choice.why}"))
    elif plan.climb:  # the same crash again
        if s.ladder.exhausted(s.rung):
            actions.append(Log("warning", f"ladder exhausted: staying at rung {s.rung} ({s.ladder.label(s.rung)})"))
        else:
            _move_to(s, _climb_target(s, None))
            actions.append(Log("warning", f"one rung safer: rung {s.rung} ({s.ladder.label(s.rung)})"))
    if plan.reason in (Reason.CRASH, Reason.OOM):
        s.consecutive_crashes += 1
        delay = restart_budget.backoff_delay(s.consecutive_crashes, cfg)
        s.state, s.backoff_until, s.stop = State.BACKOFF, now.mono + delay, None
        return actions + [Log("info", f"restarting in {delay:.1f} s (crash {s.consecutive_crashes} in a row)")]
    return actions + [_spawn(s)]


def _saved_since_spawn(s: Supervision) -> bool:
    """The attempt that just failed wrote a complete checkpoint: the next one resumes past where this one began."""
    return s.checkpoint is not None and s.spawned_at is not None and s.checkpoint.mono >= s.spawned_at


def _finish(s: Supervision, state: State, exit: Exit) -> list[Any]:
    recorded = _record_complete(s)
    s.state, s.exit, s.stop = state, exit, None
    return recorded + [exit]


def describe_exit(code: int) -> str:
    if code < 0:
        try:
            return f"killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
    return f"exited with status {code}"


def snapshot(s: Supervision, now: Now) -> dict[str, Any]:
    """The live view written for ``yolo-train status`` and read by the metrics collector."""
    p = s.progress
    due = s.deadline()
    done_batches = max(0, p.epoch - 1) * p.batches + p.batch if p.batches else 0
    total_batches = p.epochs * p.batches
    it_s = s.batches_per_second()
    eta = (total_batches - done_batches) / it_s if it_s and total_batches else None
    return {
        "state": s.state.value, "phase": p.phase, "epoch": p.epoch, "epochs": p.epochs, "batch": p.batch,
        "batches": p.batches, "losses": p.losses, "lr": p.lr,
        "it_s": it_s, "samples_s": s.samples_per_second(), "eta_seconds": eta,
        "progress": (done_batches / total_batches) if total_batches else None,
        "rung": s.rung, "rungs": len(s.ladder), "rung_label": s.ladder.label(s.rung), "attempt": s.attempt,
        "remedies": s.remedies,
        "restarts": sum(s.restarts_by_reason.values()), "restarts_by_reason": s.restarts_by_reason,
        "hangs_by_phase": s.hangs_by_phase, "budget_left": s.budget_left(now.wall),
        "kernel_events": s.kernel_events, "reboot_needed": s.reboot_needed,
        "suspicion": None if s.suspicion is None else s.suspicion.event.message[:200],
        "worker_pid": s.worker_pid, "resumed_from": s.resumed_from, "settings": s.in_force_shown(),
        "seconds_since_progress": None if s.last_progress_at is None else now.mono - s.last_progress_at,
        "worker_uptime": None if s.spawned_at is None or s.worker_pid is None else now.mono - s.spawned_at,
        "worker_spawned": s.spawned_wall, "startup_seconds": s.startup_seconds,
        "watchdog": {"timeout": due.label, "fires_in": None if due.at is None else due.at - now.mono},
        "last_restart": s.restart_times[-1] if s.restart_times else None,
        "last_incident": s.incidents[-1].to_dict() if s.incidents else None,
        "exit": asdict(s.exit) if s.exit else None,
        "last_checkpoint": None if s.checkpoint is None else {
            "path": s.checkpoint.path, "epoch": s.checkpoint.epoch, "batch": s.checkpoint.batch,
            "age_seconds": now.wall - s.checkpoint.wall, "seconds": s.checkpoint.seconds},
        "checkpoint_every": None if s.checkpoint_interval is None else s.checkpoint_interval.seconds,
        "checkpoint_interval": _interval_view(s),
        "trained_seconds": s.trained(), "lost_seconds": s.lost_seconds, "lost_batches": s.lost_batches,
        "goodput": s.goodput(now.mono), "run_started": s.run_started_wall,
        "rung_speed": s.rung_speed(s.rung), "rung0_speed": s.rung_speed(0),
        "rung_speeds": {k: s.rung_speed(int(k)) for k in s.rung_speeds},
        "node_rank": s.config.distributed.node_rank if s.config.distributed.several_hosts else None,
        "ranks": [{"rank": r, "local_rank": v.local_rank, "pid": v.pid, "device": v.device,
                   "seconds_since_progress": None if v.last_progress_at is None else now.mono - v.last_progress_at}
                  for r, v in sorted(s.ranks.items())],
        "probe": {"in_seconds": s.probe_in(), "from": s.probing_from, "probation": s.probation,
                  "hangs_by_rung": s.rung_hangs, "target": s.probe_target() if s.rung else None},
        "ladder": _ladder_view(s),
    }


def _interval_view(s: Supervision) -> dict[str, Any]:
    """How the current interval was chosen ([checkpoint] every = "auto"), for status and metrics."""
    chosen = s.checkpoint_interval
    return {"auto": s.config.checkpoint.every == "auto", "max": s.config.checkpoint.max,
            "hold_seconds": None if chosen is None else chosen.hold,
            "mean_time_between_hangs": None if chosen is None else chosen.mean_time_between_hangs}


def _ladder_view(s: Supervision) -> dict[str, Any]:
    """What the ladder's next choice is made from (rung_choice.py): each tried rung's record and expected goodput."""
    stall = _stall_cost(s)
    facts = s.rung_facts()
    used = rung_choice.DEFAULT_STALL_COST if stall is None else stall
    return {"stall_cost_seconds": stall,
            "rungs": {str(k): {"speed": f.speed, "seconds": round(f.seconds, 3), "hangs": f.hangs, "start": f.start,
                               "expected_goodput": rung_choice.expected_goodput(
                                   f, rung_choice.hang_cost(f, used, facts))}
                      for k, f in enumerate(facts) if f.tried}}
