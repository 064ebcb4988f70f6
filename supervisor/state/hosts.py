"""Several hosts: each host's view of its ranks, kept on the shared run directory so that ``status`` on any host
shows every host's ranks (``run_dir/hosts/NODE_RANK.json``, rewritten with the state file)."""

from __future__ import annotations

import json
import socket
from pathlib import Path
from typing import Any

from worker.wire.durable_file import write_durably

FIELDS = ("state", "phase", "epoch", "batch", "rung", "attempt", "worker_pid", "ranks", "updated")


def path_of(run_dir: Path, node_rank: int) -> Path:
    return run_dir / "hosts" / f"{node_rank}.json"


def publish(run_dir: Path, node_rank: int, status: dict[str, Any]) -> None:
    """Raises OSError when the shared directory cannot be written."""
    path = path_of(run_dir, node_rank)
    path.parent.mkdir(parents=True, exist_ok=True)
    view = {"node_rank": node_rank, "host": socket.gethostname(), **{k: status.get(k) for k in FIELDS}}
    write_durably(path, json.dumps(view).encode())


def read_all(run_dir: Path) -> list[dict[str, Any]]:
    """Every host's last view, by node_rank; an unreadable one is left out."""
    views = []
    for path in sorted((run_dir / "hosts").glob("*.json"), key=lambda p: p.stem):
        try:
            views.append(json.loads(path.read_text()))
        except (OSError, ValueError):
            continue
    return sorted(views, key=lambda v: v.get("node_rank", 0))
