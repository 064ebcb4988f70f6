"""The supervised trainer: a mixin in front of an Ultralytics trainer that heartbeats, checkpoints mid-epoch, resumes at
the very batch, applies the rung's settings over a checkpoint's and stops at a batch boundary when the supervisor
asks. The concrete classes, one per task, are in ``worker/training/trainers.py``.
"""

from __future__ import annotations

import io
import os
import sys
import time
from copy import deepcopy
from pathlib import Path
from typing import Any

import torch
import ultralytics
from ultralytics.engine import trainer as ultralytics_trainer
from ultralytics.utils import LOGGER
from ultralytics.utils.torch_utils import unwrap_model

from worker.loading import loader_recovery
from worker.standby import ready
from worker.supervision import exact_resume
from worker.checkpoints.checkpoint_writer import BackgroundWriter, to_host
from worker.checkpoints.checkpointing import EXACT_KEY, AtomicPath, CheckpointWriteError, atomic_write, strip_atomically
from worker.wire.contract import (HELD_LOADER_WORKERS, HELD_MODEL, HELD_RESUMED_BATCHES, HELD_TRAIN_DATASET, HELD_VAL_DATASET, InForce,
                             StartupStep)
from worker.distributed.ddp import adopt_cpu_drill, rank_link, setup_process_group
from worker.startup.device_warmup import DeviceWarmUp
from worker.startup.first_step_parts import FirstStepParts
from worker.supervision.link import StopForSupervisor, SupervisorLink
from worker.distributed.multinode import adopt_world, check_hosts_agree, mark_rank_started
from worker.loading.loaders import (EpochWorkersDataLoader, chain_worker_init, die_with_parent, hook_samples,
                            make_epoch_workers, start_workers_with, worker_start_method)
from worker.patches import batchnorm, conv2d
from worker.startup.startup_clock import CLOCK
from worker.startup.startup_steps import STEPS, few_cpu_threads
from worker.loading.thread_loader import ThreadDataLoader, thread_loader_from
from worker.witness import name_loader

RECORD_FED_ENV = "YOLO_TRAIN_RECORD_FED"  # tests: a file that gets "epoch batch image" per image fed to the model;
# under DDP each rank writes its own, the path with ".rankN" added


class SupervisedTrainerMixin:
    """Mixed in front of an Ultralytics trainer; each override says which Ultralytics behaviour it corrects."""

    def __init__(self, *args: Any, link: SupervisorLink | None = None, **kwargs: Any):
        if link is None:  # a DDP rank: Ultralytics' script rebuilds us with its arguments only
            mark_rank_started()
            link = rank_link()
            exact_resume.patch_training_loop_enumerate()
        self.link = link  # set first: BaseTrainer.__init__ calls check_resume
        self._nominal_accumulate = 1
        self._step_offset = 0  # see the accumulate property
        self._last_step_ni = -1  # the iteration of the last optimizer step, -1 before the first
        self._exact: dict[str, Any] | None = None  # a mid-epoch checkpoint's state still to restore
        self._writer = BackgroundWriter()  # mid-epoch checkpoints are written off the training step
        self._warmup: DeviceWarmUp | None = None  # the first step's, from the model on the device to the first batch
        self._first_step_parts = FirstStepParts()  # for the startup line
        self._held_model = False  # the model is the one a ready standby built ahead (worker/standby/ready.py)
        self._held: list[str] = []  # the datasets and loader workers taken from a ready standby
        self._ending = False  # trained through: the final validation and the wait for the other ranks (Phase.ENDING)
        super().__init__(*args, **kwargs)
        adopt_cpu_drill(self)
        adopt_world(self)
        # BaseTrainer.__init__ forces workers=0 on CPU, which would make DataLoader-worker hangs impossible
        # to reproduce there; honour what was asked.
        requested = link.forced.get("workers", kwargs.get("overrides", {}).get("workers"))
        if requested is not None:
            self.args.workers = requested
        # Ultralytics writes checkpoints with Path.write_bytes: these paths make every such write atomic.
        self.wdir, self.last, self.best = AtomicPath(self.wdir), AtomicPath(self.last), AtomicPath(self.best)
        if not self.ddp:  # a DDP launcher trains nothing itself; its callbacks would be pickled into every rank
            self._add_link_callbacks()

    def train(self) -> None:
        try:
            super().train()
        except BaseException as e:  # a rank's last words (the launching worker says its own in main)
            if self.link.rank is not None and not isinstance(e, (SystemExit, StopForSupervisor)):
                self.link.hb.error(f"{type(e).__name__}: {e}")
            raise

    def _setup_ddp(self) -> None:
        STEPS.enter(StartupStep.PROCESS_GROUP)
        setup_process_group(self, super()._setup_ddp)
        check_hosts_agree(self.link.hb)

    def check_resume(self, overrides: dict[str, Any]) -> None:
        super().check_resume(overrides)
        if self.resume:
            # Resume restores the checkpoint's arguments and lets only a few be overridden (amp, for one,
            # not): the rung's settings must win, or climbing the ladder would change nothing.
            for key, value in self.link.on_resume.items():
                setattr(self.args, key, value)
            # The checkpoint's save_dir is where it was written, not where this run writes (a copied or moved
            # state directory would rewrite the old one): the supervisor's placement wins, on every resume.
            if self.link.placement:
                for key, value in self.link.placement.items():
                    setattr(self.args, key, value)
                self.args.save_dir = None

    # Ultralytics steps the optimizer when ``ni - last_opt_step >= accumulate`` with ``last_opt_step`` a local
    # variable that starts at -1, so a run resumed mid-epoch would step too early. Until the first step after the
    # resume, the accumulate Ultralytics reads carries the true last step's offset; the nominal value is untouched.
    @property
    def accumulate(self) -> int:
        return self._nominal_accumulate + self._step_offset

    @accumulate.setter
    def accumulate(self, value: int) -> None:
        self._nominal_accumulate = value

    def optimizer_step(self) -> None:
        self._first_step_parts.mark("backward")
        super().optimizer_step()
        self._first_step_parts.mark("optimizer")
        self._last_step_ni = self._iteration()
        self._step_offset = 0

    def _iteration(self) -> int:
        """ni of the batch being trained: its index in the epoch plus the batches of the epochs before."""
        return self.link.batch + self.epoch * len(self.train_loader)

    def resume_training(self, ckpt: dict[str, Any] | None) -> None:
        exact = (ckpt or {}).get(EXACT_KEY)
        if not exact or not self.resume:
            return super().resume_training(ckpt)
        LOGGER.info(f"Resuming training {self.args.model} at epoch {exact['epoch'] + 1} batch {exact['batch'] + 1}")
        self._load_checkpoint_state(ckpt)
        # The checkpoint's "ema" is half precision and Ultralytics resumes the model from it: the exact state is
        # the fp32 model and EMA kept beside it.
        unwrap_model(self.model).load_state_dict(exact["model"])
        self.ema.ema.load_state_dict(exact["ema"])
        model = unwrap_model(self.model)
        if not hasattr(model, "criterion"):
            # Made by the first loss; an epoch resumed at its end trains no batch, and Ultralytics' epoch end reads it.
            model.criterion = None
        if getattr(getattr(model, "student_model", model).model[-1], "one2one_cv2", None) is not None:
            model.criterion = model.init_criterion()
            model.criterion.updates = exact["epoch"] - 1
            model.criterion.update()
        self.start_epoch = exact["epoch"]
        self._exact = exact

    def setup_model(self) -> Any:
        STEPS.enter(StartupStep.MODEL)
        with few_cpu_threads():
            made = super().setup_model()
        CLOCK.mark("model (held ready, checkpoint loaded)" if self._held_model else "model")
        return made

    def get_model(self, cfg: Any = None, weights: Any = None, verbose: bool = True) -> Any:
        """The model a ready standby built while the attempt before trained (worker/standby/ready.py), the checkpoint's
        weights loaded into it as into a new one; else Ultralytics' own build."""
        held = ready.take_model(cfg, self.data["nc"], self.data.get("channels", 3))
        if held is None:
            return super().get_model(cfg=cfg, weights=weights, verbose=verbose)
        self._held_model = True
        if weights:
            held.load(weights)
        return held

    def build_dataset(self, img_path: str, mode: str = "train", batch: int | None = None) -> Any:
        held = ready.take_dataset(self._dataset_key(img_path, mode, batch), self.args.cache)
        if held is not None:  # built by a ready standby while the attempt before trained (worker/standby/ready.py)
            self._held.append(HELD_TRAIN_DATASET if mode == "train" else HELD_VAL_DATASET)
            STEPS.enter(StartupStep.LOADERS)
            return held
        STEPS.enter(StartupStep.DATASET)
        dataset = super().build_dataset(img_path, mode, batch)
        STEPS.enter(StartupStep.LOADERS)  # its DataLoader, and what the trainer sets up after it
        return dataset

    def _dataset_key(self, img_path: str, mode: str, batch: int | None) -> str:
        return ready.dataset_key(self.args, img_path, mode, batch, ready.grid(unwrap_model(self.model)), self.data)

    def _held_loader(self, dataset_path: str, batch_size: int, rank: int) -> Any | None:
        """The training loader a ready standby made, its workers started with this rung's start method, where it is
        the one this launch would make (worker/standby/ready.py)."""
        if self.link.options.loader == "threads":
            # its workers would idle beside the threads for the whole attempt
            ready.drop_loader("this rung loads on threads", "the threads start at the first batch")
            return None
        loader = ready.take_loader(
            self._dataset_key(dataset_path, "train", batch_size),
            ready.loader_key(batch_size, self.args.workers, rank, bool(self.args.compile), self.device,
                             self.link.options.start_method, self.args.seed),
            workers_hooked="dataloader_hang" in self.link.faults.kinds())
        if loader is not None:
            self._held.append(HELD_LOADER_WORKERS)
            if getattr(loader, "held_primed", None) is not None:
                self._held.append(HELD_RESUMED_BATCHES)
        return loader

    def get_dataloader(self, dataset_path: str, batch_size: int = 16, rank: int = 0, mode: str = "train"):
        options = self.link.options
        if mode == "train" and isinstance(getattr(self, "amp", None), bool):
            self._warm_up_device(batch_size, self.amp)  # AMP decided: the training loader, not a calibration one
        held = self._held_loader(dataset_path, batch_size, rank) if mode == "train" else None
        loader = held if held is not None else super().get_dataloader(dataset_path, batch_size, rank, mode)
        if held is not None:  # its workers started by a ready standby, as below but for the per-epoch class
            if not options.persistent_workers:
                make_epoch_workers(loader)
            loader.__class__ = ready.held_class(type(loader))  # its next iterator: the held one
        elif options.loader == "threads":
            # Made before the process loader's first iteration, so not one worker process is ever started; the
            # worker-process patches (parent-death signal, per-epoch workers) have nothing to act on: the threads
            # die with the process and are stopped at every epoch's end anyway.
            loader = thread_loader_from(loader, options.threads or os.cpu_count() or 1)
        else:
            start_workers_with(loader, options.start_method)
            chain_worker_init(loader, die_with_parent)
            if not options.persistent_workers:
                make_epoch_workers(loader)
        if mode == "train":
            hook_samples(loader.dataset, self.link.faults.in_dataloader_worker)
            # On the thread loader too: its threads draw from the same batch sampler, and its _get_iterator is
            # where the epoch-keyed order learns the epoch.
            exact_resume.install(loader, int(self.args.seed), lambda: self.epoch, self.link.resume_point)
        if options.loader != "threads":  # (a thread cannot be killed: a hung loader thread is a restart's)
            loader_recovery.install(loader, mode, self.link.commands, self.link.hb)
        name_loader(loader, mode)  # the witness's reports of a wait for its batches say "train" or "val"
        return loader

    def preprocess_batch(self, batch: dict[str, Any]) -> dict[str, Any]:
        record = os.environ.get(RECORD_FED_ENV)
        if record:  # test hook: which images were fed at which position (a file per DDP rank)
            if self.link.rank is not None:
                record = f"{record}.rank{self.link.rank}"
            with open(record, "a") as f:
                f.writelines(f"{self.epoch} {self.link.batch} {Path(name).name}\n" for name in batch["im_file"])
        batch = super().preprocess_batch(batch)
        self._first_step_parts.mark("to the device")
        return batch

    def save_model(self) -> bool:
        """Ultralytics' end-of-epoch save (atomic through AtomicPath), reported to the supervisor once complete. A
        failed write leaves the previous last.pt and training goes on."""
        self._writer.wait()  # a mid-epoch write still going must not land after (over) this newer last.pt
        started = time.monotonic()
        try:
            saved = super().save_model()
        except CheckpointWriteError as e:
            print(f"yolo-train worker: {e}; training goes on", file=sys.stderr, flush=True)
            return False
        if saved and self.epoch >= 0:
            self.link.checkpoint_written()
            self.link.hb.checkpoint(str(self.last), time.monotonic() - started, epoch=self.epoch + 1,
                                           batch=len(self.train_loader))
        return saved

    def validate(self) -> tuple[Any, Any]:
        """``val = false`` validates nothing: Ultralytics validates the final epoch (and before an early stop)
        whatever ``val`` says, and a validation that hangs is what the ``val = false`` rung is there to avoid. The
        metrics stay as they were (zeros), the fitness None: best.pt is the last epoch's weights."""
        if not self.args.val:
            return self.metrics, self.fitness
        return super().validate()

    def final_eval(self) -> None:
        """Ultralytics' final strip of last.pt and best.pt, each written beside and renamed over (strip_atomically);
        with ``val = false``, the strip alone: Ultralytics would validate best.pt here too."""
        # From here to the exit nothing is left to lose and nothing observed bounds a silence: best.pt's load and
        # the validation's set-up, then (a rank done) the wait for the others' final validation on other hosts.
        self._ending = True
        self.link.hb.phase("ending", epoch=self.epoch + 1, epochs=self.epochs)
        strip = ultralytics_trainer.strip_optimizer
        ultralytics_trainer.strip_optimizer = strip_atomically(strip)
        try:
            if self.args.val:
                super().final_eval()
            elif self.link.rank in (None, 0):
                ckpt = ultralytics_trainer.strip_optimizer(self.last) if self.last.exists() else {}
                if self.best.exists():
                    ultralytics_trainer.strip_optimizer(self.best, updates={"train_results": ckpt.get("train_results")})
                print(f"yolo-train worker: val = false: nothing was validated; to validate the weights: yolo val "
                      f"model={self.best} data={self.args.data}", flush=True)
        finally:
            ultralytics_trainer.strip_optimizer = strip

    def save_mid_epoch(self, wait: bool = False) -> bool:
        """Write last.pt at the current batch boundary with all an exact resume needs. The loop waits only for the
        copy to host memory; a thread writes it (``worker/checkpoints/checkpoint_writer.py``), unless ``wait`` (a stop's save:
        the worker exits next). Returns whether the write is complete and good (False while it is still going)."""
        sup = self.link
        self._writer.wait()  # one write at a time, in order
        started = time.monotonic()
        ni = self._iteration() - 1  # the batch just trained
        ema = deepcopy(self.ema.ema).half().cpu()
        if hasattr(ema, "criterion"):
            ema.criterion = None
        params = list(self.model.parameters())
        pending_grads = self._last_step_ni != ni  # gradients accumulated since the last step would be lost
        batch_size = self.train_loader.batch_size  # this rank's
        exact = to_host({
            "epoch": self.epoch, "batch": sup.batch, "last_step_ni": self._last_step_ni, "batch_size": batch_size,
            "samples": sup.skipped_samples + (sup.batch - sup.first_batch) * batch_size,  # full batches: not the last
            "model": unwrap_model(self.model).state_dict(), "ema": self.ema.ema.state_dict(),
            "tloss": dict(self.tloss) if isinstance(self.tloss, dict) else None,  # to_host detaches and copies
            "grads": [p.grad for p in params] if pending_grads else None,
        })
        checkpoint = {
            "epoch": self.epoch - 1,  # the last completed epoch: Ultralytics' own resume redoes this one whole
            "best_fitness": self.best_fitness,
            "stopper": {"best_fitness": self.stopper.best_fitness, "best_epoch": self.stopper.best_epoch},
            "model": None, "ema": ema, "updates": self.ema.updates,
            "optimizer": to_host(self.optimizer.state_dict()), "scaler": to_host(self.scaler.state_dict()),
            "train_args": dict(vars(self.args)), "train_metrics": {**(self.metrics or {}), "fitness": self.fitness},
            "version": ultralytics.__version__, EXACT_KEY: exact,
        }
        inline = wait or not sup.checkpoint_in_thread
        held = time.monotonic() - started
        sup.checkpoint_written()  # the next interval counts from this copy, whether its write succeeds or not
        position = {"epoch": self.epoch + 1, "batch": sup.batch}
        written: list[bool] = []

        def write() -> None:
            buffer = io.BytesIO()
            torch.save(checkpoint, buffer)
            try:
                atomic_write(self.last, buffer.getbuffer())
            except CheckpointWriteError as e:
                print(f"yolo-train worker: {e}; training goes on", file=sys.stderr, flush=True)
                return
            written.append(True)
            # Only now is it a point to resume from. Its seconds: how long the loop waited for it.
            sup.hb.checkpoint(str(self.last), time.monotonic() - started if inline else held, **position)

        if inline:
            write()
        else:
            self._writer.submit(write)
        return bool(written)

    def _restore_exact_state(self) -> None:
        """After Ultralytics zeroed the gradients before the first epoch: what the loop itself held at the save."""
        exact = self._exact
        saved_batch_size, batch_size = exact.get("batch_size"), self.train_loader.batch_size
        if saved_batch_size not in (None, batch_size):
            # Another batch size (the OOM remedy): the iterations are counted in other batches, so the resumed batch
            # is an optimizer step boundary; gradients accumulated since the last step start over.
            print(f"yolo-train worker: resumed at batch size {batch_size} (the checkpoint's was {saved_batch_size}): "
                  f"epoch {self.epoch + 1} goes on at batch {self.link.batch + 1} of {len(self.train_loader)}, "
                  f"after the {self.link.skipped_samples} samples already trained", flush=True)
            self._last_step_ni = self._iteration() - 1
            self._step_offset = self._last_step_ni + 1
            return
        if exact.get("grads") is not None:
            for p, g in zip(self.model.parameters(), exact["grads"]):
                p.grad = None if g is None else g.to(p.device)
        self._last_step_ni = exact["last_step_ni"]
        self._step_offset = exact["last_step_ni"] + 1

    def set_model_attributes(self) -> None:
        super().set_model_attributes()
        # The model is on the device: its warm-up starts here, beside the AMP check, the datasets and the loaders,
        # where the batch is a number (an auto batch is known once the training loader is made).
        if isinstance(self.batch_size, int) and self.batch_size >= 1:
            self._warm_up_device(self.batch_size, self.args.amp not in {False, "fp32"})

    def _warm_up_device(self, batch_size: int, amp: bool) -> None:
        """The first step's warm-up on a GPU, on a copy of the model, from the model's move to the device (or the
        training loader's construction) to the first batch (worker/startup/device_warmup.py). Not under DDP (each rank's
        copy would meet DDP's reducer), torch.compile (it would compile in the thread) nor quantization-aware
        training (the model it trains is made later)."""
        qat = getattr(self.args, "quantize", None)
        if self.device.type != "cuda" or self.world_size > 1 or self.args.compile or qat or self._warmup is not None:
            return
        dtype = torch.bfloat16 if self.args.amp == "bf16" else torch.float16 if amp else None
        stride = max(int(self.model.stride.max()) if hasattr(self.model, "stride") else 32, 32)
        imgsz = self.args.imgsz if isinstance(self.args.imgsz, int) else max(self.args.imgsz)
        imgsz = -(-imgsz // stride) * stride  # as Ultralytics' check_imgsz rounds it, later
        shape = (batch_size, self.data.get("channels", 3), imgsz, imgsz)
        self._warmup = ready.take_warmup(shape, self.device, dtype) or DeviceWarmUp(self.model, shape, self.device,
                                                                                    dtype).start()

    def _device_warmed(self) -> None:
        if self._warmup is not None:
            line = self._warmup.finish()
            if line:
                print(f"yolo-train worker: {line}", flush=True)

    def _say_first_forward(self) -> None:
        """News in the first step once its forward has run: the first forward and the first backward each search
        their kernels (cuDNN's benchmark, MIOpen's database), so each is bounded by its own time, not by both."""
        hook = None

        def forward_done(*_: Any) -> None:
            hook.remove()
            STEPS.progress(1, 2)

        hook = self.model.register_forward_hook(forward_done)

    def _add_link_callbacks(self) -> None:
        sup, hb = self.link, self.link.hb

        def position() -> dict[str, Any]:
            return {"epoch": self.epoch + 1, "epochs": self.epochs, "batch": sup.batch,
                    "batches": len(self.train_loader) if getattr(self, "train_loader", None) else 0}

        def on_train_start(trainer) -> None:
            STEPS.enter(StartupStep.FIRST_BATCH)  # the loader's workers start with the first epoch's iteration
            CLOCK.mark("dataset and loaders")
            hb.settings(self.in_force().to_wire())

        def on_train_epoch_start(trainer) -> None:
            sup.batch = sup.first_batch = sup.skipped_samples = 0
            if self._exact is not None and self._exact["epoch"] == self.epoch:
                # The loader's own start (it differs from the checkpoint's batch when the batch size changed).
                sup.batch = sup.first_batch = getattr(self.train_loader, "first_batch_index", self._exact["batch"])
                if sup.resume_point is not None:
                    sup.skipped_samples = sup.resume_point.samples_done(self.train_loader.batch_size)
                self._restore_exact_state()
            sup.train_since = time.monotonic()
            hb.phase("train", **position())

        def on_train_batch_start(trainer) -> None:
            if not sup.started:  # the attempt's first batch is loaded: its step on the device comes next
                sup.started = True
                STEPS.enter(StartupStep.FIRST_STEP)
                self._first_step_parts.begin(self.device)
                self._device_warmed()
                self._first_step_parts.mark("warm-up wait")
                self._first_step_parts.watch(unwrap_model(self.model))
                self._say_first_forward()
                sup.faults.before_first_batch()
            if self._exact is not None:  # after the loop reset its running loss means: this epoch's so far
                if self._exact.get("tloss") is not None:
                    self.tloss = {k: v.to(self.device) for k, v in self._exact["tloss"].items()}
                self._exact = None

        def on_train_batch_end(trainer) -> None:
            if not sup.reported_startup:
                sup.reported_startup = True
                steps, parts = STEPS.trained(), self._first_step_parts.report()
                CLOCK.mark("first batch")
                print(f"\nyolo-train worker: {CLOCK.report()}; {steps}; {parts}", flush=True)  # after a bar's \r
            sup.batch += 1
            tloss = getattr(self, "tloss", None)  # running means of this epoch's losses: {name: tensor}
            losses = {str(k): round(float(v), 5) for k, v in tloss.items()} if isinstance(tloss, dict) else {}
            hb.beat(**position(), samples=self.batch_size, losses=losses,
                    lr=self.optimizer.param_groups[0]["lr"])
            if sup.stop_requested and sup.batch < len(self.train_loader):
                self.save_for_stop()  # at an epoch's last batch, its own save comes next: the stop waits for it
            if sup.writes_checkpoints and sup.checkpoint_every is not None and sup.batch < len(self.train_loader) \
                    and sup.seconds_since_checkpoint >= sup.checkpoint_every:
                hb.phase("save", **position())  # a save is watched as one, and its time is no batch interval
                self.save_mid_epoch()
                hb.phase("train", **position())
            sup.faults.after_train_batch()

        def on_train_epoch_end(trainer) -> None:
            self._device_warmed()  # an epoch resumed at its end trains no batch: validation and the save come next
            sup.pause_clock()
            hb.phase("save", **position())

        def on_val_start(validator) -> None:
            hb.phase("ending" if self._ending else "val", **position())

        def on_val_batch_end(validator) -> None:
            hb.beat(**position())
            sup.faults.after_val_batch()

        def on_val_end(validator) -> None:
            hb.phase("ending" if self._ending else "save", **position())

        def on_model_save(trainer) -> None:
            hb.beat(**position())
            if sup.stop_requested:  # asked at the epoch's last batch: this end-of-epoch save is the checkpoint
                print(f"yolo-train worker: saved {self.last} at the end of epoch {self.epoch + 1} on the "
                      f"supervisor's request", flush=True)
                raise StopForSupervisor()

        for event, callback in (("on_train_start", on_train_start), ("on_train_epoch_start", on_train_epoch_start),
                                ("on_train_batch_start", on_train_batch_start),
                                ("on_train_batch_end", on_train_batch_end), ("on_train_epoch_end", on_train_epoch_end),
                                ("on_val_start", on_val_start), ("on_val_batch_end", on_val_batch_end),
                                ("on_val_end", on_val_end), ("on_model_save", on_model_save)):
            self.add_callback(event, callback)

    def save_for_stop(self) -> None:
        """Write an exact mid-epoch checkpoint now, at this batch boundary, and stop (also in the first epoch)."""
        hb = self.link.hb
        hb.phase("save", epoch=self.epoch + 1, epochs=self.epochs, batch=self.link.batch)
        if self.save_mid_epoch(wait=True):
            print(f"yolo-train worker: saved {self.last} at epoch {self.epoch + 1} batch {self.link.batch} "
                  f"on the supervisor's request", flush=True)
        raise StopForSupervisor()

    def in_force(self) -> InForce:
        loader = self.train_loader
        threads = isinstance(loader, ThreadDataLoader)
        return InForce(
            workers=loader.num_workers,  # worker processes: 0 on the threads loader
            persistent_workers=loader.num_workers > 0 and not isinstance(loader, EpochWorkersDataLoader),
            loader="threads" if threads else "process",
            threads=loader.threads if threads else None,
            start_method=worker_start_method(loader),
            val=bool(self.args.val),
            amp=bool(self.amp),
            batch=self.batch_size,
            imgsz=self.args.imgsz,
            device=str(self.device),
            resumed=bool(self.resume),
            start_epoch=self.start_epoch + 1,
            forced={k: getattr(self.args, k, None) for k in self.link.forced},
            conv_fallback=conv2d.is_enabled(),
            batchnorm_fallback=batchnorm.is_enabled(),
            held=((HELD_MODEL,) if self._held_model else ()) + tuple(self._held),
            versions={"ultralytics": ultralytics.__version__, "torch": torch.__version__,
                      "hip": torch.version.hip, "cuda": torch.version.cuda, "python": sys.version.split()[0]},
        )
