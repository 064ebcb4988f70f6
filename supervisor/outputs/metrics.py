"""The Prometheus exporter: what the supervisor knows, rendered when Prometheus asks.

The event loop hands over its status (``Agent.status()``, a plain dict) about once a second with
``Exporter.publish``; that costs one reference swap. Everything else happens at scrape time in
``TrainingCollector.collect`` on prometheus_client's HTTP server thread: the status is turned into metric
families, the worker's process tree is read with psutil, and the GPUs are sampled (at most once every
``sample_interval`` seconds, however often the scraper comes). Nobody scraping costs nothing.

The server thread is independent of the worker: it keeps answering while the worker is down, killed or
between restarts; the worker's metrics then say 0 processes.

Every metric is ``yolo_train_*`` (the list is ``dashboards.queries.METRIC_NAMES``). A value the
supervisor does not know yet (no ETA before the first batches, no restart so far) is left out instead of
exported as a false 0; counters are exported for every known label value from the start, at 0, so that
``increase()`` sees the first hang.
"""

from __future__ import annotations

import importlib.metadata
import math
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable, Iterator

import psutil
from prometheus_client import CollectorRegistry, start_http_server
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, InfoMetricFamily, Metric
from prometheus_client.registry import Collector

from supervisor.config import Config, ConfigError, parse_deadline, parse_listen  # noqa: F401 (re-exported)
from supervisor.decision.vocabulary import HANG_PHASES, PHASE_LABELS, KernelKind, Reason, State
from supervisor.decision.incident import Tier
from supervisor.outputs import hosts
from supervisor.outputs.incidents import one_line
from supervisor.sources.gpu_metrics import GpuReader, GpuSample, discover_gpu_readers, sample_all

DEFAULT_SAMPLE_INTERVAL = 5.0  # seconds between two GPU samples, however often Prometheus scrapes

# Label values exported at 0 before they first happen: the vocabulary's, never a copy.
RESTART_REASONS = tuple(reason.value for reason in Reason)
RECOVERY_TIERS = tuple(tier.value for tier in Tier)
KERNEL_EVENT_KINDS = tuple(kind.value for kind in KernelKind)
STATES = tuple(state.value for state in State)
PHASES = PHASE_LABELS
UNKNOWN = "unknown"


def yolo_train_version() -> str:
    try:
        return importlib.metadata.version("yolo-train")
    except importlib.metadata.PackageNotFoundError:
        return UNKNOWN


@dataclass(frozen=True)
class WorkerTreeSample:
    """The worker's process tree at one moment: its main process and every descendant."""

    processes: int = 0
    dataloader_processes: int = 0  # descendants of the main process: DataLoader workers and what they start
    threads: int = 0
    resident_memory_bytes: int = 0  # sum of RSS: pages shared between forked processes count once per process
    cpu_seconds: float = 0.0  # user + system of the live processes and of the children they have reaped


def sample_worker_tree(pid: int | None) -> WorkerTreeSample:
    """Reads the tree under ``pid`` with psutil; an empty sample when there is no worker or it just died.
    Processes that vanish while being read are skipped: a tree being killed is read without an error."""
    if pid is None:
        return WorkerTreeSample()
    try:
        main = psutil.Process(pid)
        descendants = main.children(recursive=True)
    except psutil.Error:
        return WorkerTreeSample()
    processes = dataloaders = threads = rss = 0
    cpu = 0.0
    for process in [main, *descendants]:
        try:
            with process.oneshot():
                if process.status() == psutil.STATUS_ZOMBIE:
                    continue
                times = process.cpu_times()
                cpu += times.user + times.system + times.children_user + times.children_system
                threads += process.num_threads()
                rss += process.memory_info().rss
        except psutil.Error:
            continue
        processes += 1
        dataloaders += process is not main
    return WorkerTreeSample(processes, dataloaders, threads, rss, cpu)


class WorkerCpuCounter:
    """CPU seconds of every worker this supervisor ran, as one counter that never goes down.

    Each worker's own total starts at 0; when the worker pid changes, the last total read from the previous
    one is carried over. What a dying worker used after the last scrape is not counted (its processes are
    gone before anyone can read them)."""

    def __init__(self) -> None:
        self.pid: int | None = None
        self.carried = 0.0
        self.current = 0.0

    def update(self, pid: int | None, seconds: float) -> float:
        if pid != self.pid:
            self.carried += self.current
            self.pid, self.current = pid, 0.0
        if pid is not None:
            self.current = max(self.current, seconds)
        return self.carried + self.current


class CachedGpuSamples:
    """``sample_all(readers)``, read again only when the last sample is ``interval`` seconds old."""

    def __init__(self, readers: list[GpuReader], interval: float = DEFAULT_SAMPLE_INTERVAL, clock=time.monotonic):
        self.readers, self.interval, self.clock = readers, interval, clock
        self.samples: list[GpuSample] = []
        self.taken_at: float | None = None
        self.reads = 0

    def get(self) -> list[GpuSample]:
        if not self.readers:
            return []
        now = self.clock()
        if self.taken_at is None or now - self.taken_at >= self.interval:
            self.samples, self.taken_at = sample_all(self.readers), now
            self.reads += 1
        return self.samples


def _number(value: Any) -> float | None:
    """A finite float, or None for a missing, non-numeric or NaN value (a broken status never breaks a scrape)."""
    if isinstance(value, bool):
        return float(value)
    if isinstance(value, (int, float)) and math.isfinite(value):
        return float(value)
    return None


def _table(value: Any) -> dict:
    return value if isinstance(value, dict) else {}


class _Families:
    """Builds the metric families of one scrape; a gauge whose value is unknown is exported without samples,
    so its HELP and TYPE stay but no false 0 is drawn."""

    def __init__(self) -> None:
        self.families: list[Metric] = []

    def gauge(self, name: str, documentation: str, value: Any = None, labels: Iterable[str] = ()) -> GaugeMetricFamily:
        family = GaugeMetricFamily(name, documentation, labels=list(labels) or None)
        if not labels and _number(value) is not None:
            family.add_metric([], _number(value))
        self.families.append(family)
        return family

    def counter(self, name: str, documentation: str, value: Any = None,
                labels: Iterable[str] = ()) -> CounterMetricFamily:
        family = CounterMetricFamily(name, documentation, labels=list(labels) or None)
        if not labels and _number(value) is not None:
            family.add_metric([], _number(value))
        self.families.append(family)
        return family

    def counter_by(self, name: str, documentation: str, label: str, known: tuple[str, ...], counts: Any) -> None:
        counts = _table(counts)
        family = self.counter(name, documentation, labels=[label])
        for key in dict.fromkeys([*known, *map(str, counts)]):
            family.add_metric([key], _number(counts.get(key)) or 0.0)

    def one_of(self, name: str, documentation: str, label: str, values: tuple[str, ...], current: str) -> None:
        family = self.gauge(name, documentation, labels=[label])
        for value in dict.fromkeys([*values, current]):
            family.add_metric([value], 1.0 if value == current else 0.0)


def render_status(status: dict[str, Any], *, now: float, deadline: float | None, version: str,
                  tree: WorkerTreeSample, worker_cpu_seconds: float, gpus: list[GpuSample]) -> list[Metric]:
    """The metric families for one status dict at wall time ``now``: pure, for tests and for ``collect``."""
    m = _Families()
    versions = _table(_table(status.get("settings")).get("versions"))
    info = InfoMetricFamily("yolo_train", "Versions: yolo-train, and the worker's Python, Ultralytics and torch "
                            "(\"unknown\" until the worker reports them).")
    info.add_metric([], {"version": version, **{key: str(versions.get(key) or UNKNOWN)
                                                for key in ("python", "ultralytics", "torch")}})
    m.families.append(info)

    worker_pid = status.get("worker_pid")
    m.one_of("yolo_train_state", "Supervisor state: 1 for the current one, 0 for the others.", "state", STATES,
             str(status.get("state") or State.STARTING.value))
    m.one_of("yolo_train_phase", "Worker phase: 1 for the current one, 0 for the others; \"none\" while no "
             "worker runs.", "phase", PHASES, str(status.get("phase") or "none") if worker_pid else "none")

    # Training
    m.gauge("yolo_train_epoch", "Current epoch, 1-based (0 before the first).", status.get("epoch") or 0)
    m.gauge("yolo_train_epochs", "Epochs the run trains for (0 until the worker reports).", status.get("epochs") or 0)
    m.gauge("yolo_train_batch", "Batches done in the current epoch.", status.get("batch") or 0)
    m.gauge("yolo_train_batches_per_epoch", "Training batches per epoch (0 until the worker reports).",
            status.get("batches") or 0)
    m.gauge("yolo_train_batches_per_second", "Training batches per second over the recent window.",
            status.get("it_s"))
    m.gauge("yolo_train_samples_per_second", "Training images per second over the recent window.",
            status.get("samples_s"))
    losses = m.gauge("yolo_train_loss", "Latest training loss, by loss term.", labels=["name"])
    for name, value in _table(status.get("losses")).items():
        if _number(value) is not None:
            losses.add_metric([str(name)], _number(value))
    m.gauge("yolo_train_learning_rate", "Latest learning rate.", status.get("lr"))
    m.gauge("yolo_train_progress_ratio", "Share of all training batches of the run done, 0 to 1.",
            status.get("progress"))
    eta = _number(status.get("eta_seconds"))
    m.gauge("yolo_train_eta_seconds", "Seconds until the run finishes at the current speed.", eta)
    if deadline is not None:
        m.gauge("yolo_train_deadline_timestamp_seconds", "The configured deadline, Unix time.", deadline)
        m.gauge("yolo_train_deadline_slack_seconds", "Deadline minus the predicted finish (now + ETA); below 0 "
                "the run misses its deadline at the current speed.", None if eta is None else deadline - (now + eta))

    # Supervisor
    m.gauge("yolo_train_rung", "Current rung of the ladder; 0 is the configured settings.", status.get("rung") or 0)
    m.gauge("yolo_train_rungs", "Number of rungs of the ladder.", status.get("rungs") or 0)
    rung_info = m.gauge("yolo_train_rung_info", "The current rung and its settings, as a label.",
                        labels=["rung", "label"])
    rung_info.add_metric([str(status.get("rung") or 0), str(status.get("rung_label") or "")], 1.0)
    speeds = m.gauge("yolo_train_rung_batches_per_second", "Median training batches per second measured at each "
                     "rung: what a safer rung costs.", labels=["rung"])
    for rung, speed in sorted(_table(status.get("rung_speeds")).items()):
        if _number(speed) is not None:
            speeds.add_metric([str(rung)], _number(speed))
    m.counter_by("yolo_train_restarts", "Worker restarts, by reason (probe: a planned move to a faster rung).",
                 "reason", RESTART_REASONS,
                 status.get("restarts_by_reason"))
    m.counter_by("yolo_train_recoveries", "Recoveries from a failure, by tier (in_place: only the hung DataLoader "
                 "workers replaced; restart: the tree killed, a new worker resumed).", "tier", RECOVERY_TIERS,
                 status.get("recoveries"))
    m.counter_by("yolo_train_hangs", "Hangs detected, by the phase the worker hung in.", "phase", HANG_PHASES,
                 status.get("hangs_by_phase"))
    m.counter_by("yolo_train_kernel_events", "Classified kernel log messages and GPU device events, by kind.",
                 "kind", KERNEL_EVENT_KINDS, status.get("kernel_events"))
    # The ages were measured when the status was published; the time since then is added so that they keep
    # growing if the event loop itself stops publishing.
    published = _number(status.get("updated"))
    age = 0.0 if published is None else max(0.0, now - published)
    since_progress = _number(status.get("seconds_since_progress"))
    uptime = _number(status.get("worker_uptime")) if worker_pid else None
    if since_progress is None:
        since_progress = uptime  # no progress yet from this worker: none since it started
    m.gauge("yolo_train_seconds_since_progress", "Seconds since the worker last made progress (or since it "
            "started, before its first progress).", None if since_progress is None else since_progress + age)
    ranks = m.gauge("yolo_train_rank_seconds_since_progress", "Seconds since each rank of a distributed worker last "
                    "made progress, with the device it trains on; with several hosts, every host's ranks, by "
                    "node_rank and host name.", labels=["rank", "device", "node_rank", "host"])
    for node_rank, host, views, host_age in _every_hosts_ranks(status, now, age):
        for view in views:
            if isinstance(view, dict) and _number(view.get("seconds_since_progress")) is not None:
                ranks.add_metric([str(view.get("rank")), str(view.get("device") or ""), node_rank, host],
                                 _number(view["seconds_since_progress"]) + host_age)
    m.gauge("yolo_train_worker_uptime_seconds", "Seconds since the current worker started; 0 while none runs.",
            0.0 if uptime is None else uptime + age)
    m.gauge("yolo_train_last_restart_timestamp_seconds", "Unix time of the last restart.",
            status.get("last_restart"))
    m.gauge("yolo_train_restart_budget_remaining", "Restarts left in the restart budget's window.",
            status.get("budget_left"))
    m.gauge("yolo_train_reboot_needed", "1 when only a reboot clears the GPU driver's state.",
            1.0 if status.get("reboot_needed") else 0.0)
    # Work kept and lost: goodput is training time kept (progress not thrown away by a restart) over wall time
    # since the run began; startup, the stall before a hang is detected and work after the newest checkpoint lower it.
    m.counter("yolo_train_lost_seconds", "Seconds of training thrown away by restarts: progress after the checkpoint "
              "the next worker resumed from.", _number(status.get("lost_seconds")) or 0.0)
    m.gauge("yolo_train_goodput_ratio", "Training time kept over wall time since the run began, 0 to 1.",
            status.get("goodput"))
    checkpoint = _table(status.get("last_checkpoint"))
    checkpoint_age = _number(checkpoint.get("age_seconds"))
    m.gauge("yolo_train_checkpoint_age_seconds", "Seconds since the newest complete checkpoint was written.",
            None if checkpoint_age is None else checkpoint_age + age)
    m.gauge("yolo_train_checkpoint_duration_seconds", "How long the training loop waited for the newest checkpoint.",
            checkpoint.get("seconds"))
    m.gauge("yolo_train_checkpoint_interval_seconds", "Configured seconds of training between checkpoints ([checkpoint] "
            "every); absent when checkpoints are per epoch.", status.get("checkpoint_every"))
    incident = _table(status.get("last_incident"))
    if incident:
        summary = m.gauge("yolo_train_last_incident_info", "The newest incident in one line (where it hung), as a "
                          "label: the text of the dashboard's restart annotations.", labels=["reason", "summary"])
        summary.add_metric([str(incident.get("reason", "")), one_line(incident)[:300]], 1.0)
    heartbeats = _table(status.get("heartbeats"))
    m.counter("yolo_train_heartbeats_dropped", "Heartbeats the worker dropped because the pipe was full.",
              _number(heartbeats.get("dropped")) or 0.0)
    unreadable = (_number(heartbeats.get("malformed")) or 0.0) + (_number(heartbeats.get("oversized")) or 0.0)
    m.counter("yolo_train_heartbeats_malformed", "Heartbeat lines the supervisor could not read (malformed or "
              "oversized).", unreadable)

    # Worker processes
    m.counter("yolo_train_worker_cpu_seconds", "CPU seconds (user + system) of the worker process trees, over "
              "all workers of this supervisor.", worker_cpu_seconds)
    m.gauge("yolo_train_worker_resident_memory_bytes", "Sum of the resident memory of the worker's processes.",
            tree.resident_memory_bytes)
    m.gauge("yolo_train_worker_threads", "Threads of all the worker's processes.", tree.threads)
    m.gauge("yolo_train_worker_processes", "Processes of the worker's tree, main process included.", tree.processes)
    m.gauge("yolo_train_worker_dataloader_processes", "Descendants of the worker's main process (DataLoader "
            "workers).", tree.dataloader_processes)

    # GPUs
    gpu_labels = ["gpu", "pci", "name"]
    gauges = {
        "utilization_ratio": m.gauge("yolo_train_gpu_utilization_ratio", "GPU busy share, 0 to 1.", labels=gpu_labels),
        "memory_used_bytes": m.gauge("yolo_train_gpu_memory_used_bytes", "VRAM in use.", labels=gpu_labels),
        "memory_total_bytes": m.gauge("yolo_train_gpu_memory_total_bytes", "VRAM size.", labels=gpu_labels),
        "temperature_celsius": m.gauge("yolo_train_gpu_temperature_celsius", "GPU temperature (amdgpu edge "
                                       "sensor, NVML core).", labels=gpu_labels),
        "power_watts": m.gauge("yolo_train_gpu_power_watts", "GPU power draw.", labels=gpu_labels),
    }
    clocks = m.gauge("yolo_train_gpu_clock_hertz", "Current GPU clock, by clock domain.", labels=[*gpu_labels, "clock"])
    for gpu in gpus:
        device = [str(gpu.index), gpu.pci, gpu.name]
        for field, family in gauges.items():
            value = _number(getattr(gpu, field))
            if value is not None:
                family.add_metric(device, value)
        for clock, hertz in gpu.clocks_hertz.items():
            if _number(hertz) is not None:
                clocks.add_metric([*device, clock], _number(hertz))
    return m.families


def _every_hosts_ranks(status: dict[str, Any], now: float, age: float) -> Iterator[tuple[str, str, list, float]]:
    """(node_rank, host, ranks, age of that view): every host's from the shared views where hosts are several
    (``hosts``, read at the scrape), else this supervisor's own, unlabelled."""
    if not status.get("hosts"):
        yield "", "", status.get("ranks") or [], age
        return
    for view in status["hosts"]:
        if isinstance(view, dict):
            updated = _number(view.get("updated"))
            yield (str(view.get("node_rank")), str(view.get("host") or ""), view.get("ranks") or [],
                   0.0 if updated is None else max(0.0, now - updated))


class TrainingCollector(Collector):
    """Renders the latest published status when scraped; samples the worker tree and the GPUs then."""

    def __init__(self, deadline: float | None, gpu_readers: list[GpuReader],
                 sample_interval: float = DEFAULT_SAMPLE_INTERVAL, clock=time.time, hosts_dir: Path | None = None):
        self.status: dict[str, Any] = {}
        self.hosts_dir = hosts_dir  # several hosts: the shared run directory their views are kept in (hosts.py)
        self.deadline = deadline
        self.version = yolo_train_version()
        self.gpus = CachedGpuSamples(gpu_readers, sample_interval)
        self.clock = clock
        self.cpu = WorkerCpuCounter()
        self._lock = threading.Lock()  # scrapes may come in parallel (one server thread per request)

    def collect(self) -> Iterator[Metric]:
        status = self.status  # published dicts are never mutated: one read gives a consistent view
        pid = status.get("worker_pid") if isinstance(status.get("worker_pid"), int) else None
        with self._lock:
            tree = sample_worker_tree(pid)
            cpu = self.cpu.update(pid if tree.processes else None, tree.cpu_seconds)
            gpus = self.gpus.get()
        if self.hosts_dir is not None:
            status = {**status, "hosts": hosts.read_all(self.hosts_dir)}
        yield from render_status(status, now=self.clock(), deadline=self.deadline, version=self.version,
                                 tree=tree, worker_cpu_seconds=cpu, gpus=gpus)


class Exporter:
    """The running exporter: ``publish`` the agent's status, ``close`` at the end."""

    def __init__(self, collector: TrainingCollector, registry: CollectorRegistry, server=None, thread=None,
                 gpu_readers: list[GpuReader] = ()):
        self.collector, self.registry = collector, registry
        self.server, self.thread = server, thread
        self.gpu_readers = list(gpu_readers)

    @property
    def port(self) -> int | None:
        return self.server.server_address[1] if self.server else None

    def publish(self, status: dict[str, Any]) -> None:
        self.collector.status = status

    def close(self) -> None:
        if self.server is not None:
            self.server.shutdown()
            self.server.server_close()
            self.thread.join(timeout=5)
            self.server = None
        for reader in self.gpu_readers:
            close = getattr(reader, "close", None)
            if close:
                close()


def start_exporter(config: Config, *, gpu_root: Path = Path("/"), gpu_readers: list[GpuReader] | None = None,
                   sample_interval: float = DEFAULT_SAMPLE_INTERVAL) -> Exporter:
    """Starts the HTTP server on ``config.metrics_listen`` with a registry of its own. ConfigError (one line)
    when the address cannot be listened on or the deadline cannot be read."""
    deadline = config.deadline_at
    if config.metrics_address is None:  # [metrics] listen = "off": publish() goes nowhere
        return Exporter(TrainingCollector(deadline, []), CollectorRegistry())
    host, port = config.metrics_address
    readers = discover_gpu_readers(gpu_root) if gpu_readers is None else gpu_readers
    collector = TrainingCollector(deadline, readers, sample_interval, hosts_dir=config.distributed.run_dir
                                  if config.distributed.several_hosts else None)
    registry = CollectorRegistry(auto_describe=False)
    registry.register(collector)
    try:
        server, thread = start_http_server(port, addr=host, registry=registry)
    except OSError as e:
        raise ConfigError(f"{config.source}: [metrics] listen = {config.metrics_listen!r}: cannot listen "
                          f"({e.strerror or e}); pick a free port") from None
    return Exporter(collector, registry, server, thread, readers)
