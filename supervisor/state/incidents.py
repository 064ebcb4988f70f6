"""The incidents in the state directory: ``STATE_DIR/incidents.jsonl`` (one JSON line per incident, appended by the
supervisor) and ``STATE_DIR/incidents/<id>/stacks.json`` (the hung tree's stacks, supervisor/host/stacks.py); each
incident read back with its stacks, and the newest one not written yet (its batches after a recovery still being
counted, or its supervisor killed before it could write it) from the state file's status, marked ``pending``.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from supervisor.state import state_file
from supervisor.state.paths import StatePaths

LATEST_TIME = 32503680000.0  # 3000-01-01: a later "time" is no wall time a clock can show


def load_incidents(state_dir: Path) -> list[dict[str, Any]]:
    """Every readable incident, oldest first, with ``where``, ``summary`` and ``culprit`` from its stacks file
    when the line itself lacks them, then the pending one. A torn line (the supervisor killed mid-write) is skipped."""
    try:
        text = StatePaths(state_dir).incidents.read_text(errors="replace")
    except OSError:
        text = ""
    incidents = []
    for line in text.splitlines():
        try:
            incident = json.loads(line)
        except ValueError:
            continue
        if isinstance(incident, dict):
            incidents.append(_with_stacks(Path(state_dir), incident))
    return incidents + _pending(Path(state_dir), {i.get("id") for i in incidents})


def _pending(state_dir: Path, written: set[Any]) -> list[dict[str, Any]]:
    try:
        record = state_file.read(state_dir) or {}
    except state_file.StateFileError:
        return []
    status = record.get("status")
    last = status.get("last_incident") if isinstance(status, dict) else None
    if not isinstance(last, dict) or not last.get("id") or last["id"] in written:
        return []
    return [{**_with_stacks(state_dir, last), "pending": True}]  # not complete yet: written once training goes on


def _with_stacks(state_dir: Path, incident: dict[str, Any]) -> dict[str, Any]:
    if incident.get("where") and incident.get("summary") or not incident.get("id"):
        return incident
    path = StatePaths(state_dir).stacks(str(incident["id"]))
    try:
        stacks = json.loads(path.read_text())
    except (OSError, ValueError):
        return incident
    return {**incident, "where": incident.get("where") or stacks.get("where"),
            "summary": incident.get("summary") or stacks.get("summary", []),
            "culprit": incident.get("culprit") or stacks.get("culprit"), "stacks": str(path)}
