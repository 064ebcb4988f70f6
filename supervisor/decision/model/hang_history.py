"""What this run has learned from its hangs: the record the ladder and the checkpoint interval decide from.

One record, kept across supervisor restarts (its ``kept`` fields, persistence.py), written only by the decision core:

- ``stalls``: what each recent hang cost up to the next spawn: from the last progress before it, the stall until
  detection and the kill;
- ``losses``: the training each recent hang threw away (after the newest checkpoint);
- ``hang_marks``/``window_start``: the run's trained seconds at each recent hang, behind the mean time between hangs;
- ``holds``: how long the training loop waited for each recent checkpoint;
- ``restarts``: how long each recent hang's restart took, from the verdict to the next batch (checkpoint_interval.py
  holds the replay to it while hangs are frequent);
- ``points``: where each recent hang sat (phase, epoch, batch) and the checkpoint its attempt resumed from, newest
  last, for "the same hang at the same point". A hang the settings cause also recurs at the same point when no
  checkpoint lands between the resume point and the hang: only hangs that resumed from different points count as
  repeats of a deterministic one. Each point keeps the witness's word on it and whether its verdict came short of the
  phase's own bound: two such in a row at one point for one wait give it that bound later (``owed_point``).

What each rung has shown (its training seconds, hangs, starts and speeds) is that rung's record: rung_record.py.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from supervisor.decision.model.checkpoint_interval import HANG_WINDOW, HOLDS_KEPT
from supervisor.decision.model.incident import Stacks
from supervisor.decision.model.ladder import Ladder
from supervisor.decision.model.persistence import kept
from supervisor.decision.model.persistence import span
from supervisor.decision.model.rung_choice import RungFacts
from worker.wire.contract import Phase

COSTS_KEPT = 8
POINTS_KEPT = 8
REPEATS = 3  # hangs in a row at the same point, from this many different resume points, are deterministic
POINT_VERDICTS = 2  # verdicts in a row at one point for one wait, each short of the phase's bound: the judge's doubt


@dataclass(frozen=True)
class HangPoint:
    """Where a hang sat: the last progress the worker reported before it, and where its attempt resumed."""
    phase: str = kept()
    epoch: int = kept()
    batch: int = kept()
    # the checkpoint's (epoch, batch); None (left out of the file): from scratch or unknown
    resumed_at: tuple[int, int] | None = kept(default=None, omitted=True)
    rung: int | None = kept(default=None, omitted=True)  # the rung it hung at; None: recorded before rungs were kept
    # the witness's word on it, its kind and place ("lock at threading.py:_wait_for_tstate_lock"); None: no word
    wait: str | None = kept(default=None, omitted=True)
    short: bool = kept(default=False, omitted=True)  # found short of the phase's own bound for that wait
    spent: float | None = kept(default=None, omitted=True)  # wall clock: its restart spent the budget then

    def same_place(self, other: HangPoint) -> bool:
        return (self.phase, self.epoch, self.batch) == (other.phase, other.epoch, other.batch)

    def same_wait(self, other: HangPoint) -> bool:
        """At the same place, the same kind of wait at the same frame (the same epoch end, the same callback)."""
        return self.same_place(other) and self.wait is not None and self.wait == other.wait


@dataclass
class HangHistory:
    stalls: list[float] = kept(default_factory=list)
    losses: list[float] = kept(default_factory=list)
    hang_marks: list[float] = kept(default_factory=list)
    window_start: float = kept(default=0.0)
    holds: list[float] = kept(default_factory=list)
    # seconds from each recent hang's verdict to the next batch, newest last
    restarts: list[float] = kept(default_factory=list, omitted=True)
    points: list[HangPoint] = kept(default_factory=list)
    # Not kept: a monotonic time means nothing to the next supervisor.
    stall_since: float | None = None  # the last progress before the newest hang, until the next spawn

    def hang(self, point: HangPoint, trained: float, last_progress_at: float | None, lost: float) -> None:
        self.hang_marks.append(trained)
        if len(self.hang_marks) > HANG_WINDOW:
            self.window_start = self.hang_marks.pop(0)
        self.points = (self.points + [point])[-POINTS_KEPT:]
        self.stall_since = last_progress_at
        self.losses = (self.losses + [round(lost, 3)])[-COSTS_KEPT:]

    def spawned(self, now_mono: float) -> None:
        """The next worker is up: the newest hang's cost up to here is known."""
        if self.stall_since is not None:
            self.stalls = (self.stalls + [span(self.stall_since, now_mono)])[-COSTS_KEPT:]
        self.stall_since = None

    def restarted(self, seconds: float) -> None:
        """A hang's restart reached its first batch ``seconds`` after the verdict."""
        self.restarts = (self.restarts + [round(seconds, 3)])[-COSTS_KEPT:]

    def checkpoint_hold(self, seconds: float) -> None:
        self.holds = (self.holds + [seconds])[-HOLDS_KEPT:]

    def stall_cost(self, interval: float | None) -> float | None:
        """Seconds from a hang to the next spawn, work lost included (None until a hang was followed by a spawn):
        the measured stall, plus the measured loss or half the ``interval`` between checkpoints now in force,
        whichever is less (losses measured under a longer interval overstate what the next hang throws away)."""
        if not self.stalls:
            return None
        lost = sum(self.losses) / len(self.losses) if self.losses else 0.0
        if interval is not None:
            lost = min(lost, interval / 2)
        return sum(self.stalls) / len(self.stalls) + lost

    def same_point_run(self) -> list[HangPoint]:
        """The newest hangs in a row that sat at the newest one's point (phase, epoch, batch)."""
        run: list[HangPoint] = []
        for point in reversed(self.points):
            if run and not point.same_place(run[0]):
                break
            run.insert(0, point)
        return run

    def doubted_run(self) -> list[HangPoint]:
        """The newest verdicts in a row at the newest one's point for the same wait, each found short of the phase's
        own bound for it (the idle floor, a witness's bound): none of those waits had outlasted what the phase
        allows such a wait. Two or more, and the next attempt gives that point the phase's own bound
        (``POINT_VERDICTS``); their restarts spend no budget (after_stop.py): the next attempt settles it."""
        run: list[HangPoint] = []
        for point in reversed(self.points):
            if not point.short or run and not point.same_wait(run[0]) or point.wait is None:
                break
            run.insert(0, point)
        return run

    def owed_point(self) -> tuple[HangPoint, int] | None:
        """The point the next attempt owes the phase's own bound, and the verdicts there in a row (``doubted_run``,
        or those it ended with: a kill at that bound keeps the point's bound); None: none owed."""
        run: list[HangPoint] = []
        for point in reversed(self.points):
            if point.wait is None or run and not point.same_wait(run[0]):
                break
            run.insert(0, point)
        doubted = [p for p in run if p.short]
        return (run[-1], len(run)) if len(doubted) >= POINT_VERDICTS else None

    def spend(self, wall: float) -> None:
        """The newest hang's restart spent the budget at ``wall``."""
        self.points[-1] = replace(self.points[-1], spent=wall)

    def give_back(self, run: list[HangPoint]) -> list[float]:
        """The budget spends of ``run``'s restarts, taken off them (the caller takes them off the budget)."""
        spent = [p.spent for p in run if p.spent is not None]
        self.points = [replace(p, spent=None) if any(p is q for q in run) else p for p in self.points]
        return spent

    def passed(self, newest: HangPoint) -> frozenset[int]:
        """The rungs whose hang the newest one moved later: each hung twice or more at one point, in the newest's
        phase but earlier in the training, and the newest hang's rung got past that point. Its hang there is tied to
        the point (a validation that hangs whenever it comes), not to chance: going back to that rung would hang
        there again. One hang at a point proves nothing (a driver's bad night hangs anywhere, later and later)."""
        counts: dict[tuple[int, tuple[str, int, int]], int] = {}
        for p in self.points:
            if p.rung is not None and p.rung != newest.rung and p.phase == newest.phase \
                    and (p.epoch, p.batch) < (newest.epoch, newest.batch):
                place = (p.rung, (p.phase, p.epoch, p.batch))
                counts[place] = counts.get(place, 0) + 1
        return frozenset(rung for (rung, _), n in counts.items() if n >= 2)

    def repeated_point(self) -> HangPoint | None:
        """The newest hang's point, when the hangs in a row there resumed from ``REPEATS`` different points: a hang
        the settings cause, recurring a fixed distance after one resume point, is no evidence of a deterministic one."""
        run = self.same_point_run()
        return run[-1] if len({p.resumed_at for p in run}) >= REPEATS else None


# Hangs in a row at the same point: what the evidence says hung, and whether a rung not tried yet changes it.
#
# A hang the settings cause recurs at the same point as surely as one in the model or the data when every attempt
# resumes from the same checkpoint, or when it sits in a loader worker at a fixed batch of the epoch. So while the
# stacks name a DataLoader worker inside a sample, or validation is what hung, and a rung not tried yet changes that
# (the loader's settings; ``val``), the ladder climbs to it; the run ends as deterministic (exit 78) only once hangs at
# the same point from different resume points (above) are left with no such rung.
LOADER_SETTINGS = ("workers", "loader", "persistent_workers", "start_method", "threads")
VALIDATION_SETTINGS = ("val",)


def what_hung(point: HangPoint, stacks: Stacks | None) -> tuple[str, tuple[str, ...]] | None:
    """What the evidence says hung, and the settings that change it; None where no rung is known to."""
    if stacks is not None and stacks.in_loader_worker:
        return "a DataLoader worker", LOADER_SETTINGS
    if point.phase == Phase.VAL.value:
        return "validation", VALIDATION_SETTINGS
    return None


def untried_cure(ladder: Ladder, rung: int, facts: list[RungFacts], settings: tuple[str, ...]) -> int | None:
    """The lowest rung above ``rung``, not tried in this run, whose ``settings`` differ from ``rung``'s."""
    here = ladder.settings(rung)
    for k in range(rung + 1, len(ladder)):
        there = ladder.settings(k)
        if not facts[k].tried and any(here.get(key) != there.get(key) for key in settings):
            return k
    return None
