"""The walk over the recovery tiers: a hang's verdict goes to the first that applies, cheapest first; a tier that
cannot serve escalates to the next, which amends the same incident (one hang, one incident; its ``tiers`` say the
way it went). The tiers are ``TIERS``, each a tier.RecoveryTier; nothing here knows what any of them does.

The core asks this module at a hang's verdict (``hang``), for an event a tier under way is told (``on_event``),
when the watchdog's ``DeadlineKind.RECOVERY`` is due (``overdue``), when the worker exits mid-recovery
(``escalate``), and at the end of every decision for what the shell watches until the next (``watch``: the stacks read
ahead of a verdict only where no tier would read its own, which only the tiers know).

The tiers and what serves them stand beside this walk: ``tier`` (what a tier is), ``in_place``, ``restart`` (with
``standby``, the next worker made ready), ``stopping`` (the one way into STOPPING), ``stacks_ahead`` (a restart's
stacks read ahead of its verdict) and ``probe`` (back down the ladder).
May import: what ``learning`` may, and ``learning``.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from supervisor.decision.model.events import Now
from supervisor.decision.model.state import Supervision
from supervisor.decision.recovery import in_place, restart
from supervisor.decision.recovery.tier import Escalate, RecoveryTier, Verdict
from supervisor.decision.stall import watchdog, witness

TIERS: tuple[RecoveryTier, ...] = (in_place.TIER, restart.TIER)  # cheapest first; the restart always applies
EVENTS: tuple[type, ...] = tuple(dict.fromkeys(e for tier in TIERS for e in tier.events))


def watch(s: Supervision) -> watchdog.Watch:
    """The decision's one judgement of the stall, and what follows from it (``watchdog.Watch``)."""
    return watchdog.watch(s, own_stacks)


def own_stacks(s: Supervision, phase: str, word: witness.Word) -> bool:
    """A verdict now would begin a tier that reads the stall's stacks itself or needs none (watchdog.OwnStacks)."""
    return any(tier.reads_own_stacks(s, phase, word) for tier in TIERS)


def hang(s: Supervision, now: Now, phase: str, detail: str, stall: watchdog.Stall | None) -> list[Any]:
    """A hang's verdict on ``stall`` (as the tick judged it): the first tier that applies takes it."""
    return _walk(s, now, TIERS, Verdict(phase, detail, stall=stall))


def _walk(s: Supervision, now: Now, tiers: tuple[RecoveryTier, ...], verdict: Verdict) -> list[Any]:
    for tier in tiers:
        if not tier.applies(s, verdict.phase):
            continue
        began = tier.begin(s, now, verdict)
        if not isinstance(began, Escalate):
            return began
        verdict = replace(verdict, why=began.why)  # declined at once
    raise RuntimeError(f"no recovery tier took the hang in {verdict.phase}: the last of TIERS must always apply")


def on_event(s: Supervision, event: Any, now: Now) -> list[Any]:
    """An event for the tier under way, if it is one of its own."""
    r = s.current.recovery
    if r is None or not isinstance(event, r.tier.events):
        return []
    answer = r.tier.on_event(s, r, event, now)
    return escalate(s, now, answer.why) if isinstance(answer, Escalate) else answer


def overdue(s: Supervision, now: Now) -> list[Any]:
    """The tier under way did not show its proof by its deadline."""
    r = s.current.recovery
    _, why = r.tier.deadline(s, r)
    return escalate(s, now, why)


def escalate(s: Supervision, now: Now, why: str) -> list[Any]:
    """The tier under way gives up: the next tiers, from the one after it, take the same hang and its incident."""
    r, s.current.recovery = s.current.recovery, None  # (r.incident is the incident as last amended)
    later = TIERS[TIERS.index(r.tier) + 1:]
    left = r.tier.escalate(s, r, now, why)
    # the stall, with the tier no longer under way, judged again for the next tier: the words said since count
    stall = watchdog.current_stall(s, own_stacks)
    return [*left, *_walk(s, now, later, Verdict(r.phase, r.incident.detail, r.incident, why, stall))]
