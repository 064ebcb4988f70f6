"""One incident, one record: why a worker was stopped, what its tree looked like, what the kill did.

The core opens it when it decides to stop a worker and owns it from then on. What only the shell can see comes
in as typed events that the core folds in: ``IncidentEnriched`` (the process tree, the output tail and the stacks,
taken before the kill) and ``TreeKilled`` (the kill report). The record is complete once training has gone on
``PACE_BATCHES`` batches after its recovery (``restart_seconds`` at the next attempt's first, then ``after``:
model/pace.py), or sooner when the next incident opens or the supervisor exits: then the core asks for it to be
written, once, to incidents.jsonl. ``to_dict`` is the one spelling of it there, in status --json's
``last_incident`` and in the state file; its keys are the ones users script against. Both ways are derived from the
fields' declarations (persistence.py): a field added here is written and read back by its name.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, replace
from typing import Any

from supervisor.decision.model import persistence
from supervisor.decision.model.persistence import kept
from supervisor.vocabulary import Reason, Tier, WorkerStart


@dataclass(frozen=True)
class Loss:
    """The training an attempt lost after the checkpoint the next worker resumes from; None where unknown."""
    seconds: float | None = kept(key="lost_seconds")
    batches: int | None = kept(key="lost_batches")


@dataclass(frozen=True)
class Kill:
    """What killing the tree took: its processes, how long, and any that survived SIGKILL."""
    processes: int
    seconds: float
    survivors: tuple[str, ...] = ()
    confirmed_wall: float | None = None


@dataclass(frozen=True)
class Stacks:
    """Where a hung tree waited (supervisor/host/stacks.py), as the incident keeps it."""
    where: str = kept()  # the grouping key of ``yolo-train incidents``
    summary: tuple[str, ...] = kept(default=())  # one line per process
    culprit: str | None = kept(default=None)  # the line of the process the hang is best described by
    seconds: float = kept(default=0.0, key="stacks_seconds")  # the capture's duration
    path: str | None = kept(default=None, key="stacks")  # stacks.json, relative to the state directory; None: unwritten
    # the culprit is a DataLoader worker inside a sample: the loader's rungs change it
    in_loader_worker: bool = kept(default=False)
    # a known hang a native frame names, with its cause and remedy (stack_reading.NATIVE_SIGNATURES)
    native_signature: str | None = kept(default=None, omitted=True)
    # read ahead of the verdict (stacks_ahead.py): seconds from the reading's start to the verdict; None: read after it
    ahead: float | None = kept(default=None, omitted=True, key="stacks_ahead_seconds")


@dataclass(frozen=True)
class Devcoredump:
    """A GPU's devcoredump (drivers/base/devcoredump.c), copied before the kernel deletes it (host/devcoredump.py)."""
    path: str = kept()  # the copy, relative to the state directory
    source: str = kept()  # its name under /sys/class/devcoredump (devcdN)
    device: str | None = kept(default=None)  # the device that dumped, as sysfs names it (a PCI address for amdgpu)
    bytes: int = kept(default=0)  # copied
    truncated: bool = kept(default=False)  # the dump went on past the copy's bound


@dataclass(frozen=True)
class RankStart:
    """Where one DDP rank's share of a restart went (heartbeats.rank_starts), in seconds: ``start`` from the next
    worker's spawn or take-over to the rank's first word (the launching worker, torch.distributed.run, the rank's fork
    from the rank server or its own interpreter), then each startup step the rank entered, in order (``checkpoint``:
    the trainer built, its checkpoint read; ``process_group``; ``model``; ... ``first_step``); the step it was in at
    the run's first batch counted to it."""
    rank: int
    parts: dict[str, float]


@dataclass(frozen=True)
class Incident:
    """Written as ``to_dict`` says: every field by its name (``loss`` and ``stacks`` spread into the record), what
    is not known left out (``omitted``), the kill's findings only once the tree is gone."""
    id: str = kept()
    time: float = kept()  # wall clock of the verdict
    reason: Reason = kept()
    phase: str = kept()
    detail: str = kept()
    attempt: int = kept()
    rung: int = kept()
    rung_label: str = kept()
    worker_pid: int | None = kept()
    epoch: int = kept()
    batch: int = kept()
    seconds_since_progress: float | None = kept()
    last_progress_wall: float | None = kept()
    kernel_events: tuple[dict[str, Any], ...] = kept(default=(), omitted=True)
    loss: Loss | None = kept(default=None, flat=True)  # None: the attempt never trained
    resumes_from: dict[str, Any] | None = kept(default=None, omitted=True)  # the checkpoint the core knew of
    stopped_first_rank: int | None = kept(default=None, omitted=True)  # under DDP: the rank whose progress is oldest
    # under DDP, from the ranks' witnesses (witness.py): the rank the others waited for, and where each rank waited
    # ({rank, pid, waiting, waiting_kind}, as status --json's watchdog.ranks)
    hung_rank: int | None = kept(default=None, omitted=True)
    ranks: tuple[dict[str, Any], ...] = kept(default=(), omitted=True)
    # torch's NCCL Flight Recorder dumps written since the last progress (copied into the incident's directory when
    # small; host/flight_recorder.py says when torch writes them)
    flight_recorder: tuple[str, ...] = kept(default=(), omitted=True)
    # the attempt's GPU resets, each by what reset the GPU ("job timeout", "MES" ...: catalogue.reset_source), and the
    # GPU's devcoredumps, copied into the incident's directory
    gpu_resets: tuple[str, ...] = kept(default=(), omitted=True)
    devcoredumps: tuple[Devcoredump, ...] = kept(default=(), omitted=True)
    # -- several hosts ([distributed]) --
    node_rank: int | None = kept(default=None, omitted=True)  # this host's
    host: str | None = kept(default=None, omitted=True)  # this host's name (from the shell)
    caused_by: dict[str, Any] | None = kept(default=None, omitted=True)  # another host's decision that failed ours
    # -- before the first batch: the startup step the worker was in, its bound then, and the stretch seen of it --
    startup_step: str | None = kept(default=None, omitted=True)
    startup_step_bound: float | None = kept(default=None, omitted=True)  # seconds; None: no bound
    startup_step_seen: float | None = kept(default=None, omitted=True)  # the longest stretch seen; None: not yet
    # a kernel search's last word in that step, where one spoke (kernel_search.py): "MIOpen search, 243 runs left
    # (12 lines), silent for 600.0 s"
    kernel_search: str | None = kept(default=None, omitted=True)
    # under a ROCm build, the MIOpen mode the attempt's settings gave (miopen_modes.py): "normal find (...); no kernel
    # search"; None: no MIOpen, or a [worker] command, whose torch flags are its own
    miopen: str | None = kept(default=None, omitted=True)
    # verdicts in a row at this point for this wait, each short of the phase's own bound, give the point that bound
    # in the next attempts (watchdog.owed_here): "this point gets the phase's bound after 2 verdicts here (lock at ...)"
    point_bound: str | None = kept(default=None, omitted=True)
    # -- from the shell, before the kill --
    processes: tuple[dict[str, Any], ...] | None = kept(default=None, omitted=True)
    output_tail: tuple[str, ...] | None = kept(default=None, omitted=True)
    stacks: Stacks | None = kept(default=None, flat=True)
    # -- once the tree is gone --
    last_error: str | None = kept(default=None, with_field="kill")
    settings: dict[str, Any] | None = kept(default=None, with_field="kill")  # what the worker reported in force
    kill: Kill | None = kept(default=None, omitted=True)
    restart_seconds: float | None = kept(default=None, omitted=True)  # from the verdict to the next first batch
    restart_start: WorkerStart | None = kept(default=None, omitted=True)  # how the next worker came
    # a cold start where a standby waited: why it was refused (its held datasets no longer the files on disk)
    restart_start_why: str | None = kept(default=None, omitted=True)
    restart_parts: dict[str, float] | None = kept(default=None, omitted=True)  # heartbeats.restart_parts
    rank_parts: tuple[RankStart, ...] = kept(default=(), omitted=True)  # under DDP: restart_parts of each rank
    after: dict[str, Any] | None = kept(default=None, omitted=True)  # the batches after its recovery: model/pace.py
    # -- the recovery tiers (recovery/tier.py, recovery/__init__.py); None, (): no recovery (a stop, a probe) --
    tier: Tier | None = kept(default=None, omitted=True)  # the last tier it went to: the one that recovered it
    tiers: tuple[Tier, ...] = kept(default=(), omitted=True)  # every tier it went through, in order
    # the cost of the tier that recovered it, as that tier spells it (in_place.InPlaceCost); "in_place" before 60
    cost: dict[str, Any] | None = kept(default=None, omitted=True, key="tier_cost", was="in_place")
    escalation: str | None = kept(default=None, omitted=True)  # why a cheaper tier was not taken, or failed
    # -- the witness (witness.py): where the training process said it waited, and whether its stacks agree --
    witness: str | None = kept(default=None, omitted=True)
    witness_agreed: bool | None = kept(default=None, omitted=True)  # None: no stacks, or no word to hold them to
    recorded: bool = False  # written to incidents.jsonl (kept in the state file only, beside to_dict's keys)

    def to_dict(self) -> dict[str, Any]:
        """The incident as incidents.jsonl, status --json and the metrics read it; what is not known is left out."""
        items = list(persistence.dump(self).items())
        at = [key for key, _ in items].index("time") + 1  # time_iso beside it, for people (never read back)
        return dict(items[:at] + [("time_iso", time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(self.time)))]
                    + items[at:])

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Incident:
        """From the state file (``to_dict`` and ``recorded``); a record of an older version was written already."""
        return replace(persistence.construct(cls, d), recorded=bool(d.get("recorded", True)))


def where_of(incident: dict[str, Any]) -> str:
    return incident.get("where") or f"{incident.get('reason', '?')} in {incident.get('phase', '?')} (no stacks)"


def one_line(incident: dict[str, Any]) -> str:
    """For the journal and the dashboard's annotations: what happened, at which rung, and where it hung."""
    head = f"{incident.get('reason', '?')} in {incident.get('phase', '?')} at rung {incident.get('rung', '?')}"
    culprit = incident.get("culprit")
    return f"{head}: {culprit or where_of(incident)}"
