"""A real FUSE file system whose daemon holds every read: the dataset's mount that stops answering, made on demand.

One file, ``sample.bin``, served by libfuse 3 through ``mfusepy`` in a daemon process of its own (not a thread of the
test's: a reader of the mount must never wait on the process that runs the test). Its lookup, attributes, open,
flush and release are answered at once; a read is held until ``release()``. A process that reads the file goes
through the page cache: the kernel sends the daemon a readahead request and the reader waits for the page's lock,
``folio_wait_bit_common`` in a killable sleep (/proc state D, yet SIGKILL takes it at once: the daemon's answer is
not awaited). A FUSE request the reader itself sends and the daemon has read (a lookup, tests/helpers/fuse_hold.py)
is the other kind: ``request_wait_answer``, and SIGKILL waits it out.

``FuseHeldRead(mountpoint, control)``: ``path`` is the file, ``reader()`` the pid whose read the daemon holds
(None before one came), ``release()`` answers it; leaving the block releases the read, then unmounts (lazily where still busy).
``control`` is a directory the daemon and the test share (the reader's pid, the release).
"""

from __future__ import annotations

import errno
import os
import stat
import sys
import time
from pathlib import Path

if __name__ == "__main__":  # the daemon, run by its path: the repository's root importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from tests.helpers.fuse_passthrough import FusePassthrough  # noqa: E402

NAME = "sample.bin"
DATA = bytes(range(256)) * 16  # 4 KiB: one page


class FuseHeldRead(FusePassthrough):
    def __init__(self, mountpoint: Path, control: Path):
        super().__init__(control, mountpoint)  # the passthrough's root: here the control directory
        self.path = Path(mountpoint) / NAME

    def command(self) -> list[str]:
        return [sys.executable, __file__, str(self.root), str(self.mountpoint)]

    def reader(self) -> int | None:
        """The pid whose read the daemon holds (the first), or None before any read came."""
        try:
            return int((self.root / "reader").read_text())
        except FileNotFoundError:
            return None

    def release(self) -> None:
        """Answer the held reads and every later one."""
        (self.root / "released").touch()

    def __exit__(self, *exc) -> None:
        self.release()  # first: an unmount waits for no request the daemon still holds
        super().__exit__(*exc)


def serve(control: str, mountpoint: str) -> None:
    import mfusepy as fuse

    reader, released = Path(control) / "reader", Path(control) / "released"

    class HeldRead(fuse.Operations):
        use_ns = True

        def getattr(self, path, fh=None):
            if path == "/":
                return {"st_mode": stat.S_IFDIR | 0o755, "st_nlink": 2}
            if path == f"/{NAME}":
                return {"st_mode": stat.S_IFREG | 0o444, "st_nlink": 1, "st_size": len(DATA)}
            raise fuse.FuseOSError(errno.ENOENT)

        def readdir(self, path, fh):
            return [".", "..", NAME]

        def open(self, path, flags):
            return 0

        def read(self, path, size, offset, fh):
            if not reader.exists():  # the requester's pid, from the request's header (written whole: renamed)
                partial = reader.with_suffix(".partial")
                partial.write_text(str(fuse.fuse_get_context()[2]))
                partial.rename(reader)
            while not released.exists():
                time.sleep(0.05)
            return DATA[offset:offset + size]

    fuse.FUSE(HeldRead(), mountpoint, foreground=True, fsname="heldread")


if __name__ == "__main__":
    serve(os.path.realpath(sys.argv[1]), sys.argv[2])
