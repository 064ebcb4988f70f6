"""The supervisor's state file: what a restarted supervisor and ``yolo-train status`` read.

Written atomically and durably: a temporary file, fsynced, renamed over the old one, then the directory
fsynced. A reader never sees half a file, and a crash, a power cut or a full disk mid-write leaves the
previous version in place rather than an empty file (ext4 may otherwise commit the rename before the data).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from supervisor.state.paths import StatePaths
from worker.wire.durable_file import write_durably

VERSION = 1


class StateFileError(ValueError):
    """The state file cannot be used; the message is one line naming it."""


class CorruptStateFile(StateFileError):
    """The file is there but is not a state record (torn, empty, another version): moving it aside helps."""


def path_in(state_dir: Path) -> Path:
    return StatePaths(state_dir).state_file


def write(state_dir: Path, record: dict[str, Any]) -> None:
    write_durably(path_in(state_dir), json.dumps({"version": VERSION, **record}, indent=1, default=str).encode())


def read(state_dir: Path) -> dict[str, Any] | None:
    """The state record, None when there is none; StateFileError (one line) when the file cannot be used."""
    target = path_in(state_dir)
    try:
        text = target.read_bytes()
    except FileNotFoundError:
        return None
    except OSError as e:
        raise StateFileError(f"{target}: cannot read the state file ({e.strerror})") from None
    try:
        record = json.loads(text)
    except ValueError as e:
        what = "empty" if not text.strip() else f"not JSON ({e})"
        raise CorruptStateFile(f"{target}: corrupt state file: {what}") from None
    if not isinstance(record, dict) or record.get("version") != VERSION:
        raise CorruptStateFile(f"{target}: state file of another version (expected {{\"version\": {VERSION}, ...}})")
    return record
