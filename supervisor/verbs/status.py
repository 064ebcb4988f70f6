"""``yolo-train status``: the supervisor's live state at a glance, from its state file plus a look at /proc."""

from __future__ import annotations

import json
import shutil
import time
from pathlib import Path
from typing import Any

import psutil

from supervisor.config import Config
from supervisor.host import process_tree
from supervisor.state import hosts, state_file
from supervisor.vocabulary import FINAL_STATES

STALE_AFTER = 10.0  # seconds without a state write (the supervisor writes every second) before it counts as stuck
LIVE_FIGURES = ("it_s", "samples_s", "eta_seconds")  # what only a live supervisor can vouch for
CANNOT_WRITE = "cannot write state"  # its loop runs, its state file is old: a full disk (StateDir.write_state)
FULL_BELOW = 1 << 20  # bytes free under which a failing write is put down to a full disk


def deadline_slack(config: Config, status: dict[str, Any], now: float) -> float | None:
    """Seconds between the projected end (now + ETA) and the configured deadline; negative: late."""
    deadline = config.deadline_at
    eta = status.get("eta_seconds")
    return None if deadline is None or eta is None else deadline - (now + eta)


def gather(config: Config) -> dict[str, Any]:
    try:
        record = state_file.read(config.state_dir)
    except state_file.StateFileError as e:
        # Read-only here: `run` moves a corrupt file aside, status only says what is wrong.
        fix = ("`yolo-train run` moves it aside and goes on from the newest checkpoint at rung 0"
               if isinstance(e, state_file.CorruptStateFile) else "make it readable by this user")
        return {"state": "unreadable", "state_dir": str(config.state_dir), "problem": f"{e}; {fix}", "pids": [],
                "supervisor_running": False}
    if record is None:
        return {"state": "not started", "state_dir": str(config.state_dir), "pids": [], "supervisor_running": False}
    status = dict(record.get("status") or {})
    supervisor_pid = status.get("supervisor_pid")
    running = bool(supervisor_pid) and psutil.pid_exists(supervisor_pid) and status.get("state") not in FINAL_STATES
    worker_pid = status.get("worker_pid")
    pids = [p.pid for p in process_tree.tree(worker_pid)] if running and worker_pid else []
    status.update(supervisor_running=running, pids=pids, deadline=config.deadline,
                  deadline_slack_seconds=deadline_slack(config, status, time.time()) if running else None)
    if not running and status.get("state") not in FINAL_STATES:
        status["state"] = "not running"  # the supervisor died without saying how it ended
    elif running and _stopped(supervisor_pid):
        status["state"] = "supervisor stopped"  # SIGSTOP or a debugger: nobody watches the worker now
    elif running and time.time() - (status.get("updated") or 0) > STALE_AFTER:
        unwritten = _unwritten(config.state_dir, status.get("updated"))
        if unwritten:  # its loop runs (it touched the file it cannot replace): say so, and why
            status.update(state=CANNOT_WRITE, problem=unwritten)
        else:
            status["state"] = "not responding"  # alive but its loop has not written for a while
    if status["state"] in ("not running", "supervisor stopped", "not responding", CANNOT_WRITE):
        status.update({key: None for key in LIVE_FIGURES})
    run_dir = config.distributed.run_dir if config.distributed.several_hosts else status.get("run_dir")
    if run_dir:  # several hosts: the config's, or the one the state file names (status --state-dir alone)
        status["hosts"] = hosts.read_all(Path(run_dir))
    return status


def _unwritten(state_dir: Path, updated: Any) -> str | None:
    """Why a running supervisor's state is old although its loop runs, or None when its loop does not: the loop
    touches the state file whenever its write fails (a full disk), so a fresh time on an old record says it runs."""
    try:
        touched = state_file.path_in(state_dir).stat().st_mtime
        free = shutil.disk_usage(state_dir).free
    except OSError:
        return None
    if time.time() - touched > STALE_AFTER:
        return None
    since = time.strftime("%H:%M:%S", time.localtime(updated)) if isinstance(updated, (int, float)) else "?"
    why = f"the disk is full ({free // 1024} KiB free)" if free < FULL_BELOW else "its write fails"
    return (f"{state_dir}: {why}: the supervisor runs but has written no state since {since}, so what follows is "
            f"as of then; free disk space there")


def _stopped(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_STOPPED
    except psutil.Error:
        return False


def bar(fraction: float | None, width: int = 24) -> str:
    if fraction is None:
        return "[" + " " * width + "]"
    filled = round(max(0.0, min(1.0, fraction)) * width)
    return "[" + "#" * filled + "-" * (width - filled) + "]"


def duration(seconds: float | None) -> str:
    if seconds is None:
        return "?"
    seconds = int(seconds)
    h, rem = divmod(seconds, 3600)
    m, s = divmod(rem, 60)
    return f"{h}h{m:02d}m" if h else f"{m}m{s:02d}s"


def slack_text(slack: float | None) -> str:
    if slack is None:
        return ""
    return f"  {duration(slack)} before the deadline" if slack >= 0 else f"  {duration(-slack)} PAST the deadline"


def rung_speed_text(status: dict[str, Any]) -> str:
    """The current rung's measured speed against rung 0's, and when the faster rung is tried again."""
    speed, base = status.get("rung_speed"), status.get("rung0_speed")
    text = f" {speed:.2f} it/s" if speed else ""
    if speed and base and status.get("rung"):
        text += f" = {speed / base:.2f}x rung 0"
    probe = (status.get("probe") or {}).get("in_seconds")
    if probe is not None:
        text += f", probing rung {status.get('rung', 1) - 1} in {duration(probe)} of training"
    return text


def incident_line(incident: Any, now: float) -> str:
    """The last incident in one line; a record not of the incident's form (an edited file) is said, not a crash."""
    when = incident.get("time") if isinstance(incident, dict) else None
    if not isinstance(when, (int, float)) or not all(isinstance(incident.get(k), str)
                                                       for k in ("reason", "phase", "detail")):
        return f"last incident: unreadable record {json.dumps(incident, default=str)[:120]}"
    return f"last incident {duration(now - when)} ago: {incident['reason']} in {incident['phase']}: " \
           f"{incident['detail']}"


def render(status: dict[str, Any], now: float | None = None) -> str:
    now = now or time.time()
    if status["state"] == "not started":
        return f"not started (no state in {status['state_dir']})"
    if status["state"] == "unreadable":
        return f"unreadable: {status['problem']}"
    head = [f"{status['state']}: {status['problem']}"] if status["state"] == CANNOT_WRITE else []
    epoch, epochs = status.get("epoch", 0), status.get("epochs", 0)
    batch, batches = status.get("batch", 0), status.get("batches", 0)
    it_s = status.get("it_s")
    lines = [
        f"{status['state']:<10} phase {status.get('phase', '?')}, worker pid {status.get('worker_pid') or '-'}"
        f" ({len(status.get('pids', []))} processes)",
        f"epoch {epoch}/{epochs} {bar(batch / batches if batches else None)} batch {batch}/{batches}" if epochs
        else "epoch -  (training not reached)",
        f"run       {bar(status.get('progress'))} {100 * (status.get('progress') or 0):.0f}%  "
        f"{f'{it_s:.2f} it/s' if it_s else '- it/s'}  ETA {duration(status.get('eta_seconds'))}"
        + slack_text(status.get("deadline_slack_seconds")),
        f"rung {status.get('rung', 0)}/{max(0, status.get('rungs', 1) - 1)} ({status.get('rung_label', '')})"
        + rung_speed_text(status) + ", "
        f"restarts {status.get('restarts', 0)}"
        + (" (" + ", ".join(f"{k} {v}" for k, v in sorted(status.get("restarts_by_reason", {}).items())) + ")"
           if status.get("restarts") else "") + f", budget {status.get('budget_left', '?')} left",
    ]
    lines = head + lines
    ignored = (status.get("heartbeats") or {}).get("ignored")
    if ignored:
        lines.append(f"heartbeats ignored {ignored} (sent by processes other than the worker's main one: not progress)")
    if status.get("startup_step"):
        scan = status.get("startup_step_progress") or {}
        search = status.get("startup_step_search")
        lines.append(f"startup   step {status['startup_step']}" + (f" {scan['done']}/{scan.get('total') or '?'}"
                                                                  if scan else "")
                     + (f": {search}" if search else "")
                     + (f", bound {duration(status['startup_step_bound'])} without news"
                        if status.get("startup_step_bound") is not None else ", no bound"))
    incident = status.get("last_incident")
    if incident:
        lines.append(incident_line(incident, now))
    if status.get("exit"):
        lines.append(f"exit {status['exit']['code']}: {status['exit']['text']}")
    for host in status.get("hosts") or []:
        stale = " (not updated for " + duration(now - host["updated"]) + ")" \
            if host.get("updated") and now - host["updated"] > STALE_AFTER and host.get("state") not in FINAL_STATES \
            else ""
        ranks = ", ".join(f"rank {r['rank']} pid {r['pid']} {duration(r.get('seconds_since_progress'))} since progress"
                          for r in host.get("ranks") or []) or "no ranks"
        lines.append(f"host {host['node_rank']} ({host.get('host')}): {host.get('state')}{stale}, rung "
                     f"{host.get('rung')}, attempt {host.get('attempt')}: {ranks}")
    return "\n".join(lines)


def status_main(config: Config, as_json: bool) -> int:
    status = gather(config)
    print(json.dumps(status, indent=1, default=str) if as_json else render(status))
    return 1 if status["state"] == "unreadable" else 0
