"""The Prometheus exporter: what the supervisor knows, rendered when Prometheus asks.

The event loop hands over its status (``Agent.status()``, a frozen ``Status``) about once a second with
``Exporter.publish``; that costs one reference swap. Everything else happens at scrape time in
``TrainingCollector.collect`` on prometheus_client's HTTP server thread: the worker's process tree is read with
psutil, the GPUs are sampled (at most once every ``sample_interval`` seconds, however often the scraper comes), and
each row of the metric table (metric_table.py) becomes a family. Nobody scraping costs nothing.

The server thread is independent of the worker: it keeps answering while the worker is down, killed or
between restarts; the worker's metrics then say 0 processes.

Every metric is ``yolo_train_*``, one row of ``metric_table.METRICS`` each. A value the
supervisor does not know yet (no ETA before the first batches, no restart so far) is left out instead of
exported as a false 0; counters are exported for every known label value from the start, at 0, so that
``increase()`` sees the first hang.
"""

from __future__ import annotations

import importlib.metadata
import math
import threading
import time
from pathlib import Path
from typing import Any, Iterator

import psutil
from prometheus_client import CollectorRegistry, start_http_server
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, InfoMetricFamily, Metric
from prometheus_client.registry import Collector

from supervisor.config import Config, ConfigError, parse_deadline, parse_listen  # noqa: F401 (re-exported)
from supervisor.decision import Status
from supervisor.host.gpu_metrics import GpuReader, GpuSample, discover_gpu_readers, sample_all
from supervisor.state import hosts
from supervisor.telemetry.metric_table import COUNTER, GAUGE, INFO, METRICS, UNKNOWN, Row, Scrape, WorkerTreeSample

DEFAULT_SAMPLE_INTERVAL = 5.0  # seconds between two GPU samples, however often Prometheus scrapes


def yolo_train_version() -> str:
    try:
        return importlib.metadata.version("yolo-train")
    except importlib.metadata.PackageNotFoundError:
        return UNKNOWN


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


FAMILIES = {GAUGE: GaugeMetricFamily, COUNTER: CounterMetricFamily}


def render(scrape: Scrape, rows: tuple[Row, ...] = METRICS) -> list[Metric]:
    """The metric families of one scrape, a row of the table each: pure, for tests and for ``collect``. A value
    that is not a finite number gets no sample (the family keeps its HELP and TYPE, no false 0 is drawn)."""
    families: list[Metric] = []
    for row in rows:
        if row.present is not None and not row.present(scrape):
            continue
        if row.kind == INFO:
            family: Metric = InfoMetricFamily(row.name, row.help)
            family.add_metric([], row.read(scrape))
        else:
            family = FAMILIES[row.kind](row.name, row.help, labels=list(row.labels) or None)
            samples = row.read(scrape) if row.labels else [((), row.read(scrape))]
            for labels, value in samples:
                if _number(value) is not None:
                    family.add_metric(list(labels), _number(value))
        families.append(family)
    return families


class TrainingCollector(Collector):
    """Renders the latest published status when scraped; samples the worker tree and the GPUs then."""

    def __init__(self, deadline: float | None, gpu_readers: list[GpuReader],
                 sample_interval: float = DEFAULT_SAMPLE_INTERVAL, clock=time.time, hosts_dir: Path | None = None):
        self.status = Status()
        self.hosts_dir = hosts_dir  # several hosts: the shared run directory their views are kept in (hosts.py)
        self.deadline = deadline
        self.version = yolo_train_version()
        self.gpus = CachedGpuSamples(gpu_readers, sample_interval)
        self.clock = clock
        self.cpu = WorkerCpuCounter()
        self._lock = threading.Lock()  # scrapes may come in parallel (one server thread per request)

    def collect(self) -> Iterator[Metric]:
        status = self.status  # a published status is frozen: one read gives a consistent view
        pid = status.worker_pid
        with self._lock:
            tree = sample_worker_tree(pid)
            cpu = self.cpu.update(pid if tree.processes else None, tree.cpu_seconds)
            gpus = self.gpus.get()
        yield from render(Scrape(status, self.clock(), self.deadline, self.version, tree, cpu, gpus,
                                 hosts.read_all(self.hosts_dir) if self.hosts_dir is not None else None))


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

    def publish(self, status: Status) -> None:
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
