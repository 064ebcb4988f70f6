"""torch's NCCL Flight Recorder dumps, found for an incident: where ``TORCH_NCCL_TRACE_BUFFER_SIZE`` (newer torch:
``TORCH_FR_BUFFER_SIZE``) is above 0, a collective timeout makes each rank write its last collectives to
``PREFIX<global rank>``, ``PREFIX`` from ``TORCH_FR_DUMP_TEMP_FILE`` or ``TORCH_NCCL_DEBUG_INFO_TEMP_FILE``, by default
``/tmp/nccl_trace_rank_``. The incident lists the dumps written since the attempt's last progress, each copied into
the incident's directory when small (``COPY_LIMIT``).

When torch writes them (ProcessGroupNCCL, torch 2.4-2.11): the watchdog thread that sees a collective time out
signals the dump (``TORCH_NCCL_DUMP_ON_TIMEOUT``, on by default in newer torch) to every rank through the TCPStore,
then sleeps ``TORCH_NCCL_WAIT_TIMEOUT_DUMP_MILSEC`` (x 4 in newer torch: 60 s by default) before it aborts; the dump
itself is the heartbeat monitor thread's of process group 0 (``TORCH_NCCL_ENABLE_MONITORING``, on by default), which
polls for the signal every ``TORCH_NCCL_COORD_CHECK_MILSEC``. So no file comes: with the trace buffer at 0 (nothing
recorded: the default before it became 2000), with the monitor off, or when the rank is killed before the dump (the
supervisor's own verdict, or SIGKILL, before that sleep ends). Nothing here raises.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

PREFIX_VARIABLES = ("TORCH_FR_DUMP_TEMP_FILE", "TORCH_NCCL_DEBUG_INFO_TEMP_FILE")  # the newer name first
DEFAULT_PREFIX = "/tmp/nccl_trace_rank_"
COPY_LIMIT = 16 * 1024 * 1024  # bytes: a dump larger than this is listed where torch wrote it, not copied


def prefix(env: dict[str, str]) -> str:
    """Where the ranks' dumps are written, less the rank: as the worker's environment says."""
    return next((env[v] for v in PREFIX_VARIABLES if env.get(v)), DEFAULT_PREFIX)


def collect(env: dict[str, str], since_wall: float, dest: Path) -> tuple[str, ...]:
    """The dumps (``PREFIX<rank>``) written at or after ``since_wall``, in rank order: each one's copy in ``dest``
    (``flight_recorder_rank_<rank>``), or where torch wrote it when too large or not copied."""
    base = Path(prefix(env))
    try:
        names = os.listdir(base.parent)
    except OSError:
        return ()
    found = []
    for name in names:
        rank = name[len(base.name):] if name.startswith(base.name) else ""
        path = base.parent / name
        try:
            st = path.stat()
        except OSError:
            continue
        if rank.isdigit() and st.st_mtime >= since_wall and path.is_file():
            found.append((int(rank), path, st.st_size))
    out = []
    for rank, path, size in sorted(found):
        shown = str(path)
        if size <= COPY_LIMIT:
            try:
                dest.mkdir(parents=True, exist_ok=True)
                shown = str(shutil.copyfile(path, dest / f"flight_recorder_rank_{rank}"))
            except OSError:
                pass
        out.append(shown)
    return tuple(out)
