"""The GPU's devcoredump, kept: drivers/base/devcoredump.c deletes /sys/class/devcoredump/devcdN 5 minutes after it
appears (DEVCD_TIMEOUT), long before anyone reads the night's incidents. On a reset or coredump line the core asks
(``KeepDevcoredumps``) and ``keep`` copies each dump not kept yet, the first ``COPY_LIMIT`` bytes of it, into the
incident's directory, or the attempt's own before its incident opens (``move_into`` takes them there at the
incident's enrichment).

The layout, as dev_coredumpm() makes it: ``devcdN/data``, a binary attribute of size 0 (its stat says nothing: read
to its end), and ``devcdN/failing_device``, a link to the device that dumped (a PCI device for amdgpu). Nothing here
writes to ``data``: that deletes the dump, which the user or a crash collector may still want. Nothing here raises.
"""

from __future__ import annotations

import os
import shutil
from dataclasses import replace
from pathlib import Path

from supervisor.decision import Devcoredump

DEVCOREDUMPS = "sys/class/devcoredump"
# An amdgpu dump is text (the IP blocks' registers, the rings, the faulting job), a few MiB at most; another
# driver's may hold a GPU's memory. This much is kept of each, the rest cut (``truncated``).
COPY_LIMIT = 32 * 1024 * 1024
CHUNK = 1024 * 1024
# Tests point this at a fake /sys tree (this machine has no GPU to dump); the supervisor reads the real one.
SYSFS_ROOT = "YOLO_TRAIN_SYSFS_ROOT"


def sysfs_root() -> Path:
    return Path(os.environ.get(SYSFS_ROOT) or "/")


def keep(root: Path, dest: Path, state_dir: Path, kept: tuple[str, ...] = (),
         limit: int = COPY_LIMIT) -> tuple[Devcoredump, ...]:
    """Each devcdN under ``root``/sys/class/devcoredump not in ``kept``, copied to ``dest``/devcoredump-devcdN (at most
    ``limit`` bytes), oldest first; a dump that cannot be read (gone meanwhile) is skipped."""
    try:
        names = sorted((n for n in os.listdir(root / DEVCOREDUMPS) if n.startswith("devcd") and n not in kept),
                       key=lambda n: int(n[5:]) if n[5:].isdigit() else 0)
    except OSError:
        return ()
    copies = []
    for name in names:
        copy = _copy(root / DEVCOREDUMPS / name, dest / f"devcoredump-{name}", limit)
        if copy is not None:
            size, truncated = copy
            copies.append(Devcoredump(str((dest / f"devcoredump-{name}").relative_to(state_dir)), name,
                                      _device(root / DEVCOREDUMPS / name), size, truncated))
    return tuple(copies)


def _copy(dump: Path, target: Path, limit: int) -> tuple[int, bool] | None:
    try:
        with open(dump / "data", "rb") as source:
            target.parent.mkdir(parents=True, exist_ok=True)
            with open(target, "wb") as out:
                size = 0
                while size < limit and (chunk := source.read(min(CHUNK, limit - size))):
                    out.write(chunk)
                    size += len(chunk)
                return size, size >= limit and bool(source.read(1))
    except OSError:
        return None


def _device(dump: Path) -> str | None:
    try:
        return os.path.basename(os.readlink(dump / "failing_device"))
    except OSError:
        return None


def move_into(state_dir: Path, dumps: tuple[Devcoredump, ...], incident_dir: Path) -> tuple[Devcoredump, ...]:
    """The dumps kept before the incident opened, moved into its directory (where every reader looks); one that
    cannot be moved stays where it is, and so does its path."""
    moved = []
    for dump in dumps:
        source, target = state_dir / dump.path, incident_dir / Path(dump.path).name
        if source != target:
            try:
                incident_dir.mkdir(parents=True, exist_ok=True)
                os.replace(source, target)
                if not any(source.parent.iterdir()):
                    shutil.rmtree(source.parent, ignore_errors=True)
                dump = replace(dump, path=str(target.relative_to(state_dir)))
            except OSError:
                pass
        moved.append(dump)
    return tuple(moved)
