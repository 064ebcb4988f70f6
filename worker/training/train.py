"""The supervised training worker's entry points: ``main`` reads the launch record (or waits for one as a standby) and
``train`` runs Ultralytics training with heartbeats, the rung's settings and fault hooks, in this process or in DDP
ranks.

Started by the supervisor as ``python -m worker LAUNCH.json``; the launch record (``worker/wire/contract.py``) says what
to train, how safely (the current rung: trainer arguments, worker options, environment), from where (a checkpoint
or none) and which faults to inject. It can be run by hand with the same file. ``worker/__main__.py`` sets what must
come before this module's imports (Ultralytics among them); ``worker/supervision/link.py`` holds the supervisor link,
``worker/training/trainer.py`` the supervised trainer, ``worker/training/trainers.py`` its classes and ``worker/distributed/ddp.py`` the ranks.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from ultralytics.nn.tasks import guess_model_task, yaml_model_load

from worker.distributed import ddp, multinode
from worker.standby import rank_server, ready
from worker.startup import startup_steps
from worker.checkpoints.checkpointing import (EXACT_KEY, identity_mismatch, identity_refusal, is_finished, readable_checkpoint,
                                  strip_atomically)
from worker.wire.commands import relay_to_ranks
from worker.wire.contract import (ENV_FORKSERVER, ENV_RANK_STANDBY, EXIT_CONFIG, PRIME_WORD, STANDBY_FLAG, LaunchRecord,
                             LaunchRecordError, StartupStep, loader_workers)
from worker.startup.demo_data import ensure_demo_dataset
from worker.supervision.exact_resume import ResumePoint
from worker.heartbeat import Heartbeat
from worker.supervision.link import STOP_REQUESTED, StopForSupervisor, apply_patches, link_from_record
from worker.loading.loaders import die_with_parent, drop_ambient_capabilities, start_forkserver
from worker.startup.startup_clock import CLOCK
from worker.training.trainers import supervised_trainer
def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print(f"usage: python -m worker LAUNCH.json | python -m worker {STANDBY_FLAG}", file=sys.stderr)
        return 2
    parent = os.getppid()
    die_with_parent()
    drop_ambient_capabilities()
    record_path = argv[0]
    if record_path == STANDBY_FLAG:
        record_path = stand_by(parent)
        if record_path is None:
            return 0  # discarded, or the supervisor is gone: nothing was started
    try:
        record = LaunchRecord.from_json(Path(record_path).read_text(), source=record_path)
    except (OSError, LaunchRecordError) as e:
        print(f"yolo-train worker: {e}", file=sys.stderr)
        return 2
    if record.supervisor_pid and os.getppid() != record.supervisor_pid:
        return 1  # the supervisor died before we armed the parent-death signal
    hb = Heartbeat.from_env(witness=True)  # where this thread waits, while it makes no progress (worker/witness.py)
    hb.phase("setup")
    startup_steps.STEPS.attach(hb)
    try:
        return train(record, hb, record_path=record_path)
    except BaseException as e:  # our last words, so the supervisor can name the failure
        if not isinstance(e, SystemExit):
            hb.error(f"{type(e).__name__}: {e}")
        raise


def stand_by(parent: int) -> str | None:
    """The standby worker: with the imports a start spends seconds on done (torch, Ultralytics and our trainer by this
    module's own, two more here), wait, idle, for the supervisor to write a launch record's path on stdin; None at
    its end (discarded, or the supervisor gone). Unless the supervisor found room for a ready standby
    (worker/standby/ready.py), nothing touches a GPU before the launch: such a standby holds no device memory and no driver
    state, and the rung's environment, fixed at its spawn, is all it has read."""
    if os.getppid() != parent:
        return None  # the supervisor died before the parent-death signal was armed
    import torch  # noqa: F401
    import torch._inductor  # noqa: F401  (init_seeds' use_deterministic_algorithms imports it)
    import torchvision  # noqa: F401  (the validator's metrics import it)
    from matplotlib import font_manager  # noqa: F401  (the dataset check's font lookup, worker/patches/offline.py)

    if os.environ.get(ENV_RANK_STANDBY):  # before the forkserver and any thread: the ranks are forks of this one
        rank_server.start(Path(os.environ[ENV_RANK_STANDBY]))
    if os.environ.get(ENV_FORKSERVER) == "1":
        start_forkserver()  # its imports are paid while we wait, too
    ready.prepare_from_env()  # where the device has room: the context and the model, then sleep (worker/standby/ready.py)

    line = sys.stdin.readline().strip()
    while line.split(" ", 1)[0] == PRIME_WORD:  # a restart is coming, from this checkpoint: its batches load now
        print(f"yolo-train standby: {ready.prime(line.partition(' ')[2] or None)}{ready.warm_at_the_verdict()}",
              flush=True)
        line = sys.stdin.readline().strip()
    CLOCK.restart()  # the start that counts is the launch's, not the wait's
    ready.launched()
    return line or None


def train(record: LaunchRecord, hb: Heartbeat, record_path: str | None = None) -> int:
    args = {**record.train, **record.trainer_args}
    if record.options.forks_from_server(loader_workers(record.train, record.trainer_args)):
        start_forkserver()  # before the trainer touches a GPU; it imports while this process builds the trainer
    apply_patches(record)
    startup_steps.install()
    if args.get("data") == "demo":
        args["data"] = str(ensure_demo_dataset())
    task = args.get("task") or task_of(args.get("model", "yolov8n.yaml"))
    CLOCK.mark("interpreter and imports")
    startup_steps.STEPS.enter(StartupStep.CHECKPOINT)
    resume_point = None
    if record.resume:
        try:
            resume, ckpt = readable_checkpoint(record.resume)
        except ValueError as e:
            print(f"yolo-train worker: {e}", file=sys.stderr, flush=True)
            return 1
        mismatch = identity_mismatch(ckpt, {**args, "task": task})
        if mismatch:
            print(identity_refusal(resume, mismatch), file=sys.stderr, flush=True)
            return EXIT_CONFIG
        if is_finished(ckpt):
            if ckpt.get("optimizer") is not None:  # stopped in the final validation, before Ultralytics' own strip
                strip_finished(Path(resume))
            print(f"yolo-train worker: {resume} holds a finished training; nothing to resume", flush=True)
            # where it finished: a host restarted once the job was done shows the epochs trained, not 0 of 0
            epochs = (ckpt.get("train_args") or {}).get("epochs")
            hb.phase("done", **({"epoch": epochs, "epochs": epochs} if isinstance(epochs, int) else {}))
            return 0
        ready.resuming(resume)  # a loader a standby fed from another checkpoint's position is not taken
        exact = ckpt.get(EXACT_KEY)
        resume_point = ResumePoint(exact["epoch"], exact["batch"], exact.get("samples")) if exact else None
        del ckpt
        args["resume"] = resume
        args["model"] = resume
    trainer_cls = supervised_trainer(task)
    link = link_from_record(record, hb, resume_point=resume_point)
    if record.rendezvous is not None:
        multinode.install(record.rendezvous, record_path or ".")
    trainer = trainer_cls(overrides=args, link=link)
    CLOCK.mark("trainer (checkpoint read, arguments)")
    if trainer.ddp:  # Ultralytics will train in ranks under torch.distributed.run: tell them where we are
        hb.stop_witness()  # this process only waits for the ranks; each rank has its own witness
        return train_in_ranks(trainer, record_path, hb, record)
    try:
        trainer.train()
    except StopForSupervisor:
        return 0
    hb.phase("done")
    link.faults.after_done()
    return 0


def train_in_ranks(trainer: Any, record_path: str | None, hb: Heartbeat, record: LaunchRecord) -> int:
    """Ultralytics' own DDP launch, each rank supervised (worker/distributed/ddp.py). A rank that fails fails the launch; after
    the supervisor's "save and exit" that is rank 0 stopping as asked. Several hosts: a rendezvous that ended before
    any rank of this host started is joined again in place (``multinode.rejoin``), not a crash."""
    if record_path is None:
        raise ValueError("DDP training needs the launch record's path for its ranks: run `python -m worker FILE`")
    ddp.prepare_ranks(record_path, hb.fd, trainer.link.resume_point)
    launch_through_rank_server()
    os.environ.update(relay_to_ranks(trainer.link.commands, trainer.world_size,
                                     on_stop=lambda: STOP_REQUESTED.append(True)))
    signal.signal(signal.SIGUSR1, lambda *_: (STOP_REQUESTED.append(True), ddp.forward_stop()))  # by hand
    began = time.monotonic()
    bound = multinode.bound_the_launch(record.rendezvous, multinode.started_dir()) \
        if record.rendezvous is not None else None
    try:
        tries = 0
        while True:
            if record.rendezvous is not None:
                multinode.arm_launcher_error(multinode.started_dir())
            try:
                trainer.train()
                break
            except subprocess.CalledProcessError as e:
                if STOP_REQUESTED:
                    return 0
                if record.rendezvous is None:
                    print(f"yolo-train worker: a rank failed (torch.distributed.run exited with {e.returncode})",
                          file=sys.stderr, flush=True)
                    return 1
                again = multinode.rejoin(record.rendezvous, multinode.started_dir(), began, tries, e.returncode)
                if again is None:
                    code, line = multinode.launch_failure(record.rendezvous, multinode.started_dir(), began)
                    print(line, file=sys.stderr, flush=True)
                    return code
                pause, line = again
                print(line, file=sys.stderr, flush=True)
                time.sleep(pause)
                tries += 1
                if STOP_REQUESTED:
                    return 0
    finally:
        if bound is not None:
            bound.cancel()
        if record.rendezvous is not None:
            multinode.forget_started()
    hb.phase("done")
    trainer.link.faults.after_done()
    return 0


def launch_through_rank_server() -> None:
    """With the ranks' server running (a standby made for DDP: worker/standby/rank_server.py), torch.distributed.run and every
    rank are forked from it: Ultralytics' command (or the rendezvous's, worker/distributed/multinode.py) goes through its stubs."""
    if not os.environ.get(rank_server.ENV_ADDRESS):
        return
    from ultralytics.engine import trainer as engine

    command = engine.generate_ddp_command

    def through_the_server(trainer: Any) -> tuple[list[str], str]:
        cmd, file = command(trainer)
        return rank_server.through_server(cmd), file

    engine.generate_ddp_command = through_the_server


def strip_finished(last: Path) -> None:
    """The last epoch trained, its worker stopped in the final validation: last.pt and best.pt stripped of their
    optimizers as Ultralytics' final evaluation does first (its validation of best.pt is what is not done)."""
    from ultralytics.utils.torch_utils import strip_optimizer

    for path in (last, last.with_name("best.pt")):
        if path.exists():
            strip_atomically(strip_optimizer)(path)
    print(f"yolo-train worker: {last} holds every epoch trained (its final validation did not finish): "
          f"{last.name} and best.pt stripped of their optimizers, as Ultralytics does", flush=True)


def task_of(model: str) -> str:
    # A model YAML is guessed from its contents; given as a path, Ultralytics only warns and assumes detect.
    return guess_model_task(yaml_model_load(model) if str(model).endswith((".yaml", ".yml")) else model)

