"""The heartbeat protocol: the lines a training loop writes to tell the supervisor it is alive, and their reader.

The client that writes them is ``worker.heartbeat.Heartbeat`` (worker/heartbeat.py).

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

Under DDP (``worker/distributed/ddp.py``) the ranks are not the worker's children but torch.distributed.run's, which closes
inherited descriptors: a rank opens the same pipe by its ``/proc`` path, named in ``YOLO_TRAIN_HEARTBEAT_PATH``,
and every message it sends carries ``rank`` (from the ``RANK`` variable the launcher sets).

Writes are non-blocking: when the pipe is full (the supervisor is not reading) the message is
dropped and counted, never waited for. The supervisor must never be able to stall training.

A write that finds no reader (EPIPE) means the supervisor is gone (it closes its end only after the worker's tree
is dead): the sender SIGKILLs itself, as the supervisor's own worker dies with it (PR_SET_PDEATHSIG), since the
supervisor that replaces it starts another copy of this training on the same checkpoints.
"""

from __future__ import annotations

import json
import os
import select
from dataclasses import dataclass, field
from typing import Any

from worker.wire.contract import HeartbeatMessage, MessageKind, Phase

PROTOCOL_VERSION = 1
ENV_FD = "YOLO_TRAIN_HEARTBEAT_FD"
ENV_PATH = "YOLO_TRAIN_HEARTBEAT_PATH"  # a DDP rank's way to the pipe: /proc/<worker pid>/fd/<its write end>
MAX_MESSAGE_BYTES = select.PIPE_BUF
PHASES = tuple(p.value for p in Phase)
# Built once: json.dumps() with non-default arguments builds a new encoder on every call.
_ENCODER = json.JSONEncoder(separators=(",", ":"), default=str)
KINDS = tuple(k.value for k in MessageKind)


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
