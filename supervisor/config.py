"""The configuration: one TOML file, validated up front into frozen dataclasses.

Every error is one line naming the file, the key and the expected form, raised as ConfigError; the CLI
turns it into exit status 78 (EX_CONFIG) so systemd does not restart a daemon that cannot work.
Timeouts follow one convention: seconds as a number, ``"auto"`` where the value can be derived from
what the watchdog observes, and ``"off"`` (None) for no limit.
"""

from __future__ import annotations

import importlib.util
import math
import os
import re
import tomllib
from dataclasses import dataclass, field, fields, replace
from datetime import datetime
from functools import lru_cache
from pathlib import Path
from typing import Any

from supervisor.decision.checkpoint_interval import MIN_SECONDS as CHECKPOINT_FLOOR
from supervisor.patterns import CatalogueError, validate_patterns, validate_regex
from worker.contract import CONV_FALLBACK_MODES, LOADERS, OPTION_TYPES, START_METHODS
from worker.faults import Fault, FaultError

AUTO = "auto"
SOURCE_CHOICES = ("auto", "kmsg", "journal", "off")  # [kernel_log] source: auto reads kmsg, else the journal
DEMO_CONFIG = Path(__file__).with_name("demo.toml")
# units/yolo-train.service's WatchdogSec=30s: the longest the supervisor's loop may be away. Killing a tree holds
# the loop for up to kill_grace + kill_timeout (no heartbeat read, no stop request handled), so their sum must fit.
UNIT_WATCHDOG_SEC = 30.0


def _number(default: Any, *, auto: bool = False, off: bool = False, whole: bool = False) -> Any:
    """A numeric setting and the other forms it accepts: ``"auto"`` (derived from what is observed), ``"off"``
    (None: no limit). The allowances are data, read by the validation."""
    return field(default=default, metadata={"auto": auto, "off": off, "whole": whole})


class ConfigError(ValueError):
    """A configuration the supervisor refuses; the message is one line: file, key, expected form."""


@dataclass(frozen=True)
class WatchdogConfig:
    """How long each phase may go without progress before the worker counts as hung.

    startup_timeout: spawn to the first training batch: imports, dataset scan and caching, model build,
        the first kernel searches. A large dataset scan is legitimate, so the default is generous.
    stall_timeout: between two training progress beats. ``auto`` derives it from the batch intervals
        observed in this attempt: max(auto_floor, auto_factor x the slowest recent interval).
    val_timeout: between two validation beats (and from the end of training to the first val batch);
        ``auto`` as above over validation intervals, falling back to the training ones.
    save_timeout: writing a checkpoint, and from the last beat to the worker's exit after "done".
    auto_factor, auto_floor, auto_window: the safety factor, lower bound (seconds) and number of recent
        intervals behind every ``auto`` timeout.
    kill_grace: seconds between SIGTERM and SIGKILL when the tree is killed.
    kill_timeout: seconds to wait after SIGKILL before a surviving process means "reboot needed".
    """

    startup_timeout: float | None = _number(600.0, off=True)
    stall_timeout: float | str | None = _number(AUTO, auto=True, off=True)
    val_timeout: float | str | None = _number(AUTO, auto=True, off=True)
    save_timeout: float | None = _number(300.0, off=True)
    auto_factor: float = _number(10.0)
    auto_floor: float = _number(10.0)
    auto_window: int = _number(100, whole=True)
    kill_grace: float = _number(3.0)
    kill_timeout: float = _number(10.0)


@dataclass(frozen=True)
class RestartConfig:
    """When to give up, and how fast to retry after a crash.

    max_restarts, window: the restart budget: more than max_restarts restarts within window seconds, each after
        an attempt that wrote no new checkpoint, end the supervisor with exit status 1 instead of looping forever.
        An attempt that saved a checkpoint before it failed spends none: the run moved on.
    backoff_initial, backoff_max: the delay before restarting after a crash doubles from the first to
        the second with each consecutive crash; hangs restart at once (their stall was the wait).
    """

    max_restarts: int = _number(10, whole=True)
    window: float = _number(3600.0)
    backoff_initial: float = _number(1.0)
    backoff_max: float = _number(60.0)


@dataclass(frozen=True)
class KernelLogConfig:
    """What the supervisor reads besides heartbeats, and how far it trusts it.

    source: "auto" (/dev/kmsg if readable, else the systemd journal), "kmsg", "journal" or "off".
    gpu_events: "auto" (udev's netlink monitor on the drm subsystem) or "off".
    confirm_window: seconds a worker under suspicion (a stall or GPU-fault line) has to show progress
        before it is killed as hung.
    patterns: extra catalogue entries, tried before the built-in ones: [{ name, regex, kind }], kind one of
        stall, gpu_fault, gpu_lost, oom, ignore.
    """

    source: str = "auto"
    gpu_events: str = "auto"
    confirm_window: float = 10.0
    patterns: tuple = ()


@dataclass(frozen=True)
class CheckpointConfig:
    """How much training a hang may cost.

    every: seconds of training between the worker's checkpoints inside an epoch (written atomically at the next
        batch boundary); "auto" (the default): chosen at every spawn from the measured checkpoint hold and this
        run's hangs (supervisor/decision/checkpoint_interval.py), ``max`` while the run has not hung; a number or a
        duration such as "10m" for a fixed interval; or "epoch" (None) for Ultralytics' end-of-epoch save only. The
        newest checkpoint bounds the work a hang loses: at most this much, plus detection.
    max: the longest interval "auto" chooses: the interval of a run that has not hung.
    """

    every: float | str | None = "auto"
    max: float = 600.0


@dataclass(frozen=True)
class CommandConfig:
    """Any training script as the worker (``[worker] command``), instead of the Ultralytics worker.

    argv: the command; ``python`` (or ``python3``) as its first word is the Python that runs yolo-train.
    cwd: where it runs (relative to the config file); None: the supervisor's directory.
    checkpoint: a glob (relative to cwd) whose newest match is the resume point; None: the script resumes itself.
    resume_args: added to argv when the glob matches, ``{checkpoint}`` replaced by the match.
    progress_regex: ``[progress] regex``, named groups epoch, epochs, batch, batches, loss: read from the output
        when the script sends no heartbeat (tqdm, Ultralytics and Lightning bars are recognised without it).
    """

    argv: tuple[str, ...]
    cwd: Path | None = None
    checkpoint: str | None = None
    resume_args: tuple[str, ...] = ()
    progress_regex: str | None = None


@dataclass(frozen=True)
class IncidentsConfig:
    """What an incident records about a hung tree before it is killed.

    stacks: every thread of every process (py-spy: Python and native frames; /proc: wchan and the kernel stack;
        the GPU's state), stored as STATE_DIR/incidents/ID/stacks.json.
    stacks_budget: seconds the whole capture may take, all processes in parallel; what is not done by then is
        abandoned and noted, and the kill goes on.
    """

    stacks: bool = True
    stacks_budget: float = 3.0


@dataclass(frozen=True)
class NotifyConfig:
    """``[notify]``: a command told when a person may want to know (supervisor/outputs/notify_command.py).

    command: argv, run without a shell, the event as JSON on stdin and as YOLO_TRAIN_* variables; () for none.
    timeout: seconds it may run before it is killed.
    """

    command: tuple[str, ...] = ()
    timeout: float = 10.0


@dataclass(frozen=True)
class ProbeConfig:
    """Giving the speed back: trying the faster rung again after a safer one has trained well for a while.

    probe_after: seconds (or a duration such as "2h") of healthy training at rung k before the supervisor moves to
        rung k-1 at the next batch boundary (the worker saves and exits, nothing is lost); None ("off") keeps the
        ladder one-way. A hang on the probed rung returns to rung k and doubles rung k's probation.
    give_up_after: a rung whose probes hung this many times is not probed again.
    prior_between_hangs: seconds (or a duration) of training one hang is assumed to take at any rung, weighed as one
        hang seen, until the rung shows its own rate (rung_choice.py): one hang a few seconds in is no proof; None
        ("off"): each rung judged on its own hangs alone.
    """

    probe_after: float | None = 7200.0
    give_up_after: int = 3
    prior_between_hangs: float | None = 300.0


@dataclass(frozen=True)
class RecoveryConfig:
    """The recovery tier before the process restart (supervisor/decision/in_place.py).

    in_place: a hang in training or validation whose stacks show the training process waiting for a batch and one or
        more DataLoader worker processes stuck is recovered by killing only those workers: the loader goes on at the
        batch it waited for, in the same process (no restart, nothing lost). False: every hang restarts, as before.
    in_place_max, in_place_window: more than in_place_max in-place recoveries within in_place_window seconds, and the
        next hang restarts (and climbs the ladder) instead: a loader that keeps hanging wants a safer rung.
    """

    in_place: bool = True
    in_place_max: int = _number(3, whole=True)
    in_place_window: float = _number(3600.0)


@dataclass(frozen=True)
class DistributedConfig:
    """Several hosts (``[distributed]``): this host's supervisor starts its local ranks through torch.distributed's
    elastic launcher, which meets the other hosts' at a c10d rendezvous.

    nnodes: hosts in the job (1: this host alone, no rendezvous).
    node_rank: this host's number, 0 to nnodes - 1; the host with 0 hosts the rendezvous store. The global ranks
        are the rendezvous' to assign (c10d), so node_rank names the host, not its ranks.
    rdzv_endpoint: "HOST:PORT" of the rendezvous store (on the host with node_rank 0).
    rdzv_id: the job's name at the rendezvous: every host of a job gives the same one.
    run_dir: where training writes (checkpoints), on storage every host shares: the same path on every host.
        None: STATE_DIR/train (one host).
    collective_timeout: seconds a rank waits in one collective for a peer (Ultralytics asks for 3 hours).
    join_timeout: seconds a launch waits for every host to join the rendezvous (and for the store to answer).
    """

    nnodes: int = 1
    node_rank: int = 0
    rdzv_endpoint: str | None = None
    rdzv_id: str | None = None
    run_dir: Path | None = None
    collective_timeout: float = 600.0
    join_timeout: float = 300.0

    @property
    def several_hosts(self) -> bool:
        return self.nnodes > 1


@dataclass(frozen=True)
class Config:
    path: Path | None
    name: str
    state_dir: Path
    train: dict[str, Any]
    watchdog: WatchdogConfig = field(default_factory=WatchdogConfig)
    restart: RestartConfig = field(default_factory=RestartConfig)
    ladder: tuple[dict[str, Any], ...] | None = None  # None: the default ladder from train.workers
    faults: tuple[Fault, ...] = ()
    worker_python: str = ""
    worker_env: dict[str, str] = field(default_factory=dict)
    command: CommandConfig | None = None  # [worker] command: any script instead of the Ultralytics worker
    standby: bool = True  # a pre-imported worker waits for the next attempt (the Ultralytics worker only)
    metrics_listen: str | None = "127.0.0.1:10133"
    deadline: str | None = None  # as written, for display
    kernel_log: KernelLogConfig = field(default_factory=KernelLogConfig)
    checkpoint: CheckpointConfig = field(default_factory=CheckpointConfig)
    probe: ProbeConfig = field(default_factory=ProbeConfig)
    incidents: IncidentsConfig = field(default_factory=IncidentsConfig)
    conv_fallback: str = "auto"  # [patches]: the Conv2d path that bypasses MIOpen/cuDNN: auto, on, off
    amp_check: str = "local"  # [patches]: how AMP is checked: local (no download), off (trust amp), ultralytics
    distributed: DistributedConfig = field(default_factory=DistributedConfig)
    recovery: RecoveryConfig = field(default_factory=RecoveryConfig)
    notify: NotifyConfig = field(default_factory=NotifyConfig)

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
    check = _Checker(label)
    check.keys("", raw, {"name", "state_dir", "train", "watchdog", "restart", "ladder", "faults", "worker",
                         "metrics", "deadline", "kernel_log", "patches", "checkpoint", "progress", "incidents",
                         "distributed", "recovery", "notify"})
    name = check.string("name", raw.get("name", "yolo-train"))
    train = check.train(raw.get("train", {}))
    watchdog = check.section("watchdog", raw.get("watchdog", {}), WatchdogConfig)
    restart = check.section("restart", raw.get("restart", {}), RestartConfig)
    ladder = check.ladder(raw.get("ladder", {}))
    probe = check.probe(raw.get("ladder", {}))
    faults = check.faults(raw.get("faults", []))
    worker = raw.get("worker", {})
    check.keys("worker", worker, {"python", "env", "command", "cwd", "checkpoint", "resume_args", "standby"})
    command = check.command(worker, raw.get("progress", {}), path)
    standby = check.standby(worker.get("standby", command is None), command is not None)
    check.rung_arguments(ladder, command is not None)
    env = check.env("worker.env", worker.get("env", {}), 'env = { OMP_NUM_THREADS = "4" }')
    metrics = raw.get("metrics", {})
    check.keys("metrics", metrics, {"listen"})
    listen = metrics.get("listen", "127.0.0.1:10133")
    if listen in ("off", ""):
        listen = None
    elif not isinstance(listen, str):
        check.fail("metrics.listen", '"HOST:PORT" or "off"', listen)
    deadline = raw.get("deadline")
    if deadline is not None and not isinstance(deadline, str):
        deadline = deadline.isoformat() if hasattr(deadline, "isoformat") else check.fail(
            "deadline", 'an RFC 3339 time, e.g. deadline = "2025-11-30T00:00:00Z"', deadline)
    kernel_log = check.kernel_log(raw.get("kernel_log", {}))
    checkpoint = check.checkpoint(raw.get("checkpoint", {}))
    incidents = check.incidents(raw.get("incidents", {}))
    recovery = check.recovery(raw.get("recovery", {}))
    if probe.probe_after is not None and isinstance(checkpoint.every, float) and probe.probe_after < checkpoint.every:
        check.fail("ladder.probe_after", f"at least [checkpoint] every ({checkpoint.every:.0f} s): a probe moves at a "
                                         f"checkpoint boundary", raw["ladder"]["probe_after"])
    patches = raw.get("patches", {})
    check.keys("patches", patches, {"conv_fallback", "amp_check"})
    if patches.get("conv_fallback", "auto") not in CONV_FALLBACK_MODES:
        check.fail("patches.conv_fallback", _one_of(CONV_FALLBACK_MODES), patches["conv_fallback"])
    if patches.get("amp_check", "local") not in ("local", "off", "ultralytics"):
        check.fail("patches.amp_check", '"local", "off" or "ultralytics"', patches["amp_check"])
    distributed = check.distributed(raw.get("distributed", {}), command is not None, path)
    if distributed.several_hosts and watchdog.startup_timeout is not None \
            and distributed.join_timeout >= watchdog.startup_timeout:
        check.fail("distributed.join_timeout", f"less than watchdog.startup_timeout ({watchdog.startup_timeout:g} s), "
                                               f"which bounds a start including the wait for the other hosts",
                   distributed.join_timeout)
    chosen_dir = state_dir or raw.get("state_dir") or default_state_dir(name)
    config = Config(path=path, name=name, state_dir=Path(os.path.expanduser(str(chosen_dir))).absolute(),
                    train=train, watchdog=watchdog, restart=restart, ladder=ladder, probe=probe, incidents=incidents,
                    faults=faults,
                    worker_python=check.string("worker.python", worker.get("python", "")), worker_env=dict(env),
                    command=command, standby=standby,
                    metrics_listen=listen, deadline=deadline, kernel_log=kernel_log, checkpoint=checkpoint,
                    conv_fallback=patches.get("conv_fallback", "auto"), amp_check=patches.get("amp_check", "local"),
                    distributed=distributed, recovery=recovery,
                    notify=check.notify(raw.get("notify", {})))
    if not train and "command" not in worker:
        raise ConfigError(f"{label}: no [train] table: nothing to train; add one with Ultralytics' train arguments, "
                          f"e.g. [train] data = \"coco8.yaml\" model = \"yolov8n.yaml\" (see units/config.example.toml)")
    if watchdog.kill_grace + watchdog.kill_timeout > UNIT_WATCHDOG_SEC:
        raise ConfigError(f"{label}: watchdog.kill_grace + watchdog.kill_timeout: expected at most "
                          f"{UNIT_WATCHDOG_SEC:g} s together, got {watchdog.kill_grace:g} + {watchdog.kill_timeout:g}; "
                          f"killing a tree holds the supervisor's loop that long, and the unit's WatchdogSec=30s "
                          f"(units/yolo-train.service) is the longest it may be away")
    return config


def parse_deadline(text: str | None, source: str = "<config>") -> float | None:
    """The deadline as a Unix timestamp; a time without an offset is local time. ConfigError if unreadable."""
    if text is None:
        return None
    try:
        moment = datetime.fromisoformat(text.strip())
    except ValueError:
        raise ConfigError(f"{source}: deadline: expected an RFC 3339 time, e.g. deadline = "
                          f"\"2025-11-30T00:00:00Z\", got {text!r}") from None
    return moment.timestamp() if moment.tzinfo else moment.astimezone().timestamp()


DURATION_UNITS = {"s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}


def parse_duration(value: Any) -> float | None:
    """Seconds from a positive number or a string such as "90s", "10m", "2h", "1h30m"; None if it is neither."""
    if isinstance(value, bool):
        return None
    if isinstance(value, (int, float)):
        return float(value) if math.isfinite(value) and value > 0 else None
    if not isinstance(value, str) or not value.strip():
        return None
    import re

    parts = re.fullmatch(r"\s*((?:\d+(?:\.\d+)?\s*[smhd]\s*)+)", value)
    if parts is None:
        return None
    total = sum(float(n) * DURATION_UNITS[u] for n, u in re.findall(r"(\d+(?:\.\d+)?)\s*([smhd])", value))
    return total if total > 0 else None


def parse_listen(listen: str, source: str = "<config>") -> tuple[str, int]:
    """``"HOST:PORT"`` (``[::1]:PORT`` for IPv6) -> (host, port); ConfigError if it is not one."""
    host, _, port = listen.rpartition(":")
    if not host or not port.isdigit() or not 0 <= int(port) <= 65535 or not _host(host.strip("[]")):
        raise ConfigError(f"{source}: [metrics] listen = {listen!r}: expected \"HOST:PORT\" or \"off\", e.g. "
                          f"\"127.0.0.1:10133\"")
    return host.strip("[]"), int(port)


def _host(host: str) -> bool:
    """An IP address or a host name as bind() takes them (names resolve at run time, not here: no DNS in a check)."""
    import ipaddress
    import re

    try:
        ipaddress.ip_address(host)
        return True
    except ValueError:
        return re.fullmatch(r"(?!-)[A-Za-z0-9-]{1,63}(?:\.(?!-)[A-Za-z0-9-]{1,63})*\.?", host) is not None


def default_state_dir(name: str) -> Path:
    """systemd's StateDirectory= when run as a service, else the XDG state directory."""
    if os.environ.get("STATE_DIRECTORY"):
        return Path(os.environ["STATE_DIRECTORY"].split(":")[0])
    base = os.environ.get("XDG_STATE_HOME") or os.path.expanduser("~/.local/state")
    return Path(base) / "yolo-train" / name


@lru_cache(maxsize=1)
def ultralytics_train_args() -> dict[str, Any]:
    """Ultralytics' argument names and defaults, read from its default.yaml without importing torch."""
    import yaml

    spec = importlib.util.find_spec("ultralytics")
    if spec is None or not spec.submodule_search_locations:
        return {}
    default = Path(next(iter(spec.submodule_search_locations))) / "cfg" / "default.yaml"
    return yaml.safe_load(default.read_text()) or {}


@lru_cache(maxsize=1)
def ultralytics_value_kinds() -> dict[str, Any]:
    """The key sets Ultralytics' ``check_cfg`` types its arguments by (CFG_INT_KEYS, CFG_BOOL_KEYS, ... and
    CFG_INT_MIN), read from ultralytics/cfg/__init__.py as literals: importing it imports torch (2.6 s here),
    reading them takes milliseconds. Empty when the file or a name is not there (another Ultralytics)."""
    import ast

    spec = importlib.util.find_spec("ultralytics")
    if spec is None or not spec.submodule_search_locations:
        return {}
    source = Path(next(iter(spec.submodule_search_locations))) / "cfg" / "__init__.py"
    try:
        tree = ast.parse(source.read_text())
    except (OSError, SyntaxError, ValueError):
        return {}
    kinds: dict[str, Any] = {}
    for node in tree.body:
        if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
            name = node.targets[0].id
            value = node.value
            if isinstance(value, ast.Call) and getattr(value.func, "id", "") == "frozenset" and value.args:
                value = value.args[0]
            if name.startswith("CFG_") and name.endswith(("_KEYS", "_MIN")):
                try:
                    kinds[name] = ast.literal_eval(value)
                except ValueError:
                    continue
    return kinds


def _one_of(choices: tuple[str, ...]) -> str:
    """'"auto", "on" or "off"': the expected form of a key that takes one of ``choices``."""
    return ", ".join(f'"{c}"' for c in choices[:-1]) + f' or "{choices[-1]}"'


class _Checker:
    """Validation helpers that all fail the same way: one line with file, key and expected form."""

    def __init__(self, label: str):
        self.label = label

    def fail(self, key: str, expected: str, got: Any) -> None:
        shown = str(got).lower() if isinstance(got, bool) else repr(got)  # as TOML spells it
        raise ConfigError(f"{self.label}: {key}: expected {expected}, got {shown}")

    def keys(self, section: str, table: Any, allowed: set[str]) -> None:
        where = f"[{section}]" if section else "top level"
        if not isinstance(table, dict):
            self.fail(section, "a table", table)
        for key in table:
            if key not in allowed:
                raise ConfigError(f"{self.label}: {where}: unknown key {key!r}; expected one of "
                                  f"{', '.join(sorted(allowed))}")

    def standby(self, value: Any, command: bool) -> bool:
        if not isinstance(value, bool):
            self.fail("worker.standby", "true or false", value)
        if value and command:
            raise ConfigError(f"{self.label}: worker.standby: a [worker] command cannot be started ahead of its "
                              f"launch (its arguments name the checkpoint it resumes from); remove standby = true")
        return value

    def string(self, key: str, value: Any) -> str:
        if not isinstance(value, str):
            self.fail(key, "a string", value)
        self.no_nul(key, [value])
        return value

    def no_nul(self, key: str, values: Any) -> None:
        """No process can be given a NUL character in an argument, a path or the environment: refused here."""
        if any("\0" in v for v in values):
            self.fail(key, "text without a NUL character (\\u0000)", values if len(values) > 1 else values[0])

    def env(self, key: str, table: Any, example: str) -> dict[str, str]:
        """Environment variables: names an environment can hold, string values."""
        if not isinstance(table, dict) or not all(isinstance(v, str) for v in table.values()):
            self.fail(key, f"a table of strings, e.g. {example}", table)
        for name in table:
            if not name or "=" in name or "\0" in name:
                self.fail(key, f'variable names without "=" or a NUL character, e.g. {example}', name)
        self.no_nul(key, list(table.values()))
        return dict(table)

    def train(self, table: Any) -> dict[str, Any]:
        known = ultralytics_train_args()
        self.keys("train", table, set(known) - {"mode", "resume"} if known else set(table))
        for key in ("project", "name", "save_dir"):
            if key in table:
                # Where a run writes is the supervisor's decision (STATE_DIR/train, on every resume too): an
                # Ultralytics placement would be overridden silently, so it is refused instead.
                raise ConfigError(f"{self.label}: train.{key}: yolo-train decides where a run writes "
                                  f"(STATE_DIR/train); remove it and set state_dir = \"...\" or the top-level "
                                  f"name = \"...\" (the default state_dir is ~/.local/state/yolo-train/NAME)")
        for key, value in table.items():
            self.train_value(f"train.{key}", key, value)
        return dict(table)

    def train_value(self, where: str, key: str, value: Any) -> None:
        """A value Ultralytics' check_cfg (hard) or its trainer would refuse, refused here in one line; stricter
        where Ultralytics is lax: a boolean is never a number (``workers = true`` would mean one worker)."""
        kinds = ultralytics_value_kinds()
        number = isinstance(value, (int, float)) and not isinstance(value, bool)
        whole = number and (isinstance(value, int) or value.is_integer())
        if key == "workers":
            if not whole or value < 0:
                self.fail(where, "a whole number >= 0", value)
        elif key == "batch":
            if not number or not (value >= 1 and whole or value == -1 or 0 < value < 1):
                self.fail(where, "a whole number >= 1, -1 (AutoBatch) or a fraction of GPU memory between 0 and 1",
                          value)
        elif key == "imgsz":
            sizes = value if isinstance(value, list) and len(value) in (1, 2) else [value]
            if not all(isinstance(v, int) and not isinstance(v, bool) and v >= 1 for v in sizes):
                self.fail(where, "pixels as a whole number >= 1, or [height, width]", value)
        elif key in kinds.get("CFG_INT_KEYS", ()):
            least = kinds.get("CFG_INT_MIN", {}).get(key)
            if not whole or (least is not None and value < least):
                self.fail(where, "a whole number" + (f" >= {least}" if least is not None else ""), value)
        elif key in kinds.get("CFG_FLOAT_KEYS", ()):
            if not number:
                self.fail(where, "a number", value)
        elif key in kinds.get("CFG_FRACTION_KEYS", ()):
            if key == "fraction" and isinstance(value, list):
                return  # [train, val(, test)] counts or ratios: Ultralytics' own check at the worker
            if not number or not (0 <= value <= 1 or key == "fraction" and whole and value > 1):
                self.fail(where, "a number between 0 and 1" + (" or a count of images > 1" if key == "fraction"
                                                               else ""), value)
        elif key in kinds.get("CFG_BOOL_KEYS", ()):
            if not isinstance(value, bool):
                self.fail(where, "true or false", value)
        elif key in kinds.get("CFG_STR_KEYS", ()):
            if not isinstance(value, str):
                self.fail(where, "a string", value)
        elif key == "amp" and not (isinstance(value, bool) or str(value).lower() in ("fp16", "bf16", "fp32")):
            self.fail(where, 'true, false, "fp16", "bf16" or "fp32"', value)

    def section(self, name: str, table: Any, cls: type) -> Any:
        self.keys(name, table, {f.name for f in fields(cls)})
        values = {}
        for f in fields(cls):
            if f.name not in table:
                continue
            value, key = table[f.name], f"{name}.{f.name}"
            allows_auto, allows_off = f.metadata.get("auto", False), f.metadata.get("off", False)
            if value == AUTO and allows_auto:
                values[f.name] = AUTO
            elif value == "off" and allows_off:
                values[f.name] = None
            elif f.metadata.get("whole") and (not isinstance(value, int) or isinstance(value, bool) or value < 1):
                self.fail(key, "a whole number >= 1", value)
            elif isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) \
                    or value <= 0:
                forms = ["seconds (a positive number)"] + (['"auto"'] if allows_auto else []) + \
                        (['"off"'] if allows_off else [])
                self.fail(key, " or ".join(forms), value)
            else:
                values[f.name] = value
        return cls(**values)

    def notify(self, table: Any) -> NotifyConfig:
        self.keys("notify", table, {"command", "timeout"})
        argv = table.get("command", [])
        if not isinstance(argv, list) or not all(isinstance(a, str) and a for a in argv):
            self.fail("notify.command", 'a list of strings, e.g. command = ["notify-send", "yolo-train"]', argv)
        self.no_nul("notify.command", argv)
        timeout = self.section("notify", {k: v for k, v in table.items() if k == "timeout"}, NotifyConfig).timeout
        return NotifyConfig(tuple(argv), timeout)

    def command(self, worker: dict[str, Any], progress: Any, path: Path | None) -> CommandConfig | None:
        self.keys("progress", progress, {"regex"})
        if "command" not in worker:
            for key in ("cwd", "checkpoint", "resume_args"):
                if key in worker:
                    self.fail(f"worker.{key}", "only with [worker] command", worker[key])
            if progress:
                self.fail("progress", "only with [worker] command (the Ultralytics worker sends heartbeats)", progress)
            return None
        argv = worker["command"]
        if not isinstance(argv, list) or not argv or not all(isinstance(a, str) and a for a in argv):
            self.fail("worker.command", 'a list of strings, e.g. command = ["python", "train.py", "--epochs", "50"]',
                      argv)
        self.no_nul("worker.command", argv)
        base = path.parent if path else Path.cwd()
        cwd = worker.get("cwd")
        if cwd is not None:
            cwd = (base / os.path.expanduser(self.string("worker.cwd", cwd))).resolve()
            if not cwd.is_dir():
                self.fail("worker.cwd", "an existing directory (relative to the config file)", str(cwd))
        checkpoint = worker.get("checkpoint")
        if checkpoint is not None:
            self.string("worker.checkpoint", checkpoint)
        resume_args = worker.get("resume_args", [])
        if not isinstance(resume_args, list) or not all(isinstance(a, str) for a in resume_args):
            self.fail("worker.resume_args", 'a list of strings, e.g. resume_args = ["--resume", "{checkpoint}"]',
                      resume_args)
        self.no_nul("worker.resume_args", resume_args)
        if resume_args and checkpoint is None:
            self.fail("worker.resume_args", "a [worker] checkpoint glob beside it", resume_args)
        regex = progress.get("regex")
        if regex is not None:
            problem = validate_regex(self.string("progress.regex", regex))
            if problem:
                raise ConfigError(f"{self.label}: progress.regex: {problem}")
        return CommandConfig(tuple(argv), cwd, checkpoint, tuple(resume_args), regex)

    def rung_arguments(self, rungs: tuple[dict[str, Any], ...] | None, command: bool) -> None:
        """``args`` templates change a command's arguments; a command's rungs change nothing else."""
        for i, rung in enumerate(rungs or ()):
            for key, value in rung.items():
                if key == "args":
                    if not command:
                        self.fail(f"ladder.rungs[{i}].args", "only with [worker] command", value)
                    if not isinstance(value, dict) or not all(isinstance(v, str) for v in value.values()):
                        self.fail(f"ladder.rungs[{i}].args", 'a table of strings, e.g. { "--workers" = "0" }', value)
                    self.no_nul(f"ladder.rungs[{i}].args", [*value, *value.values()])
                elif command and key != "env":
                    raise ConfigError(f"{self.label}: ladder.rungs[{i}]: {key!r} changes nothing for a [worker] "
                                      f"command; use env = {{ ... }} or args = {{ \"--flag\" = \"value\" }}")

    def distributed(self, table: Any, command: bool, path: Path | None) -> DistributedConfig:
        self.keys("distributed", table, {f.name for f in fields(DistributedConfig)})
        if not table:
            return DistributedConfig()
        nnodes = table.get("nnodes", 1)
        if isinstance(nnodes, bool) or not isinstance(nnodes, int) or nnodes < 1:
            self.fail("distributed.nnodes", "the number of hosts, a whole number >= 1", nnodes)
        node_rank = table.get("node_rank")
        if isinstance(node_rank, bool) or not isinstance(node_rank, int) or not 0 <= node_rank < nnodes:
            self.fail("distributed.node_rank", f"this host's number, a whole number from 0 to {nnodes - 1} "
                                               f"(nnodes - 1)", node_rank)
        endpoint = table.get("rdzv_endpoint")
        host, _, port = endpoint.rpartition(":") if isinstance(endpoint, str) else ("", "", "")
        if not host or not port.isdigit() or not 1 <= int(port) <= 65535 or not _host(host.strip("[]")):
            self.fail("distributed.rdzv_endpoint", '"HOST:PORT" of the host with node_rank 0, e.g. '
                                                   '"10.0.0.1:29400"', endpoint)
        rdzv_id = table.get("rdzv_id")
        if not isinstance(rdzv_id, str) or not re.fullmatch(r"[A-Za-z0-9_.-]{1,64}", rdzv_id):
            self.fail("distributed.rdzv_id", 'the job\'s name, the same on every host (letters, digits, "_.-"), '
                                             'e.g. "yolo-coco-1"', rdzv_id)
        if command:
            raise ConfigError(f"{self.label}: [distributed]: several hosts are for the Ultralytics worker; with a "
                              f"[worker] command, give torchrun its --nnodes and --rdzv-* arguments yourself")
        run_dir = table.get("run_dir")
        if nnodes > 1 and run_dir is None:
            self.fail("distributed.run_dir", "a directory on storage every host shares (the same path on each), "
                                             "where checkpoints are written and read", run_dir)
        if run_dir is not None:
            base = path.parent if path else Path.cwd()
            run_dir = (base / os.path.expanduser(self.string("distributed.run_dir", run_dir))).absolute()
        timeouts = {}
        for key in ("collective_timeout", "join_timeout"):
            value = table.get(key, getattr(DistributedConfig, key))
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value < math.inf:
                self.fail(f"distributed.{key}", "seconds (a positive number)", value)
            timeouts[key] = float(value)
        return DistributedConfig(nnodes=nnodes, node_rank=node_rank, rdzv_endpoint=endpoint, rdzv_id=rdzv_id,
                                 run_dir=run_dir, **timeouts)

    def incidents(self, table: Any) -> IncidentsConfig:
        self.keys("incidents", table, {f.name for f in fields(IncidentsConfig)})
        stacks = table.get("stacks", True)
        if not isinstance(stacks, bool):
            self.fail("incidents.stacks", "true or false", stacks)
        budget = table.get("stacks_budget", IncidentsConfig.stacks_budget)
        if isinstance(budget, bool) or not isinstance(budget, (int, float)) or not 0 < budget <= 10:
            self.fail("incidents.stacks_budget", "seconds, more than 0 and at most 10 (the kill waits for it)", budget)
        return IncidentsConfig(stacks=stacks, stacks_budget=float(budget))

    def recovery(self, table: Any) -> RecoveryConfig:
        self.keys("recovery", table, {f.name for f in fields(RecoveryConfig)})
        in_place = table.get("in_place", True)
        if not isinstance(in_place, bool):
            self.fail("recovery.in_place", "true or false", in_place)
        numbers = self.section("recovery", {k: v for k, v in table.items() if k != "in_place"}, RecoveryConfig)
        return replace(numbers, in_place=in_place)

    def probe(self, table: Any) -> ProbeConfig:
        after = table.get("probe_after", ProbeConfig.probe_after)
        give_up = table.get("give_up_after", ProbeConfig.give_up_after)
        if isinstance(give_up, bool) or not isinstance(give_up, int) or give_up < 1:
            self.fail("ladder.give_up_after", "a whole number >= 1 (failed probes of a rung before it is not probed "
                                              "again)",
                      give_up)
        prior = table.get("prior_between_hangs", ProbeConfig.prior_between_hangs)
        return ProbeConfig(probe_after=None if after == "off" else self.duration("ladder.probe_after", after, '"off"'),
                           give_up_after=give_up,
                           prior_between_hangs=None if prior == "off" else self.duration("ladder.prior_between_hangs",
                                                                                         prior, '"off"'))

    def ladder(self, table: Any) -> tuple[dict[str, Any], ...] | None:
        self.keys("ladder", table, {"rungs", "probe_after", "give_up_after", "prior_between_hangs"})
        rungs = table.get("rungs")
        if rungs is None or rungs == "default":
            return None
        if not isinstance(rungs, list) or not rungs:
            self.fail("ladder.rungs", '"default" or a list of tables, e.g. rungs = [{ workers = 2 }, { val = false }]',
                      rungs)
        known = ultralytics_train_args()
        for i, rung in enumerate(rungs):
            if not isinstance(rung, dict):
                self.fail(f"ladder.rungs[{i}]", "a table of settings, e.g. { workers = 0 }", rung)
            for key, value in rung.items():
                if key in OPTION_TYPES:
                    expected = OPTION_TYPES[key]
                    if not isinstance(value, expected) or (expected is int and isinstance(value, bool)):
                        self.fail(f"ladder.rungs[{i}].{key}", expected.__name__, value)
                    if key == "conv_fallback" and value not in CONV_FALLBACK_MODES:
                        self.fail(f"ladder.rungs[{i}].conv_fallback", _one_of(CONV_FALLBACK_MODES), value)
                    if key == "loader" and value not in LOADERS:
                        self.fail(f"ladder.rungs[{i}].loader", " or ".join(f'"{v}"' for v in LOADERS), value)
                    if key == "start_method" and value not in START_METHODS:
                        self.fail(f"ladder.rungs[{i}].start_method", " or ".join(f'"{v}"' for v in START_METHODS),
                                  value)
                    if key == "threads" and value < 1:
                        self.fail(f"ladder.rungs[{i}].threads", "a whole number >= 1 (threads of the loader)",
                                  value)
                    if key == "env":
                        self.env(f"ladder.rungs[{i}].env", value, '{ MIOPEN_FIND_MODE = "FAST" }')
                elif known and key not in known:
                    raise ConfigError(f"{self.label}: ladder.rungs[{i}]: unknown setting {key!r}; expected an "
                                      f"Ultralytics train argument or one of {', '.join(OPTION_TYPES)}")
                else:
                    self.train_value(f"ladder.rungs[{i}].{key}", key, value)
        return tuple(dict(r) for r in rungs)

    def kernel_log(self, table: Any) -> KernelLogConfig:
        self.keys("kernel_log", table, {f.name for f in fields(KernelLogConfig)})
        source = table.get("source", "auto")
        if source not in SOURCE_CHOICES:
            self.fail("kernel_log.source", _one_of(SOURCE_CHOICES), source)
        gpu_events = table.get("gpu_events", "auto")
        if gpu_events not in ("auto", "off"):
            self.fail("kernel_log.gpu_events", '"auto" or "off"', gpu_events)
        confirm = table.get("confirm_window", 10.0)
        if isinstance(confirm, bool) or not isinstance(confirm, (int, float)) or not 0 < confirm < math.inf:
            self.fail("kernel_log.confirm_window", "seconds (a positive number)", confirm)
        try:
            validate_patterns(table.get("patterns", []), where=f"{self.label}: [kernel_log] patterns")
        except CatalogueError as e:
            raise ConfigError(str(e)) from None
        return KernelLogConfig(source=source, gpu_events=gpu_events, confirm_window=float(confirm),
                               patterns=tuple(table.get("patterns", [])))

    def duration(self, key: str, value: Any, *others: str) -> float:
        seconds = parse_duration(value)
        if seconds is None:
            self.fail(key, " or ".join(['seconds (a positive number)', 'a duration such as "10m"', *others]), value)
        return seconds

    def checkpoint(self, table: Any) -> CheckpointConfig:
        self.keys("checkpoint", table, {f.name for f in fields(CheckpointConfig)})
        every = table.get("every", CheckpointConfig.every)
        most = self.duration("checkpoint.max", table.get("max", CheckpointConfig.max))
        if most < CHECKPOINT_FLOOR:
            self.fail("checkpoint.max", f"at least {CHECKPOINT_FLOOR:.0f} s (the floor of the interval \"auto\" "
                                        f"chooses), e.g. max = \"10m\"", table.get("max"))
        if every in ("auto", "epoch"):
            return CheckpointConfig(every=None if every == "epoch" else every, max=most)
        return CheckpointConfig(every=self.duration("checkpoint.every", every, '"auto"', '"epoch"'), max=most)

    def faults(self, value: Any) -> tuple[Fault, ...]:
        if isinstance(value, dict):
            value = [value]
        if not isinstance(value, list):
            self.fail("faults", 'a table or list of tables, e.g. [[faults]] kind = "dataloader_hang"', value)
        try:
            return tuple(Fault.from_dict(item) for item in value)
        except FaultError as e:
            raise ConfigError(f"{self.label}: faults: {e}") from None
