"""Several hosts: the job-wide ladder decision and the job's newest checkpoint, kept beside the checkpoint on the
run directory every host shares.

A host that moves the job on the ladder (a hang climbs, a remedy, a probe) writes ``job-ladder.json`` before its
tree is killed; every host reads it, when it changed, before each event but heartbeats (``core.JobLadderRead``), so
the hosts whose ranks fail with it restart on the same rung, with the same remedies, from the same checkpoint.
The host whose rank 0 saves writes ``job-checkpoint.json`` at each checkpoint (``core.JobCheckpointRead``): the
other hosts' ranks never report one, and their restart budget, lost work and goodput count from it.
"""

from __future__ import annotations

import json
import logging
import socket
import time
from pathlib import Path

from supervisor.config import DistributedConfig
from supervisor.decision import PublishCheckpoint, PublishLadder, JobCheckpointRead, JobLadderRead, HeartbeatReceived
from supervisor.state.paths import job_checkpoint_in, job_ladder_in
from worker.wire.durable_file import write_durably

log = logging.getLogger("yolo-train")


class SharedFile:
    """One record on the shared run directory, written whole by one host and read by the others when it changed."""

    def __init__(self, path: Path, node_rank: int):
        self.path = path
        self.node_rank = node_rank
        self._seen: tuple[int, int] | None = None  # (mtime_ns, size) of the version last read

    def write(self, record: dict) -> None:
        """Raises OSError when the shared directory cannot be written (the caller says so and goes on)."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        write_durably(self.path, json.dumps({**record, "node_rank": self.node_rank}).encode())

    def read_if_changed(self):
        """The event read when the file changed since the last read; None when it did not, is missing or
        unreadable."""
        try:
            stat = self.path.stat()
            if (stat.st_mtime_ns, stat.st_size) == self._seen:
                return None
            self._seen = (stat.st_mtime_ns, stat.st_size)
            return self.parse(json.loads(self.path.read_text()))
        except (OSError, ValueError, KeyError, TypeError):
            return None

    def parse(self, raw: dict):
        raise NotImplementedError


class JobLadderFile(SharedFile):
    def __init__(self, run_dir: Path, node_rank: int):
        super().__init__(job_ladder_in(run_dir), node_rank)

    def publish(self, decision: PublishLadder) -> None:
        self.write({"seq": decision.seq, "rung": decision.rung, "remedies": decision.remedies,
                    "host": socket.gethostname(), "cause": decision.cause})

    def parse(self, raw: dict) -> JobLadderRead:
        return JobLadderRead(seq=int(raw["seq"]), rung=int(raw["rung"]), remedies=dict(raw.get("remedies") or {}),
                             node_rank=int(raw["node_rank"]), host=str(raw.get("host", "")),
                             cause=dict(raw.get("cause") or {}))


class JobCheckpointFile(SharedFile):
    def __init__(self, run_dir: Path, node_rank: int):
        super().__init__(job_checkpoint_in(run_dir), node_rank)

    def publish(self, mark: PublishCheckpoint) -> None:
        self.write({"path": mark.path, "epoch": mark.epoch, "batch": mark.batch, "seconds": mark.seconds,
                    "wall": time.time()})

    def parse(self, raw: dict) -> JobCheckpointRead:
        return JobCheckpointRead(path=str(raw["path"]), epoch=int(raw["epoch"]), batch=int(raw["batch"]),
                                 seconds=float(raw["seconds"]), wall=float(raw["wall"]),
                                 node_rank=int(raw["node_rank"]))


class JobFiles:
    """The two shared records of a job of several hosts (none on one host): read before each event but heartbeats
    and the shared records' own, written when the core publishes."""

    def __init__(self, run_dir: Path, hosts: DistributedConfig):
        self.ladder = JobLadderFile(run_dir, hosts.node_rank) if hosts.several_hosts else None
        self.checkpoint = JobCheckpointFile(run_dir, hosts.node_rank) if hosts.several_hosts else None

    def news_before(self, event) -> list:
        """Another host's decisions, to judge before ``event`` (checkpoint first), in order."""
        if self.ladder is None or isinstance(event, (HeartbeatReceived, JobLadderRead, JobCheckpointRead)):
            return []
        return [r for r in (shared.read_if_changed() for shared in (self.checkpoint, self.ladder)) if r is not None]

    def publish_ladder(self, action: PublishLadder) -> None:
        _publish(self.ladder, action, "the job-wide ladder decision", "the other hosts stay on their rung")

    def publish_checkpoint(self, action: PublishCheckpoint) -> None:
        _publish(self.checkpoint, action, "the job's checkpoint",
                 "the other hosts count their restarts as if none was saved")


def _publish(shared: SharedFile, action, what: str, otherwise: str) -> None:
    """A decision written for the other hosts; a failed write is said, and this host goes on."""
    try:
        shared.publish(action)
    except OSError as e:
        log.error(f"cannot write {what} to {shared.path} ({e.strerror}): {otherwise}")
