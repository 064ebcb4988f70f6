"""Which build of torch is installed and whether an NVIDIA GPU is present: what the default ladder is chosen by.

Read as text from the installed distribution and from ``/proc``: importing torch would cost the supervisor seconds
and hundreds of MB. The decision core gets the answer as values (``ladder.build_ladder(..., rocm=, cuda=)``).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from supervisor.config import Config
from supervisor.decision import Ladder, build_ladder, WorkerKind
from worker.wire.contract import loader_workers


@dataclass(frozen=True)
class TorchBuild:
    rocm: bool  # a ROCm build of torch: the ROCm environment rungs first
    cuda: bool  # a CUDA build training on an NVIDIA GPU: spawned DataLoader workers first


def ladder_for(config: Config) -> Ladder:
    """The ladder this configuration gets on this machine; the build is read only where the default ladder is used."""
    workers, kind = int(loader_workers(config.train)), WorkerKind.of(config)
    if config.ladder is not None or not kind.default_ladder:
        return build_ladder(config.ladder, workers, default=kind.default_ladder)
    build = detect(config.train.get("device"))
    return build_ladder(None, workers, rocm=build.rocm, cuda=build.cuda)


def detect(device: Any = None) -> TorchBuild:
    """The installed torch's build; ``device`` is [train] device (a CPU training has no GPU runtime to inherit)."""
    version, version_py = _installed_torch()
    rocm = "rocm" in version.lower() or hip_version_in(version_py)
    cuda = not on_cpu(device) and nvidia_gpu_present() and cuda_version_in(version_py)
    return TorchBuild(rocm, cuda)


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
