"""Where a restarted worker resumes from, and keeping a verified checkpoint beside the newest one.

A ``last.pt`` can be unusable: truncated by a kill mid-save or by a full disk when written in place
(Ultralytics' own ``Path.write_bytes``). Each checkpoint is checked as the zip archive ``torch.save`` writes
(CRC of every member, no torch import). While the worker runs, every completed save is verified and kept as
``last.good.pt`` (``keep_verified_copy``): a copy of its own, not a hard link, because the files this guards
against are the ones written in place (by Ultralytics' final save, a user's tool, a truncating copy), and a link
would share that write. The copy is made once per checkpoint interval.

Before a spawn, ``choose_resume`` takes ``last.pt`` if it verifies, else the newest file that does:
``last.good.pt``, then ``best.pt`` and Ultralytics' ``epochN.pt``, saying which in one line. Training starts
from scratch only when no checkpoint of this run is usable. A corrupt ``last.pt`` is moved aside (an empty one
holds nothing and is removed), and only the newest few moved-aside files are kept, so a retried disk-full save
cannot fill the disk further with them.
"""

from __future__ import annotations

import os
import shutil
import time
import zipfile
from pathlib import Path

from supervisor.decision import WeightsKept
from supervisor.state.paths import weights_in

KEEP_CORRUPT = 2  # moved-aside corrupt checkpoints kept per run, newest first


def verify(path: Path) -> str | None:
    """None when ``path`` is a complete torch checkpoint, else what is wrong with it."""
    try:
        with zipfile.ZipFile(path) as archive:
            names = archive.namelist()
            if not any(n.endswith("data.pkl") for n in names):
                return "no data.pkl inside: not a torch checkpoint"
            # zipfile reads an archive that other bytes stand before (it shifts every offset by them); torch's
            # reader refuses it ("invalid header or archive is corrupted"), and torch.save's archive starts at 0.
            before = min(i.header_offset for i in archive.infolist())
            if before:
                return f"{before} bytes of something else before the archive (torch cannot read it)"
            bad = archive.testzip()
            if bad is not None:
                return f"CRC mismatch in {bad}"
    except (zipfile.BadZipFile, EOFError) as e:  # EOFError: cut short, or being rewritten in place right now
        return f"not a complete zip archive: {e or 'it ends early'}"
    except OSError as e:
        return e.strerror or str(e)
    except Exception as e:  # whatever else a damaged archive makes zipfile raise: never the supervisor's end
        return f"unreadable ({type(e).__name__}: {e})"
    return None


def keep_verified_copy(run_dir: Path) -> str | None:
    """After a completed save: make ``last.good.pt`` a verified copy of ``last.pt``. None when done (or nothing to
    do), else one line on what is wrong; the previous ``last.good.pt`` then stays."""
    weights = weights_in(run_dir)
    last, good = weights / "last.pt", weights / "last.good.pt"
    if not last.exists():
        return None
    problem = verify(last)
    if problem is not None:
        return f"{last}: the save just completed is not a usable checkpoint ({problem}); {good.name} stays as it was"
    try:
        _copy_atomically(last, good)
    except OSError as e:
        return f"{good}: cannot keep a verified copy ({e.strerror}); free disk space in {weights}"
    return None


def weights_kept(run_dir: Path) -> WeightsKept:
    """What a training that ended left of its weights: last.pt and best.pt, those that verify, and the room on their
    filesystem."""
    weights = weights_in(run_dir)
    files = tuple(name for name in ("last.pt", "best.pt")
                  if (weights / name).exists() and verify(weights / name) is None)
    try:
        disk = os.statvfs(weights if weights.exists() else run_dir.parent)
        size, free = disk.f_blocks * disk.f_frsize / 2**20, disk.f_bavail * disk.f_frsize / 2**20
    except OSError:
        size = free = float("nan")
    return WeightsKept(str(weights), files, size, free)


def choose_resume(run_dir: Path) -> tuple[Path | None, list[str]]:
    """The checkpoint to resume from (None: start from scratch) and one-line notes on anything found wrong."""
    weights = weights_in(run_dir)
    last = weights / "last.pt"
    notes: list[str] = []
    if last.exists():
        problem = verify(last)
        if problem is None:
            note = keep_verified_copy(run_dir)
            return last, notes + ([note] if note else [])
        kept = _set_aside(last)
        fallback, skipped = _newest_good(weights)
        source = (f"{fallback.name} ({_describe(fallback)})" if fallback else "scratch: no usable checkpoint of this "
                  "run is left")
        notes.append(f"{last}: corrupt checkpoint ({problem}); {kept}; resuming from {source}" +
                     (f"; also unusable: {', '.join(skipped)}" if skipped else ""))
        return fallback, notes
    fallback, skipped = _newest_good(weights)
    if fallback is not None and fallback.name != "last.good.pt":
        notes.append(f"{last}: missing; resuming from {fallback.name} ({_describe(fallback)})")
    elif fallback is None and skipped:
        notes.append(f"{last}: missing and no usable checkpoint ({', '.join(skipped)}); starting from scratch")
    return fallback, notes


def resume_point(run_dir: Path) -> Path | None:
    """The checkpoint ``choose_resume`` would take, changing nothing (None: scratch); to say where a run goes on."""
    last = weights_in(run_dir) / "last.pt"
    if last.exists() and verify(last) is None:
        return last
    return _newest_good(weights_in(run_dir))[0]


def _newest_good(weights: Path) -> tuple[Path | None, list[str]]:
    """The newest checkpoint that verifies among the fallbacks, and the ones skipped as unusable."""
    candidates = [weights / "last.good.pt", weights / "best.pt", *weights.glob("epoch*.pt")]
    present = []
    for path in candidates:
        try:
            present.append((path.stat().st_mtime, path))
        except FileNotFoundError:
            continue
    skipped = []
    # Newest first; on equal times last.good.pt before best.pt (the stable sort keeps the list's order).
    for _, path in sorted(present, key=lambda item: -item[0]):
        problem = verify(path)
        if problem is None:
            return path, skipped
        skipped.append(f"{path.name} ({problem})")
    return None, skipped


def _describe(path: Path) -> str:
    if path.name == "best.pt":
        return "the best epoch's weights, not the newest: epochs after it are trained again"
    if path.name == "last.good.pt":
        return "the last save that verified"
    return "a periodic save (save_period)"


def _set_aside(last: Path) -> str:
    """Move a corrupt last.pt aside (removing an empty one) and prune old ones; what was done, as a phrase."""
    if last.stat().st_size == 0:
        last.unlink()
        return "empty, removed"
    aside = last.with_name(f"last.pt.corrupt-{time.time_ns()}")
    os.replace(last, aside)
    kept = sorted(last.parent.glob("last.pt.corrupt-*"), key=lambda p: p.stat().st_mtime_ns, reverse=True)
    for old in kept[KEEP_CORRUPT:]:
        old.unlink(missing_ok=True)
    dropped = len(kept) - KEEP_CORRUPT
    return f"kept as {aside.name}" + (f" ({dropped} older corrupt copies removed, {KEEP_CORRUPT} kept)"
                                      if dropped > 0 else "")


def _copy_atomically(source: Path, target: Path) -> None:
    """A complete copy or none: a temporary file, flushed to disk, renamed over the target."""
    tmp = target.with_name(f".{target.name}.tmp")
    try:
        shutil.copyfile(source, tmp)
        with open(tmp, "rb+") as f:
            os.fsync(f.fileno())
        os.replace(tmp, target)
    finally:
        tmp.unlink(missing_ok=True)
