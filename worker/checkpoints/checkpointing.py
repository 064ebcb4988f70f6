"""Checkpoint files the supervisor can trust: written atomically, checked to belong to this training.

A kill or a full disk during a save must never leave a truncated ``last.pt`` where a good one was, because the
supervisor resumes from that file. Every write goes to a temporary file in the same directory, is fsynced and
renamed over the target (a new inode each time, which also lets the supervisor keep ``last.good.pt`` as a hard
link). A checkpoint copied in from another training (another model, task, data, image size or number of epochs)
is refused by name instead of being resumed as this one's.

Mid-epoch checkpoints are ordinary Ultralytics checkpoints (``ema``, ``optimizer``, ``epoch`` = the last
completed epoch, ...) that Ultralytics' own tools load, plus one key, ``EXACT_KEY``, with what an exact resume
needs (see ``worker/supervision/exact_resume.py``).
"""

from __future__ import annotations

import errno
import os
from pathlib import Path
from typing import Any, Callable

from worker.wire.durable_file import sync_directory, write_durably

EXACT_KEY = "yolo_train_exact"  # the mid-epoch position and fp32 state; Ultralytics ignores unknown keys


class CheckpointWriteError(OSError):
    """A checkpoint could not be written; the previous file at that path, if any, is untouched."""


def atomic_write(path: Path, data: bytes) -> None:
    """Write ``data`` to ``path`` so that a reader sees either the old file or the whole new one."""
    path = Path(path)
    try:
        write_durably(path, data)
    except OSError as e:
        hint = "; free disk space" if e.errno in (errno.ENOSPC, errno.EDQUOT) else ""
        kept = f"the previous {path.name} is intact" if path.exists() else f"no {path.name} was written before it"
        raise CheckpointWriteError(e.errno, f"cannot write checkpoint {path}: {e.strerror or e}{hint}; {kept}") \
            from None


class AtomicPath(type(Path())):
    """A path whose ``write_bytes`` is ``atomic_write``: handed to Ultralytics as ``last``/``best``/``wdir`` so its
    own end-of-epoch ``save_model`` (which calls ``write_bytes``) becomes atomic without copying it."""

    def write_bytes(self, data: bytes) -> int:  # type: ignore[override]
        atomic_write(self, bytes(data))
        return len(data)


def strip_atomically(strip: Callable[..., dict[str, Any]]) -> Callable[..., dict[str, Any]]:
    """Ultralytics' ``strip_optimizer`` made to write beside the file and rename over it: its own ``torch.save`` to
    the path rewrites the file in place, where the supervisor, verifying the last save, would read it half written
    (and a kill then would tear it)."""

    def stripped(f: str | Path, s: str = "", updates: dict[str, Any] | None = None) -> dict[str, Any]:
        if s:  # saved elsewhere: nothing is rewritten
            return strip(f, s, updates)
        path = Path(f)
        tmp = path.with_name(f".{path.name}.stripped-{os.getpid()}")
        try:
            combined = strip(path, str(tmp), updates)
            if tmp.exists():  # not when the file was no checkpoint: strip_optimizer warns and writes nothing
                with open(tmp, "rb") as written:
                    os.fsync(written.fileno())
                os.replace(tmp, path)
                sync_directory(path.parent)
            return combined
        finally:
            tmp.unlink(missing_ok=True)

    return stripped


def load_checkpoint_file(path: str) -> dict[str, Any]:
    """The checkpoint dict, or ValueError with one line saying why it cannot be read."""
    import torch

    try:
        ckpt = torch.load(path, map_location="cpu", weights_only=False)
    except Exception as e:  # truncated zip, pickle garbage, missing file: all mean "not usable"
        raise ValueError(f"{path}: unreadable checkpoint ({type(e).__name__}: {str(e)[:200]})") from None
    if not isinstance(ckpt, dict) or ("ema" not in ckpt and "model" not in ckpt):
        raise ValueError(f"{path}: not an Ultralytics checkpoint (no ema or model)")
    return ckpt


def readable_checkpoint(path: str) -> tuple[str, dict[str, Any]]:
    """``path`` and its contents, or, when it is corrupt, the supervisor's ``last.good.pt`` beside it."""
    try:
        return path, load_checkpoint_file(path)
    except ValueError as first:
        good = Path(path).with_name("last.good.pt")
        if good.exists() and good.resolve() != Path(path).resolve():
            try:
                ckpt = load_checkpoint_file(str(good))
            except ValueError:
                raise first from None
            print(f"yolo-train worker: {first}; resuming from {good} instead", flush=True)
            return str(good), ckpt
        raise


def is_finished(ckpt: dict[str, Any]) -> bool:
    """Nothing is left to train. Ultralytics strips the optimizer and sets epoch -1 once training is over; before that,
    its last epoch's own save says every epoch done, and a worker stopped between the two (in the final validation)
    leaves it so: Ultralytics' resume refuses it too ("training to N epochs is finished"). A mid-epoch checkpoint
    carries the exact position and its optimizer: it is not finished, even in the first epoch (epoch -1, none done)."""
    if EXACT_KEY in ckpt and ckpt.get("optimizer") is not None:
        return False
    epoch, epochs = ckpt.get("epoch", -1), (ckpt.get("train_args") or {}).get("epochs")
    return epoch == -1 or isinstance(epochs, int) and epoch + 1 >= epochs


def _model_identity(model: Any) -> str | None:
    """The architecture a model argument names: the YAML file's stem with its scale (yolov8n), or None when unknown."""
    model = str(model)
    try:
        if model.endswith((".yaml", ".yml")):
            from ultralytics.nn.tasks import yaml_model_load

            cfg = yaml_model_load(model)
        elif model.endswith(".pt") and Path(model).exists():
            cfg = getattr(load_checkpoint_file(model).get("ema") or {}, "yaml", None)
        else:
            return None
    except Exception:
        return None
    return _yaml_identity(cfg)


def _yaml_identity(cfg: Any) -> str | None:
    if not isinstance(cfg, dict) or not cfg.get("yaml_file"):
        return None
    stem = Path(str(cfg["yaml_file"])).stem
    scale = cfg.get("scale") or ""
    # yaml_model_load maps yolov8n.yaml to the unified yolov8.yaml with scale "n": name both the same way
    return stem if stem.endswith(scale) else stem + scale


def identity_mismatch(ckpt: dict[str, Any], config: dict[str, Any]) -> tuple[str, Any, Any] | None:
    """The first of model, task, data, imgsz, epochs on which the checkpoint and this training's config differ, as
    (key, checkpoint's value, config's value); None when the checkpoint belongs to this training."""
    from ultralytics.cfg import DEFAULT_CFG_DICT

    saved = ckpt.get("train_args") or {}
    ema = ckpt.get("ema") or ckpt.get("model")
    want_model = _model_identity(config.get("model", DEFAULT_CFG_DICT.get("model")))
    have_model = _yaml_identity(getattr(ema, "yaml", None))
    if want_model and have_model and want_model != have_model:
        return "model", have_model, want_model
    for key in ("task", "data", "imgsz", "epochs"):
        if key not in saved:
            continue
        want = config.get(key, DEFAULT_CFG_DICT.get(key))
        if want is None:
            continue
        have = saved[key]
        if key == "data":
            have, want = os.path.realpath(str(have)), os.path.realpath(str(want))
        if have != want:
            return key, saved[key], config.get(key, DEFAULT_CFG_DICT.get(key))
    return None


def identity_refusal(path: str, mismatch: tuple[str, Any, Any]) -> str:
    key, have, want = mismatch
    return (f"yolo-train worker: {path}: checkpoint of another training ({key}: checkpoint {have}, config {want}); "
            f"point state_dir elsewhere or remove it")
