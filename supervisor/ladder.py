"""The ladder of ever safer settings a hung worker is restarted with.

Rung 0 is the configured ``[train]`` as it is. Each later rung adds its settings on top of the rungs
below it, so rung k is "everything that rungs 1..k changed". The default ladder is what the seeds' users
did by hand: halve ``workers`` down to 1, then ``persistent_workers = false`` (DataLoader workers made anew
every epoch), then ``workers = 0`` (no DataLoader processes at all), then ``val = false`` (no validation
pass between epochs, the last epoch still validates). Each step costs speed, so the ladder is climbed
one rung per hang and never skipped.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Ladder:
    rungs: tuple[dict[str, Any], ...]  # rungs[0] == {}: each entry is that rung's own change

    def __len__(self) -> int:
        return len(self.rungs)

    def settings(self, rung: int) -> dict[str, Any]:
        """The overrides in force at ``rung``: the changes of rungs 1..rung, later ones winning."""
        merged: dict[str, Any] = {}
        for change in self.rungs[: rung + 1]:
            merged.update(change)
        return merged

    def label(self, rung: int) -> str:
        settings = self.settings(rung)
        if not settings:
            return "as configured"
        return ", ".join(f"{k}={_toml(v)}" for k, v in settings.items())

    def next(self, rung: int) -> int:
        """One rung safer; the top rung stays where it is (the ladder is exhausted)."""
        return min(rung + 1, len(self.rungs) - 1)

    def exhausted(self, rung: int) -> bool:
        return rung >= len(self.rungs) - 1


def default_ladder(workers: int) -> Ladder:
    rungs: list[dict[str, Any]] = [{}]
    w = workers // 2
    while w >= 1:
        rungs.append({"workers": w})
        w //= 2
    if workers > 0:
        rungs.append({"persistent_workers": False})
        rungs.append({"workers": 0})
    rungs.append({"val": False})
    return Ladder(tuple(rungs))


def build_ladder(configured: tuple[dict[str, Any], ...] | None, workers: int) -> Ladder:
    if configured is None:
        return default_ladder(workers)
    return Ladder(({},) + tuple(configured))


def _toml(value: Any) -> str:
    return str(value).lower() if isinstance(value, bool) else str(value)
