"""The decision core: what the supervisor does next, as a function of its state, an event and the time.

No I/O happens here. The agent (``agent.py``) turns the world into events (a heartbeat, the worker's exit,
the tree killed, a tick of the clock, a stop request) and executes the actions returned (spawn a worker,
kill its tree, log, exit). ``decide`` updates the state it is given in place and returns it with the
actions: a reducer, cheap enough to run for every heartbeat.

Life cycle (``State``)::

    STARTING --first training batch--> HEALTHY
    STARTING | HEALTHY --stall timeout, worker exit, stop request--> STOPPING (the tree is killed)
    STOPPING --tree gone--> STARTING (a hang restarts at once, one rung safer)
                          | BACKOFF  (a crash waits, then restarts at the same rung)
                          | SUCCEEDED (training finished) | FAILED (budget spent, reboot needed)
                          | STOPPED (asked to stop; the next run resumes)
    BACKOFF --delay over--> STARTING

A crash climbs the ladder only when the same failure repeats; a hang always climbs. Every restart
counts against the restart budget; a worker that survives SIGKILL ends the supervisor with "reboot needed".

Kernel messages: a stall or GPU-fault line puts the worker under suspicion; if it makes no progress
within the confirm window it is killed as hung at once (long before the stall timeout), if it does,
the line is counted and nothing is killed. A line naming a pid outside the worker's tree only counts.
A lost GPU ends the supervisor with "reboot needed"; the OOM killer taking a worker process makes the
ensuing crash an ``oom`` one.
"""

from __future__ import annotations

import copy
import math
import signal
from collections import deque
from dataclasses import asdict, dataclass, field
from enum import Enum
from typing import Any

from supervisor.config import Config
from supervisor.decision import restart_budget, watchdog
from supervisor.decision.ladder import Ladder
from supervisor.decision.vocabulary import After, KernelKind, Reason, Remedy, State
from supervisor.exit_codes import EXIT_CONFIG, EXIT_FAILED, EXIT_OK, EXIT_REBOOT_NEEDED
from worker.contract import HeartbeatMessage, MessageKind, Phase

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
    State.BACKOFF: frozenset({State.BACKOFF, State.STARTING, State.STOPPED}),
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


# Actions --------------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Spawn:
    attempt: int
    rung: int
    rung_settings: dict[str, Any]  # the rung's changes and the remedies in force, as the ladder spells them


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
    """Kill the worker's tree. ``incident`` is a copy of the core's record for the shell to enrich and write
    (process list, output tail, kill report); the core learns the outcome from ``TreeKilled``."""
    incident: dict[str, Any] | None  # None: cleaning up after a normal exit


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
    incident: dict[str, Any]
    climb: bool = False  # one rung safer before the next attempt
    failure: str | None = None  # names the failure, so a repeat can be told from a first time
    remedy: dict[str, Any] | None = None  # settings added on top of the rung from the next attempt on
    advice: str | None = None  # After.CONFIG_ERROR: what the user should change
    save_until: float | None = None  # monotonic: the worker was asked to save and exit by then
    saved: bool = False  # it did, and exited 0


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
    progress_counter: int = -1
    progress_pid: int | None = None  # whose counter progress_counter is: the worker, or rank 0 under DDP
    ranks: dict[int, RankView] = field(default_factory=dict)
    last_progress_at: float | None = None  # monotonic
    progress: Progress = field(default_factory=Progress)
    in_force: dict[str, Any] = field(default_factory=dict)  # the settings the worker reports really in force
    intervals: dict[str, deque] = field(default_factory=dict)
    throughput: deque = field(default_factory=lambda: deque(maxlen=THROUGHPUT_WINDOW))  # (mono, samples)
    last_error: str | None = None  # the worker's own last words ("RuntimeError: ...")
    stop: StopPlan | None = None  # set while STOPPING
    backoff_until: float | None = None
    consecutive_crashes: int = 0
    last_failure: str | None = None
    restart_times: list[float] = field(default_factory=list)  # wall clock, for the budget
    restarts_by_reason: dict[str, int] = field(default_factory=dict)
    hangs_by_phase: dict[str, int] = field(default_factory=dict)
    incidents: list[dict[str, Any]] = field(default_factory=list)
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
    healthy_since: float | None = None  # monotonic: this attempt's first training batch
    trained_seconds: float = 0.0  # time spent progressing in earlier attempts (first batch to last progress)
    lost_seconds: float = 0.0  # the part of it after the checkpoint each failed attempt resumed from
    lost_batches: int = 0
    checkpoint: CheckpointMark | None = None
    batches_since_checkpoint: int = 0  # this attempt's training batches after the newest checkpoint
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

    def goodput(self, wall: float) -> float | None:
        """Training time kept (progress not thrown away by a restart) over wall time since the run began."""
        if self.run_started_wall is None or wall <= self.run_started_wall:
            return None
        return max(0.0, self.trained() - self.lost_seconds) / (wall - self.run_started_wall)

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
        if cfg.probe_after is None or self.rung == 0 or self.exit is not None:
            return None
        if self.rung_hangs.get(str(self.rung - 1), 0) >= cfg.give_up_after:
            return None
        return max(0.0, self.probation.get(str(self.rung), cfg.probe_after) - self.rung_trained())

    def budget_left(self, wall: float) -> int:
        return restart_budget.budget_left(self.restart_times, wall, self.config.restart)

    # -- persistence: what a restarted supervisor needs to continue where it was --
    def persistent(self) -> dict[str, Any]:
        return {"rung": self.rung, "attempt": self.attempt, "restart_times": self.restart_times,
                "restarts_by_reason": self.restarts_by_reason, "hangs_by_phase": self.hangs_by_phase,
                "last_failure": self.last_failure, "incidents": self.incidents, "state": self.state.value,
                "kernel_events": self.kernel_events, "remedies": self.remedies,
                "run_started_wall": self.run_started_wall, "trained_seconds": self.trained(),
                "lost_seconds": self.lost_seconds, "lost_batches": self.lost_batches,
                "startup_seen": self.startup_seen, "epoch_end_seen": self.epoch_end_seen,
                "startup_failure": self.startup_failure, "training_fingerprint": self.training_fingerprint,
                "rung_entered_trained": self.rung_entered_trained, "probation": self.probation,
                "rung_hangs": self.rung_hangs, "probing_from": self.probing_from, "rung_speeds": self.rung_speeds,
                "job_seq": self.job_seq,
                "checkpoint": None if self.checkpoint is None else asdict(self.checkpoint)}

    def restore(self, record: dict[str, Any]) -> None:
        self.rung = min(int(record.get("rung", 0)), len(self.ladder) - 1)
        self.attempt = int(record.get("attempt", 0))
        self.restart_times = [float(t) for t in record.get("restart_times", [])]
        self.restarts_by_reason = dict(record.get("restarts_by_reason", {}))
        self.hangs_by_phase = dict(record.get("hangs_by_phase", {}))
        self.last_failure = record.get("last_failure")
        self.incidents = list(record.get("incidents", []))[-INCIDENTS_KEPT:]
        self.kernel_events = dict(record.get("kernel_events", {}))
        self.remedies = dict(record.get("remedies", {}))
        self.run_started_wall = record.get("run_started_wall")
        self.trained_seconds = float(record.get("trained_seconds") or 0.0)
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
        return _heartbeat(s, event.message, now)
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
    if isinstance(event, StopRequested):
        return _stop(s, event, now)
    if isinstance(event, KernelMessage):
        return _kernel(s, event, now)
    if isinstance(event, SignatureSeen):
        return _signature(s, event)
    if isinstance(event, SupervisorPaused):
        return _paused(s, event)
    if isinstance(event, JobLadderRead):
        return _job_ladder(s, event)
    raise TypeError(f"unknown event {event!r}")


def _boot(s: Supervision, now: Now) -> list[Any]:
    if s.run_started_wall is None:
        s.run_started_wall = now.wall
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
    return Spawn(attempt=s.attempt, rung=s.rung, rung_settings={**s.ladder.settings(s.rung), **s.remedies})


def _spawned(s: Supervision, event: Spawned, now: Now) -> list[Any]:
    s.worker_pid, s.spawned_at, s.spawned_wall, s.startup_seconds = event.pid, now.mono, now.wall, None
    s.resumed_from, s.exit_0_finishes = event.resumed_from, event.exit_0_finishes
    s.progress_counter, s.last_progress_at, s.progress_pid, s.ranks = -1, None, None, {}
    s.progress = Progress()
    s.intervals, s.in_force, s.last_error = {}, {}, None
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


def _heartbeat(s: Supervision, m: HeartbeatMessage, now: Now) -> list[Any]:
    if s.state not in (State.STARTING, State.HEALTHY) and not _saving(s):
        return []
    if m.rank is not None:
        if not _rank_alive(s, m, now):
            return []
    elif m.pid != s.worker_pid:
        s.messages_ignored += 1  # a DataLoader worker or a stray writer: never counts as progress
        return []
    if m.pid != s.progress_pid:  # another sender (the launcher, then rank 0): its own counter
        s.progress_pid, s.progress_counter = m.pid, -1
    if m.kind == MessageKind.ERROR:
        s.last_error = (m.error or "")[:500]
        return []
    if m.kind == MessageKind.SETTINGS:
        s.in_force = dict(m.settings or {})
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
    s.progress_counter, s.last_progress_at, p.phase = m.progress, now.mono, phase
    actions: list[Any] = []
    if s.suspicion is not None:
        event = s.suspicion.event
        s.suspicion = None
        actions.append(Log("info", f"kernel {event.kind.value} line while training progresses: counted, nothing "
                                   f"killed ({event.message[:160]})"))
    training = m.kind == MessageKind.BEAT and m.phase == Phase.TRAIN
    if training and p.losses:
        s.nan_beats = s.nan_beats + 1 if not all(math.isfinite(v) for v in p.losses.values()) else 0
        if s.nan_beats >= NAN_BEATS and s.state == State.HEALTHY and s.in_force.get("amp", True) is not False:
            return actions + _begin_stop(s, now, Reason.NAN, "train", remedy={"amp": False}, failure="nan",
                                         detail=f"non-finite losses in {s.nan_beats} batches in a row ({p.losses})")
    if training:
        s.throughput.append((now.mono, m.samples or 0))
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
            if s.incidents and "restart_seconds" not in s.incidents[-1] and s.incidents[-1]["reason"] != "stop":
                s.incidents[-1]["restart_seconds"] = round(now.wall - s.incidents[-1]["time"], 3)
            actions.append(Log("info", f"attempt {s.attempt}: first training batch {s.startup_seconds:.1f} s "
                                       f"after spawn"))
            if s.config.standby and s.config.command is None:
                actions.append(PrepareStandby({**s.ladder.settings(s.ladder.next(s.rung)), **s.remedies}))
        elif s.state == State.HEALTHY:
            actions += _probe_check(s, now)
    return actions


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
    s.state = State.STOPPING
    s.stop = StopPlan(Reason.PROBE, After.RESTART, incident={},
                      save_until=now.mono + (t if t is not None else SAVE_WAIT_UNBOUNDED))
    return [Log("info", f"rung {s.rung} trained {s.rung_trained():.0f} s without a hang: probing rung {s.rung - 1} "
                        f"({s.ladder.label(s.rung - 1)}) at this checkpoint"),
            *_publish(s, s.rung - 1, s.remedies, {"reason": Reason.PROBE.value}), RequestCheckpoint()]


def _rank_alive(s: Supervision, m: HeartbeatMessage, now: Now) -> bool:
    """Every rank's beats keep its own liveness; only this host's first rank's (rank 0, or local rank 0 of a host
    among several) go on to count as the run's progress. A rank is the pid that first spoke for it: its DataLoader
    workers inherit RANK and must not speak for it."""
    view = s.ranks.setdefault(m.rank, RankView(pid=m.pid, local_rank=m.local_rank))
    if view.pid != m.pid:
        s.messages_ignored += 1
        return False
    if m.kind == MessageKind.SETTINGS and m.settings:
        view.device = str(m.settings.get("device", "")) or None
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
    s.checkpoint = CheckpointMark(m.path, m.epoch or s.progress.epoch, m.batch or 0, now.wall, now.mono,
                                  m.seconds or 0.0)
    s.batches_since_checkpoint = 0
    return [KeepVerifiedCopy(m.path)]


def _tick(s: Supervision, now: Now) -> list[Any]:
    due = s.deadline()
    if due.at is None or now.mono < due.at:
        return []
    if due.kind == DeadlineKind.BACKOFF:
        return [_spawn(s)]
    if due.kind in (DeadlineKind.SAVE, DeadlineKind.SAVE_STALLED):
        s.stop.save_until = None
        why = "did not save and exit in time" if due.kind == DeadlineKind.SAVE else "makes no progress: it is hung"
        return [Log("error", f"the worker {why}; killing it without a new checkpoint"),
                KillTree(copy.deepcopy(s.stop.incident))]
    phase = "startup" if s.state == State.STARTING else s.progress.phase
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


def _remedy(s: Supervision, reason: Reason, phase: str) -> tuple[SignatureSeen, dict[str, Any]] | None:
    """The one place a failure signature seen in this attempt becomes a change of settings."""
    for seen in s.signatures.values():
        if seen.remedy == Remedy.CONV_FALLBACK and reason == Reason.HANG and phase == "startup" \
                and s.remedies.get("conv_fallback") != "on":
            return seen, {"conv_fallback": "on"}
        if seen.remedy == Remedy.HALVE_BATCH and reason == Reason.CRASH:
            batch = s.in_force.get("batch") or s.config.train.get("batch", 16)
            if isinstance(batch, (int, float)) and batch >= 1 and max(MIN_BATCH, int(batch) // 2) < batch:
                return seen, {"batch": max(MIN_BATCH, int(batch) // 2)}
            return seen, {}
    return None


def _exited(s: Supervision, event: WorkerExited, now: Now) -> list[Any]:
    code = event.returncode
    if _saving(s):
        s.stop.save_until = None  # saved and gone, as asked: clean up what is left of the tree
        s.stop.saved = code == 0
        if code == 0 and s.progress.phase == Phase.DONE.value:
            s.stop.then = After.SUCCEED  # it finished training before it got to our request
        return [KillTree(None)]
    if s.state not in (State.STARTING, State.HEALTHY):
        return []  # an exit we caused while stopping
    if code == 0 and (s.progress.phase == Phase.DONE.value or s.exit_0_finishes):
        s.state = State.STOPPING
        s.stop = StopPlan(Reason.STOP, After.SUCCEED, incident={})
        _close_attempt(s, {}, lost=False)
        return [KillTree(None)]
    how = describe_exit(code)
    if code == EXIT_CONFIG:  # the worker's own verdict: restarting cannot help (a checkpoint of another training)
        return _begin_stop(s, now, Reason.CRASH, s.progress.phase, failure="worker:config", then=After.CONFIG_ERROR,
                           advice="fix the configuration or the state directory, then run again",
                           detail=f"{how}: {(event.last_words or 'the worker refused its configuration')[:300]}")
    for seen in s.signatures.values():
        if seen.remedy == Remedy.CONFIG_ERROR:
            return _begin_stop(s, now, Reason.CRASH, s.progress.phase, failure=seen.name, then=After.CONFIG_ERROR,
                               advice=seen.advice, detail=f"{how}: {seen.line.strip()[:200]}")
    reason, failure = Reason.CRASH, f"crash:{s.last_error.split(':')[0]}" if s.last_error else f"crash:{how}"
    if s.state == State.STARTING:  # before its first batch: no rung changes that, and a repeat is deterministic
        words = s.last_error or event.last_words or how
        if s.startup_failure == f"{failure}|{words}":
            return _begin_stop(s, now, Reason.CRASH, "startup", failure=failure, then=After.CONFIG_ERROR,
                               advice="it failed the same way before its first batch on two attempts in a row, "
                                      "whatever the rung; fix the cause, then run again",
                               detail=f"{how}: {words[:300]}")
        s.startup_failure = f"{failure}|{words}"
    detail = "exited with status 0 before training finished" if code == 0 else \
        how + (f": {s.last_error}" if s.last_error else "")
    change = None
    remedy = _remedy(s, Reason.CRASH, s.progress.phase)
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


def _stop(s: Supervision, event: StopRequested, now: Now) -> list[Any]:
    """A first stop request lets the worker save a checkpoint (within save_timeout); a second one kills."""
    detail = f"{event.signal} received"
    if s.state == State.STARTING:  # no batch since the checkpoint it resumed from: nothing new to save
        return _begin_stop(s, now, Reason.STOP, "startup", detail=detail, then=After.STOP)
    if s.state == State.HEALTHY:
        t = s.config.watchdog.save_timeout
        actions = _begin_stop(s, now, Reason.STOP, s.progress.phase, detail=detail, then=After.STOP,
                              save_until=now.mono + (t if t is not None else SAVE_WAIT_UNBOUNDED))
        return actions + [Log("info", "asking the worker to save a checkpoint and exit"), RequestCheckpoint()]
    if s.state == State.STOPPING and s.stop is not None:
        s.stop.then = After.STOP
        if s.stop.save_until is not None:
            s.stop.save_until = None
            return [Log("warning", f"{event.signal} again: killing the worker without waiting for its checkpoint"),
                    KillTree(copy.deepcopy(s.stop.incident))]
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


def _signature(s: Supervision, event: SignatureSeen) -> list[Any]:
    """Remembered for this attempt; acted on when the worker crashes or hangs (see signatures.py)."""
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
    """Record the incident and plan what follows; the tree is killed at once unless the worker was asked to save."""
    incident = {
        "id": f"{s.attempt}-{len(s.incidents) + 1}-{int(now.wall)}",
        "time": now.wall,
        "reason": reason.value,
        "phase": phase,
        "detail": detail,
        "attempt": s.attempt,
        "rung": s.rung,
        "rung_label": s.ladder.label(s.rung),
        "worker_pid": s.worker_pid,
        "epoch": s.progress.epoch,
        "batch": s.progress.batch,
        "seconds_since_progress": None if s.last_progress_at is None else round(now.mono - s.last_progress_at, 3),
        "last_progress_wall": None if s.last_progress_at is None else now.wall - (now.mono - s.last_progress_at),
    }
    if s.ranks:
        incident["stopped_first_rank"] = _stopped_first(s)
    if s.config.distributed.several_hosts:
        incident["node_rank"] = s.config.distributed.node_rank
        if s.peer_cause is not None:
            incident["caused_by"] = s.peer_cause
    if kernel_events:
        incident["kernel_events"] = [{**asdict(e), "kind": e.kind.value} for e in kernel_events]
    # A stop that saves loses nothing, nor does a kill after training was done (then=SUCCEED).
    _close_attempt(s, incident, lost=(reason != Reason.STOP or save_until is None) and then != After.SUCCEED)
    s.incidents = (s.incidents + [incident])[-INCIDENTS_KEPT:]
    s.state = State.STOPPING
    s.stop = StopPlan(reason, then or (After.STOP if reason == Reason.STOP else After.RESTART), incident,
                      climb=climb, failure=failure, remedy=remedy, advice=advice, save_until=save_until)
    if reason == Reason.HANG:
        s.hangs_by_phase[phase] = s.hangs_by_phase.get(phase, 0) + 1
    if reason == Reason.STOP:
        log = Log("info", f"stop requested ({detail})")
    else:
        log = Log("error", f"{reason.value} in {phase}: {detail}; killing the worker tree")
    cause = {k: incident.get(k) for k in ("id", "reason", "phase", "stopped_first_rank")}
    publish = _publish(s, _climb_target(s) if climb else s.rung, {**s.remedies, **(remedy or {})}, cause) \
        if climb or remedy else []
    return [log, *publish] if save_until is not None else [log, *publish, KillTree(copy.deepcopy(incident))]


def _climb_target(s: Supervision) -> int:
    """Where a climb goes: back to the rung a failed probe left, else one rung safer (the top rung stays)."""
    return s.probing_from if s.probing_from is not None else s.ladder.next(s.rung)


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


def _close_attempt(s: Supervision, incident: dict[str, Any], lost: bool) -> None:
    """Move this attempt's progress into the totals; when it ends without a save, what followed the newest
    checkpoint is lost (the next worker resumes from there) and the incident says how much."""
    s.trained_seconds = s.trained()
    if s.train_beats % THROUGHPUT_WINDOW >= 2:  # the attempt's last, partial window counts too
        _record_rung_speed(s)
    if s.healthy_since is not None and s.last_progress_at is not None:
        saved_at = s.checkpoint.mono if s.checkpoint is not None else -math.inf
        lost_seconds = max(0.0, s.last_progress_at - max(s.healthy_since, saved_at)) if lost else 0.0
        lost_batches = s.batches_since_checkpoint if lost else 0
        s.lost_seconds += lost_seconds
        s.lost_batches += lost_batches
        incident["lost_seconds"], incident["lost_batches"] = round(lost_seconds, 3), lost_batches
    if s.checkpoint is not None:
        incident["resumes_from"] = {"epoch": s.checkpoint.epoch, "batch": s.checkpoint.batch, "path": s.checkpoint.path}
    s.healthy_since = None


def _tree_killed(s: Supervision, event: TreeKilled, now: Now) -> list[Any]:
    if s.state != State.STOPPING or s.stop is None:
        return []
    plan = s.stop
    s.worker_pid = None
    if plan.incident:
        plan.incident["kill"] = {"processes": event.killed, "seconds": round(event.seconds, 3),
                                 "survivors": list(event.survivors), "confirmed_wall": event.confirmed_wall}
    if event.survivors:
        s.reboot_needed = True
        return _finish(s, State.FAILED, Exit(
            EXIT_REBOOT_NEEDED,
            f"{len(event.survivors)} worker process(es) survived SIGKILL ({'; '.join(event.survivors)}): stuck in the "
            f"GPU driver; no new worker is started on this GPU; reboot the machine, then run again to resume"))
    if plan.then == After.REBOOT:
        return _finish(s, State.FAILED, Exit(
            EXIT_REBOOT_NEEDED, f"the GPU is lost ({plan.incident.get('detail', 'gpu_lost')}); no new worker is "
                                f"started on it; reboot the machine, then run again to resume"))
    if plan.then == After.CONFIG_ERROR:
        return _finish(s, State.FAILED, Exit(EXIT_CONFIG, f"{plan.incident['detail']}: {plan.advice}; not restarting"))
    if plan.then == After.SUCCEED:
        return _finish(s, State.SUCCEEDED, Exit(EXIT_OK, f"training finished after {s.attempt} attempt(s)"))
    if plan.then == After.STOP:
        saved = "after saving a checkpoint" if plan.saved else "without a new checkpoint"
        return _finish(s, State.STOPPED, Exit(EXIT_OK, f"stopped at rung {s.rung} {saved}; run again to resume"))
    return _restart(s, plan, now)


def _move_to(s: Supervision, rung: int) -> None:
    s.rung, s.rung_entered_trained = rung, s.trained()


def _restart(s: Supervision, plan: StopPlan, now: Now) -> list[Any]:
    """After a failure: count it against the budget, apply the remedy or climb, then spawn or back off."""
    s.restarts_by_reason[plan.reason.value] = s.restarts_by_reason.get(plan.reason.value, 0) + 1
    if plan.reason == Reason.PROBE:  # planned, saved first: no budget, no backoff
        s.probing_from = s.rung
        _move_to(s, s.rung - 1)
        return [Log("warning", f"one rung faster: rung {s.rung} ({s.ladder.label(s.rung)}), probing; a hang returns "
                               f"to rung {s.probing_from}"), _spawn(s)]
    if plan.reason == Reason.HANG:
        s.rung_hangs[str(s.rung)] = s.rung_hangs.get(str(s.rung), 0) + 1
    s.restart_times.append(now.wall)
    s.last_failure = plan.failure
    cfg = s.config.restart
    used = restart_budget.restarts_in_window(s.restart_times, now.wall, cfg)
    if used > cfg.max_restarts:
        return _finish(s, State.FAILED, Exit(
            EXIT_FAILED,
            f"restart budget spent: {used} restarts in the last {cfg.window:.0f} s (restart.max_restarts = "
            f"{cfg.max_restarts}); last failure: {plan.incident.get('detail') or plan.failure}; "
            f"fix the cause, then run again to resume at rung {s.rung}"))
    actions: list[Any] = []
    if plan.remedy:
        s.remedies.update(plan.remedy)
        actions.append(Log("warning", "from now on: " + ", ".join(f"{k}={v}" for k, v in plan.remedy.items())))
    if plan.climb and s.probing_from is not None:  # the probed rung failed: back to where it was safe, for longer
        back, s.probing_from = _climb_target(s), None
        key = str(back)
        s.probation[key] = 2 * s.probation.get(key, s.config.probe.probe_after or 0.0)
        gave_up = s.rung_hangs.get(str(s.rung), 0) >= s.config.probe.give_up_after
        _move_to(s, back)
        actions.append(Log("warning", f"the probed rung hung: back to rung {back} ({s.ladder.label(back)}), next probe "
                                      f"after {s.probation[key]:.0f} s" + (f"; rung {back - 1} hung "
                                      f"{s.config.probe.give_up_after} times and is not probed again" if gave_up else "")))
    elif plan.climb:
        if s.ladder.exhausted(s.rung):
            actions.append(Log("warning", f"ladder exhausted: staying at rung {s.rung} ({s.ladder.label(s.rung)})"))
        else:
            _move_to(s, _climb_target(s))
            actions.append(Log("warning", f"one rung safer: rung {s.rung} ({s.ladder.label(s.rung)})"))
    if plan.reason in (Reason.CRASH, Reason.OOM):
        s.consecutive_crashes += 1
        delay = restart_budget.backoff_delay(s.consecutive_crashes, cfg)
        s.state, s.backoff_until, s.stop = State.BACKOFF, now.mono + delay, None
        return actions + [Log("info", f"restarting in {delay:.1f} s (crash {s.consecutive_crashes} in a row)")]
    return actions + [_spawn(s)]


def _finish(s: Supervision, state: State, exit: Exit) -> list[Any]:
    s.state, s.exit, s.stop = state, exit, None
    return [exit]


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
        "worker_pid": s.worker_pid, "resumed_from": s.resumed_from, "settings": s.in_force,
        "seconds_since_progress": None if s.last_progress_at is None else now.mono - s.last_progress_at,
        "worker_uptime": None if s.spawned_at is None or s.worker_pid is None else now.mono - s.spawned_at,
        "worker_spawned": s.spawned_wall, "startup_seconds": s.startup_seconds,
        "watchdog": {"timeout": due.label, "fires_in": None if due.at is None else due.at - now.mono},
        "last_restart": s.restart_times[-1] if s.restart_times else None,
        "last_incident": s.incidents[-1] if s.incidents else None,
        "exit": asdict(s.exit) if s.exit else None,
        "last_checkpoint": None if s.checkpoint is None else {
            "path": s.checkpoint.path, "epoch": s.checkpoint.epoch, "batch": s.checkpoint.batch,
            "age_seconds": now.wall - s.checkpoint.wall, "seconds": s.checkpoint.seconds},
        "checkpoint_every": s.config.checkpoint.every,
        "trained_seconds": s.trained(), "lost_seconds": s.lost_seconds, "lost_batches": s.lost_batches,
        "goodput": s.goodput(now.wall), "run_started": s.run_started_wall,
        "rung_speed": s.rung_speed(s.rung), "rung0_speed": s.rung_speed(0),
        "rung_speeds": {k: s.rung_speed(int(k)) for k in s.rung_speeds},
        "node_rank": s.config.distributed.node_rank if s.config.distributed.several_hosts else None,
        "ranks": [{"rank": r, "local_rank": v.local_rank, "pid": v.pid, "device": v.device,
                   "seconds_since_progress": None if v.last_progress_at is None else now.mono - v.last_progress_at}
                  for r, v in sorted(s.ranks.items())],
        "probe": {"in_seconds": s.probe_in(), "from": s.probing_from, "probation": s.probation,
                  "hangs_by_rung": s.rung_hangs},
    }
