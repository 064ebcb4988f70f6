"""Any training script as the worker: its command line for a rung, its resume point, and its progress read from
its output when it sends no heartbeat.

A rung changes a command through ``env`` (merged into the environment) and ``args`` (``{"--workers": "0"}``: the
flag's value is replaced where the flag appears, as ``--flag value`` or ``--flag=value``, else the pair is
appended). The resume point is the newest file matching ``[worker] checkpoint``; ``resume_args`` pass it.

What output parsing can and cannot see: a line whose counter grew (a tqdm, Ultralytics or Lightning bar, or the
``[progress] regex``) is progress, exactly as a heartbeat; a script that keeps redrawing the same bar, or spins
while printing, is not. It cannot see a DataLoader worker's death before the bar stalls, a phase the script does
not print, or a checkpoint being written: the heartbeat client (``worker/heartbeat.py``) says those.
"""

from __future__ import annotations

import glob
import os
import sys
from pathlib import Path

from supervisor.attempt.progress_lines import ProgressCounter, ProgressParser
from supervisor.config import CommandConfig
from worker.wire.contract import HeartbeatMessage, MessageKind, Phase

CHECKPOINT_FIELD = "{checkpoint}"


def newest_checkpoint(cfg: CommandConfig) -> Path | None:
    """The newest file matching the checkpoint glob (relative to cwd), or None."""
    if cfg.checkpoint is None:
        return None
    pattern = os.path.join(str(cfg.cwd or Path.cwd()), os.path.expanduser(cfg.checkpoint))
    matches = [Path(p) for p in glob.glob(pattern) if os.path.isfile(p)]
    return max(matches, key=lambda p: p.stat().st_mtime_ns, default=None)


def resume_point(cfg: CommandConfig) -> str:
    """Where a [worker] command's next attempt resumes, in words (the Ultralytics worker's: StateDir's own)."""
    found = newest_checkpoint(cfg)
    return str(found) if found else "the command's own resume point"


def command_argv(cfg: CommandConfig, args: dict[str, str], checkpoint: Path | None) -> list[str]:
    """The command for this rung: ``python`` is the supervisor's own Python (its virtualenv, also under systemd's
    short PATH), the rung's ``args`` set, the resume arguments added when there is a checkpoint."""
    argv = list(cfg.argv)
    if argv[0] in ("python", "python3"):
        argv[0] = sys.executable
    for flag, value in args.items():
        argv = _set_argument(argv, flag, value)
    if checkpoint is not None:
        argv += [a.replace(CHECKPOINT_FIELD, str(checkpoint)) for a in cfg.resume_args]
    return argv


def _set_argument(argv: list[str], flag: str, value: str) -> list[str]:
    for i, arg in enumerate(argv):
        if arg == flag and i + 1 < len(argv):
            return argv[:i + 1] + [value] + argv[i + 2:]
        if arg.startswith(flag + "="):
            return argv[:i] + [f"{flag}={value}"] + argv[i + 1:]
    return argv + [flag, value]


class OutputProgress:
    """A command's output turned into heartbeats: each reading whose position grew becomes a beat of ``pid``."""

    def __init__(self, pid: int, regex: str | None):
        self.pid = pid
        self.parser = ProgressParser(regex)
        self.counter = ProgressCounter()

    def feed(self, data: bytes) -> list[HeartbeatMessage]:
        messages = []
        for reading in self.parser.feed(data):
            if not self.counter.observe(reading):
                continue
            batch = reading.batch
            # A bar at 0/N: the loop has begun, no batch is done yet; a phase change, not a training beat.
            kind = MessageKind.BEAT if batch or reading.phase != Phase.TRAIN else MessageKind.PHASE
            messages.append(HeartbeatMessage(
                pid=self.pid, kind=kind, phase=reading.phase, progress=self.counter.progress,
                epoch=reading.epoch or self.counter.epoch, epochs=reading.epochs, batch=batch or None,
                batches=reading.batches, losses=None if reading.loss is None else {"loss": reading.loss}))
        return messages

    def never_seen(self) -> str | None:
        """For an incident: what the parser saw when no line was ever a progress line."""
        if self.parser.readings:
            return None
        return f"no progress line was ever seen in {self.parser.lines} lines of output"
