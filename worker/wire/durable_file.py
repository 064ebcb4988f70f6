"""One way to replace a file so that a crash, a kill or a power cut leaves either the old file or the whole new one.

Used for checkpoints (worker/checkpoints/checkpointing.py) and for the supervisor's state file (supervisor/state/state_file.py);
torch-free and supervisor-free so both sides import it.
"""

from __future__ import annotations

import os
import threading
from pathlib import Path


def write_durably(path: Path, data: bytes) -> None:
    """A temporary file beside ``path``, flushed to disk, renamed over it, the directory flushed too. OSError when it
    cannot be done, with the temporary file removed and ``path`` as it was."""
    path = Path(path)
    # One temporary file per writing thread: two writes of one path, each with O_TRUNC on a shared name, would write
    # into one file at two offsets and rename a mix of both.
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}-{threading.get_native_id()}")
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view):]
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, path)
    except OSError:
        tmp.unlink(missing_ok=True)
        raise
    sync_directory(path.parent)


def sync_directory(directory: Path) -> None:
    """Make a rename or a new file in ``directory`` survive a power cut."""
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
