"""Whether a process waits on something outside the worker's processes, read from /proc without stopping it: its main
thread blocked in a system call on a socket (a server that answers slowly, a network file system's client in user
space) or on a file of a network or FUSE file system (a FUSE backend's blip, an NFS server).

A loader worker that owes the training process a batch and waits so is no deadlock, however idle the tree looks: the
witness names it as the culprit, and the watchdog then keeps the phase's own bound (decision/stall/witness.py). A lock
(futex), a pipe of the tree's own, a loop that spins, a stop: none is outside.

Read: ``/proc/PID/syscall`` (the call's number and arguments; "running" while on a CPU), the descriptor's link in
``/proc/PID/fd``, a poll's descriptors from ``/proc/PID/mem`` at its array, an epoll's from its ``fdinfo``. All need the
access py-spy needs (the same user, the tree's ancestor); where one is refused the answer is False (as before).
"""

from __future__ import annotations

import os
import platform
import struct

# The calls that block on one descriptor (its number the first argument), and those that wait on a set of them.
_ONE_FD = {
    "x86_64": {0, 17, 19, 42, 43, 45, 47, 288},  # read, pread64, readv, connect, accept, recvfrom, recvmsg, accept4
    "aarch64": {63, 67, 65, 203, 202, 207, 212, 242},
}
_POLL = {"x86_64": {7, 271}, "aarch64": {73}}  # poll, ppoll: (struct pollfd *fds, nfds)
_EPOLL = {"x86_64": {232, 281, 441}, "aarch64": {22, 441}}  # epoll_wait, epoll_pwait, epoll_pwait2: (epfd, ...)
_MACHINE = platform.machine()
MAX_POLLED = 64  # descriptors of one poll read at most

# File systems whose reads wait on another machine or on a process outside the tree.
REMOTE_FILE_SYSTEMS = ("fuse", "nfs", "cifs", "smb3", "9p", "ceph", "lustre", "gpfs", "glusterfs", "beegfs")


def waits_outside(pid: int) -> bool:
    """Whether ``pid``'s main thread is blocked in a system call on a socket or a remote or FUSE file."""
    try:
        with open(f"/proc/{pid}/syscall") as f:
            fields = f.read().split()
    except OSError:
        return False
    if len(fields) < 3 or not fields[0].isdigit():
        return False  # "running", or blocked outside a system call ("-1 sp pc")
    number, args = int(fields[0]), [int(a, 16) for a in fields[1:7]]
    if number in _ONE_FD.get(_MACHINE, ()):
        return _outside(pid, args[0])
    if number in _POLL.get(_MACHINE, ()):
        return any(_outside(pid, fd) for fd in _polled(pid, args[0], args[1]))
    if number in _EPOLL.get(_MACHINE, ()):
        return any(_outside(pid, fd) for fd in _epolled(pid, args[0]))
    return False


def _outside(pid: int, fd: int) -> bool:
    try:
        target = os.readlink(f"/proc/{pid}/fd/{fd}")
    except OSError:
        return False
    if target.startswith("socket:"):
        return True
    return target.startswith("/") and file_system(target).startswith(REMOTE_FILE_SYSTEMS)


def _polled(pid: int, address: int, count: int) -> list[int]:
    count = min(count, MAX_POLLED)
    try:
        with open(f"/proc/{pid}/mem", "rb") as mem:
            mem.seek(address)
            data = mem.read(8 * count)
    except (OSError, ValueError, OverflowError):
        return []
    return [fd for fd, _, _ in struct.iter_unpack("ihh", data[:8 * (len(data) // 8)]) if fd >= 0]


def _epolled(pid: int, epfd: int) -> list[int]:
    try:
        with open(f"/proc/{pid}/fdinfo/{epfd}") as f:
            return [int(line.split()[1]) for line in f if line.startswith("tfd:")]
    except (OSError, ValueError, IndexError):
        return []


def file_system(path: str) -> str:
    """The type of the file system ``path`` lies on ("" when unknown): the longest mount point above it."""
    best, kind = "", ""
    try:
        with open("/proc/self/mounts") as f:
            for line in f:
                parts = line.split()
                if len(parts) < 3:
                    continue
                point = parts[1].replace("\\040", " ")
                if (path == point or path.startswith(point.rstrip("/") + "/")) and len(point) > len(best):
                    best, kind = point, parts[2]
    except OSError:
        return ""
    return kind
