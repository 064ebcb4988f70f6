"""One incident, one record: why a worker was stopped, what its tree looked like, what the kill did.

The core opens it when it decides to stop a worker and owns it from then on. What only the shell can see comes
in as typed events that the core folds in: ``IncidentEnriched`` (the process tree, the output tail and the stacks,
taken before the kill) and ``TreeKilled`` (the kill report). The record is complete when the next attempt trains
(``restart_seconds``), when the next incident opens, or when the supervisor exits: then the core asks for it to be
written, once, to incidents.jsonl. ``to_dict`` is the one spelling of it there, in status --json's
``last_incident`` and in the state file; its keys are the ones users script against.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, fields
from typing import Any

from supervisor.decision.vocabulary import Reason


@dataclass(frozen=True)
class Loss:
    """The training an attempt lost after the checkpoint the next worker resumes from; None where unknown."""
    seconds: float | None
    batches: int | None


@dataclass(frozen=True)
class Kill:
    """What killing the tree took: its processes, how long, and any that survived SIGKILL."""
    processes: int
    seconds: float
    survivors: tuple[str, ...] = ()
    confirmed_wall: float | None = None


@dataclass(frozen=True)
class Stacks:
    """Where a hung tree waited (supervisor/sources/stacks.py), as the incident keeps it."""
    where: str  # the grouping key of ``yolo-train incidents``
    summary: tuple[str, ...]  # one line per process
    culprit: str | None  # the line of the process the hang is best described by
    seconds: float  # the capture's duration
    path: str | None  # stacks.json, relative to the state directory; None if it could not be written


@dataclass(frozen=True)
class Incident:
    id: str
    time: float  # wall clock of the verdict
    reason: Reason
    phase: str
    detail: str
    attempt: int
    rung: int
    rung_label: str
    worker_pid: int | None
    epoch: int
    batch: int
    seconds_since_progress: float | None
    last_progress_wall: float | None
    kernel_events: tuple[dict[str, Any], ...] = ()
    loss: Loss | None = None  # None: the attempt never trained
    resumes_from: dict[str, Any] | None = None  # the checkpoint the core knew of: epoch, batch, path
    stopped_first_rank: int | None = None  # under DDP: the rank whose progress is the oldest
    # -- several hosts ([distributed]) --
    node_rank: int | None = None  # this host's
    host: str | None = None  # this host's name (from the shell)
    caused_by: dict[str, Any] | None = None  # another host's decision that failed this host's ranks
    # -- before the first batch: the startup step the worker was in, its bound then, and the stretch seen of it --
    startup_step: str | None = None
    startup_step_bound: float | None = None  # seconds; None: no bound (startup_timeout = "off")
    startup_step_seen: float | None = None  # the longest stretch of that step this run had seen; None: not yet
    # -- from the shell, before the kill --
    processes: tuple[dict[str, Any], ...] | None = None
    output_tail: tuple[str, ...] | None = None
    stacks: Stacks | None = None
    # -- once the tree is gone --
    last_error: str | None = None
    settings: dict[str, Any] | None = None  # what the worker reported in force: the rung's proof
    kill: Kill | None = None
    restart_seconds: float | None = None  # from the verdict to the next attempt's first batch
    recorded: bool = False  # written to incidents.jsonl (kept in the state file only)

    def to_dict(self) -> dict[str, Any]:
        """The incident as incidents.jsonl, status --json and the metrics read it; what is not known is left out."""
        d: dict[str, Any] = {
            "id": self.id, "time": self.time, "time_iso": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(self.time)),
            "reason": self.reason.value, "phase": self.phase, "detail": self.detail, "attempt": self.attempt,
            "rung": self.rung, "rung_label": self.rung_label, "worker_pid": self.worker_pid, "epoch": self.epoch,
            "batch": self.batch, "seconds_since_progress": self.seconds_since_progress,
            "last_progress_wall": self.last_progress_wall}
        if self.kernel_events:
            d["kernel_events"] = list(self.kernel_events)
        if self.loss is not None:
            d["lost_seconds"], d["lost_batches"] = self.loss.seconds, self.loss.batches
        if self.resumes_from is not None:
            d["resumes_from"] = self.resumes_from
        if self.startup_step is not None:
            d.update(startup_step=self.startup_step, startup_step_bound=self.startup_step_bound,
                     startup_step_seen=self.startup_step_seen)
        for key in ("stopped_first_rank", "node_rank", "host", "caused_by"):
            if getattr(self, key) is not None:
                d[key] = getattr(self, key)
        if self.processes is not None:
            d["processes"] = list(self.processes)
        if self.output_tail is not None:
            d["output_tail"] = list(self.output_tail)
        if self.stacks is not None:
            d.update(where=self.stacks.where, summary=list(self.stacks.summary), culprit=self.stacks.culprit,
                     stacks_seconds=self.stacks.seconds, stacks=self.stacks.path)
        if self.kill is not None:
            d.update(last_error=self.last_error, settings=self.settings,
                     kill={"processes": self.kill.processes, "seconds": self.kill.seconds,
                           "survivors": list(self.kill.survivors), "confirmed_wall": self.kill.confirmed_wall})
        if self.restart_seconds is not None:
            d["restart_seconds"] = self.restart_seconds
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Incident:
        """From the state file (``to_dict`` and ``recorded``); a record of an older version was written already."""
        simple = {f.name: d[f.name] for f in fields(cls) if f.name in d and f.name not in _NESTED}
        kill = d.get("kill") if isinstance(d.get("kill"), dict) else None
        return cls(**{
            **simple, "reason": Reason(d["reason"]), "recorded": bool(d.get("recorded", True)),
            "kernel_events": tuple(d.get("kernel_events") or ()),
            "loss": Loss(d.get("lost_seconds"), d.get("lost_batches")) if "lost_seconds" in d else None,
            "processes": None if d.get("processes") is None else tuple(d["processes"]),
            "output_tail": None if d.get("output_tail") is None else tuple(d["output_tail"]),
            "stacks": Stacks(d["where"], tuple(d.get("summary") or ()), d.get("culprit"),
                             float(d.get("stacks_seconds") or 0.0), d.get("stacks")) if d.get("where") else None,
            "kill": None if kill is None else Kill(kill.get("processes", 0), kill.get("seconds", 0.0),
                                                   tuple(kill.get("survivors") or ()), kill.get("confirmed_wall"))})


_NESTED = {"reason", "recorded", "kernel_events", "loss", "processes", "output_tail", "stacks", "kill"}
