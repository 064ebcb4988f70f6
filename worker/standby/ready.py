"""The ready standby: what a standby worker holds, built while the attempt before it trains, so that the next attempt
takes it instead of building it after the verdict.

The supervisor asks for it (``ENV_READY``: the rung's train arguments and loader options as JSON) only where the
device has room (supervisor/attempt/ready_room.py); the standby then builds, on one CPU thread, within the device
memory it was granted and the host memory beyond its imports (``host_mib``: it holds only what fits there, its
resident growth and its loader workers' private memory measured as it builds, a RAM cache sized before it is filled),
the device context, the model (on a GPU, with a first step that chooses its kernels), the training and validation
datasets (their labels read) and the training loader with its worker processes started, and sleeps on its stdin. At the launch each is taken only where the launch would build the same one, else dropped
and built there:

- ``take_model``: the same architecture, classes and channels; the checkpoint's weights are loaded into it as a cold
  build loads them into a new one.
- ``take_dataset``: the same arguments (all but those only the trainer reads), path, split, batch, stride and
  dataset description; nothing in a dataset depends on when it was built. One held without the RAM cache its
  arguments ask for (no room for a second copy beside the training's) has its images cached at the launch.
  Whether the files are still those it was built from is checked by the supervisor before the launch (the report's
  ``data``: supervisor/attempt/standby_worker.py), which starts the attempt cold where they are not.
- ``take_loader``: the same dataset and loader arguments, start method and seed. Its workers were started fed
  nothing (torch's iterator asks its sampler for the first batches as it starts them): at the launch the iterator
  is pointed at the sampler the resume positioned (worker/supervision/exact_resume.py) and fed then, so it loads the batches a
  new iterator would, in the same order, with the same worker seeds (drawn from the loader's generator, seeded as
  the trainer seeds it). Where a restart is coming (``prime``: the supervisor's word at the verdict, with the
  checkpoint the next attempt resumes from), the standby feeds them at once, from that checkpoint's resumed position, on
  a copy of the order the launch will draw: their first batches load while the old tree is killed, and the launch takes
  the iterator as it stands where it resumes from that same file (else its workers are dropped: they loaded another
  position). Not for "spawn" workers (each a fresh interpreter importing torch: several cores while the
  training runs) nor the threads loader (its threads are made at the launch).
"""

from __future__ import annotations

import copy
import functools
import json
import os
import sys
import time
from dataclasses import dataclass, field
from typing import Any

from worker.wire.contract import (ENV_READY, HELD_IMAGE_CACHE, HELD_LOADER_WORKERS, HELD_MODEL, HELD_PINNED_MEMORY,
                             HELD_TRAIN_DATASET, HELD_VAL_DATASET, DataFiles, StandbyReport)
from worker.checkpoints.checkpointing import EXACT_KEY, is_finished
from worker.startup.demo_data import ensure_demo_dataset
from worker.supervision import exact_resume
from worker.supervision.exact_resume import ResumePoint
from worker.loading import pinned_ahead
from worker.startup.device_warmup import DeviceWarmUp
from worker.loading.loaders import chain_worker_init, die_with_parent, start_workers_with
from worker.patches import offline
from worker.startup.startup_steps import few_cpu_threads
# Keys of a model's YAML that a build fills in from the dataset or the file: the rest is the architecture.
FILLED_IN = ("yaml_file", "nc", "ch", "channels")
MIB = 1 << 20

# Ultralytics arguments no dataset reads (the trainer's, the exporter's, the predictor's): a held dataset built with
# other values of these is the launch's all the same. Any other argument that differs drops it.
NOT_THE_DATASETS = frozenset((
    "model", "epochs", "time", "patience", "batch", "save", "save_period", "device", "workers", "project", "name",
    "exist_ok", "pretrained", "optimizer", "verbose", "deterministic", "resume", "amp", "profile", "freeze",
    "multi_scale", "compile", "dropout", "val", "plots", "lr0", "lrf", "momentum", "weight_decay", "warmup_epochs",
    "warmup_momentum", "warmup_bias_lr", "box", "cls", "dfl", "pose", "kobj", "rle", "angle", "nbs", "save_dir",
    "close_mosaic", "cos_lr", "mode", "save_json", "conf", "iou", "max_det", "half", "dnn", "source", "vid_stride",
    "stream_buffer", "visualize", "augment", "agnostic_nms", "embed", "show", "save_frames", "save_txt", "save_conf",
    "save_crop", "show_labels", "show_conf", "show_boxes", "line_width", "format", "keras", "optimize", "int8",
    "dynamic", "simplify", "opset", "workspace", "nms", "tracker", "cfg", "channels_last", "quantize",
    "distill_model", "retina_masks", "cache_dir"))

# What the launch takes or drops: "model", "datasets" {key: dataset}, "loader" HeldLoader; and "resumes", the identity
# of the checkpoint file the launch resumes from (``resuming``).
HELD: dict[str, Any] = {}
CACHE_SAMPLE = 30  # images loaded to size a RAM cache, as Ultralytics' check_cache_ram sizes it


@dataclass
class HostRoom:
    """The host memory this standby may hold beyond its imports (``allowed``, MiB), from its resident memory when it
    began, its loader workers' counted once started; where it says what it holds (``report``). Not its PSS: that
    falls as its workers fork (its pages shared by more) though nothing was freed."""
    allowed: int
    report: str | None
    began: int = 0  # bytes: its RSS before it built anything
    data: tuple[DataFiles, ...] = ()
    holds: list[str] = field(default_factory=list)
    left_out: list[str] = field(default_factory=list)  # what did not fit, for the line

    def used(self, loader: Any = None) -> int:
        """Bytes held beyond the imports: this process's resident growth (a RAM cache its workers share stays
        resident here), and the memory private to each of its loader workers (``loader``'s iterator)."""
        import psutil

        held = psutil.Process().memory_info().rss - self.began
        for worker in getattr(loader, "_workers", ()) if loader is not None else ():
            try:
                held += psutil.Process(worker.pid).memory_full_info().uss
            except psutil.Error:
                pass
        return held

    def fits(self, more: int = 0, loader: Any = None) -> bool:
        # None allowed holds nothing, though pages already resident (a dataset read before) show no growth.
        return self.allowed > 0 and self.used(loader) + more <= self.allowed * MIB

    def write(self, why: str = "") -> None:
        if self.report is None:
            return
        report = StandbyReport(data=self.data, holds=tuple(self.holds), why=why,
                               host_mib=self.used() // MIB if self.holds else None, host_allowance_mib=self.allowed)
        part = f"{self.report}.part"
        with open(part, "w", encoding="utf-8") as f:
            f.write(report.to_json())
        os.replace(part, self.report)


ROOM = HostRoom(0, None)


def architecture(cfg: Any) -> dict[str, Any] | None:
    from ultralytics.nn.tasks import yaml_model_load

    if isinstance(cfg, dict):
        yaml = cfg
    elif isinstance(cfg, str) and cfg.endswith((".yaml", ".yml")):
        yaml = yaml_model_load(cfg)
    else:
        return None
    return {k: v for k, v in yaml.items() if k not in FILLED_IN}


def prepare(spec: dict[str, Any]) -> str:
    """Build what the next attempt would build first (``spec``: ``train``, its arguments; ``options``, its rung's
    loader options); the line that says what is held, or why nothing is. Runs while another process trains: on one
    CPU thread, once, then it sleeps."""
    global ROOM
    import psutil

    began = time.monotonic()
    ROOM = HostRoom(int(spec.get("host_mib", 0)), spec.get("report"), psutil.Process().memory_info().rss)
    try:
        with few_cpu_threads(1):
            what = _build(spec.get("train", {}), spec.get("options", {}), int(spec.get("memory_mib", 1024)))
    except Exception as e:  # a standby that cannot prepare is today's standby: the launch builds all
        drop()
        ROOM.holds.clear()
        line = f"not ready ({type(e).__name__}: {e}): the launch builds the model"
    else:
        left_out = f" (not held, beyond the host's {ROOM.allowed} MiB allowed: {'; '.join(ROOM.left_out)})" \
            if ROOM.left_out else ""
        line = f"ready in {time.monotonic() - began:.1f} s: {what}{left_out}; {ROOM.used() // MIB} MiB of host memory"
    ROOM.write(line)
    return line


def _build(train: dict[str, Any], options: dict[str, Any], memory_mib: int) -> str:
    import torch
    from ultralytics.cfg import get_cfg
    from ultralytics.data.utils import check_det_dataset
    from ultralytics.nn.tasks import DetectionModel, guess_model_task
    from ultralytics.utils import DEFAULT_CFG
    from ultralytics.utils.torch_utils import select_device

    offline.install()  # the dataset check fetches a font, as in the training (worker/supervision/link.py installs it there)

    model = train.get("model", "yolov8n.yaml")
    if architecture(model) is None:
        return f"the device only (model {model} is not a YAML: its build reads the checkpoint)"
    task = train.get("task") or guess_model_task(model)
    if task != "detect":
        return f"the device only (task {task}: only a detection model is built ahead)"
    device = select_device(str(train.get("device", "")), verbose=False)
    if device.type == "cuda":
        torch.zeros(1, device=device)  # the device context, created now rather than after the verdict
        # Beside a training that holds the rest of the card, this process may allocate what the supervisor found
        # free for it and no more: a first step that needs more fails here, not in the training (restored at launch).
        total = torch.cuda.get_device_properties(device).total_memory
        torch.cuda.set_per_process_memory_fraction(min(1.0, memory_mib * MIB / total), device)
        HELD["capped"] = device
    args = get_cfg(DEFAULT_CFG, {k: v for k, v in train.items() if k in vars(DEFAULT_CFG)})
    args.task = task
    if args.data == "demo":
        args.data = str(ensure_demo_dataset())
    # As the detection trainer's get_dataset makes it, so that the datasets' key is the launch's.
    data = check_det_dataset(args.data, split=args.split)
    args.data = data.get("yaml_file", args.data)
    if args.single_cls:
        data["names"], data["nc"] = {0: "item"}, 1
    built = DetectionModel(model, nc=data["nc"], ch=data.get("channels", 3), verbose=False)
    step = ""
    if device.type == "cuda":
        built = built.to(device)
        gs = grid(built)
        imgsz = -(-int(train.get("imgsz", 640)) // gs) * gs  # as Ultralytics' check_imgsz rounds it
        step = _first_step(built, args, device, imgsz, int(train.get("batch", 16)))
    HELD["model"] = built
    ROOM.holds.append(HELD_MODEL)
    if device.type in ("cpu", "mps") and "workers" not in train:
        args.workers = 0  # as the trainer forces it there
    return f"the model {model} built on {device.type}{step}; {_build_data(args, options, built, data, device)}"


def _build_data(args: Any, options: dict[str, Any], model: Any, data: dict[str, Any], device: Any) -> str:
    """The datasets and the training loader, as the trainer would build them with ``args``; what is held, for the
    line."""
    import torch
    from ultralytics.data.build import build_dataloader, build_yolo_dataset
    from ultralytics.utils import RANK
    from ultralytics.utils.checks import check_imgsz

    if not isinstance(args.batch, int) or args.batch < 1:
        return "no dataset (an auto batch is known only to the trainer)"
    gs = grid(model)
    args.imgsz = check_imgsz(args.imgsz, stride=gs, floor=gs, max_dim=1)  # as the trainer's _setup_train does
    datasets = HELD.setdefault("datasets", {})
    splits = (("train", "train", args.batch), ("val", args.split, args.batch * 2))
    # What the files are before they are read: files changed from here on make the datasets stale at the launch.
    ROOM.data = tuple(DataFiles.read(str(p)) for _, split, _ in splits for p in
                      (data[split] if isinstance(data[split], list) else [data[split]]))
    ROOM.write()
    # Built without a RAM cache, whose size is known only once the dataset is: cached below where it fits.
    uncached = replace_cache(args, None) if ram_cache(args.cache) else args
    for mode, split, batch in splits:
        key = dataset_key(args, data[split], mode, batch, gs, data)
        datasets[key] = build_yolo_dataset(uncached, data[split], batch, data, mode=mode, rect=mode == "val",
                                           stride=gs)
        ROOM.holds.append(HELD_TRAIN_DATASET if mode == "train" else HELD_VAL_DATASET)
    if not ROOM.fits():
        ROOM.left_out.append(f"the datasets ({ROOM.used() // MIB} MiB with the model)")
        drop_datasets()
        return "no dataset"
    if ram_cache(args.cache):
        needs = sum(cache_bytes(d) for d in datasets.values())
        if ROOM.fits(needs):
            for dataset in datasets.values():
                fill_cache(dataset)
            ROOM.holds.append(HELD_IMAGE_CACHE)
        else:
            ROOM.left_out.append(f"their images cached ({needs // MIB} MiB; the launch caches them)")
    if options.get("loader", "process") != "process":
        return "the datasets (the threads loader starts its threads at the launch)"
    if options.get("start_method") == "spawn":
        return "the datasets (\"spawn\" loader workers are not started ahead: each is an interpreter importing torch)"
    train_key = dataset_key(args, data["train"], "train", args.batch, gs, data)
    torch.manual_seed(args.seed + 1 + RANK)  # the trainer's init_seeds: the loader's generator is seeded from it
    loader = build_dataloader(datasets[train_key], batch=args.batch, workers=args.workers, shuffle=True, rank=RANK,
                              drop_last=bool(args.compile), device=device)
    if loader.num_workers == 0:
        return "the datasets (no loader worker processes to start)"
    start_workers_with(loader, options.get("start_method"))
    chain_worker_init(loader, die_with_parent)
    unstarted = loader.generator.get_state() if loader.generator is not None else None  # its workers' seeds' source
    HELD["loader"] = HeldLoader(train_key, loader_key(args.batch, args.workers, RANK, bool(args.compile), device,
                                                      options.get("start_method"), args.seed), loader,
                                start_unfed(loader), seed=int(args.seed), args=args, unstarted=unstarted)
    if not ROOM.fits(loader=HELD["loader"].iterator):
        ROOM.left_out.append(f"the training loader's workers ({ROOM.used(HELD['loader'].iterator) // MIB} MiB with "
                             f"them)")
        HELD.pop("loader").close()
        return "the datasets"
    ROOM.holds.append(HELD_LOADER_WORKERS)
    return (f"the datasets and the training loader ({loader.num_workers} worker processes started"
            f"{_pin_ahead(loader, args.batch, data.get('channels', 3), args.imgsz)})")


def _pin_ahead(loader: Any, batch: int, channels: int, imgsz: int) -> str:
    """Where the held loader pins its batches (on a GPU): the pinned blocks of its first batches made now and
    cached, within the host room, so the fed batches do not page-lock memory beside the restart's first step
    (worker/loading/pinned_ahead.py). What was done, for the line."""
    if not getattr(loader, "pin_memory", False):
        return ""
    count = pinned_ahead.in_flight(loader)
    need = count * pinned_ahead.block_bytes(batch, channels, imgsz)
    if not ROOM.fits(need, loader=HELD["loader"].iterator):
        ROOM.left_out.append(f"pinned memory for its first batches ({need // MIB} MiB)")
        return ""
    pinned_ahead.pin_ahead(count, batch, channels, imgsz)
    ROOM.holds.append(HELD_PINNED_MEMORY)
    return f"; pinned memory for its first {count} batches made ahead, {need // MIB} MiB"


def ram_cache(cache: Any) -> bool:
    """Ultralytics' ``cache`` that puts the images in RAM (True or "ram")."""
    return cache is True or isinstance(cache, str) and cache.lower() == "ram"


def replace_cache(args: Any, cache: Any) -> Any:
    made = copy.copy(args)
    made.cache = cache
    return made


def cache_bytes(dataset: Any) -> int:
    """The RAM its images take once cached, from ``CACHE_SAMPLE`` of them loaded (as Ultralytics' check_cache_ram
    sizes it, without its safety margin and without drawing from the global generator); none kept loaded."""
    import random

    n = min(dataset.ni, CACHE_SAMPLE)
    picked = random.Random(0).sample(range(dataset.ni), n)
    sampled = sum(dataset.load_image(i)[0].nbytes for i in picked)
    dataset.ims, dataset.im_hw0, dataset.im_hw = [None] * dataset.ni, [None] * dataset.ni, [None] * dataset.ni
    dataset.buffer = []
    return sampled * dataset.ni // max(n, 1)


def fill_cache(dataset: Any) -> None:
    """Its images cached in RAM, as Ultralytics' dataset does at its build with ``cache = "ram"`` (where the host
    has the memory: check_cache_ram)."""
    dataset.cache = "ram"
    if dataset.check_cache_ram():
        dataset.cache_images()


def grid(model: Any) -> int:
    """The grid a detection trainer builds its datasets for: the model's largest stride, at least 32."""
    return max(int(model.stride.max()), 32)


def dataset_key(args: Any, img_path: Any, mode: str, batch: Any, stride: int, data: dict[str, Any]) -> str:
    """What a dataset is made of: two builds of one key are the same dataset."""
    kept = {k: v for k, v in sorted(vars(args).items()) if k not in NOT_THE_DATASETS}
    return json.dumps([kept, str(img_path), mode, batch, stride, data], default=str, sort_keys=True)


def loader_key(batch: int, workers: Any, rank: int, drop_last: bool, device: Any, start_method: str | None,
               seed: Any) -> str:
    """What a training loader is made of beyond its dataset."""
    return json.dumps([batch, workers, rank, drop_last, str(device), start_method, seed], default=str)


@dataclass(frozen=True)
class Primed:
    """A held loader's workers fed at the verdict (``prime``): from the resumed position of the checkpoint file
    ``checkpoint`` identifies (None: none, a start from scratch), by ``index_sampler``, a copy of the loader's own over
    ``sampler``, the epoch-keyed order as the launch's resume will make it (``unfed``: as it stood before the feeding)."""
    checkpoint: tuple[int, ...] | None
    sampler: Any
    unfed: Any
    index_sampler: Any
    mosaic_closed: bool = False  # its workers were started anew without mosaic: the resumed epoch is one of the last
    # ``close_mosaic``, where the trainer closes it and resets the loader before the first batch
    with_mosaic: Any = None  # the dataset's transforms before, for a launch that keeps mosaic after all


@dataclass
class HeldLoader:
    dataset_key: str
    loader_key: str
    loader: Any
    iterator: Any  # its workers started, fed nothing yet (or fed at the verdict: ``primed``)
    seed: int = 0  # the training's seed, which the epoch-keyed order is drawn from
    primed: Primed | None = None
    args: Any = None  # the arguments its dataset was built with (their augmentations: ``close_mosaic``)
    unstarted: Any = None  # its generator's state before its workers were started: a cold loader's first seeds

    def close_mosaic(self) -> Any:
        """Its dataset without mosaic, as the trainer's ``_close_dataloader_mosaic`` makes it, and its workers started
        anew over that dataset (a worker copies the dataset as it forks), drawing the seeds a cold loader's first
        workers draw; the dataset's transforms before."""
        self.iterator._shutdown_workers()
        dataset = self.loader.dataset
        before = dataset.transforms
        if hasattr(dataset, "mosaic"):  # (as the trainer's: not every Ultralytics dataset has it)
            dataset.mosaic = False
        dataset.close_mosaic(hyp=copy.copy(self.args))
        if self.unstarted is not None:
            self.loader.generator.set_state(self.unstarted)
        self.iterator = start_unfed(self.loader)
        return before

    def close(self) -> None:
        self.iterator._shutdown_workers()


def checkpoint_identity(stat: os.stat_result) -> tuple[int, ...]:
    """One file as it was written: a checkpoint saved again is a new file (an atomic rename), another inode."""
    return stat.st_dev, stat.st_ino, stat.st_size, stat.st_mtime_ns


@dataclass(frozen=True)
class ResumedPosition:
    """Where a launch resuming a checkpoint starts, as worker/training/train.py and the trainer read it."""
    checkpoint: tuple[int, ...] | None  # the file's identity (None: from scratch)
    epoch: int  # 0-based
    resume: Any  # the exact resume point within it (None: its start)
    closes_mosaic: bool  # the trainer closes mosaic before this epoch's first batch (one of the last close_mosaic)


def resumed_position(checkpoint: str | None, args: Any) -> ResumedPosition:
    """Where a launch resuming ``checkpoint`` (None: from scratch; ``args``, the training's arguments then) starts.
    A resume trains to the epochs its checkpoint's own arguments say, as Ultralytics' resume does."""
    import torch

    if checkpoint is None:
        return ResumedPosition(None, 0, None, _closes_mosaic(0, vars(args)))
    with open(checkpoint, "rb") as f:
        identity = checkpoint_identity(os.fstat(f.fileno()))
        ckpt = torch.load(f, map_location="cpu", weights_only=False)
    if is_finished(ckpt):
        raise ValueError("it holds a finished training")
    exact = ckpt.get(EXACT_KEY)
    trained = {**vars(args), **(ckpt.get("train_args") or {})}
    if exact:
        epoch = int(exact["epoch"])
        return ResumedPosition(identity, epoch, ResumePoint(epoch, exact["batch"], exact.get("samples")),
                               _closes_mosaic(epoch, trained))
    epoch = int(ckpt["epoch"]) + 1
    return ResumedPosition(identity, epoch, None, _closes_mosaic(epoch, trained))


def _closes_mosaic(epoch: int, args: dict[str, Any]) -> bool:
    """Ultralytics' trainer closes mosaic (and resets the loader) as it enters an epoch of the last ``close_mosaic``,
    a resumed one too."""
    close = int(args.get("close_mosaic") or 0)
    return bool(close) and epoch >= int(args.get("epochs") or 0) - close


def prime(checkpoint: str | None) -> str:
    """The restart is coming, from ``checkpoint``: feed the held loader's workers now, from its resumed position, so
    that the launch's first batches are loading while the old tree is killed. What was done, for the line."""
    held = HELD.get("loader")
    if held is None or held.primed is not None:
        return "no training loader held to feed ahead" if held is None else "its training loader is fed already"
    began = time.monotonic()
    try:
        position = resumed_position(checkpoint, held.args)
    except Exception as e:  # the launch reads it too, and says why it cannot; the held workers are fed there
        return f"its training loader is fed at the launch ({checkpoint}: {type(e).__name__}: {str(e)[:200]})"
    epoch, resume = position.epoch, position.resume
    sampler = exact_resume.epoch_order(held.loader, held.seed, resume)
    if sampler is None:
        return "its training loader is fed at the launch (its sampler keeps no epoch-keyed order)"
    closes = position.closes_mosaic and hasattr(held.loader.dataset, "close_mosaic")
    with_mosaic = held.close_mosaic() if closes else None  # the trainer would reset the loader over a dataset
    # without mosaic: its workers are started so now
    sampler.next_epoch = epoch
    index_sampler = copy.copy(held.loader.batch_sampler)  # Ultralytics' _RepeatSampler over a BatchSampler
    index_sampler.sampler = copy.copy(index_sampler.sampler)
    index_sampler.sampler.sampler = sampler
    unfed = copy.deepcopy(sampler)
    fed(held.iterator, index_sampler)
    held.primed = Primed(position.checkpoint, sampler, unfed, index_sampler, mosaic_closed=bool(closes),
                         with_mosaic=with_mosaic)
    at = f"batch {resume.batches + 1}" if resume is not None else "its start"
    anew = ", started anew without mosaic (one of the last close_mosaic epochs)" if closes else ""
    return (f"its training loader's workers{anew} load epoch {epoch + 1} from {at} now, as "
            f"{checkpoint or 'a start from scratch'} resumes ({time.monotonic() - began:.2f} s to feed them)")


def warm_at_the_verdict() -> str:
    """Where the standby's first step could not run at the training's batch within its memory grant: run it now,
    beside the old tree's kill, on the whole device (that tree is being killed; a step that finds no room fails alone
    and the launch warms up as it would have). It runs on this thread, the one that trains once the launch comes
    (the forward's cuDNN plans are a thread's own: worker/startup/device_warmup.py), and the launch waits for it
    rather than for its plans at the first step. The launch takes it (``take_warmup``)."""
    step, model = HELD.pop("training_step", None), HELD.get("model")
    if step is None or model is None:
        return ""
    shape, device, dtype = step
    launched()  # the memory cap lifted now rather than at the launch
    HELD["warmup"] = DeviceWarmUp(model, shape, device, dtype, beside="at the verdict, beside the kill").run_here()
    return f"; its first step run at batch {shape[0]} on the thread that trains"


def take_warmup(shape: tuple[int, ...], device: Any, dtype: Any) -> DeviceWarmUp | None:
    """The warm-up started at the verdict where it is the launch's (its shape, device and autocast), else None; the
    launch makes its own then (one that does not match ends on its own, its copy dropped)."""
    warm = HELD.pop("warmup", None)
    if warm is None or (warm.shape, str(warm.device), warm.autocast_dtype) != (tuple(shape), str(device), dtype):
        return None
    return warm


def resuming(checkpoint: str | None) -> None:
    """The launch resumes from ``checkpoint`` (None: from scratch): a held loader fed from another is not taken."""
    HELD["resumes"] = checkpoint_identity(os.stat(checkpoint)) if checkpoint is not None else None


def start_unfed(loader: Any) -> Any:
    """The loader's iterator, its worker processes started and asked for nothing: torch's iterator asks its sampler
    for its first batches as it starts (``_reset``), so it is made over an empty one (``fed`` points it at the
    loader's own later)."""
    sampler = loader.batch_sampler
    object.__setattr__(loader, "batch_sampler", [])  # DataLoader refuses a plain assignment after __init__
    try:
        return loader._get_iterator()
    finally:
        object.__setattr__(loader, "batch_sampler", sampler)


def fed(iterator: Any, index_sampler: Any) -> Any:
    """``iterator`` (from ``start_unfed``) asking for the batches of ``index_sampler`` (a loader's) from its position
    now, as a new iterator of the loader would at its start."""
    iterator._index_sampler = index_sampler
    iterator._sampler_iter = iter(iterator._index_sampler)
    for _ in range(iterator._prefetch_factor * iterator._num_workers):
        iterator._try_put_index()
    return iterator


@functools.cache
def held_class(base: type) -> type:
    """``base`` whose next iterator is the one held ready (``held_iterator``), fed from the sampler as it stands
    then; later iterators are made as ``base`` makes them. Below the resume's and the in-place recovery's classes,
    which subclass it: they position the sampler before it and see the iterator it gives."""

    def _get_iterator(self):
        held = self.__dict__.pop("held_iterator", None)
        primed = self.__dict__.pop("held_primed", None)
        if held is None:
            return base._get_iterator(self)
        if primed is None:
            return fed(held, self._index_sampler)
        reset = self.__dict__.pop("held_reset", False)
        if primed.mosaic_closed and not reset:  # the trainer kept mosaic: the workers started without it are not its
            self.dataset.transforms = primed.with_mosaic
            if hasattr(self.dataset, "mosaic"):
                self.dataset.mosaic = True
        if not primed.unfed.same_order(self.sampler) or primed.mosaic_closed and not reset:
            # the resume drew another order than the one fed at the verdict, or kept the mosaic they were started without
            held._shutdown_workers()
            print("yolo-train worker: the training loader's workers fed at the verdict loaded another position than "
                  "this launch resumes: starting new ones", file=sys.stderr, flush=True)
            return base._get_iterator(self)
        # The pass they were fed is under way: the loader goes on from the order it is drawn from.
        object.__setattr__(self, "batch_sampler", primed.index_sampler)  # DataLoader refuses a plain assignment
        object.__setattr__(self, "sampler", primed.sampler)
        return held

    def close(self):
        """A close or reset before the first iteration (close_mosaic's changes the dataset the workers copied)
        stops the held workers too: the next iterator is a new one, drawn from the loader's own order. Not where
        they were started without mosaic at the verdict (``prime``): the reset before the first batch is then
        close_mosaic's, which changes nothing they copied."""
        primed = self.__dict__.get("held_primed")
        if primed is not None and primed.mosaic_closed and "held_iterator" in self.__dict__:
            self.__dict__["held_reset"] = True
            return
        self.__dict__.pop("held_primed", None)
        held = self.__dict__.pop("held_iterator", None)
        if held is not None:
            held._shutdown_workers()
        base.close(self)

    return type(f"Held{base.__name__}", (base,), {"_get_iterator": _get_iterator, "close": close})


def take_dataset(key: str, cache: Any) -> Any | None:
    """The dataset held for ``key`` (dataset_key), else None; no longer held either way. One held without the RAM
    cache ``cache`` asks for has its images cached now."""
    dataset = HELD.get("datasets", {}).pop(key, None)
    if dataset is not None and ram_cache(cache) and dataset.cache != "ram":
        fill_cache(dataset)
    return dataset


def drop_datasets() -> None:
    HELD.pop("datasets", None)
    for held in (HELD_TRAIN_DATASET, HELD_VAL_DATASET):
        if held in ROOM.holds:
            ROOM.holds.remove(held)


def take_loader(data_key: str, key: str, workers_hooked: bool) -> Any | None:
    """The training loader held, its workers ready for the next iterator (``held_class``), when the launch would
    build the same (``data_key``, ``key``), hook nothing into its workers (``workers_hooked``: a fault injected
    there) and, where they were fed at the verdict, resume from that same checkpoint file (``resuming``); else None,
    its workers stopped (its dataset stays held for ``take_dataset``)."""
    held = HELD.get("loader")
    if held is None:
        return None
    other_checkpoint = held.primed is not None and held.primed.checkpoint != HELD.get("resumes")
    if held.dataset_key != data_key or held.loader_key != key or workers_hooked or other_checkpoint:
        drop_loader("a fault is hooked into its workers" if workers_hooked else "its dataset is not this launch's"
                    if held.dataset_key != data_key else
                    "made for another rung's loader (batch, workers, start method, seed)" if held.loader_key != key
                    else "its workers were fed at the verdict from another checkpoint than this launch resumes")
        return None
    HELD.pop("loader")
    HELD.get("datasets", {}).pop(data_key, None)
    held.loader.held_iterator = held.iterator
    if held.primed is not None:
        held.loader.held_primed = held.primed
    return held.loader


def drop_loader(why: str, then: str = "starting its workers at the first batch") -> None:
    """The held loader's workers stopped, and why said, where the launch does not take it."""
    held = HELD.pop("loader", None)
    if held is not None:
        held.close()
        print(f"yolo-train worker: the training loader held ready is dropped ({why}): {then}", file=sys.stderr,
              flush=True)


def drop() -> None:
    """Nothing held any more: a held loader's workers stopped."""
    held = HELD.pop("loader", None)
    if held is not None:
        held.close()
    for what in ("model", "datasets", "training_step", "warmup"):
        HELD.pop(what, None)


def _first_step(model: Any, args: Any, device: Any, imgsz: int, batch: int) -> str:
    """One forward, loss and backward as the training's first step makes them (the device warm-up, on a copy of the
    model, under the training's autocast and its determinism), so the GPU libraries are loaded and the kernels chosen
    before the verdict; the model itself is untouched. At the training's batch where the memory granted holds it,
    else at one image: the libraries are the same, and the training's batch is warmed at the verdict (``prime``).
    What it did, for the line."""
    import torch
    from ultralytics.utils import RANK
    from ultralytics.utils.torch_utils import init_seeds

    # The trainer's own first call (BaseTrainer.__init__, made again at the launch, which reseeds everything): the
    # step runs the algorithms the training will (deterministic ones where asked), not torch's defaults.
    init_seeds(args.seed + 1 + RANK, deterministic=args.deterministic)
    amp = args.amp not in {False, "fp32"}
    dtype = torch.bfloat16 if args.amp == "bf16" else torch.float16 if amp else None
    model.args = args  # the loss's hyperparameters (the trainer sets the same at the launch)
    batch = batch if batch > 0 else 16  # an auto batch (-1, a fraction) is known only to the trainer
    HELD["training_step"] = ((batch, 3, imgsz, imgsz), device, dtype)
    try:
        for size in dict.fromkeys((batch, 1)):
            warm = DeviceWarmUp(model, (size, 3, imgsz, imgsz), device, dtype).run_here()  # the thread that trains
            warm.finish()
            if warm.error is None:
                if size == batch:
                    HELD.pop("training_step")  # warmed: nothing left for the verdict
                return f", its first step run ({warm.parts()}, batch {size}, {warm.seconds:.1f} s)"
            if not isinstance(warm.error, torch.cuda.OutOfMemoryError):
                return f", no first step ({type(warm.error).__name__}: {warm.error})"
            torch.cuda.empty_cache()  # what the refused step reserved, back to the device before the smaller one
        return ", no first step (even one image needs more than [worker] standby_memory_mib)"
    finally:
        torch.cuda.empty_cache()


def launched() -> None:
    """The launch came: this process is the training now, and may use the whole device."""
    device = HELD.pop("capped", None)
    if device is not None:
        import torch

        torch.cuda.set_per_process_memory_fraction(1.0, device)


def take_model(cfg: Any, nc: int, ch: int) -> Any | None:
    """The held model if the launch would build the same (architecture, classes, channels), else None; either
    way it is no longer held."""
    model = HELD.pop("model", None)
    if model is None:
        return None
    wanted = architecture(cfg)
    if wanted is None or wanted != architecture(model.yaml) or model.yaml.get("nc") != nc \
            or model.yaml.get("channels", 3) != ch:
        print("yolo-train worker: the model held ready is not this launch's: building it", file=sys.stderr, flush=True)
        return None
    return model


def prepare_from_env() -> None:
    spec = os.environ.get(ENV_READY)
    if spec:
        print(f"yolo-train standby: {prepare(json.loads(spec))}", flush=True)
