"""The restart tier: the last of a hang's recovery tiers, the one that always applies. What follows its kill, as
any stop's, is after_stop.py's."""

from __future__ import annotations

from typing import Any

from supervisor.decision.model.events import Now
from supervisor.decision.model.incident import Incident
from supervisor.decision.model.state import Recovery, Supervision
from supervisor.decision.recovery import stopping
from supervisor.decision.recovery.stopping import Stop
from supervisor.decision.recovery.tier import Escalate, Verdict
from supervisor.decision.stall import witness
from supervisor.vocabulary import Reason, Tier


class RestartTier:
    """The last recovery tier (tier.RecoveryTier): the tree is killed and a new worker resumes from the newest
    checkpoint, at the rung the hang's record says. It always applies; what follows the kill is ``after_stop.tree_killed``'s,
    and the restart budget, not a further tier, bounds it."""
    name = Tier.RESTART
    events: tuple[type, ...] = ()
    reports: dict = {}

    def applies(self, s: Supervision, phase: str) -> bool:
        return True

    def begin(self, s: Supervision, now: Now, verdict: Verdict) -> list[Any]:
        return stopping.begin(s, now, Stop(Reason.HANG, verdict.phase, verdict.detail, climb=True,
                                           failure=f"hang:{verdict.phase}"), verdict)

    def reads_own_stacks(self, s: Supervision, phase: str, word: witness.Word) -> bool:
        return False  # its stacks are read ahead of its verdict, or at the kill (stacks_ahead.py)

    def on_event(self, s: Supervision, r: Recovery, event: Any, now: Now) -> list[Any] | Escalate:
        return []

    def deadline(self, s: Supervision, r: Recovery) -> tuple[float, str] | None:
        return None  # the stop's own (watchdog.due: the kill, a save)

    def reads_tree_from(self, r: Recovery) -> float | None:
        return None

    def escalate(self, s: Supervision, r: Recovery, now: Now, why: str) -> list[Any]:
        return []

    def recovered(self, i: Incident, where: str) -> str | None:
        if i.restart_seconds is None:
            return None
        lost = "lost work unknown" if i.loss is None or i.loss.seconds is None else \
            f"{i.loss.seconds:.0f} s of training lost"
        return f"recovered from {where}: training again after {i.restart_seconds:.0f} s, {lost}"


TIER = RestartTier()
