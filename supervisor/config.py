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
import tomllib
from dataclasses import dataclass, field, fields
from datetime import datetime
from functools import lru_cache
from pathlib import Path
from typing import Any

from worker.faults import Fault, FaultError

AUTO = "auto"
DEMO_CONFIG = Path(__file__).with_name("demo.toml")

# Our own per-rung settings that are not Ultralytics train() arguments.
WORKER_SETTINGS = {"persistent_workers": bool, "conv_fallback": str, "env": dict}


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

    startup_timeout: float | None = 600.0
    stall_timeout: float | str | None = AUTO
    val_timeout: float | str | None = AUTO
    save_timeout: float | None = 300.0
    auto_factor: float = 10.0
    auto_floor: float = 10.0
    auto_window: int = 100
    kill_grace: float = 3.0
    kill_timeout: float = 10.0


@dataclass(frozen=True)
class RestartConfig:
    """When to give up, and how fast to retry after a crash.

    max_restarts, window: the restart budget: more than max_restarts restarts within window seconds
        end the supervisor with exit status 1 instead of looping forever.
    backoff_initial, backoff_max: the delay before restarting after a crash doubles from the first to
        the second with each consecutive crash; hangs restart at once (their stall was the wait).
    """

    max_restarts: int = 10
    window: float = 3600.0
    backoff_initial: float = 1.0
    backoff_max: float = 60.0


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
    metrics_listen: str | None = "127.0.0.1:10133"
    deadline: str | None = None
    kernel_log: KernelLogConfig = field(default_factory=KernelLogConfig)
    conv_fallback: str = "auto"  # [patches]: the Conv2d path that bypasses MIOpen/cuDNN: auto, on, off
    amp_check: str = "local"  # [patches]: how AMP is checked: local (no download), off (trust amp), ultralytics

    @property
    def source(self) -> str:
        return str(self.path) if self.path else "<demo>"


def load(path: Path | None, state_dir: Path | None = None) -> Config:
    """Read and validate a config file; ``None`` loads the embedded demo."""
    source = path or DEMO_CONFIG
    label = str(path) if path else "<demo>"
    try:
        raw = tomllib.loads(source.read_text())
    except FileNotFoundError:
        raise ConfigError(f"{label}: no such file; pass --config with the path of a TOML config") from None
    except tomllib.TOMLDecodeError as e:
        raise ConfigError(f"{label}: not valid TOML ({e}); fix the syntax at that line") from None
    except OSError as e:
        raise ConfigError(f"{label}: cannot read ({e.strerror})") from None
    return parse(raw, label, path, state_dir)


def parse(raw: dict[str, Any], label: str, path: Path | None = None, state_dir: Path | None = None) -> Config:
    check = _Checker(label)
    check.keys("", raw, {"name", "state_dir", "train", "watchdog", "restart", "ladder", "faults", "worker",
                         "metrics", "deadline", "kernel_log", "patches"})
    name = check.string("name", raw.get("name", "yolo-train"))
    train = check.train(raw.get("train", {}))
    watchdog = check.section("watchdog", raw.get("watchdog", {}), WatchdogConfig)
    restart = check.section("restart", raw.get("restart", {}), RestartConfig)
    ladder = check.ladder(raw.get("ladder", {}))
    faults = check.faults(raw.get("faults", []))
    worker = raw.get("worker", {})
    check.keys("worker", worker, {"python", "env"})
    env = worker.get("env", {})
    if not isinstance(env, dict) or not all(isinstance(v, str) for v in env.values()):
        check.fail("worker.env", "a table of strings, e.g. env = { OMP_NUM_THREADS = \"4\" }", env)
    metrics = raw.get("metrics", {})
    check.keys("metrics", metrics, {"listen"})
    listen = metrics.get("listen", "127.0.0.1:10133")
    if listen in ("off", ""):
        listen = None
    elif not isinstance(listen, str) or ":" not in listen or not listen.rsplit(":", 1)[1].isdigit():
        check.fail("metrics.listen", '"HOST:PORT" or "off"', listen)
    deadline = raw.get("deadline")
    if deadline is not None and not isinstance(deadline, str):
        deadline = deadline.isoformat() if hasattr(deadline, "isoformat") else check.fail(
            "deadline", 'an RFC 3339 time, e.g. deadline = "2025-11-30T00:00:00Z"', deadline)
    parse_deadline(deadline, label)
    kernel_log = check.kernel_log(raw.get("kernel_log", {}))
    patches = raw.get("patches", {})
    check.keys("patches", patches, {"conv_fallback", "amp_check"})
    if patches.get("conv_fallback", "auto") not in ("auto", "on", "off"):
        check.fail("patches.conv_fallback", '"auto", "on" or "off"', patches["conv_fallback"])
    if patches.get("amp_check", "local") not in ("local", "off", "ultralytics"):
        check.fail("patches.amp_check", '"local", "off" or "ultralytics"', patches["amp_check"])
    chosen_dir = state_dir or raw.get("state_dir") or default_state_dir(name)
    return Config(path=path, name=name, state_dir=Path(os.path.expanduser(str(chosen_dir))).absolute(),
                  train=train, watchdog=watchdog, restart=restart, ladder=ladder, faults=faults,
                  worker_python=check.string("worker.python", worker.get("python", "")), worker_env=dict(env),
                  metrics_listen=listen, deadline=deadline, kernel_log=kernel_log,
                  conv_fallback=patches.get("conv_fallback", "auto"), amp_check=patches.get("amp_check", "local"))


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


class _Checker:
    """Validation helpers that all fail the same way: one line with file, key and expected form."""

    def __init__(self, label: str):
        self.label = label

    def fail(self, key: str, expected: str, got: Any) -> None:
        raise ConfigError(f"{self.label}: {key}: expected {expected}, got {got!r}")

    def keys(self, section: str, table: Any, allowed: set[str]) -> None:
        where = f"[{section}]" if section else "top level"
        if not isinstance(table, dict):
            self.fail(section, "a table", table)
        for key in table:
            if key not in allowed:
                raise ConfigError(f"{self.label}: {where}: unknown key {key!r}; expected one of "
                                  f"{', '.join(sorted(allowed))}")

    def string(self, key: str, value: Any) -> str:
        if not isinstance(value, str):
            self.fail(key, "a string", value)
        return value

    def train(self, table: Any) -> dict[str, Any]:
        known = ultralytics_train_args()
        self.keys("train", table, set(known) - {"mode", "resume"} if known else set(table))
        if "workers" in table and (not isinstance(table["workers"], int) or table["workers"] < 0):
            self.fail("train.workers", "a whole number >= 0", table["workers"])
        if "epochs" in table and (not isinstance(table["epochs"], int) or table["epochs"] < 1):
            self.fail("train.epochs", "a whole number >= 1", table["epochs"])
        return dict(table)

    def section(self, name: str, table: Any, cls: type) -> Any:
        self.keys(name, table, {f.name for f in fields(cls)})
        values = {}
        for f in fields(cls):
            if f.name not in table:
                continue
            value, key = table[f.name], f"{name}.{f.name}"
            allows_auto = "str" in str(f.type)
            allows_off = "None" in str(f.type)
            if value == AUTO and allows_auto:
                values[f.name] = AUTO
            elif value == "off" and allows_off:
                values[f.name] = None
            elif f.type == "int" and (not isinstance(value, int) or isinstance(value, bool) or value < 1):
                self.fail(key, "a whole number >= 1", value)
            elif isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) \
                    or value <= 0:
                forms = ["seconds (a positive number)"] + (['"auto"'] if allows_auto else []) + \
                        (['"off"'] if allows_off else [])
                self.fail(key, " or ".join(forms), value)
            else:
                values[f.name] = value
        return cls(**values)

    def ladder(self, table: Any) -> tuple[dict[str, Any], ...] | None:
        self.keys("ladder", table, {"rungs"})
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
                if key in WORKER_SETTINGS:
                    if not isinstance(value, WORKER_SETTINGS[key]):
                        self.fail(f"ladder.rungs[{i}].{key}", WORKER_SETTINGS[key].__name__, value)
                    if key == "conv_fallback" and value not in ("auto", "on", "off"):
                        self.fail(f"ladder.rungs[{i}].conv_fallback", '"auto", "on" or "off"', value)
                    if key == "env" and not all(isinstance(v, str) for v in value.values()):
                        self.fail(f"ladder.rungs[{i}].env", 'a table of strings, e.g. { MIOPEN_FIND_MODE = "FAST" }',
                                  value)
                elif known and key not in known:
                    raise ConfigError(f"{self.label}: ladder.rungs[{i}]: unknown setting {key!r}; expected an "
                                      f"Ultralytics train argument or one of {', '.join(WORKER_SETTINGS)}")
        return tuple(dict(r) for r in rungs)

    def kernel_log(self, table: Any) -> KernelLogConfig:
        from supervisor.kernel_messages import CatalogueError, validate_patterns

        self.keys("kernel_log", table, {f.name for f in fields(KernelLogConfig)})
        source = table.get("source", "auto")
        if source not in ("auto", "kmsg", "journal", "off"):
            self.fail("kernel_log.source", '"auto", "kmsg", "journal" or "off"', source)
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

    def faults(self, value: Any) -> tuple[Fault, ...]:
        if isinstance(value, dict):
            value = [value]
        if not isinstance(value, list):
            self.fail("faults", 'a table or list of tables, e.g. [[faults]] kind = "dataloader_hang"', value)
        try:
            return tuple(Fault.from_dict(item) for item in value)
        except FaultError as e:
            raise ConfigError(f"{self.label}: faults: {e}") from None
