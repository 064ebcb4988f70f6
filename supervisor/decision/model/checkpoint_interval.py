"""How often the worker checkpoints inside an epoch: fixed, or learned from the hangs this run has seen.

A checkpoint costs its hold (the training loop waits for the save) every interval; a hang costs the training since
the newest checkpoint, on average half an interval. The interval that minimises the sum is Young's,
``sqrt(2 x hold x mean time between hangs)`` (J. W. Young, CACM 1974; Daly's refinement, FGCS 2006, matters only
where the hold is not small against the mean time; a hold of a second against hangs tens of seconds apart is small).
With ``[checkpoint] every = "auto"`` it is computed at
every spawn, so after each hang, from what this run measured:

- the hold: the newest checkpoints' pauses of the training loop (``CheckpointMark.seconds``), their median;
- the mean time between hangs: training seconds over the hangs of the last ``HANG_WINDOW`` (plus the time since the
  newest), so a burst shortens the interval within a hang or two and a quiet spell lengthens it again.

Clamped to ``[floor, max]``: the floor, ten measured holds (and never under ``LEAST``), keeps a checkpoint's cost
under a tenth of training whatever the hang rate. It follows the hold this run measured, not a fixed count of
seconds: a save written from a thread holds the loop for tens of milliseconds, so a night of hangs tens of seconds
apart checkpoints inside its epochs (a fixed 5 s floor kept every restart of a 6 s-epoch night at the last epoch's
end: issue 59.4); a save that holds the loop longer (a large model, a slow disk, the writer still busy with the last
one) raises its floor with it. ``max`` (default 10 minutes) is the interval of a run that has not hung, the same as a
fixed ``every = "10m"``.

Young's balance counts a batch replayed as a batch's training; it is more: a restarted attempt's first batches run
slow. So while hangs are frequent (one every ``FREQUENT`` seconds of training or more often), the replay a restart
brings (half an interval) is kept no longer than the restart itself (its verdict to its next batch, the median of
the newest ``restart_seconds``): the interval is at most twice that, down to the floor, which bounds the
checkpoints' own cost.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

LEAST = 1.0  # seconds: "auto" never checkpoints closer, whatever the hold (a save a second is the file's size a second)
HOLD_FACTOR = 10.0  # nor closer than this many holds: checkpoints cost at most a tenth of the training loop's time
ASSUMED_HOLD = 1.0  # seconds, until this run has measured one
HOLDS_KEPT = 5  # checkpoint holds behind the median
HANG_WINDOW = 8  # hangs behind the mean time between hangs
FREQUENT = 600.0  # seconds of training between hangs, or fewer: the replay is held to the restart's own length


@dataclass(frozen=True)
class Interval:
    """The interval chosen and what it came from, as status and metrics show it."""
    seconds: float | None  # None: per epoch (Ultralytics' own save) only
    auto: bool
    hold: float | None = None  # the median hold it used (None: fixed, or none measured yet)
    mean_time_between_hangs: float | None = None  # None: no hang seen (the interval is ``max``)
    restart: float | None = None  # the restarts' median seconds, where it held the replay (the interval) down


def young(hold: float, mean_time_between_hangs: float) -> float:
    """The first-order optimum: a checkpoint's cost balanced against half an interval lost per hang."""
    return math.sqrt(2.0 * hold * mean_time_between_hangs)


def floor(hold: float) -> float:
    return max(LEAST, HOLD_FACTOR * hold)


def choose(every: float | str | None, maximum: float, holds: list[float],
           mean_time_between_hangs: float | None, restarts: list[float] | None = None) -> Interval:
    """``every`` as configured: seconds, None ("epoch"), or "auto" (computed, clamped to ``[floor, maximum]``);
    ``restarts``: the newest restarts' seconds from the verdict to the next batch."""
    if every != "auto":
        return Interval(seconds=every, auto=False)  # type: ignore[arg-type]
    hold = median(holds)
    if mean_time_between_hangs is None:
        return Interval(seconds=maximum, auto=True, hold=hold)
    used = ASSUMED_HOLD if hold is None else hold
    seconds = min(maximum, max(floor(used), young(used, mean_time_between_hangs)))
    restart = median(restarts or [])
    held = None
    if restart is not None and mean_time_between_hangs <= FREQUENT and seconds / 2 > restart:
        seconds, held = max(floor(used), min(seconds, 2 * restart)), restart  # the replay no longer than the restart
    return Interval(seconds=round(seconds, 3), auto=True, hold=hold, mean_time_between_hangs=mean_time_between_hangs,
                    restart=held)


def median(values: list[float]) -> float | None:
    ordered = sorted(values)
    return ordered[len(ordered) // 2] if ordered else None


def mean_time_between_hangs(hang_marks: list[float], window_start: float, trained: float) -> float | None:
    """Training seconds per hang over the window: ``hang_marks`` are the run's trained seconds at each hang kept
    (the newest ``HANG_WINDOW``), ``window_start`` the trained seconds where the window begins, ``trained`` now."""
    if not hang_marks:
        return None
    return max(0.0, trained - window_start) / len(hang_marks)
