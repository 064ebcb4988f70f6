"""What a configuration asks of the machine it trains on: its data file and its GPUs, refused in one line (ConfigError,
exit 78) before a worker starts rather than found by a worker that crashes at each start until the budget is spent.

Checked by ``run`` before training, and by ``check-config`` unless it is given ``--portable`` (a file checked on
another machine than the one that trains). The rest of a configuration, which the file alone decides, is checked by
``config.parse`` wherever it is read.

``data`` is resolved as Ultralytics resolves it, without the network: a path that exists (relative to the directory
``run`` starts in: the worker's), a name its ``check_file`` finds in its own package (``coco8.yaml``, ``coco8``:
``ultralytics/cfg/datasets``), a URL, or for classification a bare name it downloads itself (``mnist160``).
``model`` likewise, as its trainer resolves it: a file that is a model (a ``.pt`` in torch's archive layout, a YAML
with a backbone and a head), a model YAML of its package (``yolov8n.yaml``, through its unified ``yolov8.yaml``), a
name it downloads (``yolov8n.pt``, ``yolo11n``: ``GITHUB_ASSETS_NAMES``) or finds in its ``weights_dir``, or a URL. A
device the driver's files list is let through as it is (``gpus_present``); otherwise the GPUs are counted by the
worker's Python with the worker's environment, in a child process, and only that count refuses one: torch in the
supervisor would cost it seconds and hundreds of MB, and a GPU driver that hangs would hang it.
"""

from __future__ import annotations

import glob
import importlib.util
import json
import os
import re
import subprocess
import sys
import zipfile
from pathlib import Path
from typing import Any

import yaml

from supervisor.config import Config, ConfigError
from supervisor.host import torch_build
from supervisor.ultralytics_args import asset_names

DATASET_SUFFIXES = (".yaml", ".yml")
WEIGHTS_SUFFIX = ".pt"  # what Ultralytics' trainer loads as weights; any other name it builds as a model YAML
# torch.save's archive before torch 1.6 (_use_new_zipfile_serialization=False): a pickle of its magic number first
LEGACY_TORCH_MAGIC = bytes.fromhex("80028a0a6cfc9c46f9206aa85019")
REMOTE = "://"  # Ultralytics downloads these (https://, ul://, gs://): nothing to check without the network
NOT_COUNTED = ("npu", "xpu", "tpu", "intel", "vulkan")  # other backends Ultralytics passes through: not checked here
PROBE_TIMEOUT = 120.0  # importing torch on a loaded machine; a probe that does not answer refuses nothing
COUNT_SCRIPT = "import torch; print(torch.cuda.device_count())"  # ROCm's HIP devices count here too


def check(config: Config, count_gpus: Any = None) -> None:
    """ConfigError (one line: file, key, the fix) where this machine cannot run ``config``'s training."""
    if config.command is not None:
        return  # a command's data and devices are its own arguments
    data = config.train.get("data")
    if isinstance(data, str):
        problem = data_problem(data, _task(config.train))
        if problem:
            raise ConfigError(f"{config.source}: train.data: {problem}")
    model = config.train.get("model")
    if isinstance(model, str):
        problem = model_problem(model)
        if problem:
            raise ConfigError(f"{config.source}: train.model: {problem}")
    device = config.train.get("device")
    if device is not None:
        problem = device_problem(device, count_gpus or (lambda: gpu_count(config)), _visible(config),
                                 present=None if count_gpus or config.worker_python else gpus_present(_worker_env(config)))
        if problem:
            raise ConfigError(f"{config.source}: train.device: {problem}")


def _task(train: dict[str, Any]) -> str:
    """The task as Ultralytics' guess_model_task reads a model's name: only classification resolves data otherwise."""
    return str(train.get("task") or ("classify" if "-cls" in str(train.get("model", "")) else "detect"))


def data_problem(data: str, task: str = "detect") -> str | None:
    """Why Ultralytics would not find ``data`` on this machine, as the fix; None where it would (or cannot be told)."""
    if data == "demo" or REMOTE in data or os.path.exists(data):
        return None
    path_like = os.sep in data or data.startswith(("~", "."))
    if task == "classify" and not path_like and not Path(data).suffix:
        return None  # a bare name Ultralytics' check_cls_dataset downloads from its assets
    names = [data] if Path(data).suffix in DATASET_SUFFIXES else [data, *(data + s for s in DATASET_SUFFIXES)]
    found = [_ultralytics_finds(name) for name in names]
    if any(found) or not path_like and None in found:
        return None
    where = Path(data) if Path(data).is_absolute() else Path.cwd() / data
    return (f"no such file {str(where)!r} (a relative path is from the directory `run` starts in, {Path.cwd()}), and "
            f"not a dataset Ultralytics resolves itself (a name in ultralytics/cfg/datasets such as \"coco8.yaml\", "
            f"or a URL); give the path of an existing dataset YAML or directory")


def model_problem(model: str) -> str | None:
    """Why Ultralytics' trainer would find no model in ``model`` on this machine, as the fix; None where it would (or
    cannot be told)."""
    model = model.strip()
    if REMOTE in model:  # a URL, ul:// or Triton's grpc://: nothing to check without the network
        return None
    known = asset_names()
    if known is None:
        return None  # no Ultralytics here, or one whose names cannot be read: its own check at the worker
    path = Path(model)
    if not path.suffix and path.name + WEIGHTS_SUFFIX in known:  # check_model_file_from_stem: yolo11n -> yolo11n.pt
        path = path.with_suffix(WEIGHTS_SUFFIX)
    if path.is_dir():
        return f"{model!r} is a directory; give a model file: a .pt checkpoint or a model YAML such as \"yolov8n.yaml\""
    if path.is_file():
        wrong = _not_a_model(path)
        return None if wrong is None else (
            f"{str(path)!r} is not a model ({wrong}); give a .pt checkpoint (as torch.save writes it) or a model "
            f"YAML (with a backbone and a head), such as \"yolov8n.yaml\"")
    if path.suffix == WEIGHTS_SUFFIX:
        # attempt_download_asset: the weights_dir of Ultralytics' settings, then a download of a name it knows
        weights_dir = _weights_dir()
        if path.name in known or weights_dir is not None and (weights_dir / path).is_file():
            return None
    elif path.suffix.lower() in DATASET_SUFFIXES + ("",):
        if any(_ultralytics_finds(name) is not False for name in _model_yaml_names(path)):
            return None  # yaml_model_load's check_yaml: a model YAML of its package, or its unified name
    where = path if path.is_absolute() else Path.cwd() / path
    return (f"no such file {str(where)!r} (a relative path is from the directory `run` starts in, {Path.cwd()}), and "
            f"not a model Ultralytics downloads or builds by name (such as \"yolov8n.pt\" or \"yolov8n.yaml\"); give "
            f"the path of an existing .pt checkpoint or model YAML")


def _not_a_model(path: Path) -> str | None:
    """What keeps the file ``path`` from being a model Ultralytics trains, read cheaply (no torch); None: it is one."""
    if path.suffix == WEIGHTS_SUFFIX:
        try:
            with zipfile.ZipFile(path) as archive:
                if any(n == "data.pkl" or n.endswith("/data.pkl") for n in archive.namelist()):
                    return None
                return "a zip archive without the data.pkl of torch.save's"
        except zipfile.BadZipFile:
            with open(path, "rb") as f:
                return None if f.read(len(LEGACY_TORCH_MAGIC)) == LEGACY_TORCH_MAGIC else \
                    "neither torch.save's zip archive nor its older pickle"
        except OSError as e:
            return f"unreadable: {e.strerror}"
    if path.suffix.lower() not in DATASET_SUFFIXES + ("",):
        return f"Ultralytics trains from a .pt checkpoint or builds from a model YAML, not a {path.suffix} file"
    try:
        cfg = yaml.safe_load(path.read_text())
    except (OSError, UnicodeDecodeError, yaml.YAMLError) as e:
        return f"not YAML: {str(e).splitlines()[0] if str(e) else type(e).__name__}"
    if not isinstance(cfg, dict) or not {"backbone", "head"} <= set(cfg):
        return "a YAML without the backbone and head of a model: a dataset YAML goes in [train] data"
    return None


def _model_yaml_names(path: Path) -> list[str]:
    """The names yaml_model_load looks for: the path (a P6 model under its -p6 name), then its unified name."""
    named = str(path.with_name(re.sub(r"^(yolov[58][nsmlx])6(.*)$", r"\1-p6\2", path.name)))
    return [named, re.sub(r"(\d+)([nslmx])(.+)?$", r"\1\3", named)]


def _weights_dir() -> Path | None:
    """Ultralytics' settings' weights_dir (its settings.json, in YOLO_CONFIG_DIR or the XDG config directory)."""
    base = os.environ.get("YOLO_CONFIG_DIR") or Path(os.environ.get("XDG_CONFIG_HOME") or "~/.config").expanduser() / \
        "Ultralytics"
    try:
        weights = json.loads((Path(base) / "settings.json").read_text()).get("weights_dir")
    except (OSError, ValueError, AttributeError):
        return None
    return Path(weights) if isinstance(weights, str) else None


def _ultralytics_finds(name: str) -> bool | None:
    """Whether Ultralytics' ``check_file`` search finds ``name`` in its package (None: no Ultralytics here)."""
    spec = importlib.util.find_spec("ultralytics")  # located, not imported: that would import torch
    if spec is None or not spec.submodule_search_locations:
        return None
    root = Path(list(spec.submodule_search_locations)[0])
    return bool(glob.glob(str(root / "**" / name), recursive=True) or glob.glob(str(root.parent / name)))


def canonical_device(device: Any) -> str:
    """[train] device as Ultralytics' ``parse_device`` spells it: "", "cpu", "mps", "0" or "0,1"."""
    text = ",".join(str(d) for d in device) if isinstance(device, (list, tuple)) else str(device)
    text = text.lower()
    for noise in ("cuda:", "none", "(", ")", "[", "]", "'", " "):
        text = text.replace(noise, "")
    return "0" if text == "cuda" else text


def device_problem(device: Any, count_gpus: Any, visible: set[str], present: int | None = None) -> str | None:
    """Why this machine lacks ``device``, as the fix; None where it has it (or where its GPUs cannot be counted).
    ``count_gpus()``: the GPUs the worker's torch sees (None: unknown); ``visible``: CUDA_VISIBLE_DEVICES' ids, which
    Ultralytics also takes for the indices they stand for; ``present``: the GPUs the driver's files list
    (``gpus_present``), enough to let a device through without torch's count, never to refuse one."""
    text = canonical_device(device)
    if text in ("", "cpu") or text.startswith(NOT_COUNTED):
        return None
    if text in ("mps", "mps:0"):
        if sys.platform == "darwin":
            return None
        return ("expected \"cpu\" or a GPU index on this machine: \"mps\" is Apple silicon's GPU, which a "
                f"{sys.platform} machine has none of (Ultralytics would train on the CPU), got {device!r}")
    ids = text.split(",")
    if not all(i.isdigit() or i == "-1" for i in ids):
        return f"expected \"cpu\", a GPU index (\"0\") or a comma list of them for DDP (\"0,1\"), got {device!r}"
    if present is not None and _has(ids, present, visible):
        return None  # (torch's own count is an interpreter importing it: seconds of every start on a GPU)
    count = count_gpus()
    if count is None or _has(ids, count, visible):
        return None
    seen = f"GPUs 0 to {count - 1}" if count else "no GPU"
    return (f"expected a device this machine has: the worker's torch sees {seen}"
            f"{' (under CUDA_VISIBLE_DEVICES)' if visible else ''}; use device = \"cpu\""
            f"{' or indices below ' + str(count) if count else ''}, got {device!r}")


def _has(ids: list[str], count: int, visible: set[str]) -> bool:
    return len(ids) <= count and not [i for i in ids if i != "-1" and int(i) >= count and i not in visible]


VISIBLE_VARIABLES = ("CUDA_VISIBLE_DEVICES", "HIP_VISIBLE_DEVICES", "ROCR_VISIBLE_DEVICES", "GPU_DEVICE_ORDINAL")


def gpus_present(env: dict[str, str], root: Path = Path("/"), version_py: str | None = None) -> int | None:
    """The GPUs the worker's torch would see, read from the driver's files without importing torch: the NVIDIA
    driver's list for a CUDA build (/proc/driver/nvidia/gpus), amdkfd's GPU nodes for a ROCm one (a topology node
    with SIMDs; the CPU's has none). None where that cannot be told so: a variable that hides devices is set, the
    build is neither or unknown, the files are not there."""
    if any(env.get(v) is not None for v in VISIBLE_VARIABLES):
        return None
    if version_py is None:
        version_py = torch_build._installed_torch()[1]
    if torch_build.hip_version_in(version_py):
        nodes = sorted((root / "sys/class/kfd/kfd/topology/nodes").glob("*/properties"))
        counts = [_simd_count(n) for n in nodes]
        return None if not counts or None in counts else sum(1 for c in counts if c)
    if torch_build.cuda_version_in(version_py):
        try:
            return sum(1 for _ in (root / "proc/driver/nvidia/gpus").iterdir())
        except OSError:
            return None
    return None


def _simd_count(properties: Path) -> int | None:
    try:
        match = re.search(r"^simd_count\s+(\d+)", properties.read_text(), re.MULTILINE)
    except OSError:
        return None
    return int(match[1]) if match else None


def _worker_env(config: Config) -> dict[str, str]:
    return {**os.environ, **config.worker_env}


def _visible(config: Config) -> set[str]:
    env = _worker_env(config)
    return {i.strip() for i in env.get("CUDA_VISIBLE_DEVICES", "").split(",") if i.strip().isdigit()}


def gpu_count(config: Config) -> int | None:
    """The GPUs the worker's torch sees, counted by the worker's Python in its environment; None when it cannot
    say (no torch, a crash, no answer within PROBE_TIMEOUT): the worker's own start says more then."""
    try:
        done = subprocess.run([config.worker_python or sys.executable, "-c", COUNT_SCRIPT], capture_output=True,
                              text=True, timeout=PROBE_TIMEOUT, env=_worker_env(config), stdin=subprocess.DEVNULL)
    except (OSError, subprocess.TimeoutExpired):
        return None
    lines = done.stdout.split()
    return int(lines[-1]) if done.returncode == 0 and lines and lines[-1].isdigit() else None
