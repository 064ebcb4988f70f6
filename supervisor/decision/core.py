"""The decision core: what the supervisor does next, as a function of its state, an event and the time.

No I/O happens here. The agent (``agent.py``) turns the world into events (a heartbeat, the worker's exit,
the tree killed, a tick of the clock, a stop request) and executes the actions returned (spawn a worker,
kill its tree, log, exit). ``decide`` updates the state it is given in place and returns it with the
actions: a reducer, cheap enough to run for every heartbeat.

Life cycle (``State``)::

    STARTING --first training batch--> HEALTHY
    STARTING | HEALTHY --stall timeout, worker exit, stop request--> STOPPING (the tree is killed)
    STOPPING --tree gone--> STARTING (a hang restarts at once, at the rung its record says: rung_choice.py;
                                      survivors of SIGKILL in a file system's wait: once they are gone)
                          | BACKOFF  (a crash waits, then restarts at the same rung)
                          | SUCCEEDED (training finished) | FAILED (budget spent, reboot needed)
                          | UNSAVED (training finished, and no file of its weights was kept: exit 73)
                          | STOPPED (asked to stop; the next run resumes)
    BACKOFF --delay over--> STARTING
    any running state --another supervisor took the state directory--> STOPPING (no save) | FAILED (exit 78)

A crash climbs the ladder only when the same failure repeats; a hang moves to the rung of best expected goodput
(rung_choice.py), an untried safer one while that can pay. A restart after an attempt that saved no checkpoint
counts against the restart budget; a worker that survives SIGKILL ends the supervisor with "reboot needed".

This module dispatches each event and judges the verdicts of the clock and of an exit; the rest is by concern:
events.py and actions.py (what comes in and goes out), state.py (the records, and what persists), heartbeats.py
(a heartbeat, step by step), kernel.py (kernel messages), recovery/ (a hang's recovery tiers, walked cheapest
first: tier.py says what a tier is), stopping.py (the one way into STOPPING, and the end of
the run), after_stop.py (what follows a stop), probe.py (probing back down the ladder), goodput.py (work kept and
lost). The shell reads the decision through the package's face (``decision/__init__.py``) alone.
"""

from __future__ import annotations

import hashlib
import json
import signal
from typing import Any, Callable

from supervisor.decision import heartbeats, kernel, recovery
from supervisor.decision.learning import hang_evidence
from supervisor.decision.model import survivors
from supervisor.decision.model.actions import Exit, KillTree, Log, RequestCheckpoint
from supervisor.decision.model.events import (Boot, DevcoredumpsKept, HeartbeatReceived, IncidentEnriched, JobCheckpointRead, JobLadderRead,
                                        KernelMessage, Now, SearchNews, SignatureSeen, Spawned, StacksReadAhead,
                                        StateDirTaken, StopRequested, SupervisorPaused, SurvivorsGone, Tick,
                                        TreeActivity, TreeKilled, VerifiedCopyKept, WorkerExited)
from supervisor.decision.model.hang_history import HangHistory
from supervisor.decision.model.incident import one_line
from supervisor.decision.model.signatures import scan
from supervisor.decision.model.state import Attempt, JobRung, Supervision, later
from supervisor.decision.recovery import after_stop, stacks_ahead, stopping
from supervisor.decision.recovery.stopping import Stop
from supervisor.decision.recovery.tier import Verdict
from supervisor.decision.stall import kernel_search, witness
from supervisor.decision.stall.watchdog import DeadlineKind
from supervisor.exit_codes import EXIT_CONFIG, EXIT_OK
from supervisor.vocabulary import STARTUP_PHASE, After, Reason, Remedy, State
from worker.wire.contract import Phase

MIN_BATCH = 1  # halving the batch after GPU OOM stops here
OOM_EXIT_WINDOW = 30.0  # an OOM kill names the crash only if the worker exits within this many seconds of it

# Which state may follow which: ``decide`` refuses anything else, so the life cycle is data, not a habit.
TRANSITIONS: dict[State, frozenset[State]] = {
    State.STARTING: frozenset({State.STARTING, State.HEALTHY, State.STOPPING, State.SUCCEEDED}),
    State.HEALTHY: frozenset({State.HEALTHY, State.STOPPING}),
    State.STOPPING: frozenset({State.STOPPING, State.STARTING, State.BACKOFF, State.SUCCEEDED, State.FAILED,
                               State.STOPPED, State.UNSAVED}),
    State.BACKOFF: frozenset({State.BACKOFF, State.STARTING, State.STOPPED, State.FAILED}),
    State.SUCCEEDED: frozenset({State.SUCCEEDED}),
    State.FAILED: frozenset({State.FAILED}),
    State.STOPPED: frozenset({State.STOPPED}),
    State.UNSAVED: frozenset({State.UNSAVED}),
}


class TransitionError(RuntimeError):
    pass


# Another host's decisions made for these end its ranks at once (its tree killed, no save): the others restart with it.
# A probe's or a remedy's saves first (rank 0 may be on this host), and a crash's peers learn from their collectives.
HOST_FAILURES = (Reason.HANG.value, Reason.KERNEL.value)
CLOCK_SKEW = 2.0  # seconds two hosts' wall clocks may differ by (NTP keeps them within milliseconds)


def decide(s: Supervision, event: Any, now: Now) -> tuple[Supervision, list[Any]]:
    before = s.state
    actions = _dispatch(s, event, now)
    actions += stacks_ahead.stale(s)  # stacks read ahead for a stall that is over go
    if s.state not in TRANSITIONS[before]:
        raise TransitionError(f"{before.value} -> {s.state.value} on {type(event).__name__}")
    s.watch = recovery.watch(s)  # the decision's one judgement of the stall: read until the next decision
    return s, actions


def restore(s: Supervision, record: dict[str, Any]) -> None:
    """The kept fields of a state file's ``record`` into ``s`` (``Supervision.restore``), and what it watches."""
    s.restore(record)
    s.watch = recovery.watch(s)


# Each event and the handler that decides it: the one place an event is routed. A recovery tier's own events go to
# the walk over the tiers, which hands each to the tier under way.
HANDLERS: dict[type, Callable[[Supervision, Any, Now], list[Any]]] = {
    HeartbeatReceived: lambda s, e, now: heartbeats.received(s, e.message, now, e.from_worker_tree),
    Tick: lambda s, e, now: _tick(s, now),
    Boot: lambda s, e, now: _boot(s, now),
    Spawned: lambda s, e, now: _spawned(s, e, now),
    WorkerExited: lambda s, e, now: _exited(s, e, now),
    SurvivorsGone: lambda s, e, now: after_stop.survivors_gone(s, e, now),
    TreeKilled: lambda s, e, now: after_stop.tree_killed(s, e, now),
    IncidentEnriched: lambda s, e, now: _enriched(s, e),
    StopRequested: lambda s, e, now: _stop(s, e, now),
    KernelMessage: lambda s, e, now: kernel.message(s, e, now),
    DevcoredumpsKept: lambda s, e, now: kernel.kept(s, e),
    SignatureSeen: lambda s, e, now: _signature(s, e, now),
    SearchNews: lambda s, e, now: kernel_search.news(s, e, now),
    SupervisorPaused: lambda s, e, now: _paused(s, e, now),
    StateDirTaken: lambda s, e, now: _state_dir_taken(s, e, now),
    JobLadderRead: lambda s, e, now: _job_ladder(s, e, now),
    JobCheckpointRead: lambda s, e, now: heartbeats.job_checkpoint(s, e, now),
    TreeActivity: lambda s, e, now: _tree_activity(s, e),
    StacksReadAhead: lambda s, e, now: stacks_ahead.read(s, e, now),
    VerifiedCopyKept: lambda s, e, now: _verified_copy(s, e),
    **{kind: recovery.on_event for kind in recovery.EVENTS},
}


def _dispatch(s: Supervision, event: Any, now: Now) -> list[Any]:
    handler = HANDLERS.get(type(event))
    if handler is None:
        raise TypeError(f"unknown event {event!r}")
    return handler(s, event, now)


def _boot(s: Supervision, now: Now) -> list[Any]:
    if s.goodput.run_started_wall is None:
        s.goodput.run_started_wall = now.wall
    s.goodput.booted_at = now.mono
    if s.state == State.SUCCEEDED:
        if s.training_fingerprint not in (None, training_fingerprint(s)):
            # Another config pointed at a finished training's directory: its record stays as it is.
            return stopping.end_run(s, State.SUCCEEDED, Exit(
                EXIT_CONFIG, f"{s.config.state_dir} holds a finished training of another [train] table or ladder; "
                             f"point state_dir (or the top-level name) elsewhere"))
        return stopping.end_run(s, State.SUCCEEDED, Exit(EXIT_OK, "training already finished; nothing to do "
                                                                 "(remove the state directory to train again)"))
    s.state = State.STARTING
    note = []
    fingerprint = training_fingerprint(s)
    if s.training_fingerprint not in (None, fingerprint) and (s.rung or s.remedies):
        note.append(Log("warning", f"[train] or the ladder changed since rung {s.rung} was reached: starting again at "
                                   f"rung 0 ({s.ladder.label(0)}) without the remedies {s.remedies or '{}'}"))
        s.remedies, s.startup_failure, s.probe.probing_from = {}, None, None
        s.hang_history = HangHistory()
        for r in s.rungs.values():  # what the hangs taught goes; speeds, probes that hung, in-place costs stay
            r.seconds, r.hangs, r.starts, r.probation = 0.0, 0, [], None
        s.move_to(0)
    elif s.attempt:
        note.append(Log("info", f"continuing at rung {s.rung} ({s.ladder.label(s.rung)}) after {s.attempt} attempts"))
    s.training_fingerprint = fingerprint
    return note + [after_stop.spawn(s)]


def training_fingerprint(s: Supervision) -> str:
    """What the rung and remedies were earned under: the [train] table and the ladder, in a stable spelling."""
    text = json.dumps({"train": s.config.train, "ladder": list(s.ladder.rungs)}, sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def _spawned(s: Supervision, event: Spawned, now: Now) -> list[Any]:
    s.current = Attempt(worker_pid=event.pid, spawned_at=now.mono, spawned_wall=now.wall, step_since=now.mono,
                        step_entered=now.mono, start=event.start, start_why=event.start_why, resumed_from=event.resumed_from, job_seq=s.job_seq,
                        resumed_at=(s.checkpoint.epoch, s.checkpoint.batch) if event.resumed_from and s.checkpoint
                        else None)
    s.hang_history.spawned(now.mono)
    origin = f"resuming from {event.resumed_from}" if event.resumed_from else "from scratch"
    return [Log("info", f"attempt {s.attempt}: worker pid {event.pid} at rung {s.rung} "
                        f"({s.ladder.label(s.rung)}), {origin}")]


def _tick(s: Supervision, now: Now) -> list[Any]:
    # the stall the last decision judged (the state has not changed since): the verdict, its tier and its incident
    # read this one
    stall, due, ahead = s.watch.stall, s.watch.deadline, s.watch.stacks_at
    if due.at is None or now.mono < due.at:
        return stacks_ahead.ask(s, now, stall) if ahead is not None and now.mono >= ahead else []
    if ahead is not None:
        # A hang's verdict due before its stacks were read (its bound fell at once: an idle tree, a silent witness):
        # they are read first and the verdict is checked again after them, so progress that came meanwhile (the
        # reading holds the supervisor for a second or more) drops it: no kill after the wait ended.
        return stacks_ahead.ask(s, now, stall)
    if due.kind == DeadlineKind.BACKOFF:
        return [after_stop.spawn(s)]
    if due.kind == DeadlineKind.SURVIVORS:
        return after_stop.survivors_overdue(s, now)
    if due.kind in (DeadlineKind.SAVE, DeadlineKind.SAVE_STALLED):
        why = "did not save and exit in time" if due.kind == DeadlineKind.SAVE else "makes no progress: it is hung"
        return [Log("error", f"the worker {why}; killing it without a new checkpoint"),
                *stopping.save_failed(s, f"asked to save, the worker {why}", Reason.HANG)]
    a = s.current
    if due.kind == DeadlineKind.RECOVERY:
        return recovery.overdue(s, now)
    phase = STARTUP_PHASE if s.state == State.STARTING else a.progress.phase
    if due.kind == DeadlineKind.KERNEL_CONFIRM:
        return kernel.unconfirmed(s, now, phase, stall)
    since = stall.since  # a phase's or a startup step's deadline is its stall's (a search's: from its last line)
    quiet = now.mono - since
    where = f"{phase} step {a.startup_step.value}" if s.state == State.STARTING else phase
    detail = f"no progress for {quiet:.1f} s in {where} ({due.label} {due.at - since:.1f} s)"
    if (search := kernel_search.in_step(s) or kernel_search.in_stall(s)) is not None:
        detail += f": a kernel search went silent, {kernel_search.silent(search, now)}"
    silent = stall.word.silent
    if silent is not None and now.mono >= silent:
        detail += f": {witness.silence(now.mono - silent + witness.SILENT_AFTER, a.thread_idle_since is not None)}"
        where = stacks_ahead.where(s, stall)
        detail += f"; the stacks saw: {where}" if where else ""
    elif stall.one_place is not None:
        who = "the training process" if stall.word.seen.rank is None else f"rank {stall.word.seen.rank}"
        detail += f": {who} was held at one place ({stall.one_place}) for {quiet:.1f} s"
    if phase == Phase.DONE.value:
        # Training finished and its last checkpoint is written: a worker that then never exits (stuck in the GPU
        # runtime's teardown) has nothing left to lose. Its tree is killed and the run ends as it would have.
        detail = f"{detail}: it said training was done and did not exit; nothing is lost"
        return stopping.begin(s, now, Stop(Reason.HANG, phase, detail, failure="hang:done", then=After.SUCCEED),
                              Verdict(phase, detail, stall=stall))
    remedy = _remedy(s, Reason.HANG, phase)
    if remedy is not None:
        seen, change = remedy
        detail = f"{detail} after {seen.name}: {seen.advice}"
        return stopping.begin(s, now, Stop(Reason.HANG, phase, detail, failure=f"hang:{phase}", remedy=change),
                              Verdict(phase, detail, stall=stall))
    return recovery.hang(s, now, phase, detail, stall)  # the cheapest tier that applies first, the restart last


def _remedy(s: Supervision, reason: Reason, phase: str, ending: SignatureSeen | None = None
            ) -> tuple[SignatureSeen, dict[str, Any]] | None:
    """The one place a failure signature becomes a change of settings: for a hang, any seen in this attempt (a
    warning before it); for a crash, only the one of the failure that ended the worker (``ending``)."""
    a = s.current
    for seen in a.signatures.values() if reason == Reason.HANG else [ending] if ending else []:
        if seen.remedy == Remedy.CONV_FALLBACK and reason == Reason.HANG and phase == STARTUP_PHASE \
                and s.remedies.get("conv_fallback") != "on":
            return seen, {"conv_fallback": "on"}
        if seen.remedy == Remedy.HALVE_BATCH and reason == Reason.CRASH:
            batch = (a.in_force.batch if a.in_force else None) or s.config.train.get("batch", 16)
            if isinstance(batch, (int, float)) and batch >= 1 and max(MIN_BATCH, int(batch) // 2) < batch:
                return seen, {"batch": max(MIN_BATCH, int(batch) // 2)}
            return seen, {}
    return None


def _exited(s: Supervision, event: WorkerExited, now: Now) -> list[Any]:
    code, a = event.returncode, s.current
    if s.saving():
        if code == 0 and a.progress.phase == Phase.DONE.value:
            stopping.finished(s, s.stop, event.weights)  # it finished training before it got to our request
        elif not (s.stop.saved or code == 0 and not s.kind.saves_on_request):  # SIGTERMed: exit 0 says it saved
            # Our worker exits 0 after a failed save too (a full disk): only its checkpoint message says it saved.
            how = describe_exit(code)
            return [Log("error", f"the worker {how} without the checkpoint asked for")] + stopping.save_failed(
                s, f"asked to save, the worker {how} without writing a checkpoint", Reason.CRASH)
        s.stop.save_until = None  # saved and gone, as asked: clean up what is left of the tree
        s.stop.saved = True
        return [KillTree(None)]
    if s.state not in (State.STARTING, State.HEALTHY):
        return []  # an exit we caused while stopping
    if code == 0 and (a.progress.phase == Phase.DONE.value or s.kind.exit_0_finishes):
        return stopping.trained_to_the_end(s, event.weights)
    how = describe_exit(code)
    if a.recovery is not None:  # the hang's incident is open: the exit ends its tier, the next takes it
        return recovery.escalate(s, now, f"the worker {how} during the {a.recovery.tier.name.label} recovery"
                                         + (f": {a.last_error}" if a.last_error else ""))
    if code == EXIT_CONFIG:  # the worker's own verdict: restarting cannot help (a checkpoint of another training)
        return stopping.begin(s, now, Stop(
            Reason.CRASH, a.progress.phase, failure="worker:config", then=After.CONFIG_ERROR,
            advice="fix the configuration or the state directory, then run again",
            detail=f"{how}: {(event.last_words or 'the worker refused its configuration')[:300]}"))
    ending = _ending_signature(s, event.last_words)
    timed_out = ending if ending is not None and ending.remedy == Remedy.COLLECTIVE_HANG else \
        next((seen for seen in a.signatures.values() if seen.remedy == Remedy.COLLECTIVE_HANG), None)
    if timed_out is not None:  # torch's own collective bound ended a rank before our verdict: the same hang
        phase = STARTUP_PHASE if s.state == State.STARTING else a.progress.phase
        return stopping.begin(s, now, Stop(Reason.HANG, phase, failure=f"hang:{phase}",
                                           detail=f"{how} after torch's collective timeout ended a rank "
                                                  f"({timed_out.line.strip()[:240]}): {timed_out.advice}"))
    if ending is not None and ending.remedy == Remedy.PEER_LOST and s.config.distributed.several_hosts:
        if not _own_error_first(a):
            return _peer_lost(s, now, ending, f"{how} after its rank")
        a.last_error = a.first_error  # its own crash, whose reset reached its local peers: the crash its words name
    gpu_hang = ending if ending is not None and ending.remedy == Remedy.GPU_HANG else \
        next((seen for seen in a.signatures.values() if seen.remedy == Remedy.GPU_HANG), None)
    if gpu_hang is not None:  # ROCr aborted the worker on a hung GPU: the hang it is, up the ladder as any hang
        hang_evidence.fault_seen(s, gpu_hang.name)
        phase = STARTUP_PHASE if s.state == State.STARTING else a.progress.phase
        return stopping.begin(s, now, Stop(Reason.HANG, phase, failure=f"hang:{phase}", climb=True,
                                           detail=f"{how} after ROCr's {gpu_hang.name} "
                                                  f"({gpu_hang.line.strip()[:240]}): {gpu_hang.advice}"))
    if ending is not None and ending.remedy == Remedy.CONFIG_ERROR:
        return stopping.begin(s, now, Stop(Reason.CRASH, a.progress.phase, failure=ending.name,
                                           then=After.CONFIG_ERROR, advice=ending.advice,
                                           detail=f"{how}: {ending.line.strip()[:200]}"))
    reason, failure = Reason.CRASH, f"crash:{a.last_error.split(':')[0]}" if a.last_error else f"crash:{how}"
    if s.state == State.STARTING:  # before its first batch: no rung changes that, and a repeat is deterministic
        words = a.last_error or event.last_words or how
        if s.startup_failure == f"{failure}|{words}":
            return stopping.begin(s, now, Stop(
                Reason.CRASH, STARTUP_PHASE, failure=failure, then=After.CONFIG_ERROR,
                advice="it failed the same way before its first batch on two attempts in a row, whatever the rung; "
                       "fix the cause, then run again",
                detail=f"{how}: {words[:300]}"))
        s.startup_failure = f"{failure}|{words}"
    detail = "exited with status 0 before training finished" if code == 0 else \
        how + (f": {a.last_error}" if a.last_error else "")
    change = None
    remedy = _remedy(s, Reason.CRASH, a.progress.phase, ending)
    if remedy is not None:  # out of GPU memory
        seen, change = remedy
        reason, failure, detail = Reason.OOM, seen.name, f"{how}: out of GPU memory ({seen.line.strip()[:160]})"
    kernel_events = ()
    if a.oom is not None and now.mono - a.oom.at <= OOM_EXIT_WINDOW:
        reason, failure, kernel_events = Reason.OOM, "oom", (a.oom.event,)
        detail = f"{how} after the OOM killer took pid {a.oom.event.pid}: {a.oom.event.message[:200]}"
    return stopping.begin(s, now, Stop(reason, a.progress.phase, detail=detail, failure=failure, remedy=change or None,
                                       climb=failure == s.last_failure and not change and s.state == State.HEALTHY,
                                       kernel_events=kernel_events))


def _verified_copy(s: Supervision, event: VerifiedCopyKept) -> list[Any]:
    """The newest checkpoint's verified copy kept, or why not: said now, and again as the run ends."""
    s.verified_copy_problem = event.problem
    return [Log("error", event.problem)] if event.problem else []


def _ending_signature(s: Supervision, last_words: str | None) -> SignatureSeen | None:
    """The signature of the failure that ended the worker, read from its own last error, else its last line of
    output. A line seen earlier (an optional logger's ModuleNotFoundError, one write that hit a full disk) says
    nothing about a later crash of another cause."""
    for words in (s.current.last_error, last_words):
        found = scan(words) if words else None
        if found is not None:
            return SignatureSeen(found.name, found.remedy, found.advice, words)
    return None


def describe_exit(code: int) -> str:
    if code < 0:
        try:
            return f"killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
    return f"exited with status {code}"


def _stop(s: Supervision, event: StopRequested, now: Now) -> list[Any]:
    """A first stop request lets the worker save a checkpoint (within save_timeout); a second one kills."""
    detail = f"{event.signal} received"
    if s.state == State.STARTING:  # no batch since the checkpoint it resumed from: nothing new to save
        return stopping.begin(s, now, Stop(Reason.STOP, STARTUP_PHASE, detail=detail, then=After.STOP))
    if s.state == State.HEALTHY:
        actions = stopping.begin(s, now, Stop(Reason.STOP, s.current.progress.phase, detail=detail, then=After.STOP,
                                              save_until=stopping.save_deadline(s, now)))
        return actions + [Log("info", "asking the worker to save a checkpoint and exit"), RequestCheckpoint()]
    if s.state == State.STOPPING and s.stop is not None and s.stop.survivors:  # nothing left to save or wait for
        return stopping.end_run(s, State.STOPPED, Exit(
            EXIT_OK, f"stopped on {event.signal} while {len(s.stop.survivors)} survivor(s) of SIGKILL still wait in "
                     f"the kernel ({survivors.describe(s.stop.survivors)}); run again to resume"))
    if s.state == State.STOPPING and s.stop is not None:
        s.stop.then = After.STOP
        if s.stop.reason == Reason.PROBE and s.stop.save_until is not None:
            # The probe's save is under way: it serves the stop, which waits for it as a first request does.
            s.stop.reason = Reason.STOP
            s.amend(s.stop.incident, reason=Reason.STOP, detail=f"{s.stop.incident.detail}; then {detail}")
            return [Log("info", f"stop requested ({detail}) while the worker saves for a probe: that checkpoint "
                                f"serves the stop")]
        if s.stop.save_until is not None:
            return [Log("warning", f"{event.signal} again: killing the worker without waiting for its checkpoint"),
                    *stopping.save_failed(s, f"{event.signal} again before the checkpoint came", Reason.STOP)]
        return []
    if s.state == State.BACKOFF:
        return stopping.end_run(s, State.STOPPED, Exit(EXIT_OK, f"stopped on {event.signal}; run again to resume"))
    return []


def _paused(s: Supervision, event: SupervisorPaused, now: Now) -> list[Any]:
    """Every deadline moves by the pause: the worker may well have progressed while nobody read its beats."""
    gap, a = event.seconds, s.current
    a.shift(gap)
    if a.training is not None:  # not a deadline: the training is timed by the beats, which say whether it went on
        a.training.pause = (now.mono - gap, now.mono)
    a.idle_since, a.waits_outside, a.stopped = None, frozenset(), frozenset()  # unknown over the pause: the sampler starts again
    a.thread_idle_since, a.spun_beside = None, ()
    s.backoff_until = later(s.backoff_until, gap)
    if s.stop is not None:
        s.stop.save_until = later(s.stop.save_until, gap)
    return [Log("warning", f"the supervisor itself did not run for {gap:.1f} s (stopped or suspended): its "
                           f"deadlines move by as much instead of blaming the worker")]


def _tree_activity(s: Supervision, event: TreeActivity) -> list[Any]:
    """An idle tree lowers the floor of its stall's auto bound (watchdog.current_stall); a report that comes
    between two workers is nobody's. A process it shows stopped has said its last word (witness.still_said)."""
    if s.state in (State.STARTING, State.HEALTHY) and s.current.worker_pid is not None:
        a = s.current
        a.idle_since, a.waits_outside, a.stopped = event.idle_since, event.outside, event.stopped
        a.thread_idle_since, a.spun_beside = event.thread_idle_since, event.beside
        a.waits = witness.still_said(a.waits, a.ranks, a.progress_pid, event.stopped)
    return []


def _state_dir_taken(s: Supervision, event: StateDirTaken, now: Now) -> list[Any]:
    advice = "this one stopped its worker; stop the other, or give each supervisor its own state_dir"
    if s.state in (State.STARTING, State.HEALTHY):
        phase = STARTUP_PHASE if s.state == State.STARTING else s.current.progress.phase
        return stopping.begin(s, now, Stop(Reason.STOP, phase, detail=event.detail, then=After.CONFIG_ERROR,
                                           advice=advice))
    if s.state == State.STOPPING and s.stop is not None:
        s.stop.then, s.stop.advice = After.CONFIG_ERROR, advice
        if s.stop.incident is not None:
            s.amend(s.stop.incident, detail=f"{event.detail} (while stopping: {s.stop.incident.detail})")
        if s.stop.save_until is not None:  # its save would land in the other supervisor's training
            return [Log("error", event.detail)] + stopping.save_failed(s, "the state directory was taken", Reason.STOP)
        return [Log("error", event.detail)]
    if s.state == State.BACKOFF:
        return stopping.end_run(s, State.FAILED, Exit(EXIT_CONFIG, f"{event.detail}: {advice}; not restarting"))
    return []


def _signature(s: Supervision, event: SignatureSeen, now: Now) -> list[Any]:
    """Remembered for this attempt; acted on if the worker then hangs (a crash is judged by its own last words).
    Several hosts: a rank's lost peer is acted on at once: that rank is dying of it, and its launcher's wind-down
    (seconds: its rendezvous closed, the worker's exit) is the critical path of both hosts' restart."""
    if s.state in (State.STARTING, State.HEALTHY) and event.name not in s.current.signatures:
        s.current.signatures[event.name] = event
        seen = [Log("warning", f"worker output shows {event.name}: {event.line[:200]}")]
        if event.remedy == Remedy.PEER_LOST and s.config.distributed.several_hosts and s.current.recovery is None \
                and not _own_error_first(s.current):
            return seen + _peer_lost(s, now, event, "a rank")
        return seen
    return []


def _own_error_first(a: Attempt) -> bool:
    """A rank of this host reported an error of its own before any lost a peer: with several local ranks, the reset
    its local peers then met is its own crash's, judged as a crash when the worker exits (not another host's)."""
    found = scan(a.first_error) if a.first_error else None
    return a.first_error is not None and (found is None or found.remedy != Remedy.PEER_LOST)


def _peer_lost(s: Supervision, now: Now, seen: SignatureSeen, who: str) -> list[Any]:
    """A rank of this host lost another host's mid-collective: that host's hang or crash, which its own supervisor
    judges. This host restarts at once to meet it again: no crash counted, no backoff, no rung change (after_stop)."""
    return _restart_with_peers(s, now, f"{who} lost another host's ({seen.line.strip()[:240]}): {seen.advice}")


def _restart_with_peers(s: Supervision, now: Now, detail: str) -> list[Any]:
    """Another host's failure ends this attempt: restarted at once, reason peer (after_stop.py)."""
    phase = STARTUP_PHASE if s.state == State.STARTING else s.current.progress.phase
    return stopping.begin(s, now, Stop(Reason.PEER, phase, failure=f"peer:{phase}", detail=detail))


def _enriched(s: Supervision, event: IncidentEnriched) -> list[Any]:
    incident = s.stop.incident if s.stop is not None else None
    if incident is None or incident.id != event.incident_id:
        return []
    detail = incident.detail
    if event.output_note and incident.phase == STARTUP_PHASE:
        detail += f"; {event.output_note}"
    stacks = event.stacks or incident.stacks
    said = witness.telling(s.current.waits, s.current.loaders)[0] if incident.witness else None
    agreed = None if said is None or stacks is None else \
        witness.WAITS[said.report.kind].names_loader == stacks.in_loader_worker  # both blame a loader worker, or neither
    enriched = s.amend(incident, processes=event.processes, output_tail=event.output_tail, stacks=stacks,
                       detail=detail, host=event.host, witness_agreed=agreed,
                       flight_recorder=event.flight_recorder or incident.flight_recorder,
                       devcoredumps=event.devcoredumps or incident.devcoredumps)
    # Where it hung, in the journal: decided once the kill's own lines are out (the agent queues this event).
    return [Log("info", one_line(enriched.to_dict()))] if event.stacks is not None else []


def _ends_this_attempt(s: Supervision, event: JobLadderRead) -> bool:
    """Another host's decision for its hang, newer than the one this attempt started under and made after its spawn
    (a shared directory's cached attributes may show an old one late; the hosts' clocks agree within SKEW)."""
    made = event.cause.get("time")
    return event.cause.get("reason") in HOST_FAILURES and event.seq > s.current.job_seq \
        and s.current.recovery is None and s.current.spawned_wall is not None \
        and (not isinstance(made, (int, float)) or made >= s.current.spawned_wall - CLOCK_SKEW)


def _peer_restarts(s: Supervision, now: Now, event: JobLadderRead) -> list[Any]:
    """Another host said it kills its tree for a hang: this host's ranks lose theirs; restarted at once as for a lost
    peer (reason peer: no crash counted, no backoff, no rung change)."""
    host = f"host {event.node_rank}" + (f" ({event.host})" if event.host else "")
    what = str(event.cause.get("reason")) + (f" in {event.cause['phase']}" if event.cause.get("phase") else "")
    return _restart_with_peers(s, now, f"{host} restarts for its {what}: this host's ranks would lose theirs")


def _job_ladder(s: Supervision, event: JobLadderRead, now: Now) -> list[Any]:
    """Another host's ladder decision: this host's next attempt goes where it says, whatever this host decided at
    the same moment (its own choice is dropped; the running attempt keeps its rung). Two decisions with the same
    number (made at once) resolve to the one the file kept, which every host reads. One made for that host's hang,
    newer than the one this attempt started under, is that host's tree being killed: this attempt's ranks are about
    to lose theirs, so it restarts now, as for a lost peer, not when a collective fails or its own bound runs out
    (NCCL may say nothing of a peer gone, and the other host's bound would be the critical path)."""
    own = event.node_rank == s.config.distributed.node_rank
    if not s.config.distributed.several_hosts or event.seq < s.job_seq or own:
        return []
    s.job_seq = event.seq
    restarts = []
    if s.state in (State.STARTING, State.HEALTHY):
        s.current.peer_cause = {**event.cause, "node_rank": event.node_rank, "host": event.host}
        if _ends_this_attempt(s, event):
            restarts = _peer_restarts(s, now, event)
    if not 0 <= event.rung < len(s.ladder):
        return restarts
    s.job_next = JobRung(event.rung, dict(event.remedies))
    replaced = s.stop is not None and (s.stop.climb or bool(s.stop.remedy))
    if s.stop is not None:  # this host's own climb or remedy, decided at the same moment, is the job's to replace
        s.stop.climb, s.stop.choice, s.stop.remedy = False, None, None
    if (event.rung, event.remedies) == (s.rung, s.remedies) and not replaced:
        return restarts
    return restarts + [Log("warning", f"job-wide ladder: host {event.node_rank} moved the job to rung {event.rung} "
                           f"({s.ladder.label(event.rung)})" + (f" with {event.remedies}" if event.remedies else "")
                           + "; this host's next attempt starts there")]
