"""The configuration: one TOML file, validated up front into frozen dataclasses.

Every key is declared once, as ``key(kind, default, doc)`` on the field it fills (supervisor/config_keys.py): reading,
the one-line refusals (file, key, the form expected; exit 78 from the CLI) and docs/configuration.md derive from it.
What one key cannot say alone, the relations between keys, is checked in ``parse`` after the keys are read.
"""

from __future__ import annotations

import os
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

from supervisor import ultralytics_args
from supervisor.config_keys import (AUTO, LONGEST, Address, Argv, Choice, ConfigError, Flag, Folder, Key, Kind,
                                    Moment, Reader, Seconds, Strings, Text, Whole, build, declared_keys, key, parse_address,
                                    parse_deadline, read_keys, table)
from supervisor.patterns import CatalogueError, validate_patterns, validate_regex
from worker.wire.contract import BATCHNORM_FALLBACK_MODES, CONV_FALLBACK_MODES, LOADERS, OPTION_TYPES, START_METHODS
from worker.wire.fault_spec import Fault, FaultError

SOURCE_CHOICES = ("auto", "kmsg", "journal", "off")  # [kernel_log] source: auto reads kmsg, else the journal
DEMO_CONFIG = Path(__file__).with_name("demo.toml")
# units/yolo-train.service's WatchdogSec=30s: the longest the supervisor's loop may be away. Killing a tree holds
# the loop for up to kill_grace + kill_timeout (no heartbeat read, no stop request handled), so their sum must fit.
UNIT_WATCHDOG_SEC = 30.0
CHECKPOINT_FLOOR = 5.0  # [checkpoint] max never under this: the interval of a run that has not hung
# An "auto" bound is the factor times the slowest recent interval: beyond this one it waits hours for a batch of
# seconds, and no stall is ever found.
AUTO_FACTOR_MOST = 1000.0
# A loader's worker count is refused above this many per core of the machine. Ultralytics starts no more than the
# cores (build_dataloader: min(os.cpu_count() // devices, workers)), so a larger count trains as the cores; the factor
# leaves room for a file written on a smaller machine than the one that trains, while the default ladder, which
# halves the written count rung by rung, spends at most two rungs on counts Ultralytics caps anyway.
WORKERS_PER_CORE = 4
OFF = {"off": None}
AUTO_OR_OFF = {AUTO: AUTO, "off": None}


class TrainTable(Kind):
    """[train]: Ultralytics' train arguments, refused here where its check_cfg or trainer would refuse them."""

    expected = "a table of Ultralytics' train arguments"

    def read(self, value: Any, where: str, reader: Reader) -> dict[str, Any]:
        known = ultralytics_args.train_args()
        reader.table("train", value, set(known) - {"mode", "resume"} if known else set(value or ()))
        for name in ("project", "name", "save_dir"):
            if name in value:
                # Where a run writes is the supervisor's decision (STATE_DIR/train, on every resume too): an
                # Ultralytics placement would be overridden silently, so it is refused instead.
                reader.refuse(f"train.{name}: yolo-train decides where a run writes (STATE_DIR/train); remove it and "
                              f"set state_dir = \"...\" or the top-level name = \"...\" (the default state_dir is "
                              f"~/.local/state/yolo-train/NAME)")
        for name, setting in value.items():
            _train_value(f"train.{name}", name, setting, reader)
        return dict(value)


def _train_value(where: str, name: str, value: Any, reader: Reader) -> None:
    expected = ultralytics_args.expected_form(name, value)
    if expected:
        reader.fail(where, expected, value)


# A rung's own settings (worker/wire/contract.py's OPTION_TYPES); any other key of a rung is an Ultralytics train argument.
RUNG_SETTINGS = (
    Key("ladder.rungs", "persistent_workers", Flag(), None,
        "keep the DataLoader's worker processes between epochs (Ultralytics' own choice when not set)"),
    Key("ladder.rungs", "loader", Choice(LOADERS), "process",
        '"process": Ultralytics\' DataLoader; "threads": no worker processes, a pool of threads loads the batches'),
    Key("ladder.rungs", "threads", Whole(expected="a whole number >= 1 (threads of the loader)"), None,
        "the threads loader's pool", shown="the CPU count"),
    Key("ladder.rungs", "start_method", Choice(START_METHODS), "fork",
        'how the process loader starts its workers: "fork" (torch\'s default on Linux), "spawn", or "forkserver" '
        "(forked from a server started early with torch, cv2 and Ultralytics' data modules imported)"),
    Key("ladder.rungs", "conv_fallback", Choice(CONV_FALLBACK_MODES), None,
        "the rung's [patches] conv_fallback", shown="`[patches] conv_fallback`"),
    Key("ladder.rungs", "env", Strings('{ MIOPEN_FIND_MODE = "FAST" }'), {},
        "environment variables, adding to the rungs' below"),
    Key("ladder.rungs", "args", Strings('{ "--workers" = "0" }', environment=False), {},
        "a [worker] command's arguments this rung changes (the only setting, beside env, a command's rung has)"),
)
RUNG_KINDS = {k.name: k.kind for k in RUNG_SETTINGS}


class Rungs(Kind):
    expected = '"default" or a list of tables, e.g. rungs = [{ workers = 2 }, { val = false }]'

    def read(self, value: Any, where: str, reader: Reader) -> tuple[dict[str, Any], ...] | None:
        if value is None or value == "default":
            return None
        if not isinstance(value, list) or not value:
            reader.fail(where, self.expected, value)
        known = ultralytics_args.train_args()
        for i, rung in enumerate(value):
            if not isinstance(rung, dict):
                reader.fail(f"{where}[{i}]", "a table of settings, e.g. { workers = 0 }", rung)
            for name, setting in rung.items():
                if name in OPTION_TYPES:
                    RUNG_KINDS[name].read(setting, f"{where}[{i}].{name}", reader)
                elif known and name not in known:
                    reader.refuse(f"{where}[{i}]: unknown setting {name!r}; expected an Ultralytics train argument or "
                                  f"one of {', '.join(OPTION_TYPES)}")
                else:
                    _train_value(f"{where}[{i}].{name}", name, setting, reader)
        return tuple(dict(r) for r in value)


class Faults(Kind):
    expected = 'a table or list of tables, e.g. [[faults]] kind = "dataloader_hang"'

    def read(self, value: Any, where: str, reader: Reader) -> tuple[Fault, ...]:
        value = [value] if isinstance(value, dict) else value
        if not isinstance(value, list):
            reader.fail(where, self.expected, value)
        try:
            return tuple(Fault.from_dict(item) for item in value)
        except FaultError as e:
            reader.refuse(f"{where}: {e}")


class Patterns(Kind):
    expected = "a list of [name, regex, kind] entries or { name, regex, kind } tables"

    def read(self, value: Any, where: str, reader: Reader) -> tuple:
        try:
            validate_patterns(value, where=f"{reader.label}: [kernel_log] patterns")
        except CatalogueError as e:
            raise ConfigError(str(e)) from None
        return tuple(value or ())


class Regex(Kind):
    expected = "a regular expression with named groups epoch, epochs, batch, batches, loss"

    def read(self, value: Any, where: str, reader: Reader) -> str:
        problem = validate_regex(Text().read(value, where, reader))
        if problem:
            reader.refuse(f"{where}: {problem}")
        return value


@dataclass(frozen=True)
class WatchdogConfig:
    """How long each phase may go without progress before the worker counts as hung."""

    SECTION: ClassVar[str] = "watchdog"
    startup_timeout: float | None = key(Seconds(words=OFF), 600.0, (
        "each step of the startup (spawn to the first training batch: imports, checkpoint, model, AMP check, dataset "
        "scan, loaders, first batch), from its entry or its last progress, until this run has seen that step once; "
        "then max(auto_floor, auto_factor x its longest stretch seen), at most this (`status` shows `STEP auto`). "
        '"off": no startup bound at all'))
    stall_timeout: float | str | None = key(Seconds(words=AUTO_OR_OFF), AUTO, (
        'between two training beats; "auto": max(auto_floor, auto_factor x the slowest recent interval); a number '
        'overrides; "off": no limit'))
    val_timeout: float | str | None = key(Seconds(words=AUTO_OR_OFF), AUTO, (
        'between two validation beats (and from the end of training to the first val batch); "auto" as above, over '
        "validation intervals, falling back to the training ones until it has its own"))
    save_timeout: float | None = key(Seconds(words=OFF), 300.0, (
        "an epoch's end (validation set-up, the save, the next epoch's loader) until one epoch end has been "
        "observed, then max(auto_floor, auto_factor x its longest gap) (`save auto`); a mid-epoch checkpoint the same "
        "way by its own kind once one has been observed (`checkpoint auto`); also a silence in a training's ending "
        "(phase `ending`: best.pt's load, the final validation, a host's wait for the others' final validation), how "
        "long a stop waits for the worker's checkpoint, and how long a worker that said training is done may take to "
        "exit"))
    auto_factor: float = key(Seconds(most=AUTO_FACTOR_MOST, expected=f"a positive number, at most {AUTO_FACTOR_MOST:g}"),
                             10.0, 'the safety factor of every "auto" timeout')
    auto_floor: float = key(Seconds(), 10.0, 'the lower bound of every "auto" timeout, in seconds')
    idle_floor: float | None = key(Seconds(words=OFF), 3.0, (
        'the lower bound of an "auto" timeout while the worker\'s whole process tree is idle: under 5% of one core, '
        "no disk I/O, no process in uninterruptible sleep, none started (a stalled training that does nothing at all "
        "is hung; one that spins or waits on the disk gets auto_floor). Only over a phase's or a step's own "
        "intervals; with several hosts only while a rank of this host is stopped (SIGSTOP, a debugger: a rank waiting "
        "for another host's is idle). A loader that streams its "
        'data over a network socket waits idle through a network stall: set it higher there, or "off" (auto_floor '
        "always)"))
    auto_window: int = key(Whole(), 100, 'the number of recent intervals an "auto" timeout is taken over')
    kill_grace: float = key(Seconds(), 3.0, "seconds from SIGTERM to SIGKILL when a tree is killed")
    kill_timeout: float = key(Seconds(), 10.0, (
        "seconds after SIGKILL before a process still there is a survivor: held by the GPU driver (its wchan), "
        '"reboot needed"; by a file system, waited for (survivor_timeout); kill_grace + kill_timeout is at '
        "most 30 (the unit's WatchdogSec: killing a tree holds the supervisor's loop that long)"))
    survivor_timeout: float = key(Seconds(), 120.0, (
        "seconds to wait, after kill_timeout, for processes that survived SIGKILL in a file system's wait (a FUSE "
        "request, NFS, RPC: their wchan) to go before the next worker starts; still there then, the run ends with exit "
        "1. A survivor held by the GPU driver ends the run at once with exit 3"))


@dataclass(frozen=True)
class RestartConfig:
    """When to give up, and how fast to retry after a crash."""

    SECTION: ClassVar[str] = "restart"
    max_restarts: int = key(Whole(), 10, (
        "the restart budget: more restarts than this within `window`, each after an attempt that saved no new "
        "checkpoint, end the supervisor with exit status 1 (an attempt that saved one spends none: the run moved on)"))
    window: float = key(Seconds(), 3600.0, "seconds the restart budget counts over")
    backoff_initial: float = key(Seconds(), 1.0, (
        "the delay before restarting after a crash, doubling with each crash in a row (hangs restart at once: "
        "their stall was the wait)"))
    backoff_max: float = key(Seconds(), 60.0, "the longest delay after a crash")


@dataclass(frozen=True)
class KernelLogConfig:
    """What the supervisor reads besides heartbeats, and how far it trusts it."""

    SECTION: ClassVar[str] = "kernel_log"
    source: str = key(Choice(SOURCE_CHOICES), "auto", (
        '"auto": /dev/kmsg if readable, else the systemd journal (kernel transport); "kmsg", "journal", or "off"'))
    gpu_events: str = key(Choice(("auto", "off")), "auto", (
        '"auto": udev\'s DRM uevents (wedged, reset, removal) from its netlink monitor; "off"'))
    confirm_window: float = key(Seconds(), 10.0, (
        "seconds a worker under suspicion (a stall or GPU-fault line) has to show progress before it is killed as "
        "hung"))
    patterns: tuple = key(Patterns(), (), (
        'your own catalogue entries, tried before the built-in ones: [{ name = "x", regex = "...", kind = "stall" }], '
        "kind one of stall, gpu_fault, gpu_lost, oom, ignore"))


@dataclass(frozen=True)
class CheckpointConfig:
    """How much training a hang may cost."""

    SECTION: ClassVar[str] = "checkpoint"
    every: float | str | None = key(Seconds(durations=True, words={AUTO: AUTO, "epoch": None}), AUTO, (
        "seconds of training between the worker's checkpoints inside an epoch, taken at the next batch boundary (the "
        "loop waits only for a copy to host memory; a thread writes it, atomically); a hang loses at most this much "
        'plus detection. "auto": chosen at every spawn as Young\'s sqrt(2 x hold x mean time between hangs) from the '
        "measured checkpoint hold and this run's hangs (supervisor/decision/model/checkpoint_interval.py), at least "
        "10 measured holds (1 s at the least) and at most `max`: `max` while the run has not hung; while hangs are frequent (one in 10 "
        "minutes of training or more often), at most twice the restarts' own time, so a restart replays no more "
        'than its own time; "epoch": Ultralytics\' end-of-epoch '
        "save only. `status --json` shows it as `checkpoint_every`; metric yolo_train_checkpoint_interval_seconds"))
    max: float = key(Seconds(durations=True, least=CHECKPOINT_FLOOR, beyond=(
        f'at least {CHECKPOINT_FLOOR:.0f} s and at most a day '
        f'({LONGEST:g}), e.g. max = "10m"')), 600.0,
        'the longest interval "auto" chooses: the interval of a run that has not hung')


@dataclass(frozen=True)
class CommandConfig:
    """Any training script as the worker (``[worker] command``), instead of the Ultralytics worker."""

    SECTION: ClassVar[str] = "worker"
    argv: tuple[str, ...] = key(Argv('command = ["python", "train.py", "--epochs", "50"]', some=True), None, (
        "any training script instead of the Ultralytics worker (README *Supervising any training script*); `python` "
        "(or `python3`) as its first word is the Python that runs yolo-train"), at="worker.command", init_default=False)
    cwd: Path | None = key(Folder("an existing directory (relative to the config file)", existing=True), None,
                           "where the command runs, relative to the config file", shown="the supervisor's directory")
    checkpoint: str | None = key(Text(), None, (
        "a glob (relative to `cwd`) whose newest match is the command's resume point; none: the script resumes "
        "itself"))
    resume_args: tuple[str, ...] = key(Argv('resume_args = ["--resume", "{checkpoint}"]', empty_words=True), (), (
        "added to the command when the `checkpoint` glob matches, `{checkpoint}` replaced by the match"))
    progress_regex: str | None = key(Regex(), None, (
        "named groups epoch, epochs, batch, batches, loss, read from the command's output when it sends no heartbeat "
        "(tqdm, Ultralytics and Lightning bars are recognised without it)"), at="progress.regex")


@dataclass(frozen=True)
class IncidentsConfig:
    """What an incident records about a hung tree before it is killed."""

    SECTION: ClassVar[str] = "incidents"
    stacks: bool = key(Flag(), True, (
        "record where every thread of every process of a hung tree waits (py-spy: Python and native frames; /proc: "
        "wchan and the kernel stack; the GPU's state) as STATE_DIR/incidents/ID/stacks.json, read ahead of the "
        "verdict (a stall's bound less stacks_budget, at most half of it) so the kill waits for none"))
    stacks_budget: float = key(Seconds(most=10, expected="seconds, more than 0 and at most 10 (the kill waits for it)"),
                               3.0, "seconds the whole capture may take, all processes in parallel; the rest is "
                                    "abandoned and noted, and the kill goes on; also how far ahead of a restart's "
                                    "verdict the capture starts")


@dataclass(frozen=True)
class NotifyConfig:
    """``[notify]``: a command told when a person may want to know (supervisor/telemetry/notify_command.py)."""

    SECTION: ClassVar[str] = "notify"
    command: tuple[str, ...] = key(Argv('command = ["notify-send", "yolo-train"]'), (), (
        "argv, run without a shell when a person may want to know, the event as JSON on stdin and as YOLO_TRAIN_* "
        "variables (README *The morning after*)"), shown="none")
    timeout: float = key(Seconds(), 10.0, "seconds the command may run before it is killed")


@dataclass(frozen=True)
class ProbeConfig:
    """Giving the speed back: trying the faster rung again after a safer one has trained well for a while."""

    SECTION: ClassVar[str] = "ladder"
    probe_after: float | None = key(Seconds(durations=True, words=OFF), 7200.0, (
        "seconds of healthy training at a rung before the fastest rung below worth retrying is tried again, at the "
        'next batch boundary (the worker saves and exits, nothing is lost); "off" keeps the ladder one-way. A hang '
        "on the probed rung returns to the rung and doubles its probation. At least a fixed [checkpoint] every"))
    give_up_after: int = key(Whole(expected="a whole number >= 1 (failed probes of a rung before it is not probed "
                                            "again)"), 3, "a rung whose probes hung this many times is not probed "
                                                          "again")
    prior_between_hangs: float | None = key(Seconds(durations=True, words=OFF), 300.0, (
        "the training one hang is assumed to take at any rung, weighed as one hang seen beside a rung's own hangs "
        "(supervisor/decision/model/rung_choice.py), so one hang a few seconds in is no proof; \"off\": each rung judged on "
        "its own hangs alone"))


@dataclass(frozen=True)
class RecoveryConfig:
    """The recovery tier before the process restart (supervisor/decision/recovery/in_place.py)."""

    SECTION: ClassVar[str] = "recovery"
    in_place: bool = key(Flag(), True, (
        "a hang whose stacks show the training process waiting for a batch and DataLoader worker processes stuck is "
        "recovered by killing only those workers: the loader goes on at the batch it waited for, in the same process; "
        "false: every hang restarts"))
    in_place_max: int = key(Whole(), 3, (
        "more in-place recoveries that escalated (a rebuilt loader that brought no batch) than this within "
        "`in_place_window`, and the next hang restarts (and climbs the ladder) instead: a loader whose rebuild keeps "
        "failing wants a safer rung. Recoveries that worked do not count: each cost seconds and lost nothing"))
    in_place_window: float = key(Seconds(), 3600.0, "seconds in_place_max counts over")


@dataclass(frozen=True)
class DistributedConfig:
    """Several hosts: this host's supervisor starts its local ranks through torch.distributed's elastic launcher,
    which meets the other hosts' at a c10d rendezvous. A [distributed] table names its rendezvous."""

    SECTION: ClassVar[str] = "distributed"
    nnodes: int = key(Whole(expected="the number of hosts, a whole number >= 1"), 1,
                      "hosts in the job (1: this host alone, no rendezvous)")
    node_rank: int = key(Whole(None, "this host's number, a whole number from 0 to nnodes - 1"), 0, (
        "this host's number; the host with 0 hosts the rendezvous store (the global ranks are the rendezvous' to "
        "assign)"), required=True)
    rdzv_endpoint: str | None = key(Address('"HOST:PORT" of the host with node_rank 0, e.g. "10.0.0.1:29400"', 1),
                                    None, "the rendezvous store, on the host with node_rank 0", required=True)
    rdzv_id: str | None = key(Text('the job\'s name, the same on every host (letters, digits, "_.-"), e.g. '
                                   '"yolo-coco-1"', r"[A-Za-z0-9_.-]{1,64}"), None,
                              "the job's name at the rendezvous: every host of a job gives the same one", required=True)
    run_dir: Path | None = key(Folder("a directory on storage every host shares (the same path on each), where "
                                      "checkpoints are written and read"), None, (
        "where training writes (checkpoints), relative to the config file, on storage every host shares: the same "
        "path on every host; needed with nnodes > 1"), shown="`STATE_DIR/train`")
    collective_timeout: float = key(Seconds(), 600.0, (
        "seconds a rank waits in one collective for a peer (Ultralytics asks for 3 hours)"))
    join_timeout: float = key(Seconds(), 300.0, (
        "seconds a launch waits for every host to join the rendezvous (and for the store to answer); less than "
        "[watchdog] startup_timeout"))

    @property
    def several_hosts(self) -> bool:
        return self.nnodes > 1


@dataclass(frozen=True)
class Config:
    SECTION: ClassVar[str] = ""
    path: Path | None
    name: str = key(Text(), "yolo-train", "names the default state directory", init_default=False)
    state_dir: Path = key(Text(), None, (
        "state file, incidents, checkpoints (`train/weights/last.pt`); one supervisor per directory (a second one "
        "exits 78); if its lock file is removed and another supervisor takes the directory meanwhile, the first stops "
        "its worker without a save and exits 78"), shown="`$STATE_DIRECTORY`, else `~/.local/state/yolo-train/NAME`",
        init_default=False)
    train: dict[str, Any] = key(TrainTable(), {}, (
        "passed to Ultralytics' train() as is (`data = \"demo\"` is the synthetic set; `workers` is honoured on the "
        "CPU too); `project`, `name` and `save_dir` are refused (the run writes to STATE_DIR/train, on every resume "
        "too). A state directory holding a finished training of another [train] table or ladder is refused (exit 78); "
        "an unfinished one starts again at rung 0, and a checkpoint of another model, task, data, image size or epoch "
        "count is refused by the worker (exit 78, nothing deleted)"), init_default=False)
    watchdog: WatchdogConfig = table(WatchdogConfig)
    restart: RestartConfig = table(RestartConfig)
    ladder: tuple[dict[str, Any], ...] | None = key(Rungs(), None, (
        "the ladder: each rung's change on top of the previous ones (a rung's settings below, and any Ultralytics "
        "train argument); \"default\": halve workers down to 1, persistent_workers = false, the threads loader, "
        "workers = 0, val = false"), at="ladder.rungs", shown='`"default"`')
    faults: tuple[Fault, ...] = key(Faults(), (), "fault injection (README *Fault injection*)", shown="none")
    worker_python: str = key(Text(), "", "the interpreter that runs `-m worker`", at="worker.python",
                             shown="this Python")
    worker_env: dict[str, str] = key(Strings('env = { OMP_NUM_THREADS = "4" }'), {}, (
        "extra environment of the worker (ROCm knobs: HSA_OVERRIDE_GFX_VERSION, MIOPEN_FIND_MODE (a normal find's "
        "mode: nothing in immediate mode nor under benchmark, docs/behaviour.md), "
        "PYTORCH_HIP_ALLOC_CONF, OMP_NUM_THREADS, ...)"), at="worker.env")
    command: CommandConfig | None = table(CommandConfig, default_none=True)
    standby: bool = key(Flag(), True, (
        "once an attempt trains, start the next worker ahead (`python -m worker --standby`): it imports torch, "
        "Ultralytics and the trainer (and, made for a \"forkserver\" rung, starts that server), then waits idle (no "
        "GPU touched) for the next attempt's launch record, so a restart does not pay for the imports. The kill of a "
        "hung tree spares it; one made for another rung environment, or found stopped, is discarded for a cold start. "
        "It costs memory while it waits (torch, Ultralytics and the trainer imported) and one core for its imports "
        "each attempt (bench/RESULTS.md has the figures). A `command` cannot be started ahead "
        "of its arguments: `true` there is refused"), at="worker.standby", shown="`true` (`false` with a `command`)")
    standby_ready: str = key(Choice(("auto", "off")), "auto", (
        "\"auto\": where the device has room (`standby_memory_mib` free beside the training), the standby also holds "
        "the next attempt ready: the device context, the model built (on a GPU, its kernels chosen by a first "
        "step), the training and validation datasets (labels read) and the training loader's worker processes "
        "started (not for \"spawn\" workers nor the threads loader), so the restart only loads the checkpoint into "
        "the model and points the loader at its position; each is taken only where the launch would build the same, "
        "else built there. Where there is no room (or under DDP) it only imports, and the log and `status --json` "
        "say which kind waits and why (`standby_kind`, `standby_why`). \"off\": it only imports"),
        at="worker.standby_ready")
    standby_memory_mib: int = key(Whole(), 1024, (
        "the device memory a ready standby may hold (its context, the model, a first step's workspace): it is "
        "made ready only while this much is free on the training's device (on the CPU, the host's available memory)"),
        at="worker.standby_memory_mib")
    standby_host_percent: int = key(Whole(least=0, most=100), 50, (
        "the share of the host's available memory (MemAvailable, read as the standby is made, on a GPU too) that a "
        "ready standby may hold beyond its imports: its model, datasets, their RAM cache (`[train] cache = \"ram\"`: "
        "a second copy beside the training's) and its loader workers. It holds only what fits: the datasets "
        "without their images cached (the launch caches them), then none; `status --json` says what it holds and "
        "why (`standby_holds`, `standby_holds_why`, `standby_host_mib`)"), at="worker.standby_host_percent")
    metrics_listen: str | None = key(Address('"HOST:PORT" or "off", e.g. "127.0.0.1:10133"', words={"off": None,
                                                                                                  "": None}),
                                     "127.0.0.1:10133", "the Prometheus endpoint, or \"off\"", at="metrics.listen")
    deadline: str | None = key(Moment(), None, "`status` and the metrics show the slack between the ETA and it",
                               shown="none")
    kernel_log: KernelLogConfig = table(KernelLogConfig)
    checkpoint: CheckpointConfig = table(CheckpointConfig)
    probe: ProbeConfig = table(ProbeConfig)
    incidents: IncidentsConfig = table(IncidentsConfig)
    conv_fallback: str = key(Choice(CONV_FALLBACK_MODES), "auto", (
        'the Conv2d path that bypasses MIOpen/cuDNN (unfold + matmul); "auto": on under ROCm when MIOpen has no '
        "kernel database for the GPU"), at="patches.conv_fallback")
    batchnorm_fallback: str = key(Choice(BATCHNORM_FALLBACK_MODES), "auto", (
        "batch norm by PyTorch's own kernels instead of MIOpen's/cuDNN's (`torch.batch_norm` with `cudnn_enabled` "
        'off; statistics, momentum and gradients as torch\'s); "auto": on under ROCm when the Conv2d fallback is on, '
        "on RDNA1 (gfx101x, where MIOpen's batch-norm backward fails) and when MIOpen has no kernel database for the "
        "GPU"), at="patches.batchnorm_fallback")
    amp_check: str = key(Choice(("local", "off", "ultralytics")), "local", (
        'Ultralytics\' AMP check downloads a model; "local" compares fp32 and fp16 on the model itself, "off" trusts '
        '`amp`, "ultralytics" is theirs. Once an attempt has trained with AMP on, later attempts of the run do not '
        'check again'), at="patches.amp_check")
    distributed: DistributedConfig = table(DistributedConfig)
    recovery: RecoveryConfig = table(RecoveryConfig)
    notify: NotifyConfig = table(NotifyConfig)

    # Parsed once, here: the deadline as a Unix timestamp, the listen address as (host, port).
    deadline_at: float | None = field(init=False, default=None)
    metrics_address: tuple[str, int] | None = field(init=False, default=None)

    def __post_init__(self) -> None:
        object.__setattr__(self, "deadline_at", parse_deadline(self.deadline, self.source))
        object.__setattr__(self, "metrics_address", None if self.metrics_listen is None else
                           parse_listen(self.metrics_listen, self.source))

    @property
    def source(self) -> str:
        return str(self.path) if self.path else "<demo>"


KEYS: list[Key] = declared_keys(Config)


def expected(where: str) -> str:
    """The form a key takes, in the words of its refusal."""
    return next(k.kind.expected for k in KEYS if k.where == where)


SECTION_DOCS = {  # what each section is for, said once in docs/configuration.md
    "watchdog": "How long each phase may go without progress before the worker counts as hung.",
    "restart": "When to give up, and how fast to retry after a crash.",
    "ladder": "The ladder of safer settings a hang climbs, and giving the speed back (README *How it works*).",
    "ladder.rungs": "Each rung of `rungs` is a table of these and of any Ultralytics train argument, e.g. "
                    '`rungs = [{ workers = 2 }, { loader = "threads", threads = 2 }, { workers = 0, val = false }]`.',
    "worker": "The worker process: the Ultralytics worker, or any training script as `command`.",
    "progress": "Only with a `[worker] command`.",
    "kernel_log": "What the supervisor reads besides heartbeats, and how far it trusts it.",
    "checkpoint": "How much training a hang may cost.",
    "incidents": "What an incident records about a hung tree before it is killed.",
    "patches": "What the worker changes in torch and Ultralytics.",
    "distributed": "Several hosts (README *Several hosts*): this host's supervisor starts its local ranks through "
                   "torch.distributed's elastic launcher, which meets the other hosts' at a c10d rendezvous. A "
                   "`[distributed]` table names its rendezvous: `node_rank`, `rdzv_endpoint` and `rdzv_id` are "
                   "needed in it.",
    "recovery": "The recovery tier before the process restart (supervisor/decision/recovery/in_place.py).",
    "notify": "A command told when a person may want to know (supervisor/telemetry/notify_command.py).",
}


def load(path: Path | None, state_dir: Path | None = None) -> Config:
    """Read and validate a config file; ``None`` loads the embedded demo."""
    source = path or DEMO_CONFIG
    label = str(path) if path else "<demo>"
    try:
        raw = tomllib.loads(source.read_bytes().decode("utf-8"))
    except FileNotFoundError:
        raise ConfigError(f"{label}: no such file; pass --config with the path of a TOML config") from None
    except UnicodeDecodeError as e:
        line = source.read_bytes()[:e.start].count(b"\n") + 1
        raise ConfigError(f"{label}: not UTF-8 (byte 0x{e.object[e.start]:02x} on line {line}); TOML files are "
                          f"UTF-8: re-save it as UTF-8 (e.g. iconv -f latin1 -t utf-8)") from None
    except tomllib.TOMLDecodeError as e:
        raise ConfigError(f"{label}: not valid TOML ({e}); fix the syntax at that line") from None
    except OSError as e:
        raise ConfigError(f"{label}: cannot read ({e.strerror}); make it readable by this user") from None
    return parse(raw, label, path, state_dir)


def parse(raw: dict[str, Any], label: str, path: Path | None = None, state_dir: Path | None = None) -> Config:
    """The keys read by their kinds, then what holds between them."""
    reader = Reader(label, path.parent if path else Path.cwd())
    worker = raw.get("worker", {})
    if isinstance(worker, dict) and "command" not in worker:
        _only_with_a_command(raw, worker, reader)
    values = read_keys(raw, KEYS, reader)
    command = "worker.command" in values
    _command_rungs(raw, values, command, reader)
    values.setdefault("worker.standby", not command)
    if values["worker.standby"] and command:
        reader.refuse("worker.standby: a [worker] command cannot be started ahead of its launch (its arguments name "
                      "the checkpoint it resumes from); remove standby = true")
    name = values.get("name", "yolo-train")
    chosen_dir = state_dir or values.get("state_dir") or default_state_dir(name)
    config = build(Config, values, path=path, name=name, command=build(CommandConfig, values) if command else None,
                   state_dir=Path(os.path.expanduser(str(chosen_dir))).absolute())
    if config.probe.probe_after is not None and isinstance(config.checkpoint.every, float) \
            and config.probe.probe_after < config.checkpoint.every:
        reader.fail("ladder.probe_after", f"at least [checkpoint] every ({config.checkpoint.every:.0f} s): a probe "
                                          f"moves at a checkpoint boundary",
                    raw.get("ladder", {}).get("probe_after", config.probe.probe_after))
    _hosts(raw.get("distributed", {}), config, reader)
    _worker_counts(config, reader)
    if not config.train and not command:
        reader.refuse("no [train] table: nothing to train; add one with Ultralytics' train arguments, e.g. [train] "
                      "data = \"coco8.yaml\" model = \"yolov8n.yaml\" (see units/config.example.toml)")
    watchdog = config.watchdog
    if watchdog.kill_grace + watchdog.kill_timeout > UNIT_WATCHDOG_SEC:
        reader.refuse(f"watchdog.kill_grace + watchdog.kill_timeout: expected at most {UNIT_WATCHDOG_SEC:g} s "
                      f"together, got {watchdog.kill_grace:g} + {watchdog.kill_timeout:g}; killing a tree holds the "
                      f"supervisor's loop that long, and the unit's WatchdogSec=30s (units/yolo-train.service) is the "
                      f"longest it may be away")
    return config


def _worker_counts(config: Config, reader: Reader) -> None:
    """No loader count above WORKERS_PER_CORE per core of this machine: [train] workers, and a rung's workers and
    threads."""
    cores = os.cpu_count() or 1
    most = cores * WORKERS_PER_CORE
    counts = [("train.workers", config.train.get("workers"))] + [
        (f"ladder.rungs[{i}].{name}", rung.get(name)) for i, rung in enumerate(config.ladder or ())
        for name in ("workers", "threads")]
    for where, count in counts:
        if isinstance(count, (int, float)) and not isinstance(count, bool) and count > most:
            reader.fail(where, f"at most {most} ({WORKERS_PER_CORE} per core of this machine's {cores}; loaders past "
                               f"the cores buy nothing: Ultralytics caps its workers at them)", count)


def _only_with_a_command(raw: dict[str, Any], worker: dict[str, Any], reader: Reader) -> None:
    """The keys of a [worker] command mean nothing without one."""
    for name in ("cwd", "checkpoint", "resume_args"):
        if name in worker:
            reader.fail(f"worker.{name}", "only with [worker] command", worker[name])
    if raw.get("progress"):
        reader.fail("progress", "only with [worker] command (the Ultralytics worker sends heartbeats)", raw["progress"])


def _command_rungs(raw: dict[str, Any], values: dict[str, Any], command: bool, reader: Reader) -> None:
    """Resume arguments need the checkpoint they name; a command's rungs change its env and args only."""
    if command and values.get("worker.resume_args") and "worker.checkpoint" not in values:
        reader.fail("worker.resume_args", "a [worker] checkpoint glob beside it", raw["worker"]["resume_args"])
    for i, rung in enumerate(values.get("ladder.rungs") or ()):
        for name, value in rung.items():
            if name == "args" and not command:
                reader.fail(f"ladder.rungs[{i}].args", "only with [worker] command", value)
            elif command and name not in ("env", "args"):
                reader.refuse(f"ladder.rungs[{i}]: {name!r} changes nothing for a [worker] command; use env = {{ ... }}"
                              f" or args = {{ \"--flag\" = \"value\" }}")


def _hosts(table: dict[str, Any], config: Config, reader: Reader) -> None:
    """A [distributed] table: this host's number among nnodes, shared storage for several, within the startup."""
    hosts = config.distributed
    if not table:
        return
    if not 0 <= hosts.node_rank < hosts.nnodes:
        reader.fail("distributed.node_rank", f"this host's number, a whole number from 0 to {hosts.nnodes - 1} "
                                             f"(nnodes - 1)", hosts.node_rank)
    if config.command is not None:
        reader.refuse("[distributed]: several hosts are for the Ultralytics worker; with a [worker] command, give "
                      "torchrun its --nnodes and --rdzv-* arguments yourself")
    if hosts.several_hosts and hosts.run_dir is None:
        reader.missing("distributed.run_dir", expected("distributed.run_dir"), f"nnodes = {hosts.nnodes}")
    startup = config.watchdog.startup_timeout
    if hosts.several_hosts and startup is not None and hosts.join_timeout >= startup:
        reader.fail("distributed.join_timeout", f"less than watchdog.startup_timeout ({startup:g} s), which bounds a "
                                                f"start including the wait for the other hosts", hosts.join_timeout)


def parse_listen(listen: str, source: str = "<config>") -> tuple[str, int]:
    """``"HOST:PORT"`` (``[::1]:PORT`` for IPv6) -> (host, port); ConfigError if it is not one."""
    try:
        return parse_address(listen)
    except ValueError:
        Reader(source, Path()).fail("metrics.listen", expected("metrics.listen"), listen)


def default_state_dir(name: str) -> Path:
    """systemd's StateDirectory= when run as a service, else the XDG state directory."""
    if os.environ.get("STATE_DIRECTORY"):
        return Path(os.environ["STATE_DIRECTORY"].split(":")[0])
    base = os.environ.get("XDG_STATE_HOME") or os.path.expanduser("~/.local/state")
    return Path(base) / "yolo-train" / name
