"""What the decision core asks the shell to do: spawn, signal, kill, record, log, exit.

``core.decide`` returns these; the shell (``agent.py``) carries each out and tells the outcome back as an event
(``events.py``): a spawn as ``Spawned``, a kill as ``IncidentEnriched`` then ``TreeKilled``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from supervisor.decision.model.incident import Incident


@dataclass(frozen=True)
class Spawn:
    attempt: int
    rung: int
    rung_settings: dict[str, Any]  # the rung's changes and the remedies in force, as the ladder spells them
    checkpoint_every: float | None = None  # seconds of training between the worker's checkpoints; None: per epoch
    amp_passed: bool = False  # an earlier attempt of this run trained with AMP on: its check need not run again
    rung_keys: tuple[str, ...] = ()  # every key some rung or remedy sets: each is this attempt's, never a checkpoint's


@dataclass(frozen=True)
class PrepareStandby:
    """Start a standby worker: one that does its imports now and waits to be given the next attempt, so a restart
    does not pay for them, with the settings of the rung a hang would move to: a standby serves only a launch in the
    environment it began in. When, and again when that rung changes: standby.py."""
    rung_settings: dict[str, Any]
    # The settings whose train arguments and loader a ready standby holds (worker/standby/ready.py): the rung it is likelier
    # to run, which may be the current one where both share an environment (standby.py); None: ``rung_settings``.
    held_settings: dict[str, Any] | None = None

    @property
    def held(self) -> dict[str, Any]:
        return self.rung_settings if self.held_settings is None else self.held_settings


@dataclass(frozen=True)
class PrimeStandby:
    """A restart from the newest checkpoint follows this kill: a ready standby holding the training loader feeds its
    workers from that checkpoint's resumed position now, so the first batches load while the tree is killed
    (worker/standby/ready.py ``prime``). Said before the ``KillTree``; nothing where no such standby waits."""


@dataclass(frozen=True)
class PublishLadder:
    """Several hosts: this host decided where the job goes on the ladder; said before its tree is killed, so the
    other hosts, whose ranks fail with it, restart on the same rung."""
    seq: int
    rung: int
    remedies: dict[str, Any]
    cause: dict[str, Any] = field(default_factory=dict)  # the incident behind it, for the other hosts' incidents


@dataclass(frozen=True)
class PublishCheckpoint:
    """Several hosts: this host's ranks include global rank 0, the one that saves: the job's newest complete
    checkpoint, for the other hosts, whose ranks never report one (their restart budget and lost work need it)."""
    path: str
    epoch: int
    batch: int
    seconds: float


@dataclass(frozen=True)
class RequestCheckpoint:
    """Ask the worker to save a checkpoint at its next batch boundary and exit (a command on its pipe)."""


@dataclass(frozen=True)
class KeepVerifiedCopy:
    """The worker reported a complete checkpoint: verify it and keep it as the fallback (state/checkpoints.py)."""
    path: str


@dataclass(frozen=True)
class KillTree:
    """Kill the worker's tree. For an incident, the shell first says what it sees of the tree
    (``IncidentEnriched``); the core learns the kill's outcome from ``TreeKilled``."""
    incident: Incident | None  # None: cleaning up after a normal exit


@dataclass(frozen=True)
class ReadStacksAhead:
    """Read the stacks of the worker's tree now, left running, ahead of the verdict of the stall it is in
    (stacks_ahead.py): as a hang's kill would ([incidents] stacks_budget, stacks.json), into this attempt's own
    directory, the incident not being opened yet; told back as ``StacksReadAhead``. ``loader_pids``: the loader
    worker processes the worker reported; ``rank_pids``: each DDP rank's pid, pid -> rank; ``hung_rank``: the rank
    the witnesses name hung (host/stacks.py names the processes by them)."""
    attempt: int
    since: float  # monotonic: the stall's clock, told back so the stacks are kept only for that stall
    loader_pids: tuple[int, ...] = ()
    rank_pids: dict[int, int] = field(default_factory=dict)
    hung_rank: int | None = None


@dataclass(frozen=True)
class DropStacksAhead:
    """The stall some stacks were read ahead for is over (progress, news, a startup step) or ended without a hang's
    verdict: remove their file (``path``, relative to the state directory; None: none was written)."""
    path: str | None


@dataclass(frozen=True)
class AwaitSurvivors:
    """Watch these survivors of SIGKILL (not held by a driver) and say ``SurvivorsGone`` once none is left; the
    core bounds the wait (``[watchdog] survivor_timeout``)."""
    pids: tuple[int, ...]


@dataclass(frozen=True)
class KeepDevcoredumps:
    """A reset or coredump line: copy the GPU's devcoredumps (/sys/class/devcoredump/devcd*/data, deleted by the kernel 5
    minutes after they appear) not kept yet (``kept``, their devcdN names), bounded in size, into the directory of
    ``incident`` (the attempt's incident under way), else the attempt's own until its incident opens; told back as
    ``DevcoredumpsKept``."""
    attempt: int
    incident: str | None
    kept: tuple[str, ...] = ()


@dataclass(frozen=True)
class RecordIncident:
    """The incident is complete: append it to incidents.jsonl."""
    incident: Incident


@dataclass(frozen=True)
class IncidentResumed:
    """Training resumed after the incident (its hang is recovered: notices.py says so now); it is written once its
    batches after are counted (model/pace.py). Nothing for the shell to do."""
    incident: Incident


@dataclass(frozen=True)
class Log:
    level: str  # "info" | "warning" | "error"
    text: str


@dataclass(frozen=True)
class Exit:
    code: int
    text: str
