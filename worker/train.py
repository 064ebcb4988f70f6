"""The supervised training worker: Ultralytics training with heartbeats, the rung's settings and fault hooks.

Started by the supervisor as ``python -m worker SETTINGS.json``; the settings file says what to train
(``train``: the ``[train]`` arguments), how safely (``overrides``: the current rung), from where
(``resume``: a checkpoint or null) and which faults to inject. It can be run by hand with the same file.
"""

from __future__ import annotations

import json
import os
import signal
import sys
from pathlib import Path
from typing import Any

from worker.faults import Fault, FaultInjector, faults_from_env
from worker.heartbeat import Heartbeat

STOP_REQUESTED: list[bool] = []  # appended to by the SIGUSR1 handler


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print("usage: python -m worker SETTINGS.json", file=sys.stderr)
        return 2
    # First thing: SIGUSR1 (the supervisor's "save and exit") must never meet its default action, death.
    signal.signal(signal.SIGUSR1, lambda *_: STOP_REQUESTED.append(True))
    settings = json.loads(Path(argv[0]).read_text())
    os.environ.setdefault("YOLO_OFFLINE", "1")  # no download attempt may stall a run: fonts, AMP check weights
    os.environ.setdefault("MPLBACKEND", "Agg")
    from worker.loaders import die_with_parent, drop_ambient_capabilities

    die_with_parent()
    drop_ambient_capabilities()
    if settings.get("supervisor_pid") and os.getppid() != settings["supervisor_pid"]:
        return 1  # the supervisor died before we armed the parent-death signal
    hb = Heartbeat.from_env()
    hb.phase("setup")
    try:
        return train(settings, hb)
    except BaseException as e:  # our last words, so the supervisor can name the failure
        if not isinstance(e, SystemExit):
            hb.error(f"{type(e).__name__}: {e}")
        raise


def train(settings: dict[str, Any], hb: Heartbeat) -> int:
    attempt = int(settings.get("attempt", 1))
    faults = [Fault.from_dict(f) for f in settings.get("faults", [])] + faults_from_env()
    injector = FaultInjector(faults, attempt, settings.get("fault_flag") or f"/tmp/yolo-train-fault-{os.getpid()}")
    args = dict(settings["train"])
    overrides = dict(settings.get("overrides", {}))
    persistent = bool(overrides.pop("persistent_workers", True))
    patches = settings.get("patches", {})
    apply_patches(overrides.pop("conv_fallback", patches.get("conv_fallback", "auto")),
                  patches.get("amp_check", "local"))
    args.update(overrides)
    if args.get("data") == "demo":
        from worker.demo_data import ensure_demo_dataset

        args["data"] = str(ensure_demo_dataset())
    resume = settings.get("resume")
    if resume:
        finished = checkpoint_finished(resume)
        if finished:
            print(f"yolo-train worker: {resume} holds a finished training; nothing to resume", flush=True)
            hb.phase("done")
            return 0
        args["resume"] = resume
        args["model"] = resume
    trainer_cls = supervised_trainer(args.get("task") or task_of(args.get("model", "yolov8n.yaml")))
    supervision = Supervision(hb, injector, persistent, overrides)
    trainer = trainer_cls(overrides=args, supervision=supervision)
    try:
        trainer.train()
    except StopForSupervisor:
        return 0
    hb.phase("done")
    return 0


def apply_patches(conv_fallback: str, amp_check: str) -> None:
    """Before any model is built, so the model Ultralytics' AMP check builds gets the same Conv2d path."""
    from worker.patches import amp_check as amp
    from worker.patches import conv2d, offline

    enable, why = conv2d.should_enable(conv_fallback, os.environ)
    if enable:
        conv2d.enable()
    print(f"yolo-train worker: conv fallback {'on' if enable else 'off'} ({why})", flush=True)
    amp.install(amp_check)
    offline.install()


def checkpoint_finished(path: str) -> bool:
    """Ultralytics strips the optimizer and sets epoch -1 once training is over: then there is nothing to resume."""
    import torch

    ckpt = torch.load(path, map_location="cpu", weights_only=False)
    return ckpt.get("epoch", -1) == -1


def task_of(model: str) -> str:
    from ultralytics.nn.tasks import guess_model_task, yaml_model_load

    # A model YAML is guessed from its contents; given as a path, Ultralytics only warns and assumes detect.
    return guess_model_task(yaml_model_load(model) if str(model).endswith((".yaml", ".yml")) else model)


class StopForSupervisor(Exception):
    """Raised at a batch boundary after the checkpoint the supervisor asked for is written."""


class Supervision:
    """What the supervised trainer needs from its supervisor: heartbeats, faults and the rung's settings."""

    def __init__(self, hb: Heartbeat, faults: FaultInjector, persistent_workers: bool, forced: dict[str, Any]):
        self.hb = hb
        self.faults = faults
        self.persistent_workers = persistent_workers
        self.forced = forced  # the rung's Ultralytics arguments: they win over a checkpoint's on resume
        self.batch = 0
        self.started = False

    @property
    def stop_requested(self) -> bool:
        return bool(STOP_REQUESTED)


def supervised_trainer(task: str) -> type:
    from ultralytics.models import yolo

    bases = {"detect": yolo.detect.DetectionTrainer, "segment": yolo.segment.SegmentationTrainer,
             "pose": yolo.pose.PoseTrainer, "obb": yolo.obb.OBBTrainer,
             "classify": yolo.classify.ClassificationTrainer}
    return type(f"Supervised{bases[task].__name__}", (SupervisedTrainerMixin, bases[task]), {})


class SupervisedTrainerMixin:
    """Mixed in front of an Ultralytics trainer; each override says which Ultralytics behaviour it corrects."""

    def __init__(self, *args: Any, supervision: Supervision, **kwargs: Any):
        self.supervision = supervision  # set first: BaseTrainer.__init__ calls check_resume
        super().__init__(*args, **kwargs)
        # BaseTrainer.__init__ forces workers=0 on CPU, which would make DataLoader-worker hangs impossible
        # to reproduce there; honour what was asked.
        requested = supervision.forced.get("workers", kwargs.get("overrides", {}).get("workers"))
        if requested is not None:
            self.args.workers = requested
        self._add_supervision_callbacks()

    def check_resume(self, overrides: dict[str, Any]) -> None:
        super().check_resume(overrides)
        if self.resume:
            # Resume restores the checkpoint's arguments and lets only a few be overridden (amp, for one,
            # not): the rung's settings must win, or climbing the ladder would change nothing.
            for key, value in self.supervision.forced.items():
                setattr(self.args, key, value)

    def get_dataloader(self, dataset_path: str, batch_size: int = 16, rank: int = 0, mode: str = "train"):
        from worker.loaders import chain_worker_init, die_with_parent, hook_samples, make_epoch_workers

        loader = super().get_dataloader(dataset_path, batch_size, rank, mode)
        chain_worker_init(loader, die_with_parent)
        if mode == "train":
            hook_samples(loader.dataset, self.supervision.faults.in_dataloader_worker)
        if not self.supervision.persistent_workers:
            make_epoch_workers(loader)
        return loader

    def _add_supervision_callbacks(self) -> None:
        sup, hb = self.supervision, self.supervision.hb

        def position() -> dict[str, Any]:
            return {"epoch": self.epoch + 1, "epochs": self.epochs, "batch": sup.batch,
                    "batches": len(self.train_loader) if getattr(self, "train_loader", None) else 0}

        def on_train_start(trainer) -> None:
            hb.settings(self.settings_in_force())

        def on_train_epoch_start(trainer) -> None:
            sup.batch = 0
            hb.phase("train", **position())
            if not sup.started:
                sup.started = True
                sup.faults.before_first_batch()

        def on_train_batch_end(trainer) -> None:
            sup.batch += 1
            tloss = getattr(self, "tloss", None)  # running means of this epoch's losses: {name: tensor}
            losses = {str(k): round(float(v), 5) for k, v in tloss.items()} if isinstance(tloss, dict) else {}
            hb.beat(**position(), samples=self.batch_size, losses=losses,
                    lr=self.optimizer.param_groups[0]["lr"])
            if sup.stop_requested:
                self.save_for_stop()
            sup.faults.after_train_batch()

        def on_train_epoch_end(trainer) -> None:
            hb.phase("save", **position())

        def on_val_start(validator) -> None:
            hb.phase("val", **position())

        def on_val_batch_end(validator) -> None:
            hb.beat(**position())
            sup.faults.after_val_batch()

        def on_val_end(validator) -> None:
            hb.phase("save", **position())

        def on_model_save(trainer) -> None:
            hb.beat(**position())

        for event, callback in (("on_train_start", on_train_start), ("on_train_epoch_start", on_train_epoch_start),
                                ("on_train_batch_end", on_train_batch_end), ("on_train_epoch_end", on_train_epoch_end),
                                ("on_val_start", on_val_start), ("on_val_batch_end", on_val_batch_end),
                                ("on_val_end", on_val_end), ("on_model_save", on_model_save)):
            self.add_callback(event, callback)

    def save_for_stop(self) -> None:
        """Write last.pt now, mid-epoch, and stop. Ultralytics resumes at the epoch after the checkpoint's, so the
        checkpoint is labelled as the previous epoch's: the resumed run repeats this epoch's batches with these
        weights instead of losing them. In the first epoch there is nothing to resume from, so nothing is saved."""
        if self.epoch > 0:
            hb = self.supervision.hb
            hb.phase("save", epoch=self.epoch + 1, epochs=self.epochs, batch=self.supervision.batch)
            epoch, best = self.epoch, self.best
            self.epoch, self.best = epoch - 1, Path(os.devnull)  # best.pt stays what validation chose
            try:
                self.save_model()
            finally:
                self.epoch, self.best = epoch, best
            hb.beat(epoch=self.epoch + 1, epochs=self.epochs, batch=self.supervision.batch)
            print(f"yolo-train worker: saved {self.last} at epoch {self.epoch + 1} batch {self.supervision.batch} "
                  f"on the supervisor's request", flush=True)
        raise StopForSupervisor()

    def settings_in_force(self) -> dict[str, Any]:
        import torch
        import ultralytics

        from worker.loaders import EpochWorkersDataLoader
        from worker.patches import conv2d

        loader = self.train_loader
        return {
            "workers": loader.num_workers,
            "persistent_workers": loader.num_workers > 0 and not isinstance(loader, EpochWorkersDataLoader),
            "val": bool(self.args.val),
            "amp": bool(self.amp),
            "batch": self.batch_size,
            "imgsz": self.args.imgsz,
            "device": str(self.device),
            "resumed": bool(self.resume),
            "start_epoch": self.start_epoch + 1,
            "forced": {k: getattr(self.args, k, None) for k in self.supervision.forced},
            "conv_fallback": conv2d.is_enabled(),
            "versions": {"ultralytics": ultralytics.__version__, "torch": torch.__version__,
                         "hip": torch.version.hip, "cuda": torch.version.cuda, "python": sys.version.split()[0]},
        }

