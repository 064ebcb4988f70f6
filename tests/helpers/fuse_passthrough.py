"""A real, writable FUSE file system: every call at the mount is passed to a directory beneath it, through libfuse 3
(Debian's ``libfuse3-3``) and its ctypes bindings ``mfusepy``. What a state directory on sshfs, gcsfuse, s3fs or a
cluster's FUSE mount goes through: each open, write, rename and mmap a request to a daemon in user space.

``FusePassthrough(root, mountpoint)`` mounts it in a subprocess (``python fuse_passthrough.py ROOT MOUNTPOINT``, in
the foreground, multithreaded) and unmounts it at exit. Needs root (a mount without fusermount's setuid helper), /dev/fuse
and libfuse 3: ``unavailable()`` says which is missing.
"""

from __future__ import annotations

import errno
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def unavailable() -> str | None:
    """Why no FUSE file system can be mounted here, or None when one can."""
    if os.geteuid() != 0:
        return "not root: a FUSE mount without fusermount's setuid helper needs root"
    if not os.path.exists("/dev/fuse"):
        return "no /dev/fuse"
    try:
        import mfusepy  # noqa: F401  (loads libfuse at import)
    except ImportError:
        return "mfusepy is not installed (pip install -e '.[test]')"
    except OSError as e:
        return f"libfuse 3 is not installed ({e}; apt-get install libfuse3-3)"
    return None


def skip_without_fuse() -> None:
    """Skip the calling test, saying why, where no FUSE file system can be mounted."""
    import pytest

    why = unavailable()
    if why:
        pytest.skip(f"no FUSE mount here: {why}")


class FusePassthrough:
    def __init__(self, root: Path, mountpoint: Path):
        self.root, self.mountpoint = Path(root), Path(mountpoint)
        self.daemon: subprocess.Popen | None = None
        self.log = None

    def command(self) -> list[str]:
        """The daemon's command line (a file system of another kind, tests/helpers/fuse_held_read.py, runs its own)."""
        return [sys.executable, __file__, str(self.root), str(self.mountpoint)]

    def __enter__(self) -> "FusePassthrough":
        self.root.mkdir(parents=True, exist_ok=True)
        self.mountpoint.mkdir(parents=True, exist_ok=True)
        self.log = tempfile.TemporaryFile("w+")  # the daemon's stderr: never a pipe nobody reads while it serves
        self.daemon = subprocess.Popen(self.command(), stdout=subprocess.DEVNULL, stderr=self.log)
        deadline = time.monotonic() + 30
        while not os.path.ismount(self.mountpoint):
            if self.daemon.poll() is not None or time.monotonic() > deadline:
                self.daemon.kill()
                self.daemon.wait()
                self.log.seek(0)
                raise OSError(f"the FUSE daemon did not mount at {self.mountpoint}: {self.log.read()[-2000:]}")
            time.sleep(0.05)
        return self

    def __exit__(self, *exc) -> None:
        helper = ["fusermount3", "-u"] if shutil.which("fusermount3") else ["umount"]
        if subprocess.run([*helper, str(self.mountpoint)], capture_output=True).returncode != 0:
            subprocess.run(["umount", "-l", str(self.mountpoint)], capture_output=True)  # busy: detach it
        if self.daemon is not None:
            try:
                self.daemon.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.daemon.kill()
                self.daemon.wait()
        self.log.close()


def serve(root: str, mountpoint: str) -> None:
    import mfusepy as fuse

    def real(path: str) -> str:
        return root + path

    def oserror(call):
        """The call's OSError as the errno libfuse answers the kernel with."""
        def wrapper(self, path, *args):
            try:
                return call(self, None if path is None else real(path), *args)
            except OSError as e:
                raise fuse.FuseOSError(e.errno or errno.EIO) from None
        wrapper.__name__ = call.__name__
        return wrapper

    class Passthrough(fuse.Operations):
        use_ns = True

        @oserror
        def access(self, path, amode):
            if not os.access(path, amode):
                raise fuse.FuseOSError(errno.EACCES)
            return 0

        @oserror
        def getattr(self, path, fh=None):
            st = os.fstat(fh) if fh is not None else os.lstat(path)
            return {"st_mode": st.st_mode, "st_nlink": st.st_nlink, "st_size": st.st_size, "st_uid": st.st_uid,
                    "st_gid": st.st_gid, "st_atime": st.st_atime_ns, "st_mtime": st.st_mtime_ns,
                    "st_ctime": st.st_ctime_ns}

        @oserror
        def readdir(self, path, fh):
            return [".", "..", *os.listdir(path)]

        @oserror
        def mkdir(self, path, mode):
            return os.mkdir(path, mode)

        @oserror
        def rmdir(self, path):
            return os.rmdir(path)

        @oserror
        def unlink(self, path):
            return os.unlink(path)

        @oserror
        def rename(self, old, new):
            return os.rename(old, real(new))

        @oserror
        def symlink(self, target, source):
            return os.symlink(source, target)

        @oserror
        def readlink(self, path):
            return os.readlink(path)

        @oserror
        def link(self, target, source):
            return os.link(real(source), target)

        @oserror
        def chmod(self, path, mode):
            return os.chmod(path, mode)

        @oserror
        def chown(self, path, uid, gid):
            return os.chown(path, uid, gid)

        @oserror
        def utimens(self, path, times=None):
            return os.utime(path, ns=times) if times else os.utime(path)

        @oserror
        def truncate(self, path, length, fh=None):
            return os.ftruncate(fh, length) if fh is not None else os.truncate(path, length)

        @oserror
        def create(self, path, mode, fi=None):
            return os.open(path, os.O_RDWR | os.O_CREAT | os.O_TRUNC, mode)

        @oserror
        def open(self, path, flags):
            return os.open(path, flags)

        @oserror
        def read(self, path, size, offset, fh):
            return os.pread(fh, size, offset)

        @oserror
        def write(self, path, data, offset, fh):
            return os.pwrite(fh, data, offset)

        @oserror
        def flush(self, path, fh):
            return 0

        @oserror
        def fsync(self, path, datasync, fh):
            (os.fdatasync if datasync else os.fsync)(fh)
            return 0

        @oserror
        def release(self, path, fh):
            os.close(fh)
            return 0

        @oserror
        def statfs(self, path):
            st = os.statvfs(path)
            return {k: getattr(st, k) for k in ("f_bavail", "f_bfree", "f_blocks", "f_bsize", "f_favail", "f_ffree",
                                                 "f_files", "f_flag", "f_frsize", "f_namemax")}

    fuse.FUSE(Passthrough(), mountpoint, foreground=True, fsname="passthrough")


if __name__ == "__main__":
    serve(os.path.realpath(sys.argv[1]), sys.argv[2])
