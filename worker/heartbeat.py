"""The heartbeat protocol and its client: how a training loop tells the supervisor it is alive.

Protocol, version 1
-------------------
The supervisor creates a pipe and passes the write end to the worker as the file descriptor named in
the environment variable ``YOLO_TRAIN_HEARTBEAT_FD``. Each message is one line of compact JSON,
terminated by ``\\n``, at most ``MAX_MESSAGE_BYTES`` (= PIPE_BUF, 4096 on Linux) long, so the kernel
writes it atomically: concurrent writers (a training loop and its DataLoader workers) cannot interleave.

Every message has:

- ``v``: protocol version (1); a reader skips messages of another version.
- ``pid``: the sender's pid.
- ``kind``: ``"beat"`` (a training or validation step, or a liveness ping), ``"phase"`` (the loop entered
  a new phase), ``"settings"`` (the settings really in force), ``"error"`` (the loop is dying of an
  exception; sent just before exit so the supervisor can name the failure), ``"checkpoint"`` (a checkpoint
  was written completely at the position given by ``epoch`` and ``batch``), ``"step"`` (before the first batch:
  the worker entered the startup step ``step``, one of ``contract.StartupStep``, or progressed in it: ``done`` of
  ``total`` items, labels scanned or images cached; a step message is not progress, its step's clock is),
  ``"loader"`` (a loader's worker processes ``pids`` gave their first batch ``seconds`` after its iterator was
  made; ``loader``: train or val), ``"wait"`` (the witness, worker/witness.py: while the main thread makes no
  progress, about twice a second, where it waits: ``wait``, a ``contract.WaitReport``; never progress).
- ``progress``: a counter of completed work that never decreases within one process. The supervisor
  counts a message as progress only if this counter grew: a beat without progress is not progress,
  so a keep-alive thread cannot mask a hung loop.
- ``phase``: one of ``setup``, ``train``, ``val``, ``save``, ``done``.

Optional fields: ``epoch``, ``epochs`` (1-based epoch and total), ``batch``, ``batches`` (1-based batch in
the epoch and batches per epoch), ``samples`` (images in the batch), ``losses`` (name -> float), ``lr``,
``settings`` (dict), ``error`` (str), ``path`` and ``seconds`` (a checkpoint's file and how long the loop
waited for it), ``rank`` (the sender's distributed rank), ``local_rank`` (its rank on its host, when that
differs: several hosts), ``dropped`` (messages this sender dropped so far because the pipe was full), ``t``
(sender's wall clock, seconds since the epoch), ``sent`` (sender's CLOCK_MONOTONIC, seconds: the supervisor times
it/s by it, since the pipe delivers beats in bursts).

Under DDP (``worker/ddp.py``) the ranks are not the worker's children but torch.distributed.run's, which closes
inherited descriptors: a rank opens the same pipe by its ``/proc`` path, named in ``YOLO_TRAIN_HEARTBEAT_PATH``,
and every message it sends carries ``rank`` (from the ``RANK`` variable the launcher sets).

Writes are non-blocking: when the pipe is full (the supervisor is not reading) the message is
dropped and counted, never waited for. The supervisor must never be able to stall training.

A write that finds no reader (EPIPE) means the supervisor is gone (it closes its end only after the worker's tree
is dead): the sender SIGKILLs itself, as the supervisor's own worker dies with it (PR_SET_PDEATHSIG), since the
supervisor that replaces it starts another copy of this training on the same checkpoints.
"""

from __future__ import annotations

import errno
import json
import os
import select
import signal
import time
from dataclasses import dataclass, field
from typing import Any

from worker.contract import HeartbeatMessage, MessageKind, Phase, WaitReport
from worker.witness import INTERVAL, Witness

PROTOCOL_VERSION = 1
ENV_FD = "YOLO_TRAIN_HEARTBEAT_FD"
ENV_PATH = "YOLO_TRAIN_HEARTBEAT_PATH"  # a DDP rank's way to the pipe: /proc/<worker pid>/fd/<its write end>
MAX_MESSAGE_BYTES = select.PIPE_BUF
PHASES = tuple(p.value for p in Phase)
# Built once: json.dumps() with non-default arguments builds a new encoder on every call.
_ENCODER = json.JSONEncoder(separators=(",", ":"), default=str)
KINDS = tuple(k.value for k in MessageKind)


# The sender's pid, kept current across fork() (a DataLoader worker that beats must say it is not the loop).
_PID = [os.getpid()]
os.register_at_fork(after_in_child=lambda: _PID.__setitem__(0, os.getpid()))


class Heartbeat:
    """Sends heartbeats to the supervisor. Any PyTorch loop can use it::

        hb = Heartbeat.from_env()          # a no-op when not supervised
        hb.phase("train")
        for i, batch in enumerate(loader):
            ...
            hb.beat(epoch=epoch, epochs=epochs, batch=i + 1, batches=len(loader), losses={"loss": loss.item()})

    ``beat()`` and ``phase()`` count as progress; ``ping()`` does not. ``Heartbeat.from_env(witness=True)`` (or
    ``hb.start_witness()``) also starts the witness (worker/witness.py): while this thread makes no progress, a
    thread that says where it waits, about twice a second. Off unless asked.
    """

    def __init__(self, fd: int | None, rank: int | None = None, local_rank: int | None = None):
        self.fd = fd
        self.rank = rank  # the distributed rank this process trains as; None outside DDP
        self.local_rank = local_rank if local_rank != rank else None  # said only where hosts are several
        self.progress = 0
        self.sent = 0
        self.dropped = 0
        self.current_phase = "setup"
        self.witness: Witness | None = None
        if fd is not None:
            os.set_blocking(fd, False)

    @classmethod
    def from_env(cls, witness: bool = False) -> "Heartbeat":
        """The pipe named by the environment; a no-op client when there is none. A process that torch.distributed.run
        started with a ``RANK`` says its rank in every message. ``witness``: start the witness, watching the calling
        thread (``start_witness``)."""
        hb = cls._from_env()
        if witness:
            hb.start_witness()
        return hb

    @classmethod
    def _from_env(cls) -> "Heartbeat":
        rank = os.environ.get("RANK", "")
        rank = int(rank) if rank.isdigit() else None
        local = os.environ.get("LOCAL_RANK", "")
        local = int(local) if local.isdigit() and rank is not None else None
        path = os.environ.get(ENV_PATH)
        if path:
            try:
                return cls(os.open(path, os.O_WRONLY | os.O_NONBLOCK | os.O_CLOEXEC), rank, local)
            except OSError:
                return cls(None, rank, local)  # the worker that held the pipe is gone: its tree is being killed
        value = os.environ.get(ENV_FD)
        return cls(int(value) if value else None, rank, local)

    @property
    def enabled(self) -> bool:
        return self.fd is not None

    def beat(self, **fields: Any) -> bool:
        """One unit of work done (a training or validation batch)."""
        self.progress += 1
        return self._send("beat", fields)

    def phase(self, name: str, **fields: Any) -> bool:
        """The loop entered phase ``name``; entering a phase is progress too."""
        if name not in PHASES:
            raise ValueError(f"unknown phase {name!r}: expected one of {', '.join(PHASES)}")
        self.current_phase = name
        self.progress += 1
        return self._send("phase", fields)

    def ping(self, **fields: Any) -> bool:
        """Liveness without progress (the supervisor does not reset its stall timer for it)."""
        return self._send("beat", fields)

    def step(self, name: str, done: int | None = None, total: int | None = None) -> bool:
        """Entered the startup step ``name`` (a ``contract.StartupStep`` value), or ``done`` of its ``total`` items."""
        fields: dict[str, Any] = {"step": name}
        if done is not None:
            fields.update(done=done, total=total)
        return self._send("step", fields)

    def settings(self, settings: dict[str, Any]) -> bool:
        return self._send("settings", {"settings": settings})

    def error(self, message: str) -> bool:
        return self._send("error", {"error": message[:1000]})

    def checkpoint(self, path: str, seconds: float, **fields: Any) -> bool:
        """A checkpoint at the position in ``fields`` (epoch, batch) is completely written to ``path``."""
        return self._send("checkpoint", {"path": path, "seconds": round(seconds, 4), **fields})

    def loader_started(self, loader: str, pids: list[int], seconds: float | None) -> bool:
        """A loader ("train" or "val") started worker processes ``pids`` (once made, ``seconds`` None; again at its
        first batch, ``seconds`` after it was made): the processes the supervisor may replace in place, and how long
        a loader takes to start."""
        fields = {"loader": loader, "pids": pids, **({} if seconds is None else {"seconds": round(seconds, 4)})}
        return self._send("loader", fields)

    def wait(self, report: WaitReport) -> bool:
        """Where the main thread waits (the witness's report; the progress counter is the main thread's, unchanged)."""
        return self._send("wait", {"wait": report.to_wire()})

    def start_witness(self, interval: float = INTERVAL) -> Witness | None:
        """Start the witness on the calling thread (worker/witness.py); the one running is kept. None when there is
        no pipe to tell: an unsupervised client starts no thread."""
        if self.fd is None:
            return None
        if self.witness is None or not self.witness.alive:
            self.witness = Witness(self, interval).start()
        return self.witness

    def stop_witness(self) -> None:
        if self.witness is not None:
            self.witness.stop()
            self.witness = None

    def _send(self, kind: str, fields: dict[str, Any]) -> bool:
        if self.fd is None:
            return False
        message = {"v": PROTOCOL_VERSION, "pid": _PID[0], "kind": kind, "phase": self.current_phase,
                   "progress": self.progress, "dropped": self.dropped, "t": round(time.time(), 3),
                   "sent": round(time.monotonic(), 4), **fields}
        if self.rank is not None:
            message["rank"] = self.rank
        if self.local_rank is not None:
            message["local_rank"] = self.local_rank
        data = encode(message)
        try:
            os.write(self.fd, data)
        except BlockingIOError:
            self.dropped += 1  # pipe full: the supervisor is behind; never wait for it
            return False
        except OSError as e:
            if e.errno == errno.EPIPE:  # the supervisor is gone: a script a wrapper started outlives it otherwise
                os.kill(os.getpid(), signal.SIGKILL)
            if e.errno == errno.EBADF:
                self.fd = None  # the script closed it: keep training, stop sending
                return False
            raise
        self.sent += 1
        return True


def encode(message: dict[str, Any]) -> bytes:
    """One message as a line; fields that would overflow PIPE_BUF are shed (losses first) so it stays atomic."""
    data = (_ENCODER.encode(message) + "\n").encode()
    for optional in ("settings", "losses", "error"):
        if len(data) <= MAX_MESSAGE_BYTES:
            break
        message = {k: v for k, v in message.items() if k != optional}
        data = (_ENCODER.encode(message) + "\n").encode()
    if len(data) > MAX_MESSAGE_BYTES:
        raise ValueError(f"heartbeat message of {len(data)} bytes exceeds PIPE_BUF ({MAX_MESSAGE_BYTES})")
    return data


@dataclass
class Decoder:
    """Splits a byte stream into messages; garbage and oversized lines are counted and skipped, never fatal."""

    buffer: bytearray = field(default_factory=bytearray)
    malformed: int = 0
    oversized: int = 0
    skipping: bool = False  # inside the tail of an oversized line

    def feed(self, data: bytes) -> list[HeartbeatMessage]:
        self.buffer += data
        messages = []
        while True:
            end = self.buffer.find(b"\n")
            if end < 0:
                if len(self.buffer) > MAX_MESSAGE_BYTES:  # a line that can never be valid: drop what we have
                    self.oversized += 0 if self.skipping else 1
                    self.buffer.clear()
                    self.skipping = True
                break
            line = bytes(self.buffer[:end])
            del self.buffer[:end + 1]
            if self.skipping:
                self.skipping = False
                continue
            if len(line) + 1 > MAX_MESSAGE_BYTES:
                self.oversized += 1
                continue
            wire = parse(line)
            message = None if wire is None else HeartbeatMessage.from_wire(wire)
            if message is None:
                self.malformed += 1
            else:
                messages.append(message)
        return messages


def read_available(fd: int) -> bytes | None:
    """All bytes a non-blocking pipe holds now; b"" at end of file; None when nothing was there."""
    chunks = []
    while True:
        try:
            chunk = os.read(fd, 65536)
        except BlockingIOError:
            break
        if not chunk:
            return b"".join(chunks) if chunks else b""
        chunks.append(chunk)
    return b"".join(chunks) if chunks else None


def parse(line: bytes) -> dict[str, Any] | None:
    """A valid version-1 message, or None."""
    try:
        message = json.loads(line)
    except (ValueError, UnicodeDecodeError):
        return None
    if not isinstance(message, dict) or message.get("v") != PROTOCOL_VERSION:
        return None
    if message.get("kind") not in KINDS or message.get("phase") not in PHASES:
        return None
    progress = message.get("progress")
    if not isinstance(progress, int) or isinstance(progress, bool) or progress < 0:
        return None
    if not isinstance(message.get("pid"), int):
        return None
    return message
