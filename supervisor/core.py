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

import math
import signal
from collections import deque
from dataclasses import asdict, dataclass, field
from enum import Enum
from typing import Any

from supervisor import restart_budget, watchdog
from supervisor.config import Config
from supervisor.exit_codes import EXIT_CONFIG, EXIT_FAILED, EXIT_OK, EXIT_REBOOT_NEEDED
from supervisor.ladder import Ladder

INCIDENTS_KEPT = 20
MIN_BATCH = 1  # halving the batch after GPU OOM stops here
NAN_BEATS = 3  # training beats in a row with a non-finite loss before the run counts as diverged
THROUGHPUT_WINDOW = 20  # training beats behind it/s


class State(str, Enum):
    STARTING = "starting"
    HEALTHY = "healthy"
    STOPPING = "stopping"
    BACKOFF = "backoff"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    STOPPED = "stopped"


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


@dataclass(frozen=True)
class Heartbeat:
    message: dict[str, Any]


@dataclass(frozen=True)
class WorkerExited:
    returncode: int  # negative: killed by that signal


@dataclass(frozen=True)
class TreeKilled:
    killed: int
    survivors: tuple[str, ...] = ()  # "pid 123 (python, disk-sleep)" for each process SIGKILL did not end


@dataclass(frozen=True)
class KernelMessage:
    """A classified kernel log line or GPU device event (see kernel_messages.KernelEvent)."""
    kind: str  # stall | gpu_fault | gpu_lost | oom
    message: str
    source: str
    pattern: str
    pid: int | None = None
    in_worker_tree: bool | None = None  # None when the message names no pid


@dataclass(frozen=True)
class SignatureSeen:
    """A line of the worker's output matched a failure signature (see signatures.py)."""
    name: str
    remedy: str
    advice: str
    line: str


@dataclass(frozen=True)
class StopRequested:
    signal: str = "SIGTERM"


@dataclass(frozen=True)
class Tick:
    """Time passed; deadlines are checked."""


# Actions --------------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Spawn:
    attempt: int
    rung: int
    settings: dict[str, Any]  # the rung's overrides


@dataclass(frozen=True)
class RequestCheckpoint:
    """Ask the worker to save a checkpoint at its next batch boundary and exit (SIGUSR1)."""


@dataclass(frozen=True)
class KillTree:
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
    phase: str = "setup"
    epoch: int = 0
    epochs: int = 0
    batch: int = 0
    batches: int = 0
    losses: dict[str, float] = field(default_factory=dict)
    lr: float | None = None


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
    progress_counter: int = -1
    last_progress_at: float | None = None  # monotonic
    progress: Progress = field(default_factory=Progress)
    settings: dict[str, Any] = field(default_factory=dict)  # what the worker reports really in force
    intervals: dict[str, deque] = field(default_factory=dict)
    throughput: deque = field(default_factory=lambda: deque(maxlen=THROUGHPUT_WINDOW))  # (mono, samples)
    last_error: str | None = None  # the worker's own last words ("RuntimeError: ...")
    pending: dict[str, Any] | None = None  # why the tree is being killed and what to do after
    backoff_until: float | None = None
    consecutive_crashes: int = 0
    last_failure: str | None = None
    restart_times: list[float] = field(default_factory=list)  # wall clock, for the budget
    restarts_by_reason: dict[str, int] = field(default_factory=dict)
    hangs_by_phase: dict[str, int] = field(default_factory=dict)
    incidents: list[dict[str, Any]] = field(default_factory=list)
    messages_ignored: int = 0  # from pids other than the worker's main process
    kernel_events: dict[str, int] = field(default_factory=dict)  # by kind, every classified message
    suspicion: dict[str, Any] | None = None  # a kernel line awaiting confirmation: {"event", "since", "progress"}
    oom: dict[str, Any] | None = None  # the OOM kill of a worker process, to name the crash that follows
    reboot_needed: bool = False
    signatures: dict[str, SignatureSeen] = field(default_factory=dict)  # seen in this attempt's output
    nan_beats: int = 0  # consecutive training beats with a NaN or inf loss
    remedies: dict[str, Any] = field(default_factory=dict)  # settings signatures added on top of the rung
    exit: Exit | None = None

    # -- derived values, for the agent, status and metrics --
    def deadline(self) -> tuple[float | None, str]:
        """When the watchdog fires next (monotonic), and which timeout that is."""
        if self.state == State.BACKOFF:
            return self.backoff_until, "backoff"
        if self.state == State.STOPPING and self.pending and self.pending.get("save_until") is not None:
            # Waiting for the checkpoint asked for; a worker that stalls meanwhile is hung and cannot save.
            at, how = self.pending["save_until"], "stop save_timeout"
            if self.last_progress_at is not None:
                t, _ = watchdog.phase_timeout(self.config.watchdog, self.progress.phase, self.intervals)
                if t is not None and self.last_progress_at + t < at:
                    at, how = self.last_progress_at + t, "stop stalled"
            return at, how
        if self.state == State.STARTING and self.spawned_at is not None:
            t = self.config.watchdog.startup_timeout
            return (None if t is None else self.spawned_at + t), "startup_timeout"
        at, how = None, ""
        if self.state == State.HEALTHY and self.last_progress_at is not None:
            t, how = watchdog.phase_timeout(self.config.watchdog, self.progress.phase, self.intervals)
            at = None if t is None else self.last_progress_at + t
        if self.suspicion is not None and self.state in (State.STARTING, State.HEALTHY):
            confirm = self.suspicion["since"] + self.config.kernel_log.confirm_window
            if at is None or confirm < at:
                return confirm, "kernel confirm window"
        return at, how

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

    def budget_left(self, wall: float) -> int:
        return restart_budget.budget_left(self.restart_times, wall, self.config.restart)

    # -- persistence: what a restarted supervisor needs to continue where it was --
    def persistent(self) -> dict[str, Any]:
        return {"rung": self.rung, "attempt": self.attempt, "restart_times": self.restart_times,
                "restarts_by_reason": self.restarts_by_reason, "hangs_by_phase": self.hangs_by_phase,
                "last_failure": self.last_failure, "incidents": self.incidents, "state": self.state.value,
                "kernel_events": self.kernel_events, "remedies": self.remedies}

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
        if record.get("state") == State.SUCCEEDED.value:
            self.state = State.SUCCEEDED


# The decision ---------------------------------------------------------------------------------------------

def decide(s: Supervision, event: Any, now: Now) -> tuple[Supervision, list[Any]]:
    if isinstance(event, Boot):
        return s, _boot(s)
    if isinstance(event, Spawned):
        return s, _spawned(s, event, now)
    if isinstance(event, Heartbeat):
        return s, _heartbeat(s, event.message, now)
    if isinstance(event, WorkerExited):
        return s, _exited(s, event.returncode, now)
    if isinstance(event, TreeKilled):
        return s, _tree_killed(s, event, now)
    if isinstance(event, StopRequested):
        return s, _stop(s, event, now)
    if isinstance(event, KernelMessage):
        return s, _kernel(s, event, now)
    if isinstance(event, SignatureSeen):
        return s, _signature(s, event)
    if isinstance(event, Tick):
        return s, _tick(s, now)
    raise TypeError(f"unknown event {event!r}")


def _boot(s: Supervision) -> list[Any]:
    if s.state == State.SUCCEEDED:
        return _finish(s, State.SUCCEEDED, Exit(EXIT_OK, "training already finished; nothing to do "
                                                         "(remove the state directory to train again)"))
    s.state = State.STARTING
    note = [Log("info", f"continuing at rung {s.rung} ({s.ladder.label(s.rung)}) after {s.attempt} attempts")] \
        if s.attempt else []
    return note + [_spawn(s)]


def _spawn(s: Supervision) -> Spawn:
    s.attempt += 1
    s.state = State.STARTING
    s.pending = None
    return Spawn(attempt=s.attempt, rung=s.rung, settings={**s.ladder.settings(s.rung), **s.remedies})


def _spawned(s: Supervision, event: Spawned, now: Now) -> list[Any]:
    s.worker_pid, s.spawned_at, s.spawned_wall, s.startup_seconds = event.pid, now.mono, now.wall, None
    s.resumed_from = event.resumed_from
    s.progress_counter, s.last_progress_at = -1, None
    s.progress = Progress()
    s.intervals, s.settings, s.last_error = {}, {}, None
    s.suspicion = s.oom = None
    s.signatures, s.nan_beats = {}, 0
    s.throughput.clear()
    origin = f"resuming from {event.resumed_from}" if event.resumed_from else "from scratch"
    return [Log("info", f"attempt {s.attempt}: worker pid {event.pid} at rung {s.rung} "
                        f"({s.ladder.label(s.rung)}), {origin}")]


def _heartbeat(s: Supervision, m: dict[str, Any], now: Now) -> list[Any]:
    saving = s.state == State.STOPPING and s.pending is not None and s.pending.get("save_until") is not None
    if s.state not in (State.STARTING, State.HEALTHY) and not saving:
        return []
    if m.get("pid") != s.worker_pid:
        s.messages_ignored += 1  # a DataLoader worker or a stray writer: never counts as progress
        return []
    kind = m["kind"]
    if kind == "error":
        s.last_error = str(m.get("error", ""))[:500]
        return []
    if kind == "settings":
        s.settings = dict(m.get("settings") or {})
        return []
    p = s.progress
    for key in ("epoch", "epochs", "batch", "batches"):
        if isinstance(m.get(key), int):
            setattr(p, key, m[key])
    if isinstance(m.get("losses"), dict):
        p.losses = {str(k): float(v) for k, v in m["losses"].items() if isinstance(v, (int, float))}
    if isinstance(m.get("lr"), (int, float)):
        p.lr = float(m["lr"])
    if m["progress"] <= s.progress_counter:
        return []  # a beat without progress is not progress
    phase = m["phase"]
    if kind == "beat" and s.last_progress_at is not None:
        window = s.intervals.setdefault(phase, deque(maxlen=s.config.watchdog.auto_window))
        window.append(now.mono - s.last_progress_at)
    s.progress_counter, s.last_progress_at, p.phase = m["progress"], now.mono, phase
    actions: list[Any] = []
    if s.suspicion is not None:
        event = s.suspicion["event"]
        s.suspicion = None
        actions.append(Log("info", f"kernel {event.kind} line while training progresses: counted, nothing killed "
                                   f"({event.message[:160]})"))
    if kind == "beat" and phase == "train" and p.losses:
        s.nan_beats = s.nan_beats + 1 if not all(math.isfinite(v) for v in p.losses.values()) else 0
        if s.nan_beats >= NAN_BEATS and s.state == State.HEALTHY and s.settings.get("amp", True) is not False:
            actions += _begin_stop(s, now, reason="nan", phase="train", climb=False, failure="nan",
                                   detail=f"non-finite losses in {s.nan_beats} batches in a row ({p.losses})")
            s.pending["remedy"] = {"amp": False}
            return actions
    if kind == "beat" and phase == "train":
        samples = m.get("samples")
        s.throughput.append((now.mono, samples if isinstance(samples, int) else 0))
        if s.state == State.STARTING:
            s.state = State.HEALTHY
            s.consecutive_crashes = 0
            s.startup_seconds = now.mono - (s.spawned_at or now.mono)
            actions.append(Log("info", f"attempt {s.attempt}: first training batch {s.startup_seconds:.1f} s "
                                       f"after spawn"))
    return actions


def _tick(s: Supervision, now: Now) -> list[Any]:
    at, how = s.deadline()
    if at is None or now.mono < at:
        return []
    if s.state == State.BACKOFF:
        return [_spawn(s)]
    if how in ("stop save_timeout", "stop stalled"):
        s.pending["save_until"] = None
        why = "did not save and exit in time" if how == "stop save_timeout" else "makes no progress: it is hung"
        return [Log("error", f"the worker {why}; killing it without a new checkpoint"), KillTree(s.incidents[-1])]
    if how == "kernel confirm window":
        event = s.suspicion["event"]
        phase = "startup" if s.state == State.STARTING else s.progress.phase
        detail = (f"kernel {event.kind} ({event.pattern}) and no progress within "
                  f"{s.config.kernel_log.confirm_window:.0f} s: {event.message[:300]}")
        actions = _begin_stop(s, now, reason="kernel", phase=phase, detail=detail, climb=True,
                              failure=f"kernel:{event.kind}")
        s.incidents[-1]["kernel_events"] = [asdict(event)]
        return actions
    if s.state == State.STARTING:
        phase, since = "startup", s.spawned_at
    else:
        phase, since = s.progress.phase, s.last_progress_at
    quiet = now.mono - (since or now.mono)
    detail = f"no progress for {quiet:.1f} s in {phase} ({how} {at - (since or at):.1f} s)"
    miopen = s.signatures.get("miopen_kdb_missing")
    if phase == "startup" and miopen and s.remedies.get("conv_fallback") != "on":
        actions = _begin_stop(s, now, reason="hang", phase=phase, climb=False, failure=f"hang:{phase}",
                              detail=f"{detail} after MIOpen's missing kernel database warning")
        s.pending["remedy"] = {"conv_fallback": "on"}
        return actions
    return _begin_stop(s, now, reason="hang", phase=phase, detail=detail, climb=True, failure=f"hang:{phase}")


def _exited(s: Supervision, code: int, now: Now) -> list[Any]:
    if s.state == State.STOPPING and s.pending and s.pending.get("save_until") is not None:
        s.pending["save_until"] = None  # saved and gone, as asked: clean up what is left of the tree
        s.pending["saved"] = code == 0
        if code == 0 and s.progress.phase == "done":
            s.pending["then"] = "succeed"  # it finished training before it got to our request
        return [KillTree(None)]
    if s.state not in (State.STARTING, State.HEALTHY):
        return []  # an exit we caused while stopping
    if code == 0 and s.progress.phase == "done":
        s.pending = {"then": "succeed"}
        s.state = State.STOPPING
        return [KillTree(None)]
    how = describe_exit(code)
    failure = f"crash:{s.last_error.split(':')[0]}" if s.last_error else f"crash:{how}"
    detail = how + (f": {s.last_error}" if s.last_error else "")
    if code == 0:
        detail = "exited with status 0 before training finished"
    reason, remedy = "crash", None
    for seen in s.signatures.values():
        if seen.remedy == "config_error":
            actions = _begin_stop(s, now, reason="crash", phase=s.progress.phase, climb=False, failure=seen.name,
                                  detail=f"{how}: {seen.line.strip()[:200]}")
            s.pending.update(then="config_error", advice=seen.advice)
            return actions
        if seen.remedy == "halve_batch":
            batch = s.settings.get("batch") or s.config.train.get("batch", 16)
            smaller = max(MIN_BATCH, int(batch) // 2) if isinstance(batch, (int, float)) and batch >= 1 else None
            reason, failure, detail = "oom", "gpu_oom", f"{how}: out of GPU memory ({seen.line.strip()[:160]})"
            if smaller is not None and smaller < batch:
                remedy = {"batch": smaller}
    if s.oom is not None:
        reason, failure = "oom", "oom"
        detail = f"{how} after the OOM killer took pid {s.oom['event'].pid}: {s.oom['event'].message[:200]}"
    repeat = failure == s.last_failure
    actions = _begin_stop(s, now, reason=reason, phase=s.progress.phase, detail=detail,
                          climb=repeat and remedy is None, failure=failure)
    s.pending["remedy"] = remedy
    if s.oom is not None:
        s.incidents[-1]["kernel_events"] = [asdict(s.oom["event"])]
    return actions


def _stop(s: Supervision, event: StopRequested, now: Now) -> list[Any]:
    """A first stop request lets the worker save a checkpoint (within save_timeout); a second one kills."""
    if s.state == State.STARTING:  # no batch since the checkpoint it resumed from: nothing new to save
        actions = _begin_stop(s, now, reason="stop", phase="startup", detail=f"{event.signal} received",
                              climb=False, failure=None)
        return actions + [KillTree(s.incidents[-1])]
    if s.state == State.HEALTHY:
        actions = _begin_stop(s, now, reason="stop", phase=s.progress.phase, detail=f"{event.signal} received",
                              climb=False, failure=None)
        t = s.config.watchdog.save_timeout
        s.pending["save_until"] = now.mono + (t if t is not None else 3600.0)
        return [actions[0], Log("info", "asking the worker to save a checkpoint and exit"), RequestCheckpoint()]
    if s.state == State.STOPPING and s.pending is not None:
        s.pending["then"] = "stop"
        if s.pending.get("save_until") is not None:
            s.pending["save_until"] = None
            return [Log("warning", f"{event.signal} again: killing the worker without waiting for its checkpoint"),
                    KillTree(s.incidents[-1])]
        return []
    if s.state == State.BACKOFF:
        return _finish(s, State.STOPPED, Exit(EXIT_OK, f"stopped on {event.signal}; run again to resume"))
    return []


def _signature(s: Supervision, event: SignatureSeen) -> list[Any]:
    """Remembered for this attempt; acted on when the worker crashes or hangs (see signatures.py)."""
    if s.state in (State.STARTING, State.HEALTHY) and event.name not in s.signatures:
        s.signatures[event.name] = event
        return [Log("warning", f"worker output shows {event.name}: {event.line[:200]}")]
    return []


def _kernel(s: Supervision, event: KernelMessage, now: Now) -> list[Any]:
    s.kernel_events[event.kind] = s.kernel_events.get(event.kind, 0) + 1
    running = s.state in (State.STARTING, State.HEALTHY)
    if event.kind == "gpu_lost":
        s.reboot_needed = True
        text = f"GPU lost ({event.pattern}): {event.message[:300]}"
        if running:
            actions = _begin_stop(s, now, reason="kernel", phase=s.progress.phase, detail=text, climb=False,
                                  failure="kernel:gpu_lost")
            s.incidents[-1]["kernel_events"] = [asdict(event)]
            s.pending["then"] = "reboot"
            return actions
        return [Log("error", text)]
    if not running:
        return []
    if event.in_worker_tree is False:
        return [Log("info", f"kernel {event.kind} line about pid {event.pid}, not the worker's: counted "
                            f"({event.message[:160]})")]
    if event.kind == "oom":
        if event.in_worker_tree:
            s.oom = {"event": event, "at": now.mono}
            return [Log("error", f"the OOM killer took worker process {event.pid}")]
        return []
    if s.suspicion is None:
        s.suspicion = {"event": event, "since": now.mono, "progress": s.progress_counter}
        return [Log("warning", f"kernel {event.kind} line ({event.pattern}); the worker must show progress "
                               f"within {s.config.kernel_log.confirm_window:.0f} s: {event.message[:160]}")]
    return []


def _begin_stop(s: Supervision, now: Now, *, reason: str, phase: str, detail: str, climb: bool,
                failure: str | None) -> list[Any]:
    incident = {
        "id": f"{s.attempt}-{len(s.incidents) + 1}-{int(now.wall)}",
        "time": now.wall,
        "reason": reason,
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
    s.incidents = (s.incidents + [incident])[-INCIDENTS_KEPT:]
    s.state = State.STOPPING
    s.pending = {"then": "stop" if reason == "stop" else "restart", "reason": reason, "climb": climb,
                 "failure": failure}
    if reason == "hang":
        s.hangs_by_phase[phase] = s.hangs_by_phase.get(phase, 0) + 1
    if reason == "stop":
        return [Log("info", f"stop requested ({detail})")]
    return [Log("error", f"{reason} in {phase}: {detail}; killing the worker tree"), KillTree(incident)]


def _tree_killed(s: Supervision, event: TreeKilled, now: Now) -> list[Any]:
    if s.state != State.STOPPING or s.pending is None:
        return []
    s.worker_pid = None
    if event.survivors:
        s.reboot_needed = True
        return _finish(s, State.FAILED, Exit(
            EXIT_REBOOT_NEEDED,
            f"{len(event.survivors)} worker process(es) survived SIGKILL ({'; '.join(event.survivors)}): stuck in the "
            f"GPU driver; no new worker is started on this GPU; reboot the machine, then run again to resume"))
    then = s.pending["then"]
    if then == "reboot":
        return _finish(s, State.FAILED, Exit(
            EXIT_REBOOT_NEEDED, f"the GPU is lost ({s.incidents[-1]['detail'] if s.incidents else 'gpu_lost'}); no "
                                f"new worker is started on it; reboot the machine, then run again to resume"))
    if then == "config_error":
        return _finish(s, State.FAILED, Exit(EXIT_CONFIG, f"{s.incidents[-1]['detail']}: {s.pending['advice']}; "
                                                          f"not restarting"))
    if then == "succeed":
        return _finish(s, State.SUCCEEDED, Exit(EXIT_OK, f"training finished after {s.attempt} attempt(s)"))
    if then == "stop":
        saved = "after saving a checkpoint" if s.pending.get("saved") else "without a new checkpoint"
        return _finish(s, State.STOPPED, Exit(EXIT_OK, f"stopped at rung {s.rung} {saved}; run again to resume"))

    reason, failure = s.pending["reason"], s.pending["failure"]
    s.restart_times.append(now.wall)
    s.restarts_by_reason[reason] = s.restarts_by_reason.get(reason, 0) + 1
    s.last_failure = failure
    cfg = s.config.restart
    used = restart_budget.restarts_in_window(s.restart_times, now.wall, cfg)
    if used > cfg.max_restarts:
        return _finish(s, State.FAILED, Exit(
            EXIT_FAILED,
            f"restart budget spent: {used} restarts in the last {cfg.window:.0f} s (restart.max_restarts = "
            f"{cfg.max_restarts}); last failure: {s.incidents[-1]['detail'] if s.incidents else failure}; "
            f"fix the cause, then run again to resume at rung {s.rung}"))
    actions: list[Any] = []
    if s.pending.get("remedy"):
        s.remedies.update(s.pending["remedy"])
        actions.append(Log("warning", "from now on: " + ", ".join(f"{k}={v}" for k, v in s.pending["remedy"].items())))
    if s.pending["climb"]:
        if s.ladder.exhausted(s.rung):
            actions.append(Log("warning", f"ladder exhausted: staying at rung {s.rung} ({s.ladder.label(s.rung)})"))
        else:
            s.rung = s.ladder.next(s.rung)
            actions.append(Log("warning", f"one rung safer: rung {s.rung} ({s.ladder.label(s.rung)})"))
    if reason in ("crash", "oom"):
        s.consecutive_crashes += 1
        delay = restart_budget.backoff_delay(s.consecutive_crashes, cfg)
        s.state, s.backoff_until, s.pending = State.BACKOFF, now.mono + delay, None
        return actions + [Log("info", f"restarting in {delay:.1f} s (crash {s.consecutive_crashes} in a row)")]
    return actions + [_spawn(s)]


def _finish(s: Supervision, state: State, exit: Exit) -> list[Any]:
    s.state, s.exit, s.pending = state, exit, None
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
    at, how = s.deadline()
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
        "suspicion": None if s.suspicion is None else s.suspicion["event"].message[:200],
        "worker_pid": s.worker_pid, "resumed_from": s.resumed_from, "settings": s.settings,
        "seconds_since_progress": None if s.last_progress_at is None else now.mono - s.last_progress_at,
        "worker_uptime": None if s.spawned_at is None or s.worker_pid is None else now.mono - s.spawned_at,
        "worker_spawned": s.spawned_wall, "startup_seconds": s.startup_seconds,
        "watchdog": {"timeout": how, "fires_in": None if at is None else at - now.mono},
        "last_restart": s.restart_times[-1] if s.restart_times else None,
        "last_incident": s.incidents[-1] if s.incidents else None,
        "exit": asdict(s.exit) if s.exit else None,
    }
