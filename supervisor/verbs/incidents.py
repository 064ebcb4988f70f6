"""``yolo-train incidents``: the night's incidents grouped by where they hung, and the newest one in full.

The supervisor appends one JSON line per incident to ``STATE_DIR/incidents.jsonl`` and, when it captured the
stacks of the hung tree, writes ``STATE_DIR/incidents/<id>/stacks.json`` (supervisor/host/stacks.py).
Twelve hangs in one night are usually one bug twelve times: grouping by the place they hung (the culprit
process's top frames, without pids or line numbers) says so at a glance. Incidents without stacks (older
ones, crashes, a capture that failed) group under their reason and phase.
"""

from __future__ import annotations

import json
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from supervisor.decision import where_of
from supervisor.state.incidents import LATEST_TIME, load_incidents
from supervisor.state.paths import StatePaths


@dataclass
class Group:
    where: str
    count: int = 0
    first: float = 0.0  # wall time of the oldest incident of the group
    last: float = 0.0
    phases: dict[str, int] = field(default_factory=dict)
    reasons: dict[str, int] = field(default_factory=dict)
    tiers: dict[str, int] = field(default_factory=dict)  # how each was recovered: in_place, restart
    rungs: list[int] = field(default_factory=list)
    ids: list[str] = field(default_factory=list)


def group_by_where(incidents: list[dict[str, Any]]) -> list[Group]:
    """Groups, most frequent first (the newest first among equals)."""
    groups: dict[str, Group] = {}
    for incident in incidents:
        when = _time(incident)
        group = groups.setdefault(where_of(incident), Group(where_of(incident), first=when, last=when))
        group.count += 1
        group.first, group.last = min(group.first, when), max(group.last, when)
        for counts, key in ((group.phases, "phase"), (group.reasons, "reason"), (group.tiers, "tier")):
            if key in incident or key != "tier":
                counts[str(incident.get(key, "?"))] = counts.get(str(incident.get(key, "?")), 0) + 1
        if isinstance(incident.get("rung"), int) and incident["rung"] not in group.rungs:
            group.rungs = sorted(group.rungs + [incident["rung"]])
        group.ids.append(str(incident.get("id", "?")))
    return sorted(groups.values(), key=lambda g: (-g.count, -g.last))


def _time(incident: dict[str, Any]) -> float:
    """The incident's wall time; 0 (shown as "?") when its line holds no time a clock can show (edited by hand)."""
    when = incident.get("time")
    if isinstance(when, bool) or not isinstance(when, (int, float)) or not 0 < when < LATEST_TIME:
        return 0.0
    return float(when)


def _clock(wall: float, with_date: bool = False) -> str:
    if not wall:
        return "?"
    return time.strftime("%Y-%m-%d %H:%M:%S" if with_date else "%H:%M:%S", time.localtime(wall))


def _counts(counts: dict[str, int]) -> str:
    return ", ".join(f"{k} x{v}" if v > 1 else k for k, v in sorted(counts.items(), key=lambda kv: -kv[1]))


def _aftermath(incident: dict[str, Any]) -> str:
    """What the incident cost: the training lost (unknown where no checkpoint tells) and the time to train again."""
    text = ""
    cost = incident.get("tier_cost", incident.get("in_place"))  # "in_place": a line recorded before issue 60
    if isinstance(cost, dict):
        text += (f", recovered in place: next batch {cost.get('to_next_batch', '?')} s after the loader workers were "
                 f"replaced, {cost.get('batches_lost', '?')} batches lost")
    if incident.get("escalation"):
        text += f", restarted ({incident['escalation']})"
    if "lost_batches" in incident:
        lost = incident["lost_batches"]
        text += f", lost {lost} batch{'' if lost == 1 else 'es'}" if lost is not None else ", lost work unknown"
    if incident.get("restart_seconds") is not None:
        text += f", training again {incident['restart_seconds']:.1f} s later"
    return text


def render(state_dir: Path, incidents: list[dict[str, Any]], groups: list[Group]) -> str:
    if not incidents:
        return f"no incidents in {state_dir}"
    first, last = min(g.first for g in groups), max(g.last for g in groups)
    lines = [f"{len(incidents)} incident{'s' if len(incidents) > 1 else ''} in {state_dir} "
             f"({_clock(first, True)} to {_clock(last, True)}), {len(groups)} "
             f"place{'s' if len(groups) > 1 else ''}:", ""]
    width = len(str(groups[0].count))
    for g in groups:
        lines.append(f"  {g.count:>{width}}  {g.where}")
        span = _clock(g.first) if g.count == 1 else f"{_clock(g.first)} .. {_clock(g.last)}"
        lines.append(f"  {'':>{width}}  {span}   phase {_counts(g.phases)}   rung "
                     f"{', '.join(map(str, g.rungs)) or '?'}   {_counts(g.reasons)}"
                     + (f"   tier {_counts(g.tiers)}" if g.tiers else ""))
    newest = incidents[-1]
    lines += ["", f"newest: {newest.get('id', '?')} at {_clock(_time(newest), True)}, "
                  f"{newest.get('reason', '?')} in {newest.get('phase', '?')} ({newest.get('detail', '')}), "
                  f"rung {newest.get('rung', '?')} ({newest.get('rung_label', '')}), epoch {newest.get('epoch', '?')} "
                  f"batch {newest.get('batch', '?')}{_aftermath(newest)}"]
    summary = newest.get("summary") or []
    lines += [f"  {line}" for line in summary]
    if not summary:
        lines += [f"  {p.get('name', '?')} (pid {p.get('pid')}) {p.get('state', '?')}, "
                  f"{'?' if p.get('cpu_percent') is None else p['cpu_percent']}% CPU"
                  for p in newest.get("processes", [])]
        lines.append("  (no stacks were captured for this incident)")
    if newest.get("stacks"):
        lines.append(f"  stacks: {Path(state_dir) / newest['stacks']}")
    return "\n".join(lines)


def as_json(state_dir: Path, incidents: list[dict[str, Any]], groups: list[Group]) -> dict[str, Any]:
    return {"state_dir": str(state_dir), "count": len(incidents), "groups": [asdict(g) for g in groups],
            "newest": incidents[-1] if incidents else None}


def incidents_main(state_dir: Path, json_output: bool = False) -> int:
    unreadable = StatePaths(state_dir).unreadable()
    if unreadable:  # not "no incidents": there may be many
        print(f"yolo-train: {unreadable}", file=sys.stderr)
        return 1
    incidents = load_incidents(state_dir)
    groups = group_by_where(incidents)
    if json_output:
        print(json.dumps(as_json(state_dir, incidents, groups), indent=1, default=str))
    else:
        print(render(state_dir, incidents, groups))
    return 0
