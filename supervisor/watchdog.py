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


def phase_timeout(cfg: WatchdogConfig, phase: str, intervals: dict[str, deque]) -> tuple[float | None, str]:
    """Seconds the worker may spend in ``phase`` since its last progress, and how that was decided."""
    if phase == "train":
        configured, samples = cfg.stall_timeout, intervals.get("train", ())
    elif phase == "val":
        configured = cfg.val_timeout
        samples = intervals.get("val") or intervals.get("train", ())
    elif phase in ("save", "done"):
        return cfg.save_timeout, "save_timeout"
    else:  # setup: only before the first training batch, which the startup timeout covers
        return cfg.startup_timeout, "startup_timeout"
    if configured == AUTO:
        return auto_timeout(cfg, samples), f"{phase} auto"
    return configured, f"{phase} timeout"
