"""What this run has learned from its hangs: the record the ladder and the checkpoint interval decide from.

One record, kept across supervisor restarts (``to_dict``/``from_dict``), written only by the decision core:

- ``rung_seconds``: training seconds spent at each rung (first batch to last progress of each attempt), beside the
  hangs and speeds the core already counts per rung: a rung's hang rate is hangs over these seconds;
- ``hang_costs``: what each recent hang cost in time not training: from the last progress before it to the first
  training batch after the restart (detection, kill, restart), plus the training thrown away;
- ``hang_marks``/``window_start``: the run's trained seconds at each recent hang, behind the mean time between hangs;
- ``holds``: how long the training loop waited for each recent checkpoint;
- ``points``: where each recent hang sat (phase, epoch, batch), newest last, for "the same hang at the same point".
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from supervisor.decision.checkpoint_interval import HANG_WINDOW, HOLDS_KEPT

COSTS_KEPT = 8
POINTS_KEPT = 3  # a hang at the same point this many times in a row is deterministic


@dataclass(frozen=True)
class HangPoint:
    """Where a hang sat: the last progress the worker reported before it."""
    phase: str
    epoch: int
    batch: int


@dataclass
class HangHistory:
    rung_seconds: dict[int, float] = field(default_factory=dict)
    hang_costs: list[float] = field(default_factory=list)
    hang_marks: list[float] = field(default_factory=list)
    window_start: float = 0.0
    holds: list[float] = field(default_factory=list)
    points: list[HangPoint] = field(default_factory=list)
    cost_since: float | None = None  # monotonic: the last progress before the newest hang, until the next first batch
    cost_lost: float = 0.0  # the training that hang threw away

    def trained_at(self, rung: int, seconds: float) -> None:
        if seconds > 0:
            self.rung_seconds[rung] = self.rung_seconds.get(rung, 0.0) + seconds

    def hang(self, point: HangPoint, trained: float, last_progress_at: float | None, lost: float) -> None:
        self.hang_marks.append(trained)
        if len(self.hang_marks) > HANG_WINDOW:
            self.window_start = self.hang_marks.pop(0)
        self.points = (self.points + [point])[-POINTS_KEPT:]
        self.cost_since, self.cost_lost = last_progress_at, lost

    def training_again(self, now_mono: float) -> None:
        """The first training batch after a restart: the newest hang's cost is known now."""
        if self.cost_since is not None:
            self.hang_costs = (self.hang_costs + [round(now_mono - self.cost_since + self.cost_lost, 3)])[-COSTS_KEPT:]
        self.cost_since = None

    def checkpoint_hold(self, seconds: float) -> None:
        self.holds = (self.holds + [seconds])[-HOLDS_KEPT:]

    def mean_hang_cost(self) -> float | None:
        return sum(self.hang_costs) / len(self.hang_costs) if self.hang_costs else None

    def repeated_point(self) -> HangPoint | None:
        """The point of the last ``POINTS_KEPT`` hangs, when they all sat at the same one."""
        if len(self.points) == POINTS_KEPT and len(set(self.points)) == 1:
            return self.points[-1]
        return None

    def to_dict(self) -> dict[str, Any]:
        record = asdict(self)
        record["rung_seconds"] = {str(k): v for k, v in self.rung_seconds.items()}
        record.pop("cost_since")  # a monotonic time means nothing to the next supervisor
        return record

    @classmethod
    def from_dict(cls, record: dict[str, Any] | None) -> HangHistory:
        record = record or {}
        return cls(rung_seconds={int(k): float(v) for k, v in (record.get("rung_seconds") or {}).items()},
                   hang_costs=[float(x) for x in record.get("hang_costs") or []],
                   hang_marks=[float(x) for x in record.get("hang_marks") or []],
                   window_start=float(record.get("window_start") or 0.0),
                   holds=[float(x) for x in record.get("holds") or []],
                   points=[HangPoint(str(p["phase"]), int(p["epoch"]), int(p["batch"]))
                           for p in record.get("points") or []],
                   cost_lost=float(record.get("cost_lost") or 0.0))
