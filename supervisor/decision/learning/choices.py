"""The choices this run makes from what it has learned: the rung a hang moves it to, the rung a probe tries
(rung_choice.py's rules, read from the rung records) and the checkpoint interval of the next spawn
(checkpoint_interval.py's, read from the hang history)."""

from __future__ import annotations

from dataclasses import replace

from supervisor.decision.learning import hang_evidence
from supervisor.decision.model import checkpoint_interval, rung_choice
from supervisor.decision.model.rung_choice import Choice, RungFacts
from supervisor.decision.model.rung_record import RungRecord
from supervisor.decision.model.state import Supervision


def rung_facts(s: Supervision) -> list[RungFacts]:
    """What each rung of the ladder has shown in this run, as the ladder's choices read it."""
    return [s.rungs.get(k, RungRecord()).facts() for k in range(len(s.ladder))]


def probe_target(s: Supervision) -> int | None:
    """The rung below the current one that a probe tries; None: none is worth it."""
    return rung_choice.probe_target(s.rung, rung_facts(s), s.config.probe.give_up_after)


def after_a_hang(s: Supervision, kernel_said: bool = False) -> Choice:
    """Where a hang at this rung moves the run: decided once, at the verdict, with the attempt closed and this hang
    counted; the standby is prepared for it in advance. ``kernel_said``: the kernel's line is the hang's word."""
    evidence = hang_evidence.of(s, kernel_said)  # where the witness put the hang weighs the rungs that can change it
    counted = hang_evidence.counts(s, evidence)
    facts = rung_facts(s)
    here = facts[s.rung]
    facts[s.rung] = replace(here, hangs=here.hangs + (1 if counted else 0))
    points = s.hang_history.points
    passed = s.hang_history.passed(points[-1]) if points else frozenset()
    choice = rung_choice.after_hang(s.rung, facts, stall_cost(s), s.config.probe.prior_between_hangs, passed,
                                    hang_evidence.eligible(s, evidence))
    why = f"{evidence.why}{'' if counted else ', and counts against no rung'}; {choice.why}" if evidence.why \
        else choice.why
    return replace(choice, why=why, counts=counted)


def stall_cost(s: Supervision) -> float | None:
    """What a hang costs before the next worker starts, at the checkpoint interval the next spawn would choose."""
    return s.hang_history.stall_cost(next_interval(s).seconds)


def next_interval(s: Supervision) -> checkpoint_interval.Interval:
    """The checkpoint interval a spawn now chooses, from the hangs and checkpoint holds this run has seen."""
    cfg = s.config.checkpoint
    return checkpoint_interval.choose(cfg.every, cfg.max, s.hang_history.holds, mean_time_between_hangs(s),
                                      s.hang_history.restarts)


def mean_time_between_hangs(s: Supervision) -> float | None:
    h = s.hang_history
    return checkpoint_interval.mean_time_between_hangs(h.hang_marks, h.window_start, s.trained())
