"""The state directory: what one training leaves on disk, and the lock that makes it one supervisor's.

Its paths are named in paths.py (``StatePaths``), which ``StateDir`` is.

Who may read it: the directory is made 0700, and an existing one loses the bits of other users (its group's are the
admin's: the unit's ``StateDirectoryMode=0750`` with ``Group=``); what the supervisor and its worker create in it is
0600 and 0700, or 0640 and 0750 where the directory lets its group in, whatever the umask (the process's umask is
made at least that strict, and the worker inherits it).

The lock is an flock on ``supervisor.lock``, a 0600 file: only this user and root can open it, so only they can take
it (flock needs no more than a descriptor), and the kernel frees it when its holder dies, FUSE included. A lock file
dies with the directory: delete STATE_DIR mid-run and a second supervisor would find no lock and train beside the
first, both writing last.pt. So the supervisor also listens on an abstract Unix socket named after the directory's
path (released by the kernel with its holder, not removable by ``rm``), and re-creates the file if it disappears.
Any local user can bind an abstract name, so the name's holder counts only when its credentials (SO_PEERCRED) are
this user's or root's (lock_holder.py); another's is said in one line and the file alone holds. Abstract sockets
are per network namespace: two supervisors in different network namespaces still meet on the file's flock only.
"""

from __future__ import annotations

import errno
import fcntl
import hashlib
import json
import logging
import os
import socket
import stat
import time
from pathlib import Path
from typing import Any, Callable

from supervisor.config import ConfigError
from supervisor.decision import Unreadable
from supervisor.state import checkpoints, state_file
from supervisor.state.lock_holder import Holder, flock_holder, socket_holder, user_name
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
        self._close_to_others()
        self._lock_socket = self._bind_name()
        self._lock_fd = self._lock_file()
        self._keep_reserve()

    @property
    def listener(self) -> socket.socket | None:
        """The lock's socket, for the loop to answer a probe on (``answer_probes``); None where a squatter has it."""
        return self._lock_socket

    def answer_probes(self) -> None:
        """Close the connections of supervisors that came to read our credentials: an unaccepted one stays queued,
        and a full queue would leave the next one's connect unanswered."""
        while True:
            try:
                conn, _ = self._lock_socket.accept()
            except OSError:  # none left (BlockingIOError)
                return
            conn.close()

    def _bind_name(self) -> socket.socket | None:
        """The abstract name for this directory, listened on; None when a process of another user holds it."""
        address = lock_address(self.path)
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)  # close-on-exec: the worker does not inherit it
        try:
            sock.bind(address)
            sock.listen(16)
            sock.setblocking(False)
            return sock
        except OSError as e:
            sock.close()
            if e.errno != errno.EADDRINUSE:
                raise ConfigError(f"{self.config_source}: state_dir {self.path}: cannot take the lock ({e.strerror}); "
                                  f"allow AF_UNIX sockets to the supervisor") from None
        holder = socket_holder(address)
        name = "@" + address[1:].decode()
        if holder.is_supervisor:
            raise ConfigError(f"{self.config_source}: state_dir {self.path} is in use by another supervisor: "
                              f"{holder} holds its lock's socket {name}; stop it or choose another state_dir")
        log.warning(f"state_dir {self.path}: the lock's socket {name} is held by {holder}, not a supervisor of user "
                    f"{user_name(os.geteuid())}: ignored; {LOCK_FILE} alone keeps the directory this supervisor's")
        return None

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
            self.taken = (f"{self._in_use(flock_holder(self.lock_file), 'now ')}: its {LOCK_FILE} was removed "
                          f"while this one (pid {os.getpid()}) ran")
            raise StateDirTaken(self.taken) from None
        log.error(f"state_dir {self.path}: {LOCK_FILE} was removed while this supervisor ran (pid {os.getpid()}); "
                  f"re-created, this supervisor still holds the directory")
        return True

    def _make_directory(self) -> None:
        try:
            self.path.mkdir(mode=0o700, parents=True, exist_ok=True)
        except OSError as e:
            raise ConfigError(f"{self.config_source}: state_dir {self.path}: cannot create ({e.strerror}); choose a "
                              f"writable directory") from None

    def _close_to_others(self) -> None:
        """Other users' bits off the directory, and this process's umask (the worker's too) at least as strict as
        the directory: what is made in it is for this user, and for its group where the directory lets it in."""
        try:
            st = os.stat(self.path)
            if st.st_mode & 0o007 and st.st_uid == os.geteuid():
                os.chmod(self.path, stat.S_IMODE(st.st_mode) & ~0o007)
        except OSError:
            return  # said by the lock file's open, which fails the same way
        os.umask(os.umask(0) | (0o027 if st.st_mode & stat.S_IRGRP else 0o077))

    def _lock_file(self) -> int:
        fd, holder = self._flocked(self._open_lock_file())
        # Held: another network namespace's supervisor (the socket did not meet it), an older version's, or a squatter
        # that opened the file while it was readable by others (an older version made it 0644).
        if holder is not None and holder.is_supervisor:
            raise StateDirTaken(f"{self._in_use(holder)}; stop it or choose another state_dir")
        if holder is not None:
            fd = self._replace_lock_file(holder)
        try:
            os.ftruncate(fd, 0)
            os.pwrite(fd, str(os.getpid()).encode(), 0)
        except OSError as e:
            log.error(f"{self.lock_file}: cannot write this supervisor's pid ({e.strerror}); free disk space in "
                      f"{self.path}")
        return fd

    def _open_lock_file(self) -> int:
        try:
            fd = os.open(self.lock_file, os.O_RDWR | os.O_CREAT, 0o600)
        except OSError as e:
            raise ConfigError(f"{self.config_source}: state_dir {self.path}: cannot write {LOCK_FILE} "
                              f"({e.strerror}); make the directory writable by user {user_name(os.geteuid())} or "
                              f"choose another state_dir") from None
        if os.fstat(fd).st_uid == os.geteuid():
            os.fchmod(fd, 0o600)  # an older version's was 0644: whoever can open it can flock it
        return fd

    def _replace_lock_file(self, squatter: Holder) -> int:
        """A new lock file in place of the one a squatter holds: it keeps the old file's lock, which nobody reads,
        and cannot open the new one (0600)."""
        log.warning(f"state_dir {self.path}: {LOCK_FILE} is held by {squatter}, not a supervisor of user "
                    f"{user_name(os.geteuid())}: replaced by a new {LOCK_FILE} that only this user can open")
        self.lock_file.unlink(missing_ok=True)
        fd, holder = self._flocked(self._open_lock_file())
        if holder is not None:
            raise StateDirTaken(f"{self._in_use(holder)}; stop it or choose another state_dir")
        return fd

    def _flocked(self, fd: int) -> tuple[int | None, Holder | None]:
        """(fd, None) with the lock file's flock taken on ``fd``; (None, its holder) where another holds it (``fd``
        closed)."""
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = flock_holder(self.lock_file)
            os.close(fd)
            return None, holder
        return fd, None

    def _in_use(self, holder: Holder, now: str = "") -> str:
        return (f"{self.config_source}: state_dir {self.path} is {now}in use by another supervisor: {holder} holds "
                f"{self.lock_file}")

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
            raise ConfigError(f"{e}; make it readable by user {user_name(os.geteuid())}") from None

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

