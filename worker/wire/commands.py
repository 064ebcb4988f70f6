"""The worker's end of the supervisor's command pipe (``Command`` in worker/wire/contract.py): read without blocking.

The training loop polls it at every batch boundary (one ``read`` that finds nothing, almost always) and a loader
polls it when its worker processes die; only a loader whose worker is dead already waits on it, a bounded while, for
the word that explains that death: the supervisor can never stall training. Under DDP
the launching worker trains nothing: a thread relays each command to the pipe of the rank it concerns (a rank opens
its own by the ``/proc`` path in ``YOLO_TRAIN_COMMAND_PATHS``, as the heartbeat's).
"""

from __future__ import annotations

import os
import select
import threading
from typing import Callable

from worker.wire.contract import ENV_COMMAND_FD, Command, CommandKind

ENV_COMMAND_PATHS = "YOLO_TRAIN_COMMAND_PATHS"  # DDP: one /proc path per rank, comma-separated, by rank


class CommandChannel:
    """Commands as they come, those for this ``rank`` (None: not a DDP rank); ``take`` hands out those of a kind."""

    def __init__(self, fd: int | None, rank: int | None = None):
        self.fd, self.rank = fd, rank
        self.pending: list[Command] = []
        self._buffer = b""
        if fd is not None:
            os.set_blocking(fd, False)

    @classmethod
    def from_env(cls, rank: int | None = None) -> "CommandChannel":
        if rank is not None:  # a DDP rank: the descriptor number means nothing here, the path does
            local = os.environ.get("LOCAL_RANK", "")
            local_rank = int(local) if local.isdigit() else rank
            path = (os.environ.get(ENV_COMMAND_PATHS, "").split(",") + [""] * (local_rank + 1))[local_rank]
            try:
                return cls(os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC) if path else None, rank)
            except OSError:
                return cls(None, rank)  # the launching worker is gone: its tree is being killed
        value = os.environ.get(ENV_COMMAND_FD, "")
        return cls(int(value) if value.isdigit() else None)

    def poll(self) -> list[Command]:
        """Read what the pipe holds now; returns the commands that came.

        Each read is kept in the buffer by the statement that makes it, and the commands parsed from it replace it in
        one assignment: torch's SIGCHLD handler raises a dead loader worker's death at any bytecode of the main
        thread, and a command read but not kept would be lost with it."""
        if self.fd is None:
            return []
        while True:
            before = len(self._buffer)
            try:
                self._buffer += os.read(self.fd, 65536)
            except BlockingIOError:
                break
            except OSError:
                self.fd = None
                break
            if len(self._buffer) == before:  # the supervisor closed its end: it is killing the tree
                self.fd = None
                break
        *lines, rest = self._buffer.split(b"\n")
        came = [c for c in (Command.from_line(line) for line in lines if line.strip()) if c is not None
                and self._concerns(c)]
        self.pending, self._buffer = self.pending + came, rest
        return came

    def _concerns(self, command: Command) -> bool:
        if self.rank is None:
            return True
        if command.kind == CommandKind.CHECKPOINT_AND_STOP:
            return self.rank == 0  # it alone writes checkpoints
        return command.rank == self.rank

    def readable(self, timeout: float) -> bool:
        """Whether more comes within ``timeout`` seconds (False at once where the pipe is gone): for a loader whose
        worker died, awaiting the word that may trail it (loader_recovery.WORD_TRAILS), never in the training loop."""
        if self.fd is None:
            return False
        return bool(select.select([self.fd], [], [], timeout)[0])

    def has(self, kind: CommandKind) -> bool:
        self.poll()
        return any(c.kind == kind for c in self.pending)

    def take(self, kind: CommandKind) -> list[Command]:
        taken = self.peek(kind)
        self.drop(kind)
        return taken

    def peek(self, kind: CommandKind) -> list[Command]:
        """The pending commands of ``kind``, kept pending (``drop`` them once what they say is recorded)."""
        self.poll()
        return [c for c in self.pending if c.kind == kind]

    def drop(self, kind: CommandKind) -> None:
        self.pending = [c for c in self.pending if c.kind != kind]


def relay_to_ranks(channel: CommandChannel, world_size: int, on_stop: Callable[[], None]) -> dict[str, str]:
    """In the launching worker under DDP: a pipe per local rank and a thread that copies each command to every one
    (which rank a command concerns is the rank's to tell: a checkpoint rank 0, which alone saves; a loader's the rank
    it names). The environment the ranks need."""
    pipes = [os.pipe() for _ in range(world_size)]
    for read, write in pipes:
        os.set_inheritable(read, False)
    if channel.fd is not None:
        os.set_blocking(channel.fd, True)  # this thread only waits on it

    def relay() -> None:
        buffer = b""
        while True:
            try:
                chunk = os.read(channel.fd, 65536)
            except OSError:
                return
            if not chunk:
                return
            *lines, buffer = (buffer + chunk).split(b"\n")
            for line in lines:
                command = Command.from_line(line)
                if command is None:
                    continue
                if command.kind == CommandKind.CHECKPOINT_AND_STOP:
                    on_stop()
                for _, write in pipes:
                    try:
                        os.write(write, command.to_line())
                    except OSError:
                        pass

    if channel.fd is not None:
        threading.Thread(target=relay, name="yolo-train-commands", daemon=True).start()
    return {ENV_COMMAND_PATHS: ",".join(f"/proc/{os.getpid()}/fd/{read}" for read, _ in pipes)}
