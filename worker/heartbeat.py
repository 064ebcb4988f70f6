"""The heartbeat client: how a training loop tells the supervisor it is alive (``from worker.heartbeat import
Heartbeat``, the import a supervised script of its own makes).

The protocol it writes, one line of JSON a message on the pipe the supervisor passes, is worker/wire/heartbeat_protocol.py.
Writes are non-blocking: when the pipe is full (the supervisor is not reading) the message is dropped and counted,
never waited for. The supervisor must never be able to stall training. A write that finds no reader (EPIPE) means the
supervisor is gone: the sender SIGKILLs itself (worker/wire/heartbeat_protocol.py says why).
"""

from __future__ import annotations

import errno
import os
import signal
import time
from typing import Any

from worker.wire.contract import WaitReport
from worker.wire.heartbeat_protocol import ENV_FD, ENV_PATH, PHASES, PROTOCOL_VERSION, encode
from worker.witness import INTERVAL, Witness

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
