"""The worker process as the supervisor sees it: started from a launch record, read through three descriptors
(the heartbeat pipe, its output, a pidfd for its exit), told what to do through a fourth (the command pipe: typed
``Command`` lines, never waited on), and killed with every process it started.

The agent registers the descriptors with its selector and calls the ``read_*`` methods when they are ready; nothing
here blocks except ``kill``, which waits at most ``kill_grace + kill_timeout`` and calls ``keepalive`` while it
waits (the agent pings systemd's watchdog from it).
"""

from __future__ import annotations

import collections
import fcntl
import os
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Collection

import psutil

from supervisor.attempt.progress_lines import MAX_LINE_BYTES
from supervisor.attempt.terminal_escapes import without_escapes
from supervisor.attempt.worker_command import OutputProgress
from supervisor.host import process_tree
from worker.wire.contract import ENV_COMMAND_FD, PRIME_WORD, Command, CommandKind, HeartbeatMessage
from worker.wire.heartbeat_protocol import ENV_FD, Decoder, read_available

OUTPUT_TAIL_LINES = 20  # of the worker's output, kept for the incident record
F_SETPIPE_SZ = 1031  # fcntl.F_SETPIPE_SZ, named in Python 3.10+ only on some builds
PIPE_SIZE = 1 << 20  # the default /proc/sys/fs/pipe-max-size


class SpawnError(OSError):
    """The worker's program cannot be started (no such file, not executable)."""


@dataclass
class HeartbeatCounts:
    received: int = 0
    malformed: int = 0
    oversized: int = 0
    dropped: int = 0  # the worker's own count of beats it dropped because the pipe was full


@dataclass
class WorkerProcess:
    popen: subprocess.Popen
    pidfd: int
    heartbeat_fd: int
    output_fd: int
    decoder: Decoder = field(default_factory=Decoder)
    output_tail: collections.deque = field(default_factory=lambda: collections.deque(maxlen=OUTPUT_TAIL_LINES))
    partial_line: bytes = b""
    closed: bool = False
    output_progress: OutputProgress | None = None  # a command that sends no heartbeat: progress from its output
    launch_fd: int | None = None  # a standby's stdin: the launch record's path is written there, once
    env: dict[str, str] = field(default_factory=dict)  # as spawned: a standby serves only a launch in the same one
    descendants: dict[int, bool] = field(default_factory=dict)  # senders looked up: pid -> below the worker's pid
    command_fd: int | None = None  # the command pipe's write end, non-blocking
    checkpoint_signal: int | None = None  # a [worker] command's "save and exit" (it reads no command pipe)
    commands_sent: int = 0
    # The CPU window a stall's inspection opened before reading the stacks: the kill's snapshot that follows at
    # once ends it, and waits for no window of its own (incident_evidence.py).
    cpu_since: process_tree.CpuSample | None = None

    @property
    def pid(self) -> int:
        return self.popen.pid

    @property
    def fds(self) -> tuple[int, int, int]:
        return self.heartbeat_fd, self.output_fd, self.pidfd

    @classmethod
    def spawn(cls, argv: list[str], env: dict[str, str], cwd: Path | None = None, standby: bool = False
              ) -> "WorkerProcess":
        """Start ``argv`` in a session of its own, killed by the kernel if the supervisor dies, the heartbeat pipe's
        write end inherited (its number in the environment), stdout and stderr into one pipe; a ``standby`` also
        gets a pipe on its stdin, to be told what to train (``launch``)."""
        heartbeat_r, heartbeat_w = os.pipe()
        output_r, output_w = os.pipe()
        command_r, command_w = os.pipe()
        launch_r, launch_w = os.pipe() if standby else (subprocess.DEVNULL, None)
        for fd in (heartbeat_w, output_w):
            _grow_pipe(fd)
        try:
            popen = subprocess.Popen(argv, pass_fds=(heartbeat_w, command_r), stdin=launch_r, stdout=output_w,
                                     stderr=output_w, env={**env, ENV_FD: str(heartbeat_w),
                                                           ENV_COMMAND_FD: str(command_r)}, cwd=cwd,
                                     start_new_session=True, preexec_fn=process_tree.dies_with(os.getpid()))
        except OSError as e:
            for fd in (heartbeat_r, heartbeat_w, output_r, output_w, command_r, command_w) + \
                    ((launch_r, launch_w) if standby else ()):
                os.close(fd)
            raise SpawnError(e.errno, e.strerror) from None
        for fd in (heartbeat_w, output_w, command_r) + ((launch_r,) if standby else ()):
            os.close(fd)
        for fd in (heartbeat_r, output_r, command_w):
            os.set_blocking(fd, False)
        return cls(popen, os.pidfd_open(popen.pid), heartbeat_r, output_r, launch_fd=launch_w, env=dict(env),
                   command_fd=command_w)

    def in_tree(self, pid: int) -> bool:
        """Whether ``pid`` is the worker's process or one of its descendants (looked up once per pid)."""
        if pid == self.pid:
            return True
        if pid not in self.descendants:
            self.descendants[pid] = process_tree.descends_from(pid, self.pid)
        return self.descendants[pid]

    def request_checkpoint(self) -> None:
        """Ask the worker to save a checkpoint and exit: a command, or a [worker] command's signal."""
        if self.checkpoint_signal is None:
            self.send(Command(CommandKind.CHECKPOINT_AND_STOP))
            return
        try:
            os.kill(self.pid, self.checkpoint_signal)
        except ProcessLookupError:
            pass  # already gone: its exit is on its way through the pidfd

    def send(self, command: Command) -> bool:
        """Write one command line; never waits (a full pipe or a worker gone: False)."""
        if self.command_fd is None:
            return False
        self.commands_sent += 1
        try:
            os.write(self.command_fd, Command(command.kind, command.rank, command.pids, self.commands_sent).to_line())
            return True
        except OSError:  # full (the worker does not read), or no reader left
            return False

    def prime(self, checkpoint: Path | None) -> None:
        """Tell a standby that a restart from ``checkpoint`` (None: from scratch) is coming, before its launch: one
        line, its stdin left open for the launch's."""
        if self.launch_fd is None:
            return
        try:
            os.write(self.launch_fd, f"{PRIME_WORD} {checkpoint or ''}".rstrip().encode() + b"\n")
        except OSError:
            pass  # gone: its launch says so

    def launch(self, record_path: Path) -> bool:
        """Tell a standby what to train: the launch record's path, one line, and the end of its stdin. False when
        it is gone (its read end closed)."""
        fd, self.launch_fd = self.launch_fd, None
        try:
            os.write(fd, f"{record_path}\n".encode())  # far below PIPE_BUF: one write, never partial
            return True
        except OSError:
            return False
        finally:
            os.close(fd)

    def read_heartbeats(self, counts: HeartbeatCounts) -> tuple[list[HeartbeatMessage], bool]:
        """The messages the pipe holds now, and whether it reached its end (every writer gone)."""
        data = read_available(self.heartbeat_fd)
        messages = self.decoder.feed(data) if data else []
        counts.malformed += self.decoder.malformed
        counts.oversized += self.decoder.oversized
        self.decoder.malformed = self.decoder.oversized = 0
        counts.received += len(messages)
        for m in messages:
            if m.dropped is not None and m.pid == self.pid:
                counts.dropped = max(counts.dropped, m.dropped)
        return messages, data == b""

    def read_output(self) -> tuple[list[str], list[HeartbeatMessage], bool]:
        """Complete lines of output, each as a terminal would end up showing it (the text after its last carriage
        return, so progress bars do not swallow other lines, and no terminal escapes: terminal_escapes.py), the
        progress read from them (a command without heartbeats), and whether the output reached its end."""
        data = read_available(self.output_fd)
        if not data:
            return [], [], data == b""
        progress = self.output_progress.feed(data) if self.output_progress is not None else []
        *lines, partial = (self.partial_line + data).split(b"\n")
        # Bounded, whatever the output: a bar redrawn with \r for a whole run never ends its line, and a terminal
        # would show only what follows the last \r anyway.
        self.partial_line = partial.rsplit(b"\r", 1)[-1][:MAX_LINE_BYTES]
        shown = [without_escapes(line.rsplit(b"\r", 1)[-1]).decode(errors="replace") for line in lines]
        shown = [line for line in shown if line.strip()]
        self.output_tail.extend(shown)
        return shown, progress, False

    def wait(self) -> int:
        return self.popen.wait()

    def kill(self, grace: float, timeout: float, keepalive: Callable[[], None] | None = None,
             spare: Collection[int] = ()) -> process_tree.KillReport:
        """SIGTERM the tree, SIGKILL what is left after ``grace``, confirm it gone; then close the descriptors.
        ``spare``: other children of the supervisor to leave alone (the standby)."""
        report = process_tree.kill_tree(self.pid, grace, timeout, adopt_orphans=True, keepalive=keepalive,
                                        spare=spare)
        if self.popen.returncode is None:
            try:
                self.popen.wait(timeout=0.1)
            except subprocess.TimeoutExpired:
                pass
        self.close()
        return report

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            for fd in self.fds + tuple(fd for fd in (self.launch_fd, self.command_fd) if fd is not None):
                os.close(fd)
            self.launch_fd = self.command_fd = None

    def tree_members(self, spare: Collection[int] = ()) -> list[psutil.Process]:
        """The processes of the tree now (and any orphan re-parented to us), for an incident."""
        members = process_tree.tree(self.pid) + process_tree.tree(spare=spare)
        return list({p.pid: p for p in members}.values())


def _grow_pipe(fd: int) -> None:
    """A pipe of PIPE_SIZE, so a supervisor that is not reading for a while (stopped, busy killing) does not block
    the worker on its output: 64 KiB of progress bars fill in seconds, 1 MiB in minutes."""
    try:
        fcntl.fcntl(fd, F_SETPIPE_SZ, PIPE_SIZE)
    except OSError:
        pass  # above /proc/sys/fs/pipe-max-size for this user: the default size stays


def forward(lines: list[str]) -> None:
    """Show the worker's lines on our stderr; a closed stderr must never reach the worker."""
    try:
        sys.stderr.write("".join(line + "\n" for line in lines))
        sys.stderr.flush()
    except (OSError, ValueError):
        pass
