"""A real FUSE mount that holds its requests: the file-system blip of issue 41, made on demand.

No libfuse: the daemon speaks the kernel's protocol on /dev/fuse itself (include/uapi/linux/fuse.h). It answers
FUSE_INIT, then reads every other request (a LOOKUP for any path under the mount) and answers none until
``release``: a process waiting for that answer sleeps in the kernel's ``request_wait_answer`` (fs/fuse/dev.c), and
once the daemon has read the request even SIGKILL waits it out, exactly as a FUSE file system that blips does to
DataLoader workers. ``release`` answers them all ENOENT and the killed processes die. Needs root (mount(2)) and
/dev/fuse; ``FuseHold.available()`` says whether this machine has both.
"""

from __future__ import annotations

import ctypes
import errno
import os
import struct
import threading
from pathlib import Path

FUSE_INIT = 26
IN_HEADER = struct.Struct("<IIQQIIII")  # len, opcode, unique, nodeid, uid, gid, pid, padding
OUT_HEADER = struct.Struct("<IiQ")  # len, error, unique
# fuse_init_out (protocol 7.31): major, minor, max_readahead, flags, max_background, congestion_threshold,
# max_write, time_gran, max_pages, map_alignment, flags2, unused[7]
INIT_OUT = struct.Struct("<IIIIHHIIHHI7I")
MNT_DETACH = 2


class FuseHold:
    def __init__(self, mountpoint: Path):
        self.mountpoint = Path(mountpoint)
        self.held: list[int] = []  # the unique ids of requests read and not answered
        self.requests = threading.Condition()
        self._libc = ctypes.CDLL(None, use_errno=True)
        self._fd = -1
        self._thread: threading.Thread | None = None

    @staticmethod
    def available() -> bool:
        return os.geteuid() == 0 and os.path.exists("/dev/fuse")

    def __enter__(self) -> "FuseHold":
        self.mountpoint.mkdir(parents=True, exist_ok=True)
        self._fd = os.open("/dev/fuse", os.O_RDWR)
        options = f"fd={self._fd},rootmode=40000,user_id=0,group_id=0".encode()
        if self._libc.mount(b"fusehold", str(self.mountpoint).encode(), b"fuse.fusehold", 0, options) != 0:
            err = ctypes.get_errno()
            os.close(self._fd)
            raise OSError(err, f"mount fuse at {self.mountpoint}: {os.strerror(err)}")
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()
        return self

    def _serve(self) -> None:
        while True:
            try:
                request = os.read(self._fd, 1 << 17)
            except OSError:
                return  # the connection is gone (unmounted, aborted)
            _, opcode, unique, *_ = IN_HEADER.unpack_from(request)
            if opcode == FUSE_INIT:
                out = INIT_OUT.pack(7, 31, 0, 0, 0, 0, 4096, 0, 0, 0, 0, *[0] * 7)
                os.write(self._fd, OUT_HEADER.pack(OUT_HEADER.size + len(out), 0, unique) + out)
                continue
            with self.requests:
                self.held.append(unique)
                self.requests.notify_all()

    def wait_for_request(self, timeout: float = 30) -> None:
        """Until some process waits for an answer the daemon has read."""
        with self.requests:
            if not self.requests.wait_for(lambda: self.held, timeout):
                raise AssertionError(f"no request came to the FUSE mount at {self.mountpoint} in {timeout} s")

    def release(self) -> None:
        """Answer every held request: ENOENT (the blip is over)."""
        with self.requests:
            held, self.held = self.held, []
        for unique in held:
            try:
                os.write(self._fd, OUT_HEADER.pack(OUT_HEADER.size, -errno.ENOENT, unique))
            except OSError:
                pass  # its process is gone meanwhile: nobody waits for it

    def __exit__(self, *exc) -> None:
        self.release()
        self._libc.umount2(str(self.mountpoint).encode(), MNT_DETACH)  # the daemon's read then fails: it ends
        if self._thread is not None:
            self._thread.join(timeout=5)
        os.close(self._fd)  # aborts the connection: anything still waiting on it gets ENOTCONN
