"""What the decision core is told: the events the shell turns the world into, each with the time (``Now``).

The shell (``agent.py``) reads a heartbeat, the worker's exit, the kernel log, a signal, the clock; each becomes one
of these frozen records, and ``core.decide`` is the only reader. What the core answers with is in ``actions.py``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from supervisor.decision.model.incident import Devcoredump, Stacks
from supervisor.decision.model.survivors import Survivor
from supervisor.vocabulary import KernelKind, Remedy, WorkerStart
from worker.wire.contract import HeartbeatMessage


@dataclass(frozen=True)
class Now:
    mono: float  # for timeouts: never jumps
    wall: float  # for records that outlive the process: the restart budget, incident times


@dataclass(frozen=True)
class Boot:
    """The supervisor started (state possibly restored from its state file)."""


@dataclass(frozen=True)
class Spawned:
    pid: int
    resumed_from: str | None  # the checkpoint the worker resumes from, None when training from scratch
    start: WorkerStart = WorkerStart.COLD  # a new process, or the kind of standby that took the attempt
    start_why: str | None = None  # a cold start where a standby waited: why it was not taken (standby_worker.py)


@dataclass(frozen=True)
class HeartbeatReceived:
    message: HeartbeatMessage
    # The sender is a descendant of the worker's main process (the shell looked): the script a wrapper started.
    from_worker_tree: bool = False


@dataclass(frozen=True)
class WorkerExited:
    returncode: int  # negative: killed by that signal
    last_words: str | None = None  # the last line of its output
    weights: WeightsKept | None = None  # our worker's exit 0: what its run directory kept (None: not looked at)


@dataclass(frozen=True)
class WeightsKept:
    """The weights a training that exited 0 left (state/checkpoints.py): none kept is no success."""
    directory: str  # train/weights
    files: tuple[str, ...]  # last.pt and best.pt, those of them that verify
    disk_mib: float  # the size of the directory's filesystem, and what is free on it now
    free_mib: float


@dataclass(frozen=True)
class VerifiedCopyKept:
    """The outcome of ``KeepVerifiedCopy``: ``problem`` None when last.good.pt is now a verified copy of last.pt."""
    problem: str | None


@dataclass(frozen=True)
class TreeKilled:
    killed: int
    survivors: tuple[Survivor, ...] = ()  # each process SIGKILL did not end within kill_timeout, and its wait
    seconds: float = 0.0  # from the first signal to the tree confirmed gone
    confirmed_wall: float | None = None


@dataclass(frozen=True)
class SurvivorsGone:
    """The survivors of SIGKILL the core waits for (``AwaitSurvivors``) are all gone: their file system answered."""


@dataclass(frozen=True)
class IncidentEnriched:
    """What the shell saw of the worker's tree just before killing it, for the incident being stopped."""
    incident_id: str
    processes: tuple[dict[str, Any], ...]
    output_tail: tuple[str, ...] = ()
    output_note: str | None = None  # a command's output parser: why no line was ever progress
    stacks: Stacks | None = None  # captured for a hang
    host: str | None = None  # this host's name, where hosts are several
    flight_recorder: tuple[str, ...] = ()  # torch's NCCL Flight Recorder dumps of this attempt (host/flight_recorder.py)
    devcoredumps: tuple[Devcoredump, ...] = ()  # the incident's devcoredumps, moved into its directory


@dataclass(frozen=True)
class StacksReadAhead:
    """The stacks the core asked for ahead of a stall's verdict (``ReadStacksAhead``), read from ``at``
    (monotonic, the reading's start) for the stall whose clock started at ``since``."""
    since: float
    at: float
    stacks: Stacks


@dataclass(frozen=True)
class KernelMessage:
    """A classified kernel log line or GPU device event (see supervisor/kernel/catalogue.KernelEvent)."""
    kind: KernelKind
    message: str
    source: str
    pattern: str
    pid: int | None = None
    in_worker_tree: bool | None = None  # None when the message names no pid
    trusted: bool = True  # the kernel's own record from this run; False: forgeable or stale, never ends the run
    drill: bool = False  # a fault drill (YOLO_TRAIN_KERNEL_DRILL=1): taken as the kernel's word about our GPU
    reset_source: str | None = None  # a GPU reset's line: what reset the GPU (catalogue.reset_source)
    devcoredump: bool = False  # a line after which the GPU's devcoredump may be in sysfs, for 5 minutes


@dataclass(frozen=True)
class DevcoredumpsKept:
    """The GPU's devcoredumps the core asked for (``KeepDevcoredumps``), copied for attempt ``attempt``."""
    attempt: int
    dumps: tuple[Devcoredump, ...]


@dataclass(frozen=True)
class SignatureSeen:
    """A line of the worker's output matched a failure signature (see signatures.py)."""
    name: str
    remedy: Remedy
    advice: str
    line: str


@dataclass(frozen=True)
class SearchNews:
    """A line of MIOpen's kernel search in the worker's output (attempt/search_lines.py): the startup step it is in
    works, though no step of its own moved. ``runs_left``: the search's own count of candidates still to time; None
    where the line begins a search without saying its size."""
    library: str  # "MIOpen"
    runs_left: int | None
    line: str


@dataclass(frozen=True)
class StopRequested:
    signal: str = "SIGTERM"


@dataclass(frozen=True)
class JobLadderRead:
    """Several hosts: the job-wide ladder decision as the shared run directory holds it (state/job_ladder.py),
    read before every event but heartbeats whenever the file changed."""
    seq: int  # decisions made so far, job-wide: a newer one wins
    rung: int
    remedies: dict[str, Any]
    node_rank: int  # the host that made it
    host: str = ""
    cause: dict[str, Any] = field(default_factory=dict)  # its incident: id, reason, phase, the rank that stopped first


@dataclass(frozen=True)
class JobCheckpointRead:
    """Several hosts: the job's newest complete checkpoint as the host that saved it published it on the shared run
    directory (state/job_ladder.py), read before every event but heartbeats whenever the file changed."""
    path: str
    epoch: int
    batch: int
    seconds: float  # how long the training loop waited for the save
    wall: float  # when it was published (the saving host's clock)
    node_rank: int  # the host that published it


@dataclass(frozen=True)
class Tick:
    """Time passed; deadlines are checked."""


@dataclass(frozen=True)
class SupervisorPaused:
    """The supervisor itself did not run for ``seconds`` (SIGSTOP, a frozen VM): not the worker's time to answer for."""
    seconds: float


@dataclass(frozen=True)
class TreeActivity:
    """Whether the worker's whole process tree does anything (attempt/tree_activity.py), sent when that changes:
    ``idle_since`` is the monotonic time since which it has used no CPU to speak of, done no disk I/O, had no process
    in uninterruptible sleep and started none; None: it is busy (or it cannot be told). ``outside``: the processes
    of the tree whose main thread waits on a socket or a remote or FUSE file (host/outside_waits.py), idle or not.
    ``stopped``: the processes /proc shows stopped (state T or t: SIGSTOP, a debugger): a DDP rank among them is named
    so in the incident, and every rank stopped is the whole tree frozen (witness.py). Threads, not processes, are read:
    in the training process only its training thread and the threads on its chain of waits count (``watched``), in
    every process a device runtime's spinning thread never does. ``thread_idle_since``: the training thread's own
    idleness (a stretch its witness cannot speak through is judged by it); ``beside``: the threads that do not count
    and spun on a CPU meanwhile ("'AsyncEventsLoop' (tid 4321)"), said beside the hang."""
    idle_since: float | None
    outside: frozenset[int] = frozenset()
    stopped: frozenset[int] = frozenset()
    thread_idle_since: float | None = None
    beside: tuple[str, ...] = ()


@dataclass(frozen=True)
class StateDirTaken:
    """Another supervisor locked the state directory (this one's lock file was removed meanwhile): it trains there
    now, so this one's worker stops at once, without a save that would overwrite the other's last.pt."""
    detail: str  # one line: the config file, state_dir, and who holds it
