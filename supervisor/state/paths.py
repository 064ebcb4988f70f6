"""Every path in a state directory, named once: the holder (``StateDir``) and every reader (``status``, ``report``,
``incidents``, the history, the shared files of several hosts) take their paths from ``StatePaths``.

    STATE_DIR/supervisor.lock       flock held while a supervisor runs; holds its pid
    STATE_DIR/supervisor.json       the state file (state_file.py): restarts, rung, incidents, live status
    STATE_DIR/supervisor.reserve    space kept for the last state write: on a full disk, how the run ended still lands
    STATE_DIR/incidents.jsonl       one line per incident, enriched with the process tree and output tail
    STATE_DIR/incidents/ID/         an incident's files: stacks.json, the hung tree's stacks (host/stacks.py)
    STATE_DIR/incidents/ahead-N/    attempt N's stall's stacks, read ahead of its verdict (decision/recovery/stacks_ahead.py):
                                    moved into the incident's directory at the verdict, removed when the stall ends
    STATE_DIR/incidents/devcoredumps-N/  the GPU's devcoredumps of attempt N, copied before its incident opened
                                    (host/devcoredump.py): moved into the incident's directory when it does
    STATE_DIR/history.db            the run's history, for `yolo-train report` (history.py)
    STATE_DIR/launch-record.json    the launch record of the current attempt (worker/wire/contract.py)
    STATE_DIR/standby-ready.json    what the ready standby holds and the files its datasets were built from
                                    (worker/wire/contract.py's StandbyReport), written by it, read at the launch
    STATE_DIR/attempt-N.fault       a fault's flag, armed for attempt N (worker/supervision/faults.py)
    STATE_DIR/train/                Ultralytics' save_dir (or [distributed] run_dir): weights/last.pt, results.csv,
                                    and with several hosts job-ladder.json and job-checkpoint.json
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

from supervisor.host.stacks import STACKS_FILE
from supervisor.state.lock_holder import group_name, user_name

LOCK_FILE = "supervisor.lock"
STATE_FILE = "supervisor.json"
RESERVE_FILE = "supervisor.reserve"
INCIDENTS_FILE = "incidents.jsonl"
INCIDENTS_DIR = "incidents"
HISTORY_FILE = "history.db"
LAUNCH_RECORD = "launch-record.json"
STANDBY_REPORT = "standby-ready.json"
OLD_LAUNCH_RECORD = "worker-settings.json"  # the launch record's name in earlier versions
RUN_DIR = "train"
WEIGHTS_DIR = "weights"
RESULTS_FILE = "results.csv"
JOB_LADDER_FILE = "job-ladder.json"
JOB_CHECKPOINT_FILE = "job-checkpoint.json"


def weights_in(run_dir: Path) -> Path:
    return run_dir / WEIGHTS_DIR


def job_ladder_in(run_dir: Path) -> Path:
    return run_dir / JOB_LADDER_FILE


def job_checkpoint_in(run_dir: Path) -> Path:
    return run_dir / JOB_CHECKPOINT_FILE


class StatePaths:
    """The paths of one state directory (``path``); ``run_dir`` is [distributed] run_dir where the hosts share one."""

    def __init__(self, path: Path, run_dir: Path | None = None):
        self.path = Path(path)
        self._run_dir = run_dir

    def unreadable(self) -> str | None:
        """Why this user cannot read the directory (it is another's: 0700, or 0750 for a group it is not in), in
        one line with the fix; None when it can, or when there is none."""
        try:
            st = os.stat(self.path)
        except OSError:
            return None
        if os.access(self.path, os.R_OK | os.X_OK):
            return None
        owner = user_name(st.st_uid)
        group = f", or join group {group_name(st.st_gid)}" if st.st_mode & 0o050 == 0o050 else ""
        return (f"{self.path}: cannot read the state directory (mode {stat.S_IMODE(st.st_mode):04o}, user "
                f"{owner}'s): run as {owner if st.st_uid == 0 else owner + ' or root'}{group} "
                f"(docs/behaviour.md#who-can-read-a-state-directory)")

    @property
    def lock_file(self) -> Path:
        return self.path / LOCK_FILE

    @property
    def state_file(self) -> Path:
        return self.path / STATE_FILE

    @property
    def reserve(self) -> Path:
        return self.path / RESERVE_FILE

    @property
    def incidents(self) -> Path:
        return self.path / INCIDENTS_FILE

    def incident_dir(self, incident_id: str) -> Path:
        return self.path / INCIDENTS_DIR / incident_id

    def stacks_ahead_dir(self, attempt: int) -> Path:
        return self.path / INCIDENTS_DIR / f"ahead-{attempt}"

    def devcoredumps_dir(self, attempt: int) -> Path:
        return self.path / INCIDENTS_DIR / f"devcoredumps-{attempt}"

    def stacks(self, incident_id: str) -> Path:
        return self.incident_dir(incident_id) / STACKS_FILE

    @property
    def history(self) -> Path:
        return self.path / HISTORY_FILE

    @property
    def launch_record(self) -> Path:
        return self.path / LAUNCH_RECORD

    @property
    def standby_report(self) -> Path:
        return self.path / STANDBY_REPORT

    @property
    def old_launch_record(self) -> Path:
        return self.path / OLD_LAUNCH_RECORD

    def fault_flag(self, attempt: int) -> Path:
        return self.path / f"attempt-{attempt}.fault"

    @property
    def run_dir(self) -> Path:
        return self._run_dir or self.path / RUN_DIR  # Ultralytics' save_dir: weights/last.pt lives here

    @property
    def weights(self) -> Path:
        return weights_in(self.run_dir)

    @property
    def last_checkpoint(self) -> Path:
        return self.weights / "last.pt"

    @property
    def results(self) -> Path:
        return self.run_dir / RESULTS_FILE

    @property
    def job_ladder(self) -> Path:
        return job_ladder_in(self.run_dir)

    @property
    def job_checkpoint(self) -> Path:
        return job_checkpoint_in(self.run_dir)
