"""Where a worker's start goes: interpreter and imports, the trainer, model/data/loaders, the first batch.

Restart time is what a hang costs after detection, so the worker says, at its first batch, how long each stage
took since its process began (read from /proc, so the interpreter's own start counts too). With
``YOLO_TRAIN_PROFILE_START`` set to a directory, a standby's launch is also profiled (cProfile, the main thread) up to
its first batch, written there as ``start-PID.pstats``: what a stage's seconds are spent on (bench/device_wait.py)."""

from __future__ import annotations

import cProfile
import os
import time

ENV_PROFILE_START = "YOLO_TRAIN_PROFILE_START"


def process_start_wall() -> float:
    """When this process began, in wall-clock seconds (its start time in /proc/self/stat, since boot)."""
    try:
        with open("/proc/self/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        started_after_boot = int(fields[19]) / os.sysconf("SC_CLK_TCK")
        with open("/proc/uptime") as f:
            uptime = float(f.read().split()[0])
        return time.time() - (uptime - started_after_boot)
    except (OSError, ValueError, IndexError):
        return time.time()


class StartupClock:
    def __init__(self) -> None:
        self.began = process_start_wall()
        self.marks: list[tuple[str, float]] = []
        self.origin = "spawn"
        self.profile: cProfile.Profile | None = None

    def restart(self) -> None:
        """A standby worker was launched: its start is measured from now, its imports done while it waited."""
        self.began = time.time()
        self.marks = []
        self.origin = "standby launch"
        if os.environ.get(ENV_PROFILE_START):
            self.profile = cProfile.Profile()
            self.profile.enable()

    def rank_started(self) -> None:
        """A DDP rank's start is measured from its process's: a rank forked by the rank server (worker/standby/rank_server.py)
        holds the server's clock, made at its imports."""
        self.began = process_start_wall()
        self.marks = []
        self.origin = "rank start"

    def mark(self, stage: str) -> None:
        """``stage`` just ended."""
        self.marks.append((stage, time.time()))

    def report(self) -> str:
        if self.profile is not None:
            self.profile.disable()
            self.profile.dump_stats(os.path.join(os.environ[ENV_PROFILE_START], f"start-{os.getpid()}.pstats"))
            self.profile = None
        parts, before = [], self.began
        for stage, at in self.marks:
            parts.append(f"{stage} {at - before:.1f}")
            before = at
        return f"{self.origin} to first batch {before - self.began:.1f} s: " + ", ".join(parts)


CLOCK = StartupClock()
