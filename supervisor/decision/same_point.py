"""Hangs in a row at the same point: what the evidence says hung, and whether a rung not tried yet changes it.

A hang the settings cause recurs at the same point as surely as one in the model or the data when every attempt
resumes from the same checkpoint, or when it sits in a loader worker at a fixed batch of the epoch. So while the
stacks name a DataLoader worker inside a sample, or validation is what hung, and a rung not tried yet changes that
(the loader's settings; ``val``), the ladder climbs to it; the run ends as deterministic (exit 78) only once hangs at
the same point from different resume points (hang_history.py) are left with no such rung.
"""

from __future__ import annotations

from supervisor.decision.hang_history import HangPoint
from supervisor.decision.incident import Stacks
from supervisor.decision.ladder import Ladder
from supervisor.decision.rung_choice import RungFacts
from worker.contract import Phase

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
