"""What one rung of the ladder has shown in this run: one record per rung, kept across supervisor restarts.

``Supervision.rungs`` maps a rung to its ``RungRecord``; the ladder's choices (choices.py) read it as
``rung_choice.RungFacts``, and the status shows it (``rung_speeds``, ``probe``, ``ladder.rungs``). A rung has a
record from its first fact on (``Supervision.rung_record``); one without is one with nothing to show.

State files written before the records (each fact in a map of its own, keyed by the rung) are read by
``from_maps``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from supervisor.decision.model import persistence
from supervisor.decision.model.checkpoint_interval import median
from supervisor.decision.model.persistence import kept
from supervisor.decision.model.rung_choice import RungFacts

SPEEDS_KEPT = 25  # it/s measurements kept per rung, behind its median
STARTS_KEPT = 5  # starts per rung behind its median


@dataclass
class RungRecord:
    speeds: list[float] = kept(default_factory=list, omitted=True)  # recent it/s measurements
    seconds: float = kept(default=0.0, omitted=True)  # training seconds: first batch to last progress of each attempt
    hangs: int = kept(default=0, omitted=True)  # hangs here that restarted the worker (not those recovered in place)
    starts: list[float] = kept(default_factory=list, omitted=True)  # recent spawns to a first training batch
    # healthy seconds here before the rung below is probed, doubled by each probe that hung; None: probe_after
    probation: float | None = kept(default=None, omitted=True)
    failed_probes: int = kept(default=0, omitted=True)  # probes of this rung that hung
    # what its hangs recovered short of a restart cost (their tier_cost), how many, and how many escalated after all
    tier_seconds: float = kept(default=0.0, omitted=True, was="in_place_seconds")
    tier_recovered: int = kept(default=0, omitted=True, was="in_place")
    tier_escalated: int = kept(default=0, omitted=True, was="in_place_failed")

    def speed(self) -> float | None:
        """The median it/s measured here (None until measured)."""
        return median(self.speeds)

    def start(self) -> float | None:
        """The median seconds from a spawn here to the first training batch (None until measured)."""
        return median(self.starts)

    def facts(self) -> RungFacts:
        """The record as the ladder's choices read it (rung_choice.py)."""
        return RungFacts(self.speed(), self.seconds, self.hangs, self.start(), self.failed_probes,
                         self.tier_seconds, self.tier_recovered, self.tier_escalated)

    def measured(self, speed: float) -> None:
        self.speeds = (self.speeds + [round(speed, 4)])[-SPEEDS_KEPT:]

    def started(self, seconds: float) -> None:
        """An attempt here reached its first training batch ``seconds`` after its spawn."""
        self.starts = (self.starts + [round(seconds, 3)])[-STARTS_KEPT:]


@dataclass
class _HangHistoryMaps:
    rung_seconds: dict[int, float] = kept(default_factory=dict)
    rung_starts: dict[int, list[float]] = kept(default_factory=dict)


@dataclass
class _Maps:
    """The state file's per-rung maps from before ``RungRecord`` (the first state files' layout), read by type."""
    rung_speeds: dict[int, list[float]] = kept(default_factory=dict)
    rung_hangs: dict[int, int] = kept(default_factory=dict)
    rung_in_place_seconds: dict[int, float] = kept(default_factory=dict)
    probation: dict[int, float] = kept(default_factory=dict)
    failed: dict[int, int] = kept(default_factory=dict)
    hang_history: _HangHistoryMaps = kept(default_factory=_HangHistoryMaps)


def from_maps(saved: dict[str, Any]) -> dict[int, RungRecord]:
    """The records of a state file that holds the per-rung maps instead (persistence.Unreadable where one is not of
    its type)."""
    maps = persistence.construct(_Maps, saved)
    h = maps.hang_history
    rungs = {}
    for k in sorted({*maps.rung_speeds, *maps.rung_hangs, *maps.rung_in_place_seconds, *maps.probation, *maps.failed,
                     *h.rung_seconds, *h.rung_starts}):
        rungs[k] = RungRecord(speeds=maps.rung_speeds.get(k, []), seconds=h.rung_seconds.get(k, 0.0),
                              hangs=maps.rung_hangs.get(k, 0), starts=h.rung_starts.get(k, []),
                              probation=maps.probation.get(k), failed_probes=maps.failed.get(k, 0),
                              tier_seconds=maps.rung_in_place_seconds.get(k, 0.0))
    return rungs
