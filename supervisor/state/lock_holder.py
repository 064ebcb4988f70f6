"""Who holds the state directory's lock, from the kernel's word and never from what the holder wrote: the flock's
owner from /proc/locks, the abstract socket's from SO_PEERCRED. A holder of this uid or root's is taken for a
supervisor; any other uid's is a squatter, which no supervisor of this user is kept from starting by."""

from __future__ import annotations

import os
import socket
import struct
from dataclasses import dataclass
from pathlib import Path

PEER_TIMEOUT = 1.0  # seconds a connect to the abstract name may take: a listener that never accepts is no supervisor


@dataclass(frozen=True)
class Holder:
    pid: int | None  # None: the kernel named no process (a pid of another pid namespace, a socket not listening)
    uid: int | None  # None: its /proc entry is hidden (another user's, under ProtectProc=invisible) or gone

    @property
    def is_supervisor(self) -> bool:
        """Ours or root's: a process of another uid cannot run as this user's supervisor, so it squats."""
        return self.uid in (os.getuid(), 0)

    def __str__(self) -> str:
        pid = "?" if self.pid is None else str(self.pid)
        return f"pid {pid}, {'uid ?' if self.uid is None else f'user {user_name(self.uid)} (uid {self.uid})'}"


def flock_holder(path: Path) -> Holder:
    """The process /proc/locks names as holding ``path``'s flock (the first, for a lock shared by a fork)."""
    try:
        st = os.stat(path)
        lines = Path("/proc/locks").read_text().splitlines()
    except OSError:
        return Holder(None, None)
    where = f"{os.major(st.st_dev):02x}:{os.minor(st.st_dev):02x}:{st.st_ino}"
    for line in lines:
        fields = line.split()  # "1: FLOCK  ADVISORY  WRITE 1234 fe:00:5678 0 EOF"; a waiter's has "->" after "1:"
        if len(fields) >= 6 and fields[1] == "FLOCK" and fields[5] == where and fields[4].isdigit():
            pid = int(fields[4])
            return Holder(pid or None, uid_of(pid) if pid else None)
    return Holder(None, None)


def socket_holder(address: bytes) -> Holder:
    """The credentials of the process listening on the abstract ``address``: SO_PEERCRED, the listener's at listen()."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.settimeout(PEER_TIMEOUT)
    try:
        sock.connect(address)
        pid, uid, _ = struct.unpack("3i", sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED,
                                                          struct.calcsize("3i")))
    except OSError:  # bound but not listening (ECONNREFUSED), or never accepting: not how a supervisor holds it
        return Holder(None, None)
    finally:
        sock.close()
    return Holder(pid or None, uid)


def uid_of(pid: int) -> int | None:
    try:
        return os.stat(f"/proc/{pid}").st_uid
    except OSError:
        return None


def user_name(uid: int) -> str:
    import pwd

    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return str(uid)


def group_name(gid: int) -> str:
    import grp

    try:
        return grp.getgrgid(gid).gr_name
    except KeyError:
        return str(gid)
