"""The core's records as one live view: what ``yolo-train status`` shows and the metrics collector reads.

Written into the state file's "status" by the agent; its keys are the ones status --json and users' scripts read.
It only reads the decision core's state (supervisor/decision/state.py) and never changes it.
"""

from __future__ import annotations

from dataclasses import asdict
from typing import Any

from supervisor.decision import rung_choice
from supervisor.decision.events import Now
from supervisor.decision.state import Attempt, Supervision


def snapshot(s: Supervision, now: Now) -> dict[str, Any]:
    """The live view written for ``yolo-train status`` and read by the metrics collector."""
    a, p = s.current, s.current.progress
    due = s.deadline()
    done_batches = p.batches_done() or 0
    total_batches = p.epochs * p.batches
    it_s = a.batches_per_second()
    eta = (total_batches - done_batches) / it_s if it_s and total_batches else None
    return {
        "state": s.state.value, "phase": p.phase, "epoch": p.epoch, "epochs": p.epochs, "batch": p.batch,
        "batches": p.batches, "losses": p.losses, "lr": p.lr,
        "it_s": it_s, "samples_s": samples_per_second(a), "eta_seconds": eta,
        "progress": (done_batches / total_batches) if total_batches else None,
        "rung": s.rung, "rungs": len(s.ladder), "rung_label": s.ladder.label(s.rung), "attempt": s.attempt,
        "remedies": s.remedies,
        "restarts": sum(s.restarts_by_reason.values()), "restarts_by_reason": s.restarts_by_reason,
        "hangs_by_phase": s.hangs_by_phase, "budget_left": s.budget_left(now.wall),
        "kernel_events": s.kernel_events, "reboot_needed": s.reboot_needed,
        "suspicion": None if a.suspicion is None else a.suspicion.event.message[:200],
        "worker_pid": a.worker_pid, "resumed_from": a.resumed_from, "settings": a.in_force_shown(),
        "seconds_since_progress": None if a.last_progress_at is None else now.mono - a.last_progress_at,
        "worker_uptime": None if a.spawned_at is None or a.worker_pid is None else now.mono - a.spawned_at,
        "worker_spawned": a.spawned_wall, "startup_seconds": a.startup_seconds,
        "watchdog": {"timeout": due.label, "fires_in": None if due.at is None else due.at - now.mono},
        "last_restart": s.restart_times[-1] if s.restart_times else None,
        "last_incident": s.incidents[-1].to_dict() if s.incidents else None,
        "exit": asdict(s.exit) if s.exit else None,
        "last_checkpoint": None if s.checkpoint is None else {
            "path": s.checkpoint.path, "epoch": s.checkpoint.epoch, "batch": s.checkpoint.batch,
            "age_seconds": now.wall - s.checkpoint.wall, "seconds": s.checkpoint.seconds},
        "checkpoint_every": None if s.checkpoint_interval is None else s.checkpoint_interval.seconds,
        "checkpoint_interval": _interval_view(s),
        "trained_seconds": s.trained(), "lost_seconds": s.goodput.lost_seconds, "lost_batches": s.goodput.lost_batches,
        "goodput": s.goodput.ratio(s.trained(), now.mono), "run_started": s.goodput.run_started_wall,
        "rung_speed": s.rung_speed(s.rung), "rung0_speed": s.rung_speed(0),
        "rung_speeds": {k: s.rung_speed(int(k)) for k in s.rung_speeds},
        "node_rank": s.config.distributed.node_rank if s.config.distributed.several_hosts else None,
        "ranks": [{"rank": r, "local_rank": v.local_rank, "pid": v.pid, "device": v.device,
                   "seconds_since_progress": None if v.last_progress_at is None else now.mono - v.last_progress_at}
                  for r, v in sorted(a.ranks.items())],
        "probe": {"in_seconds": s.probe_in(), "from": s.probe.probing_from, "probation": s.probe.probation,
                  "hangs_by_rung": s.rung_hangs, "target": s.probe_target() if s.rung else None},
        "ladder": _ladder_view(s),
    }


def samples_per_second(a: Attempt) -> float | None:
    """Images per second over the attempt's recent training beats (its batches per second: ``Attempt``)."""
    if len(a.throughput) < 2:
        return None
    span = a.throughput[-1][0] - a.throughput[0][0]
    return sum(n for _, n in list(a.throughput)[1:]) / span if span > 0 else None


def _interval_view(s: Supervision) -> dict[str, Any]:
    """How the current interval was chosen ([checkpoint] every = "auto"), for status and metrics."""
    chosen = s.checkpoint_interval
    return {"auto": s.config.checkpoint.every == "auto", "max": s.config.checkpoint.max,
            "hold_seconds": None if chosen is None else chosen.hold,
            "mean_time_between_hangs": None if chosen is None else chosen.mean_time_between_hangs}


def _ladder_view(s: Supervision) -> dict[str, Any]:
    """What the ladder's next choice is made from (rung_choice.py): each tried rung's record and expected goodput."""
    stall = s.stall_cost()
    facts = s.rung_facts()
    used = rung_choice.DEFAULT_STALL_COST if stall is None else stall
    prior = s.config.probe.prior_between_hangs
    return {"stall_cost_seconds": stall,
            "rungs": {str(k): {"speed": f.speed, "seconds": round(f.seconds, 3), "hangs": f.hangs, "start": f.start,
                               "expected_goodput": rung_choice.expected_goodput(
                                   f, rung_choice.hang_cost(f, used, facts), rung_choice.prior_of(k, facts, prior)),
                               "between_hangs": rung_choice.between_hangs(f, rung_choice.prior_of(k, facts, prior))}
                      for k, f in enumerate(facts) if f.tried}}
