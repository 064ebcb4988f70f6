"""What follows once a stopped worker's tree is gone: the end of the run, or the next attempt.

The stop plan (stopping.py) says which: the run ends (reboot needed, a configuration error, finished, stopped), or
the failure is counted against the restart budget, a remedy or a rung change applies, and the next worker is spawned
at once (a hang, a probe, another host's ranks lost: ``Reason.PEER``) or after a backoff (a crash). A restart after
an attempt that saved no checkpoint spends the budget; the same hang at the same point climbs while an untried rung
changes what hung (hang_history.py), and ends the run as deterministic once hangs there from different resume points
leave no such rung. Verdicts in a row at one point for one wait, each short of the phase's own bound for that wait
(the idle floor, a witness's bound), are the judge's doubt, not a hang the phase's bound saw: "whose waits each
ended" as far as the phase allows, since the kill ended them. From the second, the next attempt gives the point the
phase's own bound (watchdog.owed_here) and none of their restarts spends the budget; a kill at that bound spends it.
"""

from __future__ import annotations

from typing import Any

from supervisor.decision.learning import choices, goodput
from supervisor.decision.model import hang_history, survivors
from supervisor.decision.model.actions import AwaitSurvivors, Exit, Log, Spawn
from supervisor.decision.model.events import Now, SurvivorsGone, TreeKilled
from supervisor.decision.model.incident import Kill
from supervisor.decision.model.rung_choice import Choice
from supervisor.decision.model.state import StopPlan, Supervision, backoff_delay, restarts_in_window, trains_on_cpu
from supervisor.decision.recovery import probe, stopping
from supervisor.decision.recovery.tier import recovered
from supervisor.exit_codes import EXIT_CONFIG, EXIT_FAILED, EXIT_NO_WEIGHTS, EXIT_OK, EXIT_REBOOT_NEEDED
from supervisor.vocabulary import STARTUP_PHASE, After, Reason, State, Tier
from worker.wire.contract import split_rung


def tree_killed(s: Supervision, event: TreeKilled, now: Now) -> list[Any]:
    if s.state != State.STOPPING or s.stop is None:
        return []
    plan = s.stop
    s.current.worker_pid = None
    if plan.incident is not None:
        s.amend(plan.incident, last_error=s.current.last_error, settings=s.current.in_force_shown(),
                kill=Kill(event.killed, round(event.seconds, 3), tuple(x.describe() for x in event.survivors),
                          event.confirmed_wall))
    if event.survivors:
        return _survived(s, plan, event.survivors, now)
    return _tree_gone(s, plan, now)


def _survived(s: Supervision, plan: StopPlan, found: tuple[survivors.Survivor, ...], now: Now) -> list[Any]:
    """Survivors of SIGKILL: held by a driver, only a reboot frees them; held by a file system (or a wait nobody
    named), they go when it answers: the next worker waits for that, within survivor_timeout (survivors.py)."""
    if not survivors.waits_out(found):
        return _reboot_needed(s, found)
    bound = s.config.watchdog.survivor_timeout
    plan.survivors, plan.survivors_until = found, now.mono + bound
    where = "a file system's wait" if all(x.wait == survivors.KernelWait.FILE_SYSTEM for x in found) \
        else "the kernel"
    return [Log("warning", f"{len(found)} worker process(es) survived SIGKILL in {where} ({survivors.describe(found)}): "
                           f"the next worker starts once they are gone (watchdog.survivor_timeout = {bound:g} s)"),
            AwaitSurvivors(tuple(x.pid for x in found))]


def survivors_gone(s: Supervision, event: SurvivorsGone, now: Now) -> list[Any]:
    """The survivors waited for are gone (their file system answered): what the kill was for follows."""
    plan = s.stop
    if s.state != State.STOPPING or plan is None or not plan.survivors:
        return []
    waited = now.mono - (plan.survivors_until - s.config.watchdog.survivor_timeout)
    gone = [Log("info", f"the {len(plan.survivors)} survivor(s) of SIGKILL are gone after {waited:.1f} s: going on")]
    plan.survivors, plan.survivors_until = (), None
    return gone + _tree_gone(s, plan, now)


def survivors_overdue(s: Supervision, now: Now) -> list[Any]:
    """survivor_timeout passed with survivors left: a driver's (a reboot), or a file system that does not answer."""
    found = s.stop.survivors
    if survivors.driver_bound(found, on_gpu=not trains_on_cpu(s)):
        return _reboot_needed(s, found)
    waits = sorted({w for x in found for w in x.waits}) or ["an unnamed kernel wait"]
    return stopping.end_run(s, State.FAILED, Exit(
        EXIT_FAILED,
        f"{len(found)} worker process(es) still wait in {', '.join(waits)} "
        f"{s.config.watchdog.survivor_timeout:g} s after SIGKILL ({survivors.describe(found)}): a file system the "
        f"training reads (a FUSE or NFS mount) does not answer; no new worker is started beside them; fix the mount "
        f"(or raise watchdog.survivor_timeout), then run again to resume"))


def _reboot_needed(s: Supervision, found: tuple[survivors.Survivor, ...]) -> list[Any]:
    s.reboot_needed = True
    held = "the GPU driver; no new worker is started on this GPU" if not trains_on_cpu(s) else \
        "a driver; no new worker is started"
    return stopping.end_run(s, State.FAILED, Exit(
        EXIT_REBOOT_NEEDED,
        f"{len(found)} worker process(es) survived SIGKILL ({survivors.describe(found)}): stuck in {held}; reboot "
        f"the machine, then run again to resume"))


def _tree_gone(s: Supervision, plan: StopPlan, now: Now) -> list[Any]:
    """The worker's tree is gone: the run ends, or the next attempt follows."""
    if plan.then == After.REBOOT:
        return stopping.end_run(s, State.FAILED, Exit(
            EXIT_REBOOT_NEEDED, f"the GPU is lost ({plan.incident.detail}); no new worker is "
                                f"started on it; reboot the machine, then run again to resume"))
    if plan.then == After.CONFIG_ERROR:
        return stopping.end_run(s, State.FAILED, Exit(EXIT_CONFIG,
                                                     f"{plan.incident.detail}: {plan.advice}; not restarting"))
    if plan.then == After.UNSAVED:
        return stopping.end_run(s, State.UNSAVED, Exit(
            EXIT_NO_WEIGHTS, f"training finished after {s.attempt} attempt(s), but {plan.advice}"))
    if plan.then == After.SUCCEED:
        lost = f"; but the newest checkpoint has no verified copy: {s.verified_copy_problem}" \
            if s.verified_copy_problem else ""
        return stopping.end_run(s, State.SUCCEEDED, Exit(EXIT_OK, f"training finished after {s.attempt} attempt(s)"
                                                                  f"{lost}"))
    if plan.then == After.STOP:
        saved = "after saving a checkpoint" if plan.saved else "without a new checkpoint"
        if not plan.saved and plan.at_risk[1]:
            saved += (f" (none was written: the {plan.at_risk[0]:.0f} s and {plan.at_risk[1]} batches trained after "
                      f"the newest one are trained again)")
        return stopping.end_run(s, State.STOPPED, Exit(EXIT_OK,
                                                      f"stopped at rung {s.rung} {saved}; run again to resume"))
    return _restart(s, plan, now)


def _restart(s: Supervision, plan: StopPlan, now: Now) -> list[Any]:
    """After a failure: count it against the budget, apply the remedy or climb, then spawn or back off."""
    s.restarts_by_reason[plan.reason] += 1
    if plan.reason == Reason.PROBE:  # planned, saved first: no budget, no backoff
        return [probe.enter(s), spawn(s)]
    recovered(s, Tier.RESTART)
    actions: list[Any] = []
    if plan.point is not None:
        if plan.choice is None or plan.choice.counts:  # (a hang no rung changes counts against none)
            s.rung_record(s.rung).hangs += 1
        run = s.hang_history.same_point_run()
        if len(run) >= 2 and plan.point.phase != STARTUP_PHASE:
            hung = hang_history.what_hung(plan.point, plan.incident.stacks if plan.incident else None)
            cure = None if hung is None or plan.remedy or s.probe.probing_from is not None or s.job_next else \
                hang_history.untried_cure(s.ladder, s.rung, choices.rung_facts(s), hung[1])
            repeated = s.hang_history.repeated_point()
            if cure is not None:
                published = stopping.climb_target(s, plan.choice) if plan.climb else s.rung
                plan.climb, plan.choice = True, Choice(cure, f"the same hang {len(run)} times in a row at epoch "
                                                             f"{plan.point.epoch}, batch {plan.point.batch}, in "
                                                             f"{hung[0]}: rung {cure} is untried and changes it")
                if cure != published:
                    actions += stopping.publish(s, cure, dict(s.remedies), stopping.cause_of(plan.incident))
            elif repeated is not None:
                return stopping.end_run(s, State.FAILED, Exit(
                    EXIT_CONFIG, f"the same hang {len(run)} times in a row at epoch {repeated.epoch}, batch "
                                 f"{repeated.batch} ({repeated.phase}), from {len({p.resumed_at for p in run})} "
                                 f"different resume points, whatever the rung: a deterministic hang in the model or "
                                 f"the data, which no rung left changes (last: {plan.incident.detail}); find what "
                                 f"that batch does (yolo-train incidents shows the stacks), then run again to "
                                 f"resume"))
    s.restart_times.append(now.wall)
    doubted = s.hang_history.doubted_run() if plan.point is not None else []
    if len(doubted) >= hang_history.POINT_VERDICTS:
        # Kills at one point for one wait, each short of the phase's own bound for it: none of those waits outlasted
        # what the phase allows, and the next attempt gives the point that bound. The judge's doubt spends no budget
        # (those before it spent are given back); a kill at the phase's own bound there spends as any hang.
        given = s.hang_history.give_back(doubted)
        s.budget_times = [t for t in s.budget_times if t not in given]
        actions.append(Log("warning", f"{len(doubted)} verdicts in a row at epoch {plan.point.epoch}, batch "
                                      f"{plan.point.batch} for one wait ({plan.point.wait}), each short of the "
                                      f"phase's own bound: no restart of theirs spends the budget"
                                      + (f" ({len(given)} given back)" if given else "")))
    elif not goodput.saved_since_spawn(s):  # a loop saves nothing; a run that checkpoints between hangs moves on
        s.budget_times.append(now.wall)
        if plan.point is not None and s.hang_history.points and s.hang_history.points[-1] == plan.point:
            s.hang_history.spend(now.wall)
    s.last_failure = plan.failure
    cfg = s.config.restart
    used = restarts_in_window(s.budget_times, now.wall, cfg)
    if used > cfg.max_restarts:
        return stopping.end_run(s, State.FAILED, Exit(
            EXIT_FAILED,
            f"restart budget spent: {used} restarts in the last {cfg.window:.0f} s, none after a new checkpoint "
            f"(restart.max_restarts = "
            f"{cfg.max_restarts}); last failure: {plan.incident.detail if plan.incident else plan.failure}; "
            f"fix the cause, then run again to resume at rung {s.rung}"))
    if plan.remedy:
        s.remedies.update(plan.remedy)
        actions.append(Log("warning", "from now on: " + ", ".join(f"{k}={v}" for k, v in plan.remedy.items())))
    if s.job_next is not None:  # another host decided where the job goes for this failure
        follow_job(s)
    elif plan.climb and s.probe.probing_from is not None:
        actions.append(probe.back(s))
    elif plan.climb and plan.choice is not None:  # a hang: the rung its record says, chosen at the verdict
        step, was = plan.choice.rung - s.rung, s.rung
        move = "staying" if step == 0 else "one rung safer" if step == 1 else f"{step} rungs safer" if step > 0 \
            else "faster"
        if step:
            s.move_to(plan.choice.rung)
        actions.append(Log("warning", f"{move}: rung {s.rung} ({s.ladder.label(s.rung)}): {plan.choice.why}"
                                      + _cost(s, was)))
    elif plan.climb:  # the same crash again
        if s.ladder.exhausted(s.rung):
            actions.append(Log("warning", f"ladder exhausted: staying at rung {s.rung} ({s.ladder.label(s.rung)})"))
        else:
            was = s.rung
            s.move_to(stopping.climb_target(s, None))
            actions.append(Log("warning", f"one rung safer: rung {s.rung} ({s.ladder.label(s.rung)})" + _cost(s, was)))
    if plan.reason in (Reason.CRASH, Reason.OOM):
        s.consecutive_crashes += 1
        delay = backoff_delay(s.consecutive_crashes, cfg)
        s.state, s.backoff_until, s.stop = State.BACKOFF, now.mono + delay, None
        return actions + [Log("info", f"restarting in {delay:.1f} s (crash {s.consecutive_crashes} in a row)")]
    return actions + [spawn(s)]


def spawn(s: Supervision) -> Spawn:
    """The next attempt: at the current rung (where another host moved the job, if one did) with the remedies in
    force, checkpointing at the interval chosen now."""
    follow_job(s)
    s.attempt += 1
    s.state = State.STARTING
    s.stop = None
    s.checkpoint_interval = choices.next_interval(s)
    return Spawn(attempt=s.attempt, rung=s.rung, rung_settings={**s.ladder.settings(s.rung), **s.remedies},
                 checkpoint_every=s.checkpoint_interval.seconds, amp_passed=s.amp_passed,
                 rung_keys=tuple(sorted({*s.remedies, *(k for r in range(len(s.ladder))
                                                         for k in split_rung(s.ladder.settings(r)).trainer_args)})))


def follow_job(s: Supervision) -> None:
    """Several hosts: move to where another host moved the job, once this host's attempt is over."""
    job, s.job_next = s.job_next, None
    if job is not None:
        if job.rung != s.rung:
            s.move_to(job.rung)
        s.remedies, s.probe.probing_from = dict(job.remedies), None


def _cost(s: Supervision, was: int) -> str:
    """The speed the rung just taken gives up, where the ladder knows it (ladder.COSTS), against the speed measured at
    the rung it left, and its own where it trained before."""
    cost = s.ladder.cost(was, s.rung)
    if not cost:
        return ""
    facts = choices.rung_facts(s)
    measured = [f"rung {k} trained at {facts[k].speed:.2f} it/s" for k in (was, s.rung) if facts[k].speed is not None]
    return f"; its cost: {cost}" + (f" ({', '.join(measured)})" if measured else "")
