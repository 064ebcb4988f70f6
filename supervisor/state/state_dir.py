"""The state directory: what one training leaves on disk, and the lock that makes it one supervisor's.

Its paths are named in paths.py (``StatePaths``), which ``StateDir`` is.

A lock file inside the directory dies with the directory: delete STATE_DIR mid-run and a second supervisor
would find no lock and train beside the first, both writing last.pt. So the lock is also an abstract Unix
socket named after the directory's path (no file, released by the kernel when the supervisor dies, not
removable by ``rm``), and the file is re-created if it disappears. Abstract sockets are per network
namespace: two supervisors in different network namespaces still meet on the file's flock only.
"""

from __future__ import annotations

import errno
import fcntl
import hashlib
import json
import logging
import os
import socket
import time
from pathlib import Path
from typing import Any, Callable

from supervisor.config import ConfigError
from supervisor.decision import Unreadable
from supervisor.state import checkpoints, state_file
from supervisor.state.paths import LOCK_FILE, StatePaths

log = logging.getLogger("yolo-train")

RESERVE_BYTES = 1 << 20  # several state files' worth: the last write on a full disk frees it first


class StateDirTaken(ConfigError):
    """Another supervisor holds the state directory: at the start, or after this one's lock file was removed and
    the other locked a new one (two supervisors in different network namespaces do not meet on the socket)."""


def lock_address(path: Path) -> bytes:
    """The abstract socket that stands for ``path``: the same for every spelling of the path."""
    digest = hashlib.sha256(os.fsencode(os.path.realpath(path))).hexdigest()[:40]
    return b"\0yolo-train-state-dir:" + digest.encode()


class StateDir(StatePaths):
    """The state directory of the running supervisor: its lock, its state file's writes, its incidents' lines."""

    def __init__(self, path: Path, config_source: str, run_dir: Path | None = None):
        super().__init__(path, run_dir)  # run_dir: [distributed] run_dir, on storage the hosts share
        self.config_source = config_source
        self._lock_fd: int | None = None
        self._lock_socket: socket.socket | None = None
        self._write_failed = False
        self.taken: str | None = None  # why the directory is no longer this supervisor's: nothing is written to it

    def write_launch_record(self, text: str) -> None:
        """The current attempt's launch record. The name it had before (worker-settings.json) is removed where an
        earlier version left one: nothing reads it, and an older attempt's settings would mislead a reader."""
        self.launch_record.write_text(text)
        self.old_launch_record.unlink(missing_ok=True)

    def lock(self) -> None:
        """Take the directory for this supervisor, or say in one line who has it (ConfigError)."""
        self._make_directory()
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)  # close-on-exec: the worker does not inherit it
        try:
            sock.bind(lock_address(self.path))
        except OSError as e:
            sock.close()
            if e.errno != errno.EADDRINUSE:
                raise ConfigError(f"{self.config_source}: state_dir {self.path}: cannot take the lock ({e.strerror}); "
                                  f"allow AF_UNIX sockets to the supervisor") from None
            raise ConfigError(f"{self.config_source}: state_dir {self.path} is in use by another supervisor (pid "
                              f"{self._holder()}); stop it or choose another state_dir") from None
        self._lock_socket = sock
        self._lock_fd = self._lock_file()
        self._keep_reserve()

    def _keep_reserve(self) -> None:
        """Set space aside for the final state write; none on a disk already full (said by the writes that fail)."""
        reserve = self.reserve
        try:
            fd = os.open(reserve, os.O_WRONLY | os.O_CREAT, 0o644)
            try:
                os.posix_fallocate(fd, 0, RESERVE_BYTES)
            finally:
                os.close(fd)
        except OSError:
            reserve.unlink(missing_ok=True)

    def lock_held(self) -> bool:
        """Whether the lock file is still the one this supervisor locked; re-creates it when the directory or the
        file was removed (the socket still holds the lock against any supervisor of this network namespace).
        StateDirTaken when another supervisor locked the new file first."""
        if self._lock_fd is None:
            return False
        try:
            on_disk, ours = os.stat(self.lock_file), os.fstat(self._lock_fd)
            if (on_disk.st_dev, on_disk.st_ino) == (ours.st_dev, ours.st_ino):
                return True
        except FileNotFoundError:
            pass
        os.close(self._lock_fd)
        self._lock_fd = None
        self._make_directory()
        try:
            self._lock_fd = self._lock_file()
        except StateDirTaken:
            self.taken = (f"{self.config_source}: state_dir {self.path} is now in use by another supervisor (pid "
                          f"{self._holder()}): its {LOCK_FILE} was removed while this one (pid {os.getpid()}) ran")
            raise StateDirTaken(self.taken) from None
        log.error(f"state_dir {self.path}: {LOCK_FILE} was removed while this supervisor ran (pid {os.getpid()}); "
                  f"re-created, this supervisor still holds the directory")
        return True

    def _make_directory(self) -> None:
        try:
            self.path.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise ConfigError(f"{self.config_source}: state_dir {self.path}: cannot create ({e.strerror}); choose a "
                              f"writable directory") from None

    def _lock_file(self) -> int:
        try:
            fd = os.open(self.lock_file, os.O_RDWR | os.O_CREAT, 0o644)
        except OSError as e:
            raise ConfigError(f"{self.config_source}: state_dir {self.path}: cannot write {LOCK_FILE} "
                              f"({e.strerror}); make the directory writable by user {_user()} or choose another "
                              f"state_dir") from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            # Another network namespace's supervisor (the socket did not meet it), or an older version's.
            os.close(fd)
            raise StateDirTaken(f"{self.config_source}: state_dir {self.path} is in use by another supervisor (pid "
                              f"{self._holder()}); stop it or choose another state_dir") from None
        try:
            os.ftruncate(fd, 0)
            os.pwrite(fd, str(os.getpid()).encode(), 0)
        except OSError as e:
            log.error(f"{self.lock_file}: cannot write this supervisor's pid ({e.strerror}); free disk space in "
                      f"{self.path}")
        return fd

    def _holder(self) -> str:
        try:
            return self.lock_file.read_text().strip() or "?"
        except OSError:
            return "?"

    def read_state(self, restore: Callable[[dict[str, Any]], None],
                   resume_point: Callable[[], str] | None = None) -> dict[str, Any] | None:
        """The previous supervisor's record, given to ``restore``. A corrupt one (torn, or a value ``restore`` finds
        of the wrong type) is moved aside, said in one line with ``resume_point()`` (where the next attempt resumes,
        in words; by default the checkpoint the Ultralytics worker would take), and None returned: the run goes on at rung 0 from its checkpoints, which hold the training. Only
        a file that cannot be moved aside or read at all ends the run (ConfigError)."""
        try:
            record = state_file.read(self.path)
            if record is not None:
                try:
                    restore(record)
                except Unreadable as e:
                    raise state_file.CorruptStateFile(f"{self.state_file}: corrupt state file: "
                                                      f"{e}") from None
            return record
        except state_file.CorruptStateFile as e:
            target = self.state_file
            aside = target.with_name(f"{target.name}.corrupt-{time.strftime('%Y%m%dT%H%M%S')}")
            try:
                os.replace(target, aside)
            except OSError as move:
                raise ConfigError(f"{e}; cannot move it aside ({move.strerror}): move or delete it to start the "
                                  f"ladder afresh") from None
            log.error(f"{e}; moved aside to {aside}; training resumes from {(resume_point or self._resume_point)()} at rung 0 (the restart "
                      f"count and the rungs' history are lost)")
            return None
        except state_file.StateFileError as e:
            raise ConfigError(f"{e}; make it readable by user {_user()}") from None

    def _resume_point(self) -> str:
        checkpoint = checkpoints.resume_point(self.run_dir)
        return str(checkpoint) if checkpoint else "scratch (no usable checkpoint of this run)"

    def write_state(self, record: dict[str, Any], final: bool = False) -> None:
        """Replace the state file; a failure is said once and supervision goes on (the previous file stays). The
        ``final`` write (how the run ended) frees the reserve on a full disk and tries again.
        StateDirTaken, once, when another supervisor took the directory; nothing is written to it after that."""
        if self.taken is not None:
            return
        try:
            self.lock_held()
            try:
                state_file.write(self.path, record)
            except OSError as e:
                reserve = self.reserve
                if not (final and e.errno in (errno.ENOSPC, errno.EDQUOT) and reserve.exists()):
                    raise
                reserve.unlink()
                state_file.write(self.path, record)
            self._write_failed = False
        except StateDirTaken:
            raise
        except (OSError, ConfigError) as e:
            if not self._write_failed:
                why = e.strerror if isinstance(e, OSError) else str(e)
                log.error(f"{self.state_file}: cannot write state ({why}); free disk space in "
                          f"{self.path}")
            self._write_failed = True
            try:  # the file's time alone needs no space: `status` tells a loop that runs from one that hangs
                os.utime(self.state_file)
            except OSError:
                pass

    def append_incident(self, incident: dict[str, Any]) -> None:
        """One line, written by one write() and fsynced; after a torn last line (a crash mid-append) it starts on
        a line of its own, so the torn one stays the only unreadable line."""
        if self.taken is not None:
            return  # the other supervisor's record now; this one's incident is in its log
        line = (json.dumps(incident, default=str) + "\n").encode()
        try:
            fd = os.open(self.incidents, os.O_RDWR | os.O_APPEND | os.O_CREAT, 0o644)
            try:
                size = os.fstat(fd).st_size
                if size and os.pread(fd, 1, size - 1) != b"\n":
                    line = b"\n" + line
                os.write(fd, line)
                os.fsync(fd)
            finally:
                os.close(fd)
        except OSError as e:
            log.error(f"{self.incidents}: cannot record incident {incident['id']} ({e.strerror}); free disk space")


def _user() -> str:
    import pwd

    try:
        return pwd.getpwuid(os.geteuid()).pw_name
    except KeyError:
        return str(os.geteuid())
