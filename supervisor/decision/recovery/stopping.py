"""The one way into STOPPING, and the one way out of the run.

Whatever stops a worker (a hang, a confirmed kernel line, a crash, NaN losses, a stop request, a probe, another
supervisor taking the state directory, a finished training) goes through ``begin`` (with an incident) or
``trained_to_the_end`` (without): the attempt is closed into the goodput account, the plan of what follows is set,
and the tree is killed at once unless the worker was asked to save first. What follows the kill is after_stop.py's.
``end_run`` ends the run in a final state, with every incident written.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, replace
from typing import Any

from supervisor.decision.learning import choices, goodput
from supervisor.decision.model import rung_choice
from supervisor.decision.model.actions import Exit, KillTree, Log, PrimeStandby, PublishLadder
from supervisor.decision.model.events import KernelMessage, Now, WeightsKept
from supervisor.decision.model.hang_history import HangPoint
from supervisor.decision.model.incident import Incident
from supervisor.decision.model.state import StopPlan, Supervision
from supervisor.decision.recovery import stacks_ahead, tier
from supervisor.decision.recovery.tier import Verdict
from supervisor.decision.stall import kernel_search, watchdog
from supervisor.vocabulary import After, Reason, State, Tier

SAVE_WAIT_UNBOUNDED = 3600.0  # how long a stop waits for the worker's checkpoint when save_timeout is "off"


@dataclass(frozen=True)
class Stop:
    """What stops the worker and what follows: ``begin``'s question, asked by every way a worker ends."""
    reason: Reason
    phase: str
    detail: str
    failure: str | None = None  # names the failure, so a repeat can be told from a first time (StopPlan.failure)
    then: After | None = None  # what follows the kill; None: a restart (a stop's own: After.STOP)
    climb: bool = False  # the next attempt moves up the ladder (a hang: where its choice says)
    remedy: dict[str, Any] | None = None  # settings added on top of the rung from the next attempt on
    advice: str | None = None  # After.CONFIG_ERROR: what the user should change
    kernel_events: tuple[KernelMessage, ...] = ()  # the kernel's lines that made the verdict
    save_until: float | None = None  # monotonic: the worker was asked to save first, and is killed only after that


def begin(s: Supervision, now: Now, stop: Stop, verdict: Verdict | None = None) -> list[Any]:
    """Open the incident and plan what follows; the tree is killed at once unless the worker was asked to save.
    ``verdict``: a hang's, from a recovery tier (recovery/__init__.py) or the tick: the stall judged for it, and the
    incident a cheaper tier opened before it escalated (amended, not doubled) with the reason it did."""
    a = s.current
    reason, phase, detail, then, save_until = stop.reason, stop.phase, stop.detail, stop.then, stop.save_until
    climb, remedy, incident = stop.climb, stop.remedy, verdict.incident if verdict else None
    earlier = s.record_complete(still_open=incident)  # the one before, if its restart never reached a batch
    point = HangPoint(phase, a.progress.epoch, a.progress.batch, a.resumed_at, s.rung) \
        if reason in (Reason.HANG, Reason.KERNEL) else None
    # a hang's stall, judged once: the verdict's (the tick's, an escalation's), else the one the last decision left
    stall = (verdict.stall if verdict is not None else s.watch.stall) if point is not None else None
    if point is not None and stall is not None and s.state == State.HEALTHY and then in (None, After.RESTART):
        point = replace(point, wait=watchdog.wait_of(stall.word), short=watchdog.short_of_own(stall))
    last_progress_at, lost_before = a.last_progress_at, s.goodput.lost_seconds
    # A stop or probe that saves loses nothing (unless its save fails), nor does a kill after training was done.
    loss, resumes_from, at_risk = goodput.close_attempt(s, lost=save_until is None and then != After.SUCCEED)
    owed = None
    if point is not None and then in (None, After.RESTART):
        s.hang_history.hang(point, s.trained(), last_progress_at, s.goodput.lost_seconds - lost_before)
        owed = s.hang_history.owed_point()
    if s.job_next is not None:  # another host already decided where the job goes for this attempt's failure
        climb, remedy = False, None
    choice = choices.after_a_hang(s, reason == Reason.KERNEL) if climb and point is not None and s.probe.probing_from is None else None
    several_hosts = s.config.distributed.several_hosts
    starting = s.state == State.STARTING
    by = None if reason in (Reason.STOP, Reason.PROBE) or then not in (None, After.RESTART) else Tier.RESTART
    miopen = kernel_search.miopen(s)  # the MIOpen mode this attempt's settings gave
    stopped = dict(  # what the stop knows; the verdict's own fields stay an escalated incident's
        kernel_events=tuple({**asdict(e), "kind": e.kind.value} for e in stop.kernel_events),
        loss=loss, resumes_from=resumes_from, stopped_first_rank=_stopped_first(s) if a.ranks else None,
        node_rank=s.config.distributed.node_rank if several_hosts else None,
        caused_by=a.peer_cause if several_hosts else None,
        startup_step=a.startup_step.value if starting else None,
        startup_step_bound=watchdog.startup_step_bound(s)[0] if starting else None,
        startup_step_seen=watchdog.startup_step_seen(s) if starting else None,
        escalation=verdict.why if verdict else None, tier=by, kernel_search=_search(s, now),
        gpu_resets=tuple(a.gpu_resets), devcoredumps=tuple(a.devcoredumps),
        miopen=miopen.describe() if miopen else None,
        point_bound=None if owed is None else f"{watchdog.point_bound_phrase(owed[1])} ({owed[0].wait})")
    if point is not None:  # a hang: where the training process said it waited
        stopped.update(tier.witness_fields(s, stall, now))
    ahead = None
    if incident is not None:  # (an escalated hang's stacks are its first tier's, or read at the kill)
        incident = s.amend(incident, **stopped, tiers=incident.tiers + ((by,) if by else ()))
    else:  # a hang's stacks read ahead of this verdict: the kill need not wait for them
        ahead = stacks_ahead.taken(s, now, stall) if point is not None else None
        incident = s.open_incident(now, reason, phase, detail, **stopped, tiers=(by,) if by else (),
                                   stacks=ahead)
    _enter(s, StopPlan(reason, then or (After.STOP if reason == Reason.STOP else After.RESTART), incident,
                       climb=climb, failure=stop.failure, remedy=remedy, advice=stop.advice, save_until=save_until,
                       at_risk=at_risk if save_until is not None else (0.0, 0), point=point, choice=choice))
    if reason == Reason.HANG:
        s.hangs_by_phase[phase] += 1
    if reason == Reason.STOP:
        log = Log("info", f"stop requested ({detail})")
    elif reason == Reason.PROBE:
        log = Log("info", detail)
    else:
        # a wait on other threads, or a thread spun beside the hang: the log says the chain, as the incident does
        chain = stall is not None and stall.word.seen is not None and stall.word.seen.report.chain or a.spun_beside
        said = f" (the witness: {incident.witness})" if chain and incident.witness else ""
        log = Log("error", f"{reason.value} in {phase}: {detail}{said}; killing the worker tree"
                           + (f" (its stacks were read {ahead.ahead:.2f} s before the verdict)" if ahead else "")
                           + (f"; {incident.point_bound} in the next attempt" if incident.point_bound else ""))
    # With several hosts a hang is said even where it moves nothing: the other hosts restart with this one at once
    announced = several_hosts and reason in (Reason.HANG, Reason.KERNEL) and then in (None, After.RESTART)
    published = publish(s, climb_target(s, choice) if climb else s.rung, {**s.remedies, **(remedy or {})},
                        cause_of(incident)) if climb or remedy or announced else []
    if save_until is not None:  # the worker saves first: the checkpoint the restart resumes is still to come
        return earlier + [log, *published]
    # a standby was asked for: where it is ready, its loader's first batches load while the tree is killed
    primed = [PrimeStandby()] if s.stop.then == After.RESTART and a.standby_settings is not None else []
    return earlier + [log, *published, *primed, KillTree(incident)]


def _search(s: Supervision, now: Now) -> str | None:
    """A kernel search under way at the stop: before the first batch, its step's; once training, its stall's, bounded
    as a search (kernel_search.py), which the next attempt's search at that point gets again."""
    if (search := kernel_search.in_step(s)) is not None:
        return kernel_search.silent(search, now)
    if (search := kernel_search.in_stall(s)) is not None:
        bound = s.config.watchdog.startup_timeout
        return f"{kernel_search.silent(search, now)}; bounded as a search (startup_timeout {bound:g} s) in every " \
               f"attempt, never by the phase's batch rhythm" if bound is not None else kernel_search.silent(search, now)
    return None


def trained_to_the_end(s: Supervision, weights: WeightsKept | None) -> list[Any]:
    """The worker finished training and exited: what is left of its tree goes, then the run succeeds, unless no file
    of its weights was kept. No incident."""
    goodput.close_attempt(s, lost=False)
    plan = StopPlan(Reason.STOP, After.SUCCEED, incident=None)
    finished(s, plan, weights)
    _enter(s, plan)
    return [KillTree(None)]


def finished(s: Supervision, plan: StopPlan, weights: WeightsKept | None) -> None:
    """A training trained to its end: a success where it kept a file of its weights (or where that is not ours to
    know: ``weights`` None), else the run ends UNSAVED, its closing line saying what was lost and why."""
    plan.then = After.SUCCEED
    if weights is None or weights.files:
        return
    progress = s.current.progress
    disk_full = next((seen.line.strip().removeprefix("yolo-train worker: ") for seen in s.current.signatures.values()
                      if seen.name == "disk_full"), None)
    why = f"its saves failed ({disk_full[:240]})" if disk_full else \
        "its saves failed (the worker's lines above say why)"
    plan.then = After.UNSAVED
    plan.advice = (f"no weights were saved: {weights.directory} holds no usable last.pt or best.pt, and the "
                   f"{progress.epoch} epoch(s) trained are lost; {why}; that filesystem has "
                   f"{weights.disk_mib:.0f} MiB, {weights.free_mib:.0f} MiB free now; free space there or point "
                   f"state_dir at a larger disk, then run again: it trains from scratch")


def _enter(s: Supervision, plan: StopPlan) -> None:
    s.state, s.stop = State.STOPPING, plan


def save_deadline(s: Supervision, now: Now) -> float:
    """When a worker asked to save a checkpoint and exit must have done so."""
    t = s.config.watchdog.save_timeout
    return now.mono + (t if t is not None else SAVE_WAIT_UNBOUNDED)


def save_failed(s: Supervision, why: str, reason: Reason) -> list[Any]:
    """The checkpoint a stop or a probe asked for did not come: what followed the newest one is lost, and a probe
    is what it turned into (a hang or crash while saving), a real incident and a restart at the rung it was to
    leave, whose probation starts over."""
    plan = s.stop
    plan.save_until = None
    goodput.count_lost(s, *plan.at_risk)
    changes: dict[str, Any] = {"detail": f"{plan.incident.detail}; {why}"}
    actions: list[Any] = []
    if plan.reason == Reason.PROBE:
        plan.reason, plan.failure = reason, f"{reason.value}:probe save"
        changes["reason"] = reason
        if reason == Reason.HANG:
            phase = plan.incident.phase
            s.hangs_by_phase[phase] += 1
        s.move_to(s.rung)
        actions.append(Log("warning", f"the probe is off: rung {s.rung} ({s.ladder.label(s.rung)}) goes on after the "
                                      f"restart, its probation counted again"))
    s.amend(plan.incident, **changes)
    return actions + [KillTree(plan.incident)]


def end_run(s: Supervision, state: State, exit: Exit) -> list[Any]:
    """The run ends in ``state``: every incident not written yet is, and the supervisor exits."""
    recorded: list[Any] = s.record_complete()
    s.state, s.exit, s.stop = state, exit, None
    return recorded + [exit]


def climb_target(s: Supervision, choice: rung_choice.Choice | None) -> int:
    """Where a climb goes: back to the rung a failed probe left, else where a hang's choice says, else (the same
    crash again) one rung safer (the top rung stays)."""
    if s.probe.probing_from is not None:
        return s.probe.probing_from
    return choice.rung if choice is not None else s.ladder.next(s.rung)


def cause_of(incident: Incident | None) -> dict[str, Any]:
    """What the other hosts are told of the incident behind a ladder decision."""
    if incident is None:
        return {}
    return {"id": incident.id, "reason": incident.reason.value, "phase": incident.phase,
            "stopped_first_rank": incident.stopped_first_rank, "time": incident.time}


def publish(s: Supervision, rung: int, remedies: dict[str, Any], cause: dict[str, Any]) -> list[Any]:
    """Several hosts: a ladder decision of this host is the job's (PublishLadder)."""
    if not s.config.distributed.several_hosts:
        return []
    s.job_seq += 1
    return [PublishLadder(s.job_seq, rung, dict(remedies), cause)]


def _stopped_first(s: Supervision) -> int | None:
    """The rank whose progress is the oldest: under a collective the others wait for it, so it stopped first."""
    seen = [(v.last_progress_at, r) for r, v in s.current.ranks.items() if v.last_progress_at is not None]
    return min(seen)[1] if seen else None
