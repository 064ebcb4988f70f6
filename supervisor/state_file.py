"""The supervisor's state file: what a restarted supervisor and ``yolo-train status`` read.

Written atomically (a temporary file renamed over the old one), so a reader never sees half a file and a
crash or a full disk mid-write leaves the previous version in place.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

STATE_FILE = "supervisor.json"
VERSION = 1


class StateFileError(ValueError):
    pass


def path_in(state_dir: Path) -> Path:
    return state_dir / STATE_FILE


def write(state_dir: Path, record: dict[str, Any]) -> None:
    target = path_in(state_dir)
    tmp = target.with_name(f".{target.name}.{os.getpid()}.tmp")
    data = json.dumps({"version": VERSION, **record}, indent=1, default=str)
    try:
        with open(tmp, "w") as f:
            f.write(data)
        os.replace(tmp, target)
    except OSError:
        tmp.unlink(missing_ok=True)
        raise


def read(state_dir: Path) -> dict[str, Any] | None:
    target = path_in(state_dir)
    try:
        record = json.loads(target.read_text())
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as e:
        raise StateFileError(f"{target}: unreadable state file ({e}); move it aside to start the ladder afresh") \
            from None
    if not isinstance(record, dict) or record.get("version") != VERSION:
        raise StateFileError(f"{target}: state file of another version; move it aside to start afresh")
    return record
