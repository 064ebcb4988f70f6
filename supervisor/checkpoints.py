"""Where a restarted worker resumes from, and guarding that checkpoint.

Ultralytics writes ``last.pt`` in place (``Path.write_bytes``), so a worker killed while saving, or a full
disk, leaves a truncated file that would fail every resume. Before each spawn the supervisor checks
``last.pt`` as the zip archive ``torch.save`` writes (CRC of every member, no torch import, milliseconds),
keeps a verified copy as ``last.good.pt``, and when ``last.pt`` is corrupt moves it aside (nothing is
deleted) and resumes from the copy.
"""

from __future__ import annotations

import os
import shutil
import time
import zipfile
from pathlib import Path


def weights_dir(run_dir: Path) -> Path:
    return run_dir / "weights"


def verify(path: Path) -> str | None:
    """None when ``path`` is a complete torch checkpoint, else what is wrong with it."""
    try:
        with zipfile.ZipFile(path) as archive:
            names = archive.namelist()
            if not any(n.endswith("data.pkl") for n in names):
                return "no data.pkl inside: not a torch checkpoint"
            bad = archive.testzip()
            if bad is not None:
                return f"CRC mismatch in {bad}"
    except zipfile.BadZipFile as e:
        return f"not a complete zip archive: {e}"
    except OSError as e:
        return e.strerror or str(e)
    return None


def choose_resume(run_dir: Path) -> tuple[Path | None, list[str]]:
    """The checkpoint to resume from (None: start from scratch) and one-line notes on anything found wrong."""
    weights = weights_dir(run_dir)
    last, good = weights / "last.pt", weights / "last.good.pt"
    notes: list[str] = []
    if last.exists():
        problem = verify(last)
        if problem is None:
            try:
                _copy_atomically(last, good)
            except OSError as e:
                notes.append(f"{good}: cannot keep a verified copy ({e.strerror}); free disk space in {weights}")
            return last, notes
        aside = last.with_name(f"last.pt.corrupt-{int(time.time())}")
        os.replace(last, aside)
        fallback = good if good.exists() and verify(good) is None else None
        notes.append(f"{last}: corrupt checkpoint ({problem}); kept as {aside.name}; resuming from "
                     f"{fallback.name if fallback else 'scratch'}")
        return fallback, notes
    if good.exists() and verify(good) is None:
        return good, notes
    return None, notes


def _copy_atomically(source: Path, target: Path) -> None:
    tmp = target.with_name(f".{target.name}.tmp")
    try:
        shutil.copyfile(source, tmp)
        os.replace(tmp, target)
    finally:
        tmp.unlink(missing_ok=True)
