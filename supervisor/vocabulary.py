"""The supervisor's words: the one spelling of every state, reason, kind and phase that is shown or exported.

Metrics, the dashboard builder, status and docs/design.md import these enums instead of copying their values, so a
new member reaches every label set at once (``tests/ground/test_vocabulary.py`` holds them to it).
"""

from __future__ import annotations

from enum import Enum

from worker.wire.contract import Phase


class State(str, Enum):
    """The supervisor's life cycle; the transitions are told in ``core.py``'s docstring and checked there."""
    STARTING = "starting"  # a worker is spawned and has not trained a batch yet
    HEALTHY = "healthy"  # the worker trains and shows progress
    STOPPING = "stopping"  # the worker's tree is being killed, or asked to save and exit
    BACKOFF = "backoff"  # after a crash, waiting before the next attempt
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    STOPPED = "stopped"  # asked to stop; the next run resumes
    UNSAVED = "unsaved"  # trained to the end, and no last.pt or best.pt was kept (exit 73): the next run starts over


FINAL_STATES = frozenset({State.SUCCEEDED, State.FAILED, State.STOPPED, State.UNSAVED})


class MiopenMode(str, Enum):
    """How PyTorch asks MIOpen for a convolution's kernels (decision/model/miopen_modes.py): the incident's and
    ``yolo-train doctor``'s word."""
    IMMEDIATE = "immediate"  # the find-db's solution or a heuristic's, no find and no search
    FIND = "normal find"  # miopenFind*Algorithm without exhaustiveSearch: what a find does is MIOPEN_FIND_MODE's
    EXHAUSTIVE = "exhaustive"  # miopenFind*Algorithm with exhaustiveSearch: every new shape is tuned


class WorkerStart(str, Enum):
    """How an attempt's worker process came: ``status --json``'s ``standby_kind`` (the one waiting) and an incident's
    ``restart_start`` (the one that took the restart)."""
    COLD = "cold"  # a new interpreter: imports, device context, model, dataset and loaders after the verdict
    IMPORTED = "imported"  # a standby that had imported torch, Ultralytics and the trainer
    READY = "ready"  # a standby that also held the device context and the model built (worker/standby/ready.py)


class Reason(str, Enum):
    """Why a worker was stopped: the ``reason`` of an incident and of ``yolo_train_restarts_total``."""
    HANG = "hang"  # no progress within its phase's timeout
    CRASH = "crash"  # exited before training finished
    OOM = "oom"  # out of memory: the kernel's OOM killer or the GPU's
    KERNEL = "kernel"  # a kernel stall or GPU-fault line, and no progress within the confirm window
    NAN = "nan"  # non-finite losses batch after batch
    STOP = "stop"  # asked to stop (SIGTERM, SIGINT)
    PROBE = "probe"  # a planned stop to try the faster rung below (not a failure: no budget, nothing lost)
    # Several hosts: this host's rank lost another host's in a collective (its connection reset, NCCL's remote error):
    # the other host's failure, not this one's: restarted at once, no crash counted, no backoff, no rung change.
    PEER = "peer"


class KernelKind(str, Enum):
    """What a classified kernel line or GPU device event means for the worker (see kernel/catalogue.py)."""
    STALL = "stall"  # the kernel saw a task or workqueue stuck: suspicion, confirmed by a lack of progress
    GPU_FAULT = "gpu_fault"  # a GPU page fault, ring timeout or reset: suspicion likewise
    GPU_LOST = "gpu_lost"  # the GPU is gone until a reboot
    OOM = "oom"  # the OOM killer took a process


class After(str, Enum):
    """What the supervisor does once a stopped worker's tree is gone."""
    RESTART = "restart"  # a new attempt, maybe one rung safer, maybe after a backoff
    STOP = "stop"  # exit 0; the next run resumes
    SUCCEED = "succeed"  # training finished
    UNSAVED = "unsaved"  # training finished and no weights file was kept: exit 73
    CONFIG_ERROR = "config_error"  # exit 78: restarting cannot help
    REBOOT = "reboot"  # exit 3: the GPU needs a reboot


class Tier(str, Enum):
    """A recovery tier (decision/recovery/), as an incident says how it was recovered from: the spelling of incidents, status --json and the metric's label."""
    IN_PLACE = "in_place"  # only the hung DataLoader worker processes were replaced; the training process went on
    RESTART = "restart"  # the tree was killed and a new worker resumed from the newest checkpoint

    @property
    def label(self) -> str:
        """For people: "in-place", "restart"."""
        return self.value.replace("_", "-")


class Remedy(str, Enum):
    """What a failure signature asks for (see signatures.py); each is chosen in one place, ``core._remedy``."""
    CONFIG_ERROR = "config_error"  # restarting cannot help: exit 78 with the signature's advice
    HALVE_BATCH = "halve_batch"  # GPU out of memory: the next attempt with half the batch
    CONV_FALLBACK = "conv_fallback"  # a hang before the first batch after MIOpen's warning: the Conv2d fallback on
    COLLECTIVE_HANG = "collective_hang"  # torch's own collective timeout ended a rank: the hang it was, restarted as one
    GPU_HANG = "gpu_hang"  # ROCr aborted the worker on a GPU hang (or memory it could not free): a hang, up the ladder
    PEER_LOST = "peer_lost"  # several hosts: a rank lost another host's rank mid-collective: Reason.PEER, restarted at once


# The phase of an incident before the worker's first training batch (its own phase is setup, or none yet).
STARTUP_PHASE = "startup"
# Where a hang can be detected: before the first batch (STARTUP_PHASE), in a phase of training, or after training was
# done and the worker never exited ("done": killed, the run ends as succeeded).
HANG_PHASES = (STARTUP_PHASE,) + tuple(p.value for p in Phase if p != Phase.SETUP)
# The phase label of the metrics: a worker's phase, or "none" while no worker runs.
NO_PHASE = "none"
PHASE_LABELS = tuple(p.value for p in Phase) + (NO_PHASE,)
