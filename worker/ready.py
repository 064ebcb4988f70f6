"""The ready standby: what a standby worker holds, built while the attempt before it trains, so that the next attempt
takes it instead of building it after the verdict.

The supervisor asks for it (``ENV_READY``, the train arguments it needs as JSON) only where the device has room
(supervisor/attempt/ready_room.py); the standby then builds the device context and the model (on a GPU, with a
first step that chooses its kernels), on one CPU thread and within the device memory it was granted, and sleeps on
its stdin. At the launch the trainer's ``get_model`` takes the held model when it is the one the
launch would build (same architecture, classes and channels) and loads the checkpoint's weights into it, as a cold
build does into a new one: the weights, the buffers and every later step are the same; only the build is gone. A
model that does not match is dropped, and the launch builds its own.
"""

from __future__ import annotations

import json
import os
import sys
import time
from typing import Any

from worker.contract import ENV_READY
from worker.demo_data import ensure_demo_dataset
from worker.startup_steps import few_cpu_threads
# Keys of a model's YAML that a build fills in from the dataset or the file: the rest is the architecture.
FILLED_IN = ("yaml_file", "nc", "ch", "channels")
MIB = 1 << 20

HELD: dict[str, Any] = {}  # "model": the model built ahead, until the launch takes or drops it


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
    """Build what the next attempt would build first (``spec``: its model, data, device); the line that says what is
    held, or why nothing is. Runs while another process trains: on one CPU thread, once, then it sleeps."""
    began = time.monotonic()
    try:
        with few_cpu_threads(1):
            what = _build(spec)
    except Exception as e:  # a standby that cannot prepare is today's standby: the launch builds all
        HELD.pop("model", None)
        return f"not ready ({type(e).__name__}: {e}): the launch builds the model"
    return f"ready in {time.monotonic() - began:.1f} s: {what}"


def _build(spec: dict[str, Any]) -> str:
    import torch
    from ultralytics.data.utils import check_det_dataset
    from ultralytics.nn.tasks import DetectionModel, guess_model_task
    from ultralytics.utils.torch_utils import select_device

    model = spec.get("model", "yolov8n.yaml")
    if architecture(model) is None:
        return f"the device only (model {model} is not a YAML: its build reads the checkpoint)"
    task = spec.get("task") or guess_model_task(model)
    if task != "detect":
        return f"the device only (task {task}: only a detection model is built ahead)"
    device = select_device(str(spec.get("device", "")), verbose=False)
    if device.type == "cuda":
        torch.zeros(1, device=device)  # the device context, created now rather than after the verdict
        # Beside a training that holds the rest of the card, this process may allocate what the supervisor found
        # free for it and no more: a first step that needs more fails here, not in the training (restored at launch).
        total = torch.cuda.get_device_properties(device).total_memory
        torch.cuda.set_per_process_memory_fraction(min(1.0, int(spec.get("memory_mib", 1024)) * MIB / total), device)
        HELD["capped"] = device
    data = spec.get("data")
    if data == "demo":

        data = str(ensure_demo_dataset())
    dataset = check_det_dataset(data)
    built = DetectionModel(model, nc=dataset["nc"], ch=dataset.get("channels", 3), verbose=False)
    step = ""
    if device.type == "cuda":
        built = built.to(device)
        step = _first_step(built, device, int(spec.get("imgsz", 640)), int(spec.get("batch", 16)))
    HELD["model"] = built
    return f"the model {model} built on {device.type}{step}"


def _first_step(model: Any, device: Any, imgsz: int, batch: int) -> str:
    """One forward and backward at the training's shape, so the kernels are chosen (cuDNN's benchmark) before the
    verdict; the weights and buffers it changes are the checkpoint's after the launch. What it did, for the line."""
    import torch

    batch = batch if batch > 0 else 16  # an auto batch (-1, a fraction) is known only to the trainer
    try:
        images = torch.zeros(batch, 3, imgsz, imgsz, device=device)
        model.train()
        outputs = model(images)
        sum(o.float().sum() for o in (outputs if isinstance(outputs, (list, tuple)) else [outputs])).backward()
        torch.cuda.synchronize(device)
        return ", its first step run"
    except torch.cuda.OutOfMemoryError:
        return ", no first step (it needs more than [worker] standby_memory_mib)"
    finally:
        for p in model.parameters():
            p.grad = None
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
