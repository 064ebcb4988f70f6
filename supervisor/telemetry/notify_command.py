"""``[notify] command``: tells a person, through their own command, what the core's notices say.

The command (argv, no shell) gets the notice as one JSON object on stdin and as ``YOLO_TRAIN_*`` variables. It runs
beside the loop, never in it: started without waiting, its stdin written without blocking, its end looked at from
``poll`` on each turn of the loop, killed (its whole session) after ``[notify] timeout``. Its first failure is
logged at once, later ones counted and said at most once an hour; training never waits for it. The rate rule is the
core's (decision/notices.py); a held summary goes out from ``poll`` once it is due.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import signal
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from supervisor.config import NotifyConfig
from supervisor.decision import Notice, NoticeLimit
from supervisor.host import process_tree

log = logging.getLogger("yolo-train")

FAILURES_SAID_EVERY = 3600.0  # seconds: after the first, a command's failures are said at most this often
MARK = "YOLO_TRAIN_NOTIFY_OF"  # in each command's environment, the supervisor's pid: what it leaves behind is its own


def payload(notice: Notice, name: str, state_dir: Path) -> dict[str, Any]:
    """The notice as the command reads it on stdin."""
    d: dict[str, Any] = {"event": notice.kind.value, "text": notice.text, "time": notice.time,
                         "time_iso": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(notice.time)),
                         "name": name, "state_dir": str(state_dir), "rung": notice.rung,
                         "rung_label": notice.rung_label}
    if notice.previous_rung is not None:
        d["previous_rung"] = notice.previous_rung
    if notice.exit_code is not None:
        d["exit_code"] = notice.exit_code
    if notice.incident is not None:
        i = notice.incident.to_dict()
        d["incident"] = {k: i[k] for k in ("id", "reason", "phase", "epoch", "batch", "detail", "culprit", "where",
                                           "lost_seconds", "lost_batches", "restart_seconds") if k in i}
    if notice.counts:
        d["counts"], d["held"] = notice.counts, list(notice.held)
    return d


def environment(d: dict[str, Any]) -> dict[str, str]:
    """The flat part of the payload as YOLO_TRAIN_EVENT, YOLO_TRAIN_TEXT, YOLO_TRAIN_RUNG, ..."""
    return {f"YOLO_TRAIN_{k.upper()}": str(v) for k, v in d.items() if isinstance(v, (str, int, float))}


@dataclass
class _Running:
    process: subprocess.Popen
    kill_at: float
    event: str


class NotifyCommand:
    def __init__(self, config: NotifyConfig, name: str, state_dir: Path, clock=time.monotonic):
        self.config, self.name, self.state_dir, self.clock = config, name, state_dir, clock
        self.limit = NoticeLimit()
        self.running: list[_Running] = []
        self.said_at: float | None = None  # when a failure was last said (clock)
        self.unsaid, self.last_why = 0, ""  # failures since, not said yet, and the newest one's why
        self.started = False  # a command has been started: children of the supervisor may be its leftovers
        self.mark = str(os.getpid())
        missing = not_found(config.command)
        if missing:  # said at the start, not at the first notice hours later (check-config refuses it)
            self._failure(f"cannot be started ({missing})")

    def tell(self, notice: Notice) -> None:
        if self.config.command:
            for n in self.limit.offer(notice, self.clock()):
                self._start(n)

    def poll(self) -> None:
        """Each turn of the loop: a summary that is due goes out; ended commands are judged, late ones killed."""
        if not self.config.command:
            return
        self._say_failures()
        for n in self.limit.due(self.clock()):
            self._start(n)
        for r in list(self.running):
            code = r.process.poll()
            if code is None and self.clock() >= r.kill_at:
                _kill_session(r.process)
                self._failure(f"ran longer than [notify] timeout = {self.config.timeout:g} s and was killed "
                              f"({r.event})")
                r.process.wait()
            elif code is None:
                continue
            elif code != 0:
                self._failure(f"exited with status {code} ({r.event})")
            self.running.remove(r)

    def pids(self) -> tuple[int, ...]:
        """Children a kill of the worker's tree must leave alone, and whose activity is not the worker's: the
        commands running, and what they left behind (a daemon, ``setsid ... &``, re-parented to the supervisor once
        its command ended), found by the mark in its environment."""
        running = tuple(r.process.pid for r in self.running)
        if not self.started:
            return running
        return running + tuple(p for p in process_tree.children_marked(MARK, self.mark) if p not in running)

    def close(self, keepalive=lambda: None) -> None:
        """At the supervisor's exit: the last notices get their time (each its timeout), then are killed;
        ``keepalive`` is called meanwhile (systemd's watchdog)."""
        while self.running:
            self.poll()
            keepalive()
            if self.running:
                time.sleep(0.05)

    def _start(self, notice: Notice) -> None:
        d = payload(notice, self.name, self.state_dir)
        try:
            process = subprocess.Popen(list(self.config.command), stdin=subprocess.PIPE, stdout=subprocess.DEVNULL,
                                       stderr=subprocess.DEVNULL, env={**os.environ, **environment(d), MARK: self.mark},
                                       start_new_session=True, close_fds=True)
        except OSError as e:
            self._failure(f"cannot be started ({e.strerror or e})")
            return
        self.started = True
        data = json.dumps(d).encode() + b"\n"
        try:
            os.set_blocking(process.stdin.fileno(), False)
            os.write(process.stdin.fileno(), data)  # a few hundred bytes: the pipe's buffer takes them at once
        except OSError:
            pass  # it does not read its stdin (or is gone): the variables tell it all
        finally:
            process.stdin.close()
        self.running.append(_Running(process, self.clock() + self.config.timeout, notice.kind.value))

    def _failure(self, why: str) -> None:
        """The first failure is said at once; later ones at most once per FAILURES_SAID_EVERY, counted, with the last
        one's why (a command failing at every notice fills no log, one that breaks later is not unheard of)."""
        self.unsaid, self.last_why = self.unsaid + 1, why
        self._say_failures()

    def _say_failures(self) -> None:
        now = self.clock()
        if not self.unsaid or self.said_at is not None and now - self.said_at < FAILURES_SAID_EVERY:
            return
        command = list(self.config.command)
        if self.said_at is None:
            log.warning(f"[notify] command {command} {self.last_why}; training goes on, and further failures of it "
                        f"are said at most once an hour")
        else:
            log.warning(f"[notify] command {command} failed {self.unsaid} time(s) in the last "
                        f"{(now - self.said_at) / 60:.0f} min, the last: {self.last_why}; training goes on")
        self.said_at, self.unsaid = now, 0


def not_found(command: tuple[str, ...]) -> str | None:
    """Why ``command`` cannot be started here (no such program, or not executable), or None when it can."""
    if not command:
        return None
    program = command[0]
    if "/" in program:
        return None if os.access(program, os.X_OK) and os.path.isfile(program) else \
            f"{program!r} is not an executable file"
    return None if shutil.which(program) else f"{program!r} is not found on PATH"


def _kill_session(process: subprocess.Popen) -> None:
    try:
        os.killpg(process.pid, signal.SIGKILL)
    except OSError:
        pass
