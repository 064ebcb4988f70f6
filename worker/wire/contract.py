"""The supervisor-to-worker contract: what the supervisor asks a worker to run, and what a worker says back.

This module is free of torch and of the supervisor, as all of ``worker/wire/`` is: the wire is what the two sides
share, and the supervisor imports nothing else of the worker (worker/__init__.py states the wing's law,
``tests/worker/test_worker_imports.py`` holds it).

Launch record (version 1): a JSON file whose path is the worker's one argument (``python -m worker FILE``). It
says what to train (``train``: the ``[train]`` table plus where to write), how safely (the current rung, split by
``split_rung`` into Ultralytics arguments, our own worker options and environment variables), from where
(``resume``), how often to checkpoint inside an epoch, and which faults to inject. A worker refuses a record of
another version instead of guessing.

Standby (``python -m worker --standby``): a worker started ahead of its attempt. It does its imports, then reads
one line on stdin, the launch record's path, and goes on as ``python -m worker FILE`` would; at the end of stdin
without a line it exits 0, having started nothing.

Heartbeat message: one line of JSON on the heartbeat pipe (wire format in ``worker/wire/heartbeat_protocol.py``); the supervisor
reads it as a ``HeartbeatMessage`` and never as a dict, and a report of what is in force as an ``InForce``.

Command (version 1): one line of JSON on the command pipe, from the supervisor to the worker (a ``Command``): the
worker's read end is the descriptor in ``YOLO_TRAIN_COMMAND_FD`` (under DDP each rank reads its own pipe, which the
launching worker fills with what concerns that rank: ``worker/wire/commands.py``). The worker reads it without blocking,
at batch boundaries and when its loader fails; the supervisor writes without blocking. A ``CHECKPOINT_AND_STOP``
asks for a checkpoint at the next batch boundary, then the exit; a ``REPLACE_LOADER_WORKERS`` says that the
supervisor is killing these hung DataLoader worker processes: the loader that sees them die starts a new iterator
at the batch it waited for, instead of failing the training (``worker/loading/loader_recovery.py``).

Exit status ``EXIT_CONFIG`` (78): a worker that refuses its launch for good (a checkpoint of another training) exits
with it, and ``yolo-train run`` exits with it on a configuration error: the one number both sides mean the same by.
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass, field
from enum import Enum
from typing import Any

LAUNCH_VERSION = 1
STANDBY_FLAG = "--standby"
# A standby's stdin before its launch record's path: "prime CHECKPOINT" (or "prime" alone: from scratch), the
# supervisor's word at a verdict that a restart from that checkpoint is coming (worker/standby/ready.py ``prime``).
PRIME_WORD = "prime"
# "1" in a standby's environment: the rung it is made for forks its loader workers from a forkserver, which it starts
# and preloads while it waits (the supervisor sets it for a cold worker of that rung too, so either serves it)
ENV_FORKSERVER = "YOLO_TRAIN_FORKSERVER"
# In a standby's environment, the state directory: its training runs DDP ranks, so it forks their server
# (worker/standby/rank_server.py) once its imports are done, listening in that directory (0700), and the next launch's
# torch.distributed.run and ranks are forks of it, not cold interpreters
ENV_RANK_STANDBY = "YOLO_TRAIN_RANK_STANDBY"
# A standby's environment: the train arguments (JSON) of what it builds ahead while it waits, the device context and
# the model (worker/standby/ready.py); set only where the supervisor found the device has room for them
ENV_READY = "YOLO_TRAIN_STANDBY_READY"
ENV_CPU_RANKS = "YOLO_TRAIN_CPU_RANKS"  # the CPU drill: this many gloo ranks with device = "cpu" (worker/distributed/ddp.py)
ULTRALYTICS_DEFAULT_WORKERS = 8
EXIT_CONFIG = 78  # EX_CONFIG from sysexits.h: the configuration is wrong; restarting cannot help


class Phase(str, Enum):
    """Where a worker is in its life: the phases of the heartbeat protocol."""
    SETUP = "setup"  # imports, dataset scan, model build: before the first training batch
    TRAIN = "train"
    VAL = "val"
    SAVE = "save"  # from the end of an epoch's training to the next epoch's first batch
    # Trained through, the last epoch saved: the final validation (best.pt read, its set-up, its batches) and the
    # wait for the other ranks and hosts to end theirs. Nothing is left to lose, and its silences are no epoch's.
    ENDING = "ending"
    DONE = "done"


class MessageKind(str, Enum):
    BEAT = "beat"  # a step done (or, without a progress increase, a liveness ping)
    PHASE = "phase"  # entered a phase
    IN_FORCE = "settings"  # what is really in force (an ``InForce``), once per attempt
    ERROR = "error"  # dying of an exception: its last words
    CHECKPOINT = "checkpoint"  # a checkpoint was written completely (atomically) at a position
    LOADER = "loader"  # a training or validation loader started its worker processes (``pids``, ``seconds``)
    STEP = "step"  # before the first batch: entered a startup step (``step``), or progressed in it (``done``)
    WAIT = "wait"  # the witness: where the main thread waits while it makes no progress (a ``WaitReport``)


class StartupStep(str, Enum):
    """The steps of a worker's startup, each bounded on its own by the supervisor (supervisor/decision/stall/watchdog.py).
    Our worker enters them in about this order (the dataset and loaders steps twice: training, then validation); a
    worker that reports none is in ``imports`` from its spawn to its first batch."""
    IMPORTS = "imports"  # from the spawn: the interpreter, torch and Ultralytics imported (nothing, for a standby)
    CHECKPOINT = "checkpoint"  # the checkpoint read and the trainer built from it (a fresh start: the trainer alone)
    # a DDP rank's process group formed (its rendezvous with the other ranks). Said by ranks alone, whose steps are
    # kept per rank for the restart's parts, not bounded one by one: the launching worker's step bounds their start
    PROCESS_GROUP = "process_group"
    MODEL = "model"  # the model built (on resume, its weights loaded) and moved to the device
    AMP_CHECK = "amp_check"  # the AMP check (after torch.compile, where asked for)
    DATASET = "dataset"  # a dataset built: its labels scanned, its images cached, with progress (``done``, ``total``)
    LOADERS = "loaders"  # its DataLoader, then the validator, EMA, optimizer and resumed state
    FIRST_BATCH = "first_batch"  # the loader's workers started and the first batch loaded
    # The first batch on the device: forward, backward, the optimizer's step (cuDNN's or MIOpen's kernel search is
    # here: the seeds' "first batch never runs"). Apart from the loader's start, so neither bounds the other.
    FIRST_STEP = "first_step"


COMMAND_VERSION = 1
ENV_COMMAND_FD = "YOLO_TRAIN_COMMAND_FD"  # the worker's read end of the command pipe


class CommandKind(str, Enum):
    CHECKPOINT_AND_STOP = "checkpoint_and_stop"  # save at the next batch boundary, then exit (was SIGUSR1)
    REPLACE_LOADER_WORKERS = "replace_loader_workers"  # these loader workers are being killed: start a new iterator


@dataclass(frozen=True)
class Command:
    """What the supervisor asks of a running worker. ``rank``: the DDP rank it concerns; None: the worker (outside
    DDP), or rank 0 for a checkpoint (it alone saves). ``pids``: the loader worker processes being replaced."""

    kind: CommandKind
    rank: int | None = None
    pids: tuple[int, ...] = ()
    seq: int = 0  # numbered by the supervisor, per worker

    def to_line(self) -> bytes:
        return (json.dumps({"v": COMMAND_VERSION, "kind": self.kind.value, "rank": self.rank,
                            "pids": list(self.pids), "seq": self.seq}, separators=(",", ":")) + "\n").encode()

    @classmethod
    def from_line(cls, line: bytes) -> "Command | None":
        """A command from one line, or None when it is not one of this version."""
        try:
            raw = json.loads(line)
            if not isinstance(raw, dict) or raw.get("v") != COMMAND_VERSION:
                return None
            pids = tuple(p for p in raw.get("pids") or () if _int(p) is not None)
            return cls(CommandKind(raw.get("kind")), _int(raw.get("rank")), pids, _int(raw.get("seq")) or 0)
        except (ValueError, TypeError):
            return None


# Per-rung settings that are ours, not Ultralytics train() arguments, with their types: one table that the
# config's validation and ``split_rung`` both read.
LOADERS = ("process", "threads")
CONV_FALLBACK_MODES = ("auto", "on", "off")  # a rung's conv_fallback and [patches] conv_fallback
BATCHNORM_FALLBACK_MODES = ("auto", "on", "off")  # [patches] batchnorm_fallback
START_METHODS = ("fork", "spawn", "forkserver")  # multiprocessing's own names, as torch's DataLoader takes them
OPTION_TYPES: dict[str, type] = {"persistent_workers": bool, "conv_fallback": str, "loader": str, "threads": int,
                                 "start_method": str, "env": dict, "args": dict}


class LaunchRecordError(ValueError):
    pass


@dataclass(frozen=True)
class WorkerOptions:
    """How the worker runs Ultralytics, beyond its arguments; each one is a ladder rung's to change.

    persistent_workers: False makes DataLoader worker processes anew each epoch (Ultralytics keeps them forever).
    conv_fallback: "auto", "on" or "off" for this rung; None keeps the ``[patches]`` setting.
    loader: "process" (Ultralytics' DataLoader, ``workers`` processes) or "threads" (a pool of ``threads`` threads
        inside the training process: no fork, no shared memory).
    threads: the size of that pool; None: the CPU count.
    start_method: how the process loader starts its worker processes ("fork", "spawn", "forkserver"); None: torch's
        default (fork on Linux). "spawn" starts each from a fresh interpreter: nothing of the training process's
        GPU runtime or memory map is inherited. "forkserver" forks each from a server process started early (before
        the trainer touches a GPU; in a standby, while it waits) with torch, cv2 and Ultralytics' data modules
        imported: inherits no more than "spawn", starts as fast as "fork" (worker/loading/loaders.py).
    """

    persistent_workers: bool = True
    conv_fallback: str | None = None
    loader: str = "process"
    threads: int | None = None
    start_method: str | None = None

    def forks_from_server(self, workers: Any) -> bool:
        """Loader workers forked from a forkserver: ``workers`` (``loader_workers``) processes, started
        "forkserver"."""
        return self.loader == "process" and self.start_method == "forkserver" and workers != 0


@dataclass(frozen=True)
class RungSplit:
    trainer_args: dict[str, Any]  # Ultralytics train() arguments: they win over a checkpoint's on resume
    options: WorkerOptions
    env: dict[str, str]
    args: dict[str, str]  # a [worker] command's arguments to set: {"--workers": "0"}


def loader_workers(train: dict[str, Any], trainer_args: dict[str, Any] | None = None) -> Any:
    """The DataLoader worker processes a training asks for: the rung's ``workers`` (``trainer_args``), else the
    ``[train]`` table's, else Ultralytics' default. The one place this is computed, by the supervisor and the worker."""
    return (trainer_args or {}).get("workers", train.get("workers", ULTRALYTICS_DEFAULT_WORKERS))


def split_rung(settings: dict[str, Any]) -> RungSplit:
    """The one place a rung's settings are told apart: ours, the environment's, and Ultralytics' arguments."""
    ours = {k: v for k, v in settings.items() if k in OPTION_TYPES and k not in ("env", "args")}
    trainer_args = {k: v for k, v in settings.items() if k not in OPTION_TYPES}
    return RungSplit(trainer_args, WorkerOptions(**ours), dict(settings.get("env", {})), dict(settings.get("args", {})))


@dataclass(frozen=True)
class Patches:
    conv_fallback: str = "auto"  # the Conv2d path that bypasses MIOpen/cuDNN: auto, on, off
    batchnorm_fallback: str = "auto"  # batch norm by ATen's own kernels, not MIOpen/cuDNN: auto, on, off
    amp_check: str = "local"  # local (no download), off (trust amp), ultralytics
    amp_passed: bool = False  # the check passed in an earlier attempt of this run: not run again


@dataclass(frozen=True)
class Rendezvous:
    """Several hosts: where this host's launcher meets the others' (torch.distributed's c10d rendezvous)."""
    nnodes: int
    node_rank: int  # this host's number; 0 hosts the store
    endpoint: str  # "HOST:PORT"
    rdzv_id: str
    join_timeout: float  # seconds to wait for every host (and for the store)
    fingerprint: str = ""  # what must be the same on every host: the [train] table, the rung, the ladder


@dataclass(frozen=True)
class LaunchRecord:
    attempt: int
    rung: int
    train: dict[str, Any]  # the [train] table, with project/name/exist_ok set to where this run writes
    trainer_args: dict[str, Any]  # the rung's Ultralytics arguments (and remedies such as a halved batch)
    # Every Ultralytics argument some rung of the ladder (or a remedy) sets: on a resume each is forced to this
    # attempt's value (its rung's, else the [train] table's, else Ultralytics' default), never the checkpoint's.
    rung_keys: tuple[str, ...] = ()
    options: WorkerOptions = field(default_factory=WorkerOptions)
    patches: Patches = field(default_factory=Patches)
    resume: str | None = None  # a checkpoint path, None to train from scratch
    checkpoint_every: float | None = None  # seconds of training between checkpoints inside an epoch; None: per epoch
    checkpoint_in_thread: bool = True  # the loop waits for a host copy only; False: for the whole write (benches)
    faults: tuple[dict[str, Any], ...] = ()
    fault_flag: str = ""  # a file the fault injector marks once a fault fired, so it fires once per attempt
    supervisor_pid: int | None = None  # the worker exits at once if its parent is not this (it died meanwhile)
    rendezvous: Rendezvous | None = None  # several hosts; None: this host's devices only
    version: int = LAUNCH_VERSION

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=1)

    @classmethod
    def from_json(cls, text: str, source: str = "launch record") -> "LaunchRecord":
        try:
            raw = json.loads(text)
        except ValueError as e:
            raise LaunchRecordError(f"{source}: not JSON ({e})") from None
        if not isinstance(raw, dict) or raw.get("version") != LAUNCH_VERSION:
            got = raw.get("version") if isinstance(raw, dict) else None
            raise LaunchRecordError(f"{source}: launch record version {got!r}, this worker reads version "
                                    f"{LAUNCH_VERSION}; run the worker of the same yolo-train as the supervisor")
        raw = dict(raw)
        raw["options"] = WorkerOptions(**raw.get("options", {}))
        raw["patches"] = Patches(**raw.get("patches", {}))
        raw["faults"] = tuple(raw.get("faults", ()))
        raw["rung_keys"] = tuple(raw.get("rung_keys", ()))
        if raw.get("rendezvous") is not None:
            raw["rendezvous"] = Rendezvous(**raw["rendezvous"])
        return cls(**raw)


def _int(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _float(value: Any) -> float | None:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def _bool(value: Any) -> bool | None:
    return value if isinstance(value, bool) else None


def _str(value: Any) -> str | None:
    return value if isinstance(value, str) else None


def _dict(value: Any) -> dict[str, Any] | None:
    return dict(value) if isinstance(value, dict) else None


def _strs(value: Any) -> tuple[str, ...] | None:
    return tuple(value) if isinstance(value, (list, tuple)) and all(isinstance(v, str) for v in value) else None


# What a launch can take from a ready standby (InForce.held): the spelling the incident's restart parts are named by.
HELD_MODEL, HELD_TRAIN_DATASET, HELD_VAL_DATASET, HELD_LOADER_WORKERS = (
    "model", "train dataset", "val dataset", "training loader workers")
HELD_RESUMED_BATCHES = "resumed batches"  # the held loader's workers fed at the verdict: loading before the launch
HELD_IMAGE_CACHE = "image cache"  # its datasets' images in RAM ([train] cache = "ram"); else the launch caches them
HELD_PINNED_MEMORY = "pinned memory"  # page-locked blocks for its loader's first batches (loading/pinned_ahead.py)


@dataclass(frozen=True)
class DataFiles:
    """What a dataset was built from, read again cheaply: an image directory (its files, counted through its
    subdirectories, and the newest mtime of those directories: adding, removing or renaming a file changes its
    directory's), or an image list (the files in the directories it names, and the newest mtime of the list and of
    those directories). Counts, not mtimes alone: a change within the file system's clock tick keeps an mtime."""
    path: str
    files: int
    newest_mtime_ns: int

    @classmethod
    def read(cls, path: str) -> "DataFiles":
        """As found now; a path gone reads as no files."""
        files, newest = 0, 0
        try:
            if os.path.isdir(path):
                for top, dirs, names in os.walk(path):
                    files += len(names)
                    newest = max(newest, os.stat(top).st_mtime_ns)
            else:
                parent = os.path.dirname(os.path.abspath(path))
                with open(path, encoding="utf-8-sig") as f:
                    listed = [line.strip() for line in f if line.strip()]
                dirs = [d for d in {os.path.dirname(os.path.join(parent, p)) for p in listed} if os.path.isdir(d)]
                files = sum(len(os.listdir(d)) for d in dirs)
                newest = max([os.stat(path).st_mtime_ns, *(os.stat(d).st_mtime_ns for d in dirs)])
        except OSError:
            return cls(path, 0, 0)
        return cls(path, files, newest)

    def changed(self) -> str | None:
        """How the files differ now from when this was read; None: the same."""
        now = DataFiles.read(self.path)
        if now == self:
            return None
        return f"{self.path}: {self.files} files then, {now.files} now" if now.files != self.files else \
            f"{self.path}: changed since (newest mtime)"


@dataclass(frozen=True)
class StandbyReport:
    """What a ready standby holds and why, as it writes it for the supervisor (the path in ``ENV_READY``'s
    ``report``): first the data its datasets are about to be built from, then, ready, all of it. ``status --json``
    shows it (``standby_holds``, ``standby_holds_why``, ``standby_host_mib``); the launch's check reads ``data``."""
    data: tuple[DataFiles, ...] = ()
    holds: tuple[str, ...] = ()  # HELD_* names; () while it builds
    why: str = ""  # its line: what it holds, and what it left out because it did not fit
    host_mib: int | None = None  # host memory beyond its imports (RSS growth, its loader workers' USS)
    host_allowance_mib: int | None = None  # what it was granted ([worker] standby_host_share of MemAvailable)

    def to_json(self) -> str:
        return json.dumps(asdict(self))

    @classmethod
    def from_json(cls, text: str) -> "StandbyReport | None":
        try:
            m = json.loads(text)
            return cls(data=tuple(DataFiles(str(d["path"]), int(d["files"]), int(d["newest_mtime_ns"]))
                                  for d in m.get("data", ())),
                       holds=tuple(str(h) for h in m.get("holds", ())), why=str(m.get("why", "")),
                       host_mib=_int(m.get("host_mib")), host_allowance_mib=_int(m.get("host_allowance_mib")))
        except (ValueError, TypeError, KeyError, AttributeError):
            return None


@dataclass(frozen=True)
class InForce:
    """What a worker reports really in force, once per attempt: the proof of what its rung changed, shown by
    ``status`` and kept in every incident. A field not reported, or of another type, is None. The wire, ``status
    --json`` and incidents spell it "settings" (their readers script against that); in code, settings are a rung's
    (``split_rung``) and this is what is in force."""

    workers: int | None = None  # DataLoader worker processes: 0 on the threads loader
    persistent_workers: bool | None = None
    loader: str | None = None  # one of LOADERS
    threads: int | None = None  # the threads loader's pool; None on the process loader
    start_method: str | None = None  # one of START_METHODS
    val: bool | None = None
    amp: bool | None = None
    batch: int | None = None
    imgsz: Any = None  # as Ultralytics holds it: an int or [h, w]
    device: str | None = None
    resumed: bool | None = None
    start_epoch: int | None = None  # 1-based
    forced: dict[str, Any] | None = None  # the rung's Ultralytics arguments as the trainer holds them
    conv_fallback: bool | None = None  # whether the Conv2d fallback is on
    batchnorm_fallback: bool | None = None  # whether the batch-norm fallback is on
    versions: dict[str, Any] | None = None  # ultralytics, torch, hip, cuda, python
    # What this attempt took from a ready standby instead of building it (worker/standby/ready.py): HELD_PARTS; () none
    held: tuple[str, ...] | None = None

    def to_wire(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_wire(cls, m: dict[str, Any]) -> "InForce":
        return cls(workers=_int(m.get("workers")), persistent_workers=_bool(m.get("persistent_workers")),
                   loader=_str(m.get("loader")), threads=_int(m.get("threads")),
                   start_method=_str(m.get("start_method")), val=_bool(m.get("val")), amp=_bool(m.get("amp")),
                   batch=_int(m.get("batch")), imgsz=m.get("imgsz"), device=_str(m.get("device")),
                   resumed=_bool(m.get("resumed")), start_epoch=_int(m.get("start_epoch")),
                   forced=_dict(m.get("forced")), conv_fallback=_bool(m.get("conv_fallback")),
                   batchnorm_fallback=_bool(m.get("batchnorm_fallback")),
                   versions=_dict(m.get("versions")), held=_strs(m.get("held")))


# Where torch's DataLoader iterator waits for the batch one of its worker processes owes: read from the training
# process's own frames by its witness (worker/witness.py), and from py-spy's stacks by the supervisor
# (supervisor/decision/stall/loader_judgement.py).
BATCH_WAIT_FILE = "torch/utils/data/dataloader.py"
BATCH_WAIT_FUNCTIONS = ("_next_data", "_get_data", "_try_get_data")


class WaitKind(str, Enum):
    """Where the training process's main thread waits, as its witness reads it from the process's own frames and
    the objects on them (worker/witness.py). The supervisor judges a stall by it (supervisor/decision/stall/witness.py)."""
    LOADER = "loader"  # for a batch from one DataLoader worker process (``worker_pid``, ``worker``, ``batch_index``)
    COLLECTIVE = "collective"  # in a torch.distributed collective or its work's wait (``function``)
    DEVICE = "device"  # for the device: a synchronisation, a copy to the host, work queued on a stream not done
    LOCK = "lock"  # on a lock, a condition, an event or a queue of its own process
    IO = "io"  # on a socket, a pipe, a file, a subprocess: something outside its own processes
    SLEEP = "sleep"  # in time.sleep: a wait it chose
    ELSEWHERE = "elsewhere"  # none of these (a native call, a loop in Python): ``where`` says where; ``function``
    # names the native call the innermost frame is inside, none in a loop of Python


class Via(str, Enum):
    """How one thread of a chain of waits waits on the next (worker/wait_chain.py follows it)."""
    JOIN = "join"  # Thread.join: the thread ends it by ending
    FUTURE = "future"  # a concurrent.futures future: the executor's thread that runs it ends it
    HOLDER = "holder"  # an RLock whose owner is known
    STANDS_IN = "stands_in"  # a queue, an event, a condition, a bare lock: any thread may end it; a thread of the
    # process that progresses or waits outside stands for that other end


# The native threads of a device runtime that spin on a core for ever (ROCm 7.x's HIP ``AsyncEventsLoop``,
# ROCm/TheRock #7051) by their kernel name (/proc/PID/task/TID/comm, at most 15 characters): never a chain's, never
# work, never a hang's culprit.
RUNTIME_THREADS = ("AsyncEventsLoop",)
MAX_CHAIN = 4  # links a report carries: with each ``where`` cut to WHERE_CHARS it stays well under PIPE_BUF
WHERE_CHARS = 160


@dataclass(frozen=True)
class ChainLink:
    """One thread further along the training thread's chain of waits: how the one before waits on it, and what it
    does itself (its own wait, classified by the witness's rules)."""
    via: Via
    thread: str  # its name (threading's)
    tid: int | None  # its native id (threading.get_native_id): /proc/PID/task/TID
    kind: WaitKind  # its own wait; ELSEWHERE: it runs code
    where: str  # "file:line in function" of its innermost frame
    function: str | None = None  # its waiting call
    peer: str | None = None  # IO: the socket's other end ("127.0.0.1:18765"), where one is on its frames
    busy: bool = False  # it used a CPU since the witness's last look (/proc says so)

    def to_wire(self) -> dict[str, Any]:
        return {k: (v.value if isinstance(v, Enum) else v) for k, v in asdict(self).items() if v is not None}

    @classmethod
    def from_wire(cls, m: Any) -> "ChainLink | None":
        if not isinstance(m, dict):
            return None
        try:
            via, kind = Via(m.get("via")), WaitKind(m.get("kind"))
        except ValueError:
            return None
        thread, where = _str(m.get("thread")), _str(m.get("where"))
        if thread is None or where is None:
            return None
        return cls(via, thread[:80], _int(m.get("tid")), kind, where[:WHERE_CHARS], _str(m.get("function")),
                   _str(m.get("peer")), m.get("busy") is True)


# A COLLECTIVE's ``function`` where the rank waits inside autograd's backward under a process group: DDP's reducer
# all-reduces the gradients there, so the rank waits for its peers (on a GPU too, where its own stream holds the work)
DDP_BACKWARD = "DDP's backward all-reduce"


@dataclass(frozen=True)
class WaitReport:
    """What the witness says, about twice a second while the main thread makes no progress."""

    kind: WaitKind
    where: str  # "file:line in function" of the innermost frame of the main thread
    stalled: float  # seconds since the main thread last made progress, by the witness's clock
    function: str | None = None  # the waiting call: "all_reduce", "synchronize", "_try_get_data", "recv_into"...
    loader: str | None = None  # LOADER: "train" or "val", where the worker knows it
    worker: int | None = None  # LOADER: the DataLoader worker's index K
    worker_pid: int | None = None  # LOADER: its process
    batch_index: int | None = None  # LOADER: the index of the batch awaited (the iterator's ``_rcvd_idx``)
    tid: int | None = None  # the main thread's native id (threading.get_native_id): /proc/PID/task/TID
    # LOCK: the threads it waits on, followed to the end of the chain (worker/wait_chain.py); () where none is known
    chain: tuple[ChainLink, ...] = ()

    def to_wire(self) -> dict[str, Any]:
        wire = {k: (v.value if isinstance(v, Enum) else v) for k, v in asdict(self).items()
                if v is not None and k != "chain"}
        return {**wire, "chain": [link.to_wire() for link in self.chain]} if self.chain else wire

    @classmethod
    def from_wire(cls, m: Any) -> "WaitReport | None":
        if not isinstance(m, dict):
            return None
        try:
            kind = WaitKind(m.get("kind"))
        except ValueError:
            return None
        where, stalled = _str(m.get("where")), _float(m.get("stalled"))
        if where is None or stalled is None:
            return None
        return cls(kind=kind, where=where[:300], stalled=stalled, function=_str(m.get("function")),
                   loader=_str(m.get("loader")), worker=_int(m.get("worker")), worker_pid=_int(m.get("worker_pid")),
                   batch_index=_int(m.get("batch_index")), tid=_int(m.get("tid")), chain=_chain(m.get("chain")))


def _chain(value: Any) -> tuple[ChainLink, ...]:
    links = tuple(ChainLink.from_wire(v) for v in value[:MAX_CHAIN]) if isinstance(value, list) else ()
    return () if None in links else links


@dataclass(frozen=True)
class HeartbeatMessage:
    """One heartbeat as the supervisor reads it; every field but the first four is optional."""

    pid: int
    kind: MessageKind
    phase: Phase
    progress: int  # never decreases within one sender; only an increase is progress
    epoch: int | None = None  # 1-based
    epochs: int | None = None
    batch: int | None = None  # 1-based, inside the epoch
    batches: int | None = None
    samples: int | None = None  # images in the batch
    losses: dict[str, float] | None = None
    lr: float | None = None
    in_force: InForce | None = None  # kind IN_FORCE (its wire field is "settings")
    error: str | None = None  # kind ERROR: the exception
    path: str | None = None  # kind CHECKPOINT: the file written
    seconds: float | None = None  # kind CHECKPOINT: how long the loop was held up by the save; LOADER: its start
    dropped: int | None = None  # messages this sender dropped so far (pipe full)
    rank: int | None = None  # the sender's distributed rank, when it has one
    sent: float | None = None  # the sender's CLOCK_MONOTONIC (system-wide) when it sent this; None: unknown
    local_rank: int | None = None  # its rank among this host's ranks (differs from rank on several hosts)
    pids: tuple[int, ...] | None = None  # kind LOADER: the loader's worker processes
    loader: str | None = None  # kind LOADER: "train" or "val"
    step: StartupStep | None = None  # kind STEP: the startup step entered or progressing
    done: int | None = None  # kind STEP: items of the step's current pass done (labels scanned, images cached) ...
    total: int | None = None  # ... of how many
    wait: WaitReport | None = None  # kind WAIT: where the main thread waits

    @classmethod
    def from_wire(cls, m: dict[str, Any]) -> "HeartbeatMessage | None":
        """A message from a parsed wire dict, or None when its required fields are not what the protocol says."""
        try:
            kind, phase = MessageKind(m.get("kind")), Phase(m.get("phase"))
        except ValueError:
            return None
        pid, progress = _int(m.get("pid")), _int(m.get("progress"))
        if pid is None or progress is None or progress < 0:
            return None
        losses = m.get("losses")
        if isinstance(losses, dict):
            losses = {str(k): float(v) for k, v in losses.items() if _float(v) is not None}
        else:
            losses = None
        lr = _float(m.get("lr"))
        in_force = InForce.from_wire(m["settings"]) if isinstance(m.get("settings"), dict) else None
        error = str(m["error"])[:1000] if m.get("error") is not None else None
        seconds = _float(m.get("seconds"))
        pids = tuple(p for p in m["pids"] if _int(p) is not None) if isinstance(m.get("pids"), list) else None
        try:
            step = StartupStep(m["step"]) if m.get("step") is not None else None
        except ValueError:
            step = None
        if kind == MessageKind.STEP and step is None:
            return None
        wait = WaitReport.from_wire(m.get("wait")) if kind == MessageKind.WAIT else None
        if kind == MessageKind.WAIT and wait is None:
            return None
        return cls(pid=pid, kind=kind, phase=phase, progress=progress, epoch=_int(m.get("epoch")),
                   epochs=_int(m.get("epochs")), batch=_int(m.get("batch")), batches=_int(m.get("batches")),
                   samples=_int(m.get("samples")), losses=losses, lr=lr,
                   in_force=in_force, error=error, path=m.get("path") if isinstance(m.get("path"), str) else None,
                   seconds=seconds, dropped=_int(m.get("dropped")), rank=_int(m.get("rank")),
                   sent=_float(m.get("sent")), local_rank=_int(m.get("local_rank")), pids=pids,
                   loader=_str(m.get("loader")), step=step, done=_int(m.get("done")), total=_int(m.get("total")),
                   wait=wait)


def trains_ranks(train: dict[str, Any], env: dict[str, str], several_hosts: bool = False) -> bool:
    """Whether our worker trains in DDP ranks under torch.distributed.run: several devices (``device = "0,1"`` or a
    list), the CPU drill's ranks, or several hosts."""
    device = train.get("device")
    several = len(device) > 1 if isinstance(device, (list, tuple)) else "," in str(device or "").strip(", ")
    return several or several_hosts or env.get(ENV_CPU_RANKS, "").isdigit() and int(env[ENV_CPU_RANKS]) >= 2
