"""Several GPUs: Ultralytics' own DDP launch, supervised in every rank.

With ``device = "0,1"`` Ultralytics' trainer does not train in its own process: it pickles its class, arguments,
model and callbacks, writes a script that rebuilds the trainer from them, runs it under ``python -m
torch.distributed.run --nproc_per_node N`` and waits. Three things in that path stop a supervised trainer, and this
module is where each is answered:

- the script imports the trainer class by module and name, so the supervised classes live at module level, in
  ``worker/training/trainers.py``;
- the script rebuilds the trainer with only ``cfg``, ``overrides`` and ``_callbacks``, and torch.distributed.run
  closes every inherited descriptor: the launching worker leaves the launch record's path and the heartbeat pipe's
  ``/proc`` path in the environment its ranks inherit (``prepare_ranks``), and each rank's trainer builds its own
  ``SupervisorLink`` from them (``rank_link``): patches, rung, faults, a heartbeat client that says its rank, and
  the mid-epoch checkpoint's position the launching worker read, so every rank resumes its share of that epoch at
  the checkpoint's batch (worker/supervision/exact_resume.py);
- Ultralytics gives every collective a 3-hour timeout: ``setup_process_group`` makes it
  ``YOLO_TRAIN_COLLECTIVE_TIMEOUT`` seconds, so a rank left waiting on a dead or frozen peer fails in minutes.

CPU drill: Ultralytics never uses DDP with ``device = "cpu"`` (its world size is 0 there) and its DDP setup needs
CUDA. With ``YOLO_TRAIN_CPU_RANKS = N`` and ``device = "cpu"`` the trainer takes the DDP branch with N ranks anyway:
the same generated script under the same torch.distributed.run, the same DistributedSampler, rank-0-only saving and
broadcasts; what differs is only the device (cpu in every rank), the backend (gloo), the DDP wrapper, built
without ``device_ids`` (torch refuses them for a CPU module), and the final validation's device (Ultralytics puts
a rank's on CUDA). The tests use it; a real run has no use for it.
"""

from __future__ import annotations

import os
import signal
from datetime import timedelta
from pathlib import Path
from types import SimpleNamespace
from typing import Any, Callable

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel
from ultralytics.engine import validator
from ultralytics.utils import LOCAL_RANK, RANK

from worker.startup import startup_steps
from worker.wire.contract import ENV_COMMAND_FD, ENV_CPU_RANKS, LaunchRecord, StartupStep, loader_workers
from worker.supervision.exact_resume import ResumePoint
from worker.heartbeat import Heartbeat
from worker.wire.heartbeat_protocol import ENV_FD, ENV_PATH
from worker.supervision.link import STOP_REQUESTED, SupervisorLink, apply_patches, link_from_record
from worker.loading.loaders import die_with_parent, drop_ambient_capabilities, start_forkserver
from worker.startup.startup_clock import CLOCK

ENV_LAUNCH_RECORD = "YOLO_TRAIN_LAUNCH_RECORD"  # the launch record's path, for the ranks
ENV_RESUME_POINT = "YOLO_TRAIN_RESUME_POINT"  # "EPOCH:BATCHES:SAMPLES" of a mid-epoch checkpoint, for the ranks
ENV_COLLECTIVE_TIMEOUT = "YOLO_TRAIN_COLLECTIVE_TIMEOUT"  # seconds a rank may wait in one collective
COLLECTIVE_TIMEOUT = 600.0  # default: longer than a validation pass (the other ranks wait for rank 0's)

# For NCCL ranks, set unless the user's [worker] env says otherwise: a timed-out collective tears the process down
# (instead of leaving it in a CUDA kernel that never returns), and NCCL's own watchdog thread, which notices a
# stuck communicator, is on and reports within a minute.
NCCL_ENV = {
    "TORCH_NCCL_ASYNC_ERROR_HANDLING": "1",
    "TORCH_NCCL_ENABLE_MONITORING": "1",
    "TORCH_NCCL_HEARTBEAT_TIMEOUT_SEC": "60",
    "OMP_NUM_THREADS": "1",  # torch.distributed.run's own default, said here so it does not warn about it
}


def collective_timeout() -> timedelta:
    value = os.environ.get(ENV_COLLECTIVE_TIMEOUT, "")
    try:
        seconds = float(value) if value else COLLECTIVE_TIMEOUT
    except ValueError:
        seconds = -1.0
    if seconds <= 0:
        raise ValueError(f"{ENV_COLLECTIVE_TIMEOUT}={value!r}: expected seconds > 0, e.g. 600 (set it in the "
                         f"config's [worker] env)")
    return timedelta(seconds=seconds)


def cpu_ranks() -> int:
    value = os.environ.get(ENV_CPU_RANKS, "")
    if value and not (value.isdigit() and int(value) >= 2):
        raise ValueError(f"{ENV_CPU_RANKS}={value!r}: expected a number of ranks >= 2, or unset")
    return int(value) if value else 0


def prepare_ranks(record_path: str, heartbeat_fd: int | None, resume_point: ResumePoint | None = None) -> None:
    """In the launching worker, before Ultralytics starts torch.distributed.run: what its ranks will inherit."""
    collective_timeout()  # a wrong value is said once, here, not by every rank
    os.environ[ENV_LAUNCH_RECORD] = str(Path(record_path).resolve())
    if resume_point is not None:
        samples = "" if resume_point.samples is None else resume_point.samples
        os.environ[ENV_RESUME_POINT] = f"{resume_point.epoch}:{resume_point.batches}:{samples}"
    else:
        os.environ.pop(ENV_RESUME_POINT, None)
    # The descriptor number means nothing in a rank (it is closed there, or another file): the /proc path does.
    os.environ.pop(ENV_FD, None)
    os.environ.pop(ENV_COMMAND_FD, None)  # each rank reads its own command pipe (worker/wire/commands.py)
    if heartbeat_fd is not None:
        os.environ[ENV_PATH] = f"/proc/{os.getpid()}/fd/{heartbeat_fd}"
    for key, value in NCCL_ENV.items():
        os.environ.setdefault(key, value)


def rank_link() -> SupervisorLink:
    """A rank's supervision, rebuilt from what the launching worker left in the environment."""
    path = os.environ.get(ENV_LAUNCH_RECORD)
    if not path:
        raise RuntimeError(f"a supervised trainer without a SupervisorLink is a DDP rank, but {ENV_LAUNCH_RECORD} "
                           f"is not set: start training with `python -m worker LAUNCH.json`")
    rank = int(os.environ["RANK"])
    # The supervisor's "save and exit" reaches rank 0 only (forward_stop): it alone writes checkpoints.
    signal.signal(signal.SIGUSR1, (lambda *_: STOP_REQUESTED.append(True)) if rank == 0 else signal.SIG_IGN)
    die_with_parent()
    drop_ambient_capabilities()
    record = LaunchRecord.from_json(Path(path).read_text(), source=path)
    if record.options.forks_from_server(loader_workers(record.train, record.trainer_args)):
        # at the rank's first line, before its process group, model and checkpoint (and any thread): forked from the
        # rank, whose imports are done, ready before the loader first asks for a worker
        start_forkserver(fork=True)
    apply_patches(record)
    startup_steps.install()
    CLOCK.rank_started()
    hb = Heartbeat.from_env(witness=True)  # the rank's own witness, on its main thread (worker/witness.py)
    hb.phase("setup")
    # the rank's steps, kept per rank for the restart's parts (the incident's rank_parts)
    startup_steps.STEPS.attach(hb)
    startup_steps.STEPS.enter(StartupStep.CHECKPOINT)  # the trainer built by the caller: its arguments, the checkpoint's read
    return link_from_record(record, hb, rank=rank, resume_point=resume_point_from_env())


def resume_point_from_env() -> ResumePoint | None:
    value = os.environ.get(ENV_RESUME_POINT, "")
    if not value:
        return None
    epoch, batches, samples = value.split(":")
    return ResumePoint(int(epoch), int(batches), int(samples) if samples else None)


def adopt_cpu_drill(trainer: Any) -> None:
    """After BaseTrainer.__init__: with the CPU drill on, a CPU trainer takes the DDP branch with its ranks."""
    n = cpu_ranks()
    if n and trainer.device.type == "cpu":
        trainer.world_size = n
        trainer.ddp = LOCAL_RANK == -1  # the launcher; a rank trains


def setup_process_group(trainer: Any, ultralytics_setup: Callable[[], None]) -> None:
    """Ultralytics' ``_setup_ddp`` with our collective timeout (it asks for 3 hours), or the CPU drill's gloo."""
    timeout = collective_timeout()
    if trainer.device.type == "cpu":
        torch.set_num_threads(1)  # N ranks on a few cores: one thread each, or they fight over them
        dist.init_process_group(backend="gloo", timeout=timeout, rank=RANK, world_size=trainer.world_size)
        torch.nn.parallel.DistributedDataParallel = _CpuDistributedDataParallel
        _final_validation_on_cpu()
        return
    original = dist.init_process_group

    def with_our_timeout(*args: Any, **kwargs: Any) -> Any:
        kwargs["timeout"] = timeout
        return original(*args, **kwargs)

    dist.init_process_group = with_our_timeout
    try:
        ultralytics_setup()
    finally:
        dist.init_process_group = original


def forward_stop() -> bool:
    """In the launching worker, on the supervisor's SIGUSR1: pass it to rank 0 (through torch.distributed.run), which
    saves at its next batch boundary and stops; False when no rank 0 runs. Rank 0 is the shallowest descendant
    started with RANK=0: the rank itself, or the stub that stands for a rank forked by the rank server
    (worker/standby/rank_server.py), which passes the signal on (a rank's loader workers, deeper, inherit its RANK)."""
    level = _children(os.getpid())
    while level:
        for pid in level:
            try:
                environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
            except OSError:
                continue
            if b"RANK=0" in environ:
                try:
                    os.kill(pid, signal.SIGUSR1)
                    return True
                except ProcessLookupError:
                    return False
        level = [child for pid in level for child in _children(pid)]
    return False


def _children(pid: int) -> list[int]:
    try:
        text = Path(f"/proc/{pid}/task/{pid}/children").read_text()
    except OSError:
        return []
    return [int(p) for p in text.split()]


def _final_validation_on_cpu() -> None:
    """Ultralytics' validator puts a DDP rank's final validation on ``cuda:<current device>``: the drill's is cpu."""
    auto_backend = validator.AutoBackend
    validator.get_torch_device_backend = lambda _type: SimpleNamespace(current_device=lambda: 0)  # no CUDA init
    validator.AutoBackend = lambda *args, device=None, **kwargs: auto_backend(*args, device=torch.device("cpu"),
                                                                               **kwargs)


class _CpuDistributedDataParallel(DistributedDataParallel):
    """Ultralytics passes ``device_ids=[device.index]``; for a CPU module torch wants none."""

    def __init__(self, module: Any, device_ids: Any = None, **kwargs: Any):
        super().__init__(module, device_ids=None, **kwargs)
