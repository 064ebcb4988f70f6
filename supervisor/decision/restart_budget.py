"""The restart budget and the crash backoff: when to stop retrying, and how long to wait before the next try."""

from __future__ import annotations

from supervisor.config import RestartConfig

MAX_DOUBLINGS = 64  # far past any cap; 2 ** 1024 would not fit a float


def restarts_in_window(restart_times: list[float], wall: float, cfg: RestartConfig) -> int:
    return sum(1 for t in restart_times if wall - t <= cfg.window)


def budget_left(restart_times: list[float], wall: float, cfg: RestartConfig) -> int:
    """Restarts still allowed now; 0 means the next failure ends the supervisor."""
    return max(0, cfg.max_restarts - restarts_in_window(restart_times, wall, cfg))


def backoff_delay(consecutive_crashes: int, cfg: RestartConfig) -> float:
    """initial, 2x initial, 4x initial ... capped at backoff_max, for the 1st, 2nd, 3rd crash in a row."""
    if consecutive_crashes <= 0:
        return 0.0
    return min(cfg.backoff_max, cfg.backoff_initial * 2.0 ** min(consecutive_crashes - 1, MAX_DOUBLINGS))
