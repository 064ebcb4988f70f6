"""The worker's link to its supervisor: the command channel (a checkpoint-and-stop request, loader workers being
replaced; SIGUSR1 by hand or by the ``stop_request`` fault sets the same stop flag), the supervision a trainer gets
from its launch record (heartbeats, faults, the rung's options and Ultralytics arguments, where to write), and the
patches applied before any model is built. The launching worker (``worker/training/train.py``) and every DDP rank
(``worker/distributed/ddp.py``) build theirs here.
"""

from __future__ import annotations

import os
import time
from typing import Any

from worker.wire.commands import CommandChannel
from worker.wire.contract import CommandKind, LaunchRecord, WorkerOptions
from worker.supervision.exact_resume import ResumePoint
from worker.supervision.faults import FaultInjector
from worker.wire.fault_spec import Fault, faults_from_env
from worker.heartbeat import Heartbeat
from worker.patches import amp_check as amp
from worker.patches import batchnorm, conv2d, offline

STOP_REQUESTED: list[bool] = []  # appended to by the SIGUSR1 handler (by hand, the stop_request fault)


def link_from_record(record: LaunchRecord, hb: Heartbeat, rank: int | None = None,
                     resume_point: ResumePoint | None = None) -> "SupervisorLink":
    """The supervision a trainer gets from its launch record: in the worker itself, or in one DDP rank."""
    faults = [Fault.from_dict(f) for f in record.faults] + faults_from_env()
    injector = FaultInjector(faults, record.attempt, record.fault_flag or f"/tmp/yolo-train-fault-{os.getpid()}",
                             rank=rank)
    placement = {k: record.train[k] for k in ("project", "name", "exist_ok") if k in record.train}
    return SupervisorLink(hb, injector, record.options, record.trainer_args, on_resume=forced_on_resume(record),
                          placement=placement,
                          checkpoint_every=record.checkpoint_every, resume_point=resume_point, rank=rank,
                          checkpoint_in_thread=record.checkpoint_in_thread, commands=CommandChannel.from_env(rank))


def forced_on_resume(record: LaunchRecord) -> dict[str, Any]:
    """What a resume sets over the checkpoint's arguments: the rung's own, and every other key some rung sets at
    this attempt's value, the [train] table's where the rung says nothing, else Ultralytics' default. Ultralytics
    restores its arguments from the checkpoint: after a last.pt written at the ``val = false`` rung, an attempt at
    rung 0 trained with val=False."""
    from ultralytics.cfg import DEFAULT_CFG_DICT  # the worker has imported Ultralytics by now

    configured = {k: record.train.get(k, DEFAULT_CFG_DICT.get(k)) for k in record.rung_keys
                  if k in record.train or k in DEFAULT_CFG_DICT}
    return {**configured, **record.trainer_args}


def apply_patches(record: LaunchRecord) -> None:
    """Before any model is built, so the model Ultralytics' AMP check builds gets the same Conv2d and batch-norm
    paths."""
    conv_on, why = conv2d.should_enable(record.options.conv_fallback or record.patches.conv_fallback, os.environ)
    if conv_on:
        conv2d.enable()
    print(f"yolo-train worker: conv fallback {'on' if conv_on else 'off'} ({why})", flush=True)
    bn_on, why = batchnorm.should_enable(record.patches.batchnorm_fallback, os.environ, conv_fallback=conv_on)
    if bn_on:
        batchnorm.enable()
    print(f"yolo-train worker: batchnorm fallback {'on' if bn_on else 'off'} ({why})", flush=True)
    amp.install(record.patches.amp_check, record.patches.amp_passed)
    offline.install()


class StopForSupervisor(Exception):
    """Raised at a batch boundary after the checkpoint the supervisor asked for is written."""


class SupervisorLink:
    """What the supervised trainer needs from its supervisor: heartbeats, faults and the rung's settings."""

    def __init__(self, hb: Heartbeat, faults: FaultInjector, options: WorkerOptions, forced: dict[str, Any],
                 placement: dict[str, Any] | None = None, checkpoint_every: float | None = None,
                 resume_point: ResumePoint | None = None, rank: int | None = None, checkpoint_in_thread: bool = True,
                 commands: CommandChannel | None = None, on_resume: dict[str, Any] | None = None):
        self.hb = hb
        self.commands = commands or CommandChannel(None)
        self.faults = faults
        self.options = options
        self.forced = forced  # the rung's Ultralytics arguments
        # ... and on a resume, every key some rung sets at this attempt's value (forced_on_resume): none is the
        # checkpoint's
        self.on_resume = {**forced, **(on_resume or {})}
        self.placement = placement or {}  # project/name/exist_ok: where this run writes, whatever a checkpoint says
        self.checkpoint_every = checkpoint_every  # seconds of training between mid-epoch checkpoints; None: never
        self.checkpoint_in_thread = checkpoint_in_thread  # mid-epoch writes off the training step
        self.resume_point = resume_point  # a mid-epoch checkpoint's position, None to start at an epoch's first batch
        self.rank = rank  # the DDP rank this trainer trains as; None outside DDP
        self.batch = 0  # batches of the current epoch trained, skipped ones of a resumed epoch included
        self.first_batch = 0  # the index the current epoch's iteration started at (> 0 in a resumed epoch)
        self.skipped_samples = 0  # the samples a resumed epoch skipped, trained before the checkpoint
        self.started = False
        self.reported_startup = False  # the startup clock is printed once, at the first batch
        self.train_seconds = 0.0  # training time since the last checkpoint, of finished train-phase stretches
        self.train_since: float | None = None  # monotonic start of the current train-phase stretch

    @property
    def seconds_since_checkpoint(self) -> float:
        running = time.monotonic() - self.train_since if self.train_since is not None else 0.0
        return self.train_seconds + running

    def pause_clock(self) -> None:
        if self.train_since is not None:
            self.train_seconds += time.monotonic() - self.train_since
            self.train_since = None

    def checkpoint_written(self) -> None:
        self.train_seconds = 0.0
        if self.train_since is not None:
            self.train_since = time.monotonic()

    @property
    def stop_requested(self) -> bool:
        """Asked to save and exit: polled at every batch boundary (a read that finds nothing, as a rule)."""
        if not STOP_REQUESTED and self.commands.has(CommandKind.CHECKPOINT_AND_STOP):
            STOP_REQUESTED.append(True)
        return bool(STOP_REQUESTED)

    @property
    def writes_checkpoints(self) -> bool:
        return self.rank in (None, 0)  # under DDP rank 0 alone, as Ultralytics' own saves

