"""Word when it matters: which of the core's decisions a person is told of, and how often.

``derive`` reads what one ``decide`` call did (its actions, the rung and state before and after) and names the
notices in it: a hang the run recovered from (its incident recorded once the next attempt trained, or once the next
batch came after its loader workers were replaced in place), a rung change, an exit that needs a person (78: the
configuration, 3: reboot, 73: no weights kept), the run finished. ``NoticeLimit`` is the rate rule
between them and the ``[notify] command`` (supervisor/telemetry/notify_command.py): a bad night sends a summary, not
hundreds of messages. No I/O here; time is given.
"""

from __future__ import annotations

from collections import Counter, deque
from dataclasses import dataclass, field
from enum import Enum
from typing import Any

from supervisor.decision import recovery
from supervisor.decision.model.actions import Exit, IncidentResumed, RecordIncident
from supervisor.decision.model.incident import Incident
from supervisor.decision.model.state import Supervision
from supervisor.exit_codes import EXIT_CONFIG, EXIT_NO_WEIGHTS, EXIT_OK, EXIT_REBOOT_NEEDED
from supervisor.vocabulary import Reason, State

BURST = 3  # notices sent as they come within WINDOW; later ones wait for one summary
WINDOW = 3600.0  # seconds
HELD_SHOWN = 20  # the newest held notices a summary lists (all are counted)


class NoticeKind(str, Enum):
    HANG_RECOVERED = "hang_recovered"  # a hang's incident is complete: the next attempt trains
    RUNG_CHANGED = "rung_changed"
    NEEDS_A_PERSON = "needs_a_person"  # exit 78, 3 or 73: restarting cannot help
    FINISHED = "finished"  # training finished
    SUMMARY = "summary"  # what the rate limit held back


FINAL = frozenset({NoticeKind.NEEDS_A_PERSON, NoticeKind.FINISHED})  # never held: the run ends with them


@dataclass(frozen=True)
class Notice:
    kind: NoticeKind
    text: str
    time: float  # wall clock
    rung: int
    rung_label: str
    previous_rung: int | None = None  # RUNG_CHANGED
    exit_code: int | None = None  # NEEDS_A_PERSON, FINISHED
    incident: Incident | None = None  # HANG_RECOVERED
    counts: dict[str, int] = field(default_factory=dict)  # SUMMARY: held notices by kind
    held: tuple[str, ...] = ()  # SUMMARY: the newest held notices' texts


def derive(s: Supervision, state_before: State, rung_before: int, actions: list[Any], wall: float) -> list[Notice]:
    """The notices in one decision: ``s`` is the Supervision after it, ``actions`` what it returned."""
    here = {"time": wall, "rung": s.rung, "rung_label": s.ladder.label(s.rung)}
    notices = []
    for action in actions:
        # recovered as training resumed after it, or, where that was not watched, as it is written
        i = action.incident if isinstance(action, IncidentResumed) or isinstance(action, RecordIncident) and \
            action.incident.after is None else None
        if i is None or i.reason not in (Reason.HANG, Reason.KERNEL):
            continue
        culprit = f"; {i.stacks.culprit}" if i.stacks is not None and i.stacks.culprit else ""
        where = f"a {i.reason.value} in {i.phase} at epoch {i.epoch} batch {i.batch} (rung {i.rung}){culprit}"
        said = next((words for tier in recovery.TIERS if (words := tier.recovered(i, where)) is not None), None)
        if said is not None:  # the tier that recovered it says how
            notices.append(Notice(NoticeKind.HANG_RECOVERED, said, incident=i, **here))
    if s.rung != rung_before:
        notices.append(Notice(NoticeKind.RUNG_CHANGED, f"rung {rung_before} -> {s.rung} ({s.ladder.label(s.rung)})",
                              previous_rung=rung_before, **here))
    for action in actions:
        if isinstance(action, Exit) and action.code in (EXIT_CONFIG, EXIT_REBOOT_NEEDED, EXIT_NO_WEIGHTS):
            notices.append(Notice(NoticeKind.NEEDS_A_PERSON, f"exit {action.code}: {action.text}",
                                  exit_code=action.code, **here))
        elif isinstance(action, Exit) and action.code == EXIT_OK and s.state == State.SUCCEEDED \
                and state_before != State.SUCCEEDED:
            notices.append(Notice(NoticeKind.FINISHED, action.text, exit_code=action.code, **here))
    return notices


class NoticeLimit:
    """At most BURST notices within any WINDOW seconds go out as they come; the rest are held and go out as one
    SUMMARY as soon as the window allows another (``due``). A final notice is never held: any summary goes first."""

    def __init__(self, burst: int = BURST, window: float = WINDOW):
        self.burst, self.window = burst, window
        self.sent: deque[float] = deque()  # monotonic times of the notices sent within the window
        self.held: list[Notice] = []

    def offer(self, notice: Notice, now: float) -> list[Notice]:
        if notice.kind in FINAL:
            return self._summary(now) + [notice]
        self._forget(now)
        if self.held or len(self.sent) >= self.burst:
            self.held.append(notice)
            return []
        self.sent.append(now)
        return [notice]

    def next_due(self) -> float | None:
        """When a held summary may go (monotonic), or None."""
        if not self.held:
            return None
        return self.sent[0] + self.window if len(self.sent) >= self.burst else 0.0

    def due(self, now: float) -> list[Notice]:
        self._forget(now)
        if not self.held or len(self.sent) >= self.burst:
            return []
        return self._summary(now)

    def _forget(self, now: float) -> None:
        while self.sent and now - self.sent[0] >= self.window:
            self.sent.popleft()

    def _summary(self, now: float) -> list[Notice]:
        if not self.held:
            return []
        held, self.held = self.held, []
        self.sent.append(now)
        counts = Counter(n.kind.value for n in held)
        newest = held[-1]
        told = ", ".join(f"{n} {kind.replace('_', ' ')}" for kind, n in sorted(counts.items()))
        return [Notice(NoticeKind.SUMMARY, f"{len(held)} more events ({told}); now at rung {newest.rung} "
                                           f"({newest.rung_label}); last: {newest.text}",
                       time=newest.time, rung=newest.rung, rung_label=newest.rung_label, counts=dict(counts),
                       held=tuple(n.text for n in held[-HELD_SHOWN:]))]
