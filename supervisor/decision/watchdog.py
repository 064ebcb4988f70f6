"""The watchdog's arithmetic: how long the current phase may go without progress.

Pure functions of the configuration and the intervals observed in the current attempt. An ``auto``
timeout is max(auto_floor, auto_factor x the slowest of the recent intervals of that phase), so it
tracks the machine and the rung (``workers = 0`` is several times slower per batch than ``workers = 8``)
without anyone tuning it. Intervals are kept per attempt for that reason.
"""

from __future__ import annotations

from collections import deque
from typing import Iterable

from supervisor.config import AUTO, WatchdogConfig


def auto_timeout(cfg: WatchdogConfig, intervals: Iterable[float]) -> float:
    slowest = max(intervals, default=0.0)
    return max(cfg.auto_floor, cfg.auto_factor * slowest)


def startup_step_timeout(cfg: WatchdogConfig, step: str, seen: float | None) -> tuple[float | None, str]:
    """A startup step since its clock started (its entry, or its last progress): ``startup_timeout`` until this run
    has seen that step once, then max(auto_floor, auto_factor x its slowest seen), never more than
    ``startup_timeout`` (the seeds' most frequent hang came at the same point before the first batch on every resume:
    the first batch's own bound finds it, whatever the scan or the imports before it took)."""
    if seen is None or cfg.startup_timeout is None:
        return cfg.startup_timeout, "startup_timeout"
    observed = auto_timeout(cfg, [seen])
    return (observed, f"{step} auto") if observed < cfg.startup_timeout else (cfg.startup_timeout, "startup_timeout")


def phase_timeout(cfg: WatchdogConfig, phase: str, intervals: dict[str, deque],
                  epoch_end_seen: float | None = None) -> tuple[float | None, str]:
    """Seconds the worker may spend in ``phase`` since its last progress, and how that was decided.

    The end of an epoch (``save``: the epoch's last batch, validation's set-up, the save, the next epoch's loader)
    has no rhythm of its own: ``save_timeout`` holds until one epoch end has been observed, then the longest gap
    seen there bounds it like a batch interval."""
    if phase == "train":
        configured, samples = cfg.stall_timeout, intervals.get("train", ())
    elif phase == "val":
        configured = cfg.val_timeout
        samples = intervals.get("val") or intervals.get("train", ())
    elif phase == "save" and epoch_end_seen is not None and cfg.save_timeout is not None:
        observed = auto_timeout(cfg, [epoch_end_seen])
        return (observed, "save auto") if observed < cfg.save_timeout else (cfg.save_timeout, "save_timeout")
    elif phase in ("save", "done"):
        return cfg.save_timeout, "save_timeout"
    else:  # setup: only before the first training batch, which the startup timeout covers
        return cfg.startup_timeout, "startup_timeout"
    if configured == AUTO:
        return auto_timeout(cfg, samples), f"{phase} auto"
    return configured, f"{phase} timeout"
