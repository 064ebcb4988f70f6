"""Which build of torch is installed, whether an NVIDIA GPU is present and which AMD GPUs train: what the default
ladder is chosen by, and what MIOpen is asked for.

Read as text from the installed distribution, ``/proc`` and the kfd topology in sysfs: importing torch would cost the
supervisor seconds and hundreds of MB. The decision core gets the answer as values (``ladder.build_ladder(..., rocm=,
cuda=, gfx=)``, ``MiopenRun``).
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from supervisor.config import Config
from supervisor.decision import Ladder, MiopenRun, build_ladder, WorkerKind
from worker.wire.contract import loader_workers
from worker.wire.miopen_db import kfd_gpu_nodes


@dataclass(frozen=True)
class TorchBuild:
    rocm: bool  # a ROCm build of torch: the ROCm environment rungs first
    cuda: bool  # a CUDA build training on an NVIDIA GPU: spawned DataLoader workers first
    version: tuple[int, int] | None = None  # torch's (major, minor)
    gfx: tuple[str, ...] = ()  # the real architectures of the AMD GPUs it trains on (kfd topology), e.g. ("gfx1201",)


def ladder_for(config: Config) -> Ladder:
    """The ladder this configuration gets on this machine; the build is read only where the default ladder is used."""
    workers, kind = int(loader_workers(config.train)), WorkerKind.of(config)
    if config.ladder is not None or not kind.default_ladder:
        return build_ladder(config.ladder, workers, default=kind.default_ladder)
    build = detect(config.train.get("device"), visible=visible_devices({**os.environ, **config.worker_env}))
    return build_ladder(None, workers, rocm=build.rocm, cuda=build.cuda, gfx=build.gfx)


def miopen_run_for(config: Config, environ: Mapping[str, str] = os.environ) -> MiopenRun | None:
    """What the core needs to say which MIOpen mode a run's settings give; None without a ROCm build of torch."""
    build = detect(config.train.get("device"))
    if not build.rocm or build.version is None:
        return None
    return MiopenRun(build.version, {k: v for k, v in environ.items() if k.startswith("MIOPEN_")})


def detect(device: Any = None, root: Path = Path("/"), visible: list[int] | None = None) -> TorchBuild:
    """The installed torch's build; ``device`` is [train] device (a CPU training has no GPU runtime to inherit);
    ``visible``: the GPUs the runtime is shown (``visible_devices``)."""
    version, version_py = _installed_torch()
    rocm = "rocm" in version.lower() or hip_version_in(version_py)
    cuda = not on_cpu(device) and nvidia_gpu_present() and cuda_version_in(version_py)
    gfx = training_gfx(root, device, visible) if rocm and not on_cpu(device) else ()
    return TorchBuild(rocm, cuda, torch_version(version), gfx)


def visible_devices(env: Mapping[str, str]) -> list[int] | None:
    """The GPUs the ROCm runtime shows the worker, in its order, as kfd GPU indices: ROCR_VISIBLE_DEVICES picks among
    them, then HIP_VISIBLE_DEVICES (else CUDA_VISIBLE_DEVICES, which HIP also reads) among those; None: all. (A UUID
    list is not read: all.)"""
    shown: list[int] | None = None
    for names in (("ROCR_VISIBLE_DEVICES",), ("HIP_VISIBLE_DEVICES", "CUDA_VISIBLE_DEVICES")):
        value = next((env[n].strip() for n in names if env.get(n, "").strip()), "")
        if not re.fullmatch(r"\d+(?:\s*,\s*\d+)*", value):
            continue
        picked = [int(v) for v in value.split(",")]
        shown = picked if shown is None else [shown[i] for i in picked if 0 <= i < len(shown)]
    return shown


def torch_version(version: str) -> tuple[int, int] | None:
    """``2.14.1+rocm7.14.0`` -> (2, 14)."""
    m = re.match(r"(\d+)\.(\d+)", version)
    return (int(m.group(1)), int(m.group(2))) if m else None


def training_gfx(root: Path, device: Any, visible: list[int] | None = None) -> tuple[str, ...]:
    """The real architectures of the GPUs [train] device names: indices into the GPUs the runtime is shown
    (``visible``, else the kfd topology's GPU nodes in node order, as HIP numbers them); unset: the first."""
    nodes = kfd_gpu_nodes(root)
    shown = [nodes[i] for i in visible if 0 <= i < len(nodes)] if visible is not None else nodes
    wanted = [int(d) for d in re.findall(r"\d+", str(device))] if device is not None and str(device).strip() else [0]
    return tuple(shown[i].arch for i in wanted if 0 <= i < len(shown))


def on_cpu(device: Any) -> bool:
    """[train] device names the CPU (or Apple's MPS): no GPU runtime for a forked worker to inherit."""
    return str(device if device is not None else "").strip().lower() in ("cpu", "mps")


def nvidia_gpu_present(driver: Path = Path("/proc/driver/nvidia/gpus")) -> bool:
    """The NVIDIA driver lists a GPU: a CUDA build on a machine without one trains on the CPU."""
    try:
        return any(driver.iterdir())
    except OSError:
        return False


def _installed_torch() -> tuple[str, str]:
    """The installed torch's version and its ``torch/version.py``; empty strings where there is none."""
    from importlib import metadata

    try:
        dist = metadata.distribution("torch")
    except metadata.PackageNotFoundError:
        return "", ""
    try:
        return dist.version or "", Path(str(dist.locate_file("torch/version.py"))).read_text()
    except OSError:
        return dist.version or "", ""


def hip_version_in(version_py: str) -> bool:
    """``torch/version.py`` of a ROCm build says ``hip: Optional[str] = '6.2.41133-dd7f95766'``; others ``None``."""
    return _names_version("hip", version_py)


def cuda_version_in(version_py: str) -> bool:
    """``torch/version.py`` of a CUDA build says ``cuda: Optional[str] = '12.8'``; others ``None``."""
    return _names_version("cuda", version_py)


def _names_version(key: str, version_py: str) -> bool:
    return bool(re.search(rf"""^{key}\b[^=\n]*=\s*['"][^'"]+['"]""", version_py, re.MULTILINE))
