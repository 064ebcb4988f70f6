"""The incidents in the state directory: ``STATE_DIR/incidents.jsonl`` (one JSON line per incident, appended by the
supervisor) and ``STATE_DIR/incidents/<id>/stacks.json`` (the hung tree's stacks, supervisor/host/stacks.py); each
incident read back with its stacks.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from supervisor.state.paths import StatePaths

LATEST_TIME = 32503680000.0  # 3000-01-01: a later "time" is no wall time a clock can show


def load_incidents(state_dir: Path) -> list[dict[str, Any]]:
    """Every readable incident, oldest first, with ``where``, ``summary`` and ``culprit`` from its stacks file
    when the line itself lacks them. A torn line (the supervisor killed mid-write) is skipped."""
    try:
        text = StatePaths(state_dir).incidents.read_text(errors="replace")
    except OSError:
        return []
    incidents = []
    for line in text.splitlines():
        try:
            incident = json.loads(line)
        except ValueError:
            continue
        if isinstance(incident, dict):
            incidents.append(_with_stacks(Path(state_dir), incident))
    return incidents


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
