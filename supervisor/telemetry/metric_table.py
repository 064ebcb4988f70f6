"""Every metric the exporter serves, one row each: its name, kind, help, labels and how it is read.

A row reads a ``Scrape`` (the published ``Status`` and what is sampled when Prometheus asks: the worker's process
tree, the GPUs, the other hosts' views). An unlabelled row's ``read`` gives a number, or None where the value is not
known yet (the family is then served without a sample: no false 0); a labelled row's gives (label values, number)
pairs. ``present`` leaves a family out altogether (no deadline configured, no incident yet). The exporter
(metrics.py), ``METRIC_NAMES`` and the dashboard's checks (dashboards/queries.py) are derived from ``METRICS``:
a metric of an existing status field is one row here.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, Iterable, Iterator

from supervisor.decision import Heartbeats, Status, one_line
from supervisor.vocabulary import HANG_PHASES, PHASE_LABELS, KernelKind, Reason, State, Tier

if TYPE_CHECKING:
    from supervisor.host.gpu_metrics import GpuSample

GAUGE, COUNTER, INFO = "gauge", "counter", "info"
# Label values exported at 0 before they first happen: the vocabulary's, never a copy.
RESTART_REASONS = tuple(reason.value for reason in Reason)
RECOVERY_TIERS = tuple(tier.value for tier in Tier)
KERNEL_EVENT_KINDS = tuple(kind.value for kind in KernelKind)
STATES = tuple(state.value for state in State)
PHASES = PHASE_LABELS
UNKNOWN = "unknown"
GPU_LABELS = ("gpu", "pci", "name")


@dataclass(frozen=True)
class WorkerTreeSample:
    """The worker's process tree at one moment: its main process and every descendant."""

    processes: int = 0
    dataloader_processes: int = 0  # descendants of the main process: DataLoader workers and what they start
    threads: int = 0
    resident_memory_bytes: int = 0  # sum of RSS: pages shared between forked processes count once per process
    cpu_seconds: float = 0.0  # user + system of the live processes and of the children they have reaped


@dataclass(frozen=True)
class Scrape:
    """What one scrape renders: the status as published at ``status.supervisor.updated``, read at wall time
    ``now``, and what was sampled for it."""
    status: Status
    now: float
    deadline: float | None = None
    version: str = UNKNOWN
    tree: WorkerTreeSample = field(default_factory=WorkerTreeSample)
    worker_cpu_seconds: float = 0.0
    gpus: list[GpuSample] = field(default_factory=list)
    hosts: list[dict[str, Any]] | None = None  # several hosts: every host's view (hosts.py), read at the scrape

    @property
    def age(self) -> float:
        """Seconds since the status was published: added to the ages it holds, so that they keep growing if the
        event loop itself stops publishing."""
        updated = self.status.supervisor.updated if self.status.supervisor else None
        return 0.0 if updated is None else max(0.0, self.now - updated)

    @property
    def uptime(self) -> float | None:
        return self.status.worker_uptime if self.status.worker_pid else None

    @property
    def eta(self) -> float | None:
        return self.status.eta_seconds


@dataclass(frozen=True)
class Row:
    name: str  # the family's; a counter's sample is name_total, an info's name_info
    kind: str
    help: str
    read: Callable[[Scrape], Any]
    labels: tuple[str, ...] = ()
    present: Callable[[Scrape], bool] | None = None
    only_with: str = ""  # where its samples appear only with something this machine may lack: "gpu", "ranks"

    @property
    def exported(self) -> str:
        """The name its samples carry, as PromQL selects them."""
        return self.name + {COUNTER: "_total", INFO: "_info"}.get(self.kind, "")


def gauge(name: str, help: str, read: Callable[[Scrape], Any], **more: Any) -> Row:
    return Row(name, GAUGE, help, read, **more)


def counter(name: str, help: str, read: Callable[[Scrape], Any], **more: Any) -> Row:
    return Row(name, COUNTER, help, read, **more)


def counted_by(name: str, help: str, label: str, known: tuple[str, ...], counts: Callable[[Status], dict]) -> Row:
    """A counter by one label: every known value from the start (at 0), so that ``increase()`` sees the first one."""
    def read(x: Scrape) -> Iterator[tuple[tuple[str, ...], float]]:
        seen = counts(x.status)
        return (((key,), seen.get(key) or 0.0) for key in dict.fromkeys([*known, *map(str, seen)]))
    return Row(name, COUNTER, help, read, labels=(label,))


def one_of(name: str, help: str, label: str, values: tuple[str, ...], current: Callable[[Scrape], str]) -> Row:
    """1 for the current value, 0 for the others."""
    def read(x: Scrape) -> Iterator[tuple[tuple[str, ...], float]]:
        now = current(x)
        return (((value,), 1.0 if value == now else 0.0) for value in dict.fromkeys([*values, now]))
    return Row(name, GAUGE, help, read, labels=(label,))


def per_gpu(name: str, help: str, sample_field: str) -> Row:
    return gauge(name, help, lambda x: (((str(g.index), g.pci, g.name), getattr(g, sample_field)) for g in x.gpus),
                 labels=GPU_LABELS, only_with="gpu")


def _versions(x: Scrape) -> dict[str, str]:
    versions = x.status.settings.get("versions")
    versions = versions if isinstance(versions, dict) else {}
    return {"version": x.version, **{key: str(versions.get(key) or UNKNOWN) for key in ("python", "ultralytics",
                                                                                       "torch")}}


def _since_progress(x: Scrape) -> float | None:
    """Since the last progress; since the worker started, before its first."""
    since = x.status.seconds_since_progress
    since = x.uptime if since is None else since
    return None if since is None else since + x.age


def _every_hosts_ranks(x: Scrape) -> Iterable[tuple[tuple[str, ...], Any]]:
    """Every host's ranks from the shared views where hosts are several (``hosts``, read at the scrape), else this
    supervisor's own, unlabelled."""
    if not x.hosts:
        return (((str(r.rank), str(r.device or ""), "", ""), None if r.seconds_since_progress is None
                 else r.seconds_since_progress + x.age) for r in x.status.ranks)
    rows = []
    for view in x.hosts:
        if not isinstance(view, dict):
            continue
        updated = view.get("updated")
        host_age = 0.0 if not isinstance(updated, (int, float)) else max(0.0, x.now - updated)
        for r in view.get("ranks") or []:
            since = r.get("seconds_since_progress") if isinstance(r, dict) else None
            if isinstance(since, (int, float)):
                rows.append(((str(r.get("rank")), str(r.get("device") or ""), str(view.get("node_rank")),
                              str(view.get("host") or "")), since + host_age))
    return rows


def _heartbeats(x: Scrape) -> Heartbeats:
    return x.status.supervisor.heartbeats if x.status.supervisor else Heartbeats()


def _checkpoint_age(x: Scrape) -> float | None:
    c = x.status.last_checkpoint
    return None if c is None or c.age_seconds is None else c.age_seconds + x.age


METRICS: tuple[Row, ...] = (
    Row("yolo_train", INFO, "Versions: yolo-train, and the worker's Python, Ultralytics and torch (\"unknown\" "
        "until the worker reports them).", _versions),
    one_of("yolo_train_state", "Supervisor state: 1 for the current one, 0 for the others.", "state", STATES,
           lambda x: x.status.state or State.STARTING.value),
    one_of("yolo_train_phase", "Worker phase: 1 for the current one, 0 for the others; \"none\" while no worker runs.",
           "phase", PHASES, lambda x: (x.status.reported.phase or "none") if x.status.worker_pid else "none"),
    # Training
    gauge("yolo_train_epoch", "Current epoch, 1-based (0 before the first).", lambda x: x.status.reported.epoch),
    gauge("yolo_train_epochs", "Epochs the run trains for (0 until the worker reports).", lambda x: x.status.reported.epochs),
    gauge("yolo_train_batch", "Batches done in the current epoch.", lambda x: x.status.reported.batch),
    gauge("yolo_train_batches_per_epoch", "Training batches per epoch (0 until the worker reports).",
          lambda x: x.status.reported.batches),
    gauge("yolo_train_batches_per_second", "Training batches per second over the recent window.",
          lambda x: x.status.it_s),
    gauge("yolo_train_samples_per_second", "Training images per second over the recent window.",
          lambda x: x.status.samples_s),
    gauge("yolo_train_loss", "Latest training loss, by loss term.",
          lambda x: (((str(k),), v) for k, v in x.status.reported.losses.items()), labels=("name",)),
    gauge("yolo_train_learning_rate", "Latest learning rate.", lambda x: x.status.reported.lr),
    gauge("yolo_train_progress_ratio", "Share of all training batches of the run done, 0 to 1.",
          lambda x: x.status.progress),
    gauge("yolo_train_eta_seconds", "Seconds until the run finishes at the current speed.", lambda x: x.eta),
    gauge("yolo_train_deadline_timestamp_seconds", "The configured deadline, Unix time.", lambda x: x.deadline,
          present=lambda x: x.deadline is not None),
    gauge("yolo_train_deadline_slack_seconds", "Deadline minus the predicted finish (now + ETA); below 0 the run "
          "misses its deadline at the current speed.",
          lambda x: None if x.eta is None else x.deadline - (x.now + x.eta), present=lambda x: x.deadline is not None),
    # Supervisor
    gauge("yolo_train_rung", "Current rung of the ladder; 0 is the configured settings.", lambda x: x.status.rung),
    gauge("yolo_train_rungs", "Number of rungs of the ladder.", lambda x: x.status.rungs),
    gauge("yolo_train_rung_info", "The current rung and its settings, as a label.",
          lambda x: [((str(x.status.rung), x.status.rung_label), 1.0)], labels=("rung", "label")),
    gauge("yolo_train_rung_batches_per_second", "Median training batches per second measured at each rung: what a "
          "safer rung costs.", lambda x: (((k,), v) for k, v in sorted(x.status.rung_speeds.items())),
          labels=("rung",)),
    counted_by("yolo_train_restarts", "Worker restarts, by reason (probe: a planned move to a faster rung).",
               "reason", RESTART_REASONS, lambda s: s.restarts_by_reason),
    counted_by("yolo_train_recoveries", "Recoveries from a failure, by tier (in_place: only the hung DataLoader "
               "workers replaced; restart: the tree killed, a new worker resumed).", "tier", RECOVERY_TIERS,
               lambda s: s.recoveries.to_dict()),
    counted_by("yolo_train_hangs", "Hangs detected, by the phase the worker hung in.", "phase", HANG_PHASES,
               lambda s: s.hangs_by_phase),
    counted_by("yolo_train_kernel_events", "Classified kernel log messages and GPU device events, by kind.", "kind",
               KERNEL_EVENT_KINDS, lambda s: s.kernel_events),
    gauge("yolo_train_seconds_since_progress", "Seconds since the worker last made progress (or since it started, "
          "before its first progress).", _since_progress),
    gauge("yolo_train_rank_seconds_since_progress", "Seconds since each rank of a distributed worker last made "
          "progress, with the device it trains on; with several hosts, every host's ranks, by node_rank and host "
          "name.", _every_hosts_ranks, labels=("rank", "device", "node_rank", "host"), only_with="ranks"),
    gauge("yolo_train_worker_uptime_seconds", "Seconds since the current worker started; 0 while none runs.",
          lambda x: 0.0 if x.uptime is None else x.uptime + x.age),
    gauge("yolo_train_last_restart_timestamp_seconds", "Unix time of the last restart.",
          lambda x: x.status.last_restart),
    gauge("yolo_train_restart_budget_remaining", "Restarts left in the restart budget's window.",
          lambda x: x.status.budget_left),
    gauge("yolo_train_reboot_needed", "1 when only a reboot clears the GPU driver's state.",
          lambda x: x.status.reboot_needed),
    # Work kept and lost: goodput is training time kept (progress not thrown away by a restart) over wall time
    # since the run began; startup, the stall before a hang is detected and work after the newest checkpoint lower it.
    counter("yolo_train_lost_seconds", "Seconds of training thrown away by restarts: progress after the checkpoint "
            "the next worker resumed from.", lambda x: x.status.lost_seconds),
    gauge("yolo_train_goodput_ratio", "Training time kept over wall time since the run began, 0 to 1.",
          lambda x: x.status.goodput),
    gauge("yolo_train_checkpoint_age_seconds", "Seconds since the newest complete checkpoint was written.",
          _checkpoint_age),
    gauge("yolo_train_checkpoint_duration_seconds", "How long the training loop waited for the newest checkpoint.",
          lambda x: x.status.last_checkpoint and x.status.last_checkpoint.seconds),
    gauge("yolo_train_checkpoint_interval_seconds", "Configured seconds of training between checkpoints ([checkpoint] "
          "every); absent when checkpoints are per epoch.", lambda x: x.status.checkpoint_every),
    gauge("yolo_train_last_incident_info", "The newest incident in one line (where it hung), as a label: the text of "
          "the dashboard's restart annotations.",
          lambda x: [((str(x.status.last_incident.get("reason", "")), one_line(x.status.last_incident)[:300]), 1.0)],
          labels=("reason", "summary"), present=lambda x: bool(x.status.last_incident)),
    counter("yolo_train_heartbeats_dropped", "Heartbeats the worker dropped because the pipe was full.",
            lambda x: _heartbeats(x).dropped),
    counter("yolo_train_heartbeats_malformed", "Heartbeat lines the supervisor could not read (malformed or "
            "oversized).", lambda x: _heartbeats(x).malformed + _heartbeats(x).oversized),
    # Worker processes
    counter("yolo_train_worker_cpu_seconds", "CPU seconds (user + system) of the worker process trees, over all "
            "workers of this supervisor.", lambda x: x.worker_cpu_seconds),
    gauge("yolo_train_worker_resident_memory_bytes", "Sum of the resident memory of the worker's processes.",
          lambda x: x.tree.resident_memory_bytes),
    gauge("yolo_train_worker_threads", "Threads of all the worker's processes.", lambda x: x.tree.threads),
    gauge("yolo_train_worker_processes", "Processes of the worker's tree, main process included.",
          lambda x: x.tree.processes),
    gauge("yolo_train_worker_dataloader_processes", "Descendants of the worker's main process (DataLoader workers).",
          lambda x: x.tree.dataloader_processes),
    # GPUs
    per_gpu("yolo_train_gpu_utilization_ratio", "GPU busy share, 0 to 1.", "utilization_ratio"),
    per_gpu("yolo_train_gpu_memory_used_bytes", "VRAM in use.", "memory_used_bytes"),
    per_gpu("yolo_train_gpu_memory_total_bytes", "VRAM size.", "memory_total_bytes"),
    per_gpu("yolo_train_gpu_temperature_celsius", "GPU temperature (amdgpu edge sensor, NVML core).",
            "temperature_celsius"),
    per_gpu("yolo_train_gpu_power_watts", "GPU power draw.", "power_watts"),
    gauge("yolo_train_gpu_clock_hertz", "Current GPU clock, by clock domain.",
          lambda x: (((str(g.index), g.pci, g.name, clock), hertz) for g in x.gpus
                     for clock, hertz in g.clocks_hertz.items()), labels=(*GPU_LABELS, "clock"), only_with="gpu"),
)


METRIC_NAMES = frozenset(row.exported for row in METRICS)
