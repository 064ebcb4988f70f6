"""A recovery tier: one small object with one interface, as NVRx's in-process layers (Abort, Finalize, HealthCheck).

A hang's verdict is recovered by the first tier that applies, cheapest first (recovery/__init__.py walks them: the
in-place tier, in_place.py, then the restart, restart.py); a tier that cannot serve escalates to the next, and the
next amends the same incident. Every tier answers the same questions::

    name                         its vocabulary.Tier: the spelling of incidents, status --json and the metric
    applies(s, phase)            may it take this hang at all (its configuration, what the worker reported)
    begin(s, now, verdict)       take the hang: its first actions, or Escalate(why) when it declines at once
    events, on_event(s, r, e, now)  what it is told while under way, and what it does then (or Escalate)
    reports                      the worker's reports (heartbeat kinds) it reads whether or not it is under way
    deadline(r)                  when it must have shown its proof, and the escalation's reason if it did not
    escalate(s, r, now, why)     what it leaves behind when it gives up (its log line); the walk goes on
    recovered(incident, where)   the notice of a hang it recovered (None: not its, or not recovered)

A tier under way keeps one ``state.Recovery`` in the attempt (``Attempt.recovery``): the hang's one incident,
where it sat, and the clock of its action. A new tier is its module here, its events and actions, the shell's part
of its actions and the worker's side; the core, the watchdog, the status and the metrics take it from
``recovery.TIERS`` and ``vocabulary.Tier``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Protocol

from supervisor.decision.model.events import Now
from supervisor.decision.model.incident import Incident
from supervisor.decision.model.state import Recovery, Supervision
from supervisor.decision.recovery import stacks_ahead
from supervisor.decision.stall import witness
from supervisor.decision.stall.watchdog import Stall
from supervisor.vocabulary import Tier
from worker.wire.contract import HeartbeatMessage, MessageKind


@dataclass(frozen=True)
class Verdict:
    """The hang a tier is begun with: where, what the watchdog said, and what earlier tiers left of it."""
    phase: str
    detail: str
    incident: Incident | None = None  # the hang's one incident, once a tier opened it: amended, never doubled
    why: str | None = None  # why the earlier tiers did not serve (the incident's ``escalation``)
    stall: Stall | None = None  # the stall as the watchdog judged it for this verdict (None: none under way)


@dataclass(frozen=True)
class Escalate:
    """A tier's answer when it cannot serve (any more): the walk goes on to the next tier, with ``why``."""
    why: str


class RecoveryTier(Protocol):
    name: Tier  # its one spelling: incidents, status --json's recoveries, the metric's label
    events: tuple[type, ...]  # the events on_event is told while the tier is under way
    # the worker's reports that are this tier's to read, under way or not (the in-place tier: each loader's start)
    reports: dict[MessageKind, Callable[[Supervision, HeartbeatMessage, Now], list[Any]]]

    def applies(self, s: Supervision, phase: str) -> bool: ...

    def begin(self, s: Supervision, now: Now, verdict: Verdict) -> list[Any] | Escalate: ...

    # whether a verdict now (in ``phase``, the witness saying ``word`` of the stall) would begin this tier, which
    # reads the stall's stacks itself or needs none: then none are read ahead of it (watchdog.OwnStacks)
    def reads_own_stacks(self, s: Supervision, phase: str, word: witness.Word) -> bool: ...

    def on_event(self, s: Supervision, r: Recovery, event: Any, now: Now) -> list[Any] | Escalate: ...

    # when its proof is overdue, and why, the state as it is now (its tree's activity read since ``reads_tree_from``)
    def deadline(self, s: Supervision, r: Recovery) -> tuple[float, str] | None: ...

    # from when the shell reads the worker's tree for activity while this tier waits for its proof; None: not read
    def reads_tree_from(self, r: Recovery) -> float | None: ...

    def escalate(self, s: Supervision, r: Recovery, now: Now, why: str) -> list[Any]: ...

    def recovered(self, i: Incident, where: str) -> str | None: ...


def recovered(s: Supervision, tier: Tier) -> None:
    """One more recovery by ``tier`` (status --json's ``recoveries``, the metric's series)."""
    s.recoveries[tier] += 1


def witness_fields(s: Supervision, stall: Stall | None, now: Now, *, silence: bool = True) -> dict[str, Any]:
    """The one writer of a hang's incident's words of the witness, for every tier: ``witness`` (where the training
    process said it waited: the word that tells ``stall``) and, under DDP, ``hung_rank``, ``ranks`` and the ranks
    named as ``witness``. With ``silence`` (the restart's), a witness fallen silent in the stall is said so, with the
    frame its stacks read ahead saw: its last word is not where it was; the in-place tier reads its own stacks."""
    a, word = s.current, stall_word(s, stall)
    fields = {} if word.seen is None else {"witness": witness.describe(word.seen)}
    named = witness.rank_fields(a.ranks, a.waits, a.loaders, a.stopped)
    if named:  # under DDP: which rank hung, and where each one waited (or that it is stopped)
        fields.update(named, witness=named["witness"] or fields.get("witness"))
    if silence and word.silent is not None and now.mono >= word.silent and not a.ranks:
        where = stacks_ahead.where(s, stall)
        fields["witness"] = witness.silence(now.mono - word.silent + witness.SILENT_AFTER,
                                            a.thread_idle_since is not None) + (f"; the stacks saw: {where}" if where else "")
    if a.spun_beside and "witness" in fields:
        fields["witness"] += witness.beside(a.spun_beside)
    return fields


def stall_word(s: Supervision, stall: Stall | None) -> witness.Word:
    """The witness's word on the stall judged for a verdict; with none under way (a stop while a tier is), the word
    said now."""
    a = s.current
    return stall.word if stall is not None else witness.Word(*witness.telling(a.waits, a.loaders), None)
