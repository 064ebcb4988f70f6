"""The training's pace after a recovery against before it (issue 59.2): a restarted attempt's first batches, or
those after an in-place rebuild, may run slow (kernels chosen again, a page cache refilled, new loader workers
warming up), a cost no verdict or restart part shows. Each incident that training resumed after is watched over
its first ``PACE_BATCHES`` training batches (from the resumed attempt's second batch: its first is the restart's,
``restart_seconds``), against the ``PACE_BATCHES`` before its stall, and written with that as its ``after`` once
the window is full, or with what it holds where training stopped sooner (the attempt's end, the next incident).

A batch's time is the gap between two training beats in a row, by the worker's own clock; a gap across an epoch's
end, a mid-epoch checkpoint or a recovery is no batch's."""

from __future__ import annotations

from dataclasses import dataclass, field

PACE_BATCHES = 50


@dataclass
class PaceWatch:
    """One incident's window: the batches before its stall, then those after the recovery (None until resumed)."""
    before: tuple[float, ...]
    after: list[float] | None = None

    @property
    def full(self) -> bool:
        return self.after is not None and len(self.after) >= PACE_BATCHES

    def after_field(self) -> dict[str, float | int | None] | None:
        """The incident's ``after``: None where training never resumed after it."""
        if self.after is None:
            return None
        return pace_after(self.before, self.after)


def pace_after(before: tuple[float, ...] | list[float], after: list[float]) -> dict[str, float | int | None]:
    """``batches`` and ``seconds`` after, ``before_batches`` and ``before_seconds``, the mean batch's ``ratio`` (after
    over before), ``extra_seconds`` (what the batches after took beyond the pace before) and the ``slowest`` batch
    after; the comparisons None where either side has no batch."""
    ratio = extra = None
    if before and after and sum(before) > 0:
        mean_before = sum(before) / len(before)
        ratio = round(sum(after) / len(after) / mean_before, 3)
        extra = round(sum(after) - len(after) * mean_before, 3)
    return {"batches": len(after), "seconds": round(sum(after), 3), "before_batches": len(before),
            "before_seconds": round(sum(before), 3), "ratio": ratio, "extra_seconds": extra,
            "slowest": round(max(after), 3) if after else None}


@dataclass
class Paces:
    """The windows under way, by incident id (``Supervision.paces``; not kept: a restarted supervisor writes the
    incident without its ``after``)."""
    watches: dict[str, PaceWatch] = field(default_factory=dict)

    def opened(self, incident_id: str, before: list[float]) -> None:
        self.watches[incident_id] = PaceWatch(tuple(before[-PACE_BATCHES:]))

    def resumed(self, incident_id: str) -> bool:
        """Training resumed after the incident: its window after opens. False where it has none (a stop's)."""
        watch = self.watches.get(incident_id)
        if watch is None:
            return False
        watch.after = []
        return True

    def watching(self, incident_id: str) -> bool:
        """Its window after is open: the incident waits only for its ``after``."""
        watch = self.watches.get(incident_id)
        return watch is not None and watch.after is not None

    def batch(self, seconds: float) -> list[str]:
        """A training batch's time: the ids of the incidents whose window it fills."""
        filled = []
        for incident_id, watch in self.watches.items():
            if watch.after is not None and not watch.full:
                watch.after.append(seconds)
                if watch.full:
                    filled.append(incident_id)
        return filled

    def kept_for(self, incident_ids: set[str]) -> None:
        """Only the windows of these incidents stay (one dropped as no hang, or past the incidents kept, has none)."""
        self.watches = {i: w for i, w in self.watches.items() if i in incident_ids}

    def closed(self, incident_id: str) -> dict[str, float | int | None] | None:
        """The incident is written now: its ``after`` as it stands, and its window gone."""
        watch = self.watches.pop(incident_id, None)
        return None if watch is None else watch.after_field()
