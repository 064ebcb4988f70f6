"""Whether the next attempt can wait ready to train ([worker] standby_ready) or only imported, and why: decided by
the supervisor before it spawns the standby, from the free memory of the training's device, so that a ready
standby never takes the memory the training runs in (a card of 8 GB that the training fills keeps today's standby).

Free memory is read without touching the device from this process: NVML on an NVIDIA GPU (no CUDA context), the
host's available memory on the CPU. On the host, on a GPU too, a ready standby is granted a share of the available
memory ([worker] standby_host_percent): its datasets' RAM cache is a second copy of the training's, and it holds
only what fits there (worker/standby/ready.py).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from supervisor.vocabulary import WorkerStart
from worker.wire.contract import ENV_READY, WorkerOptions

MIB = 1 << 20


@dataclass(frozen=True)
class Room:
    kind: WorkerStart
    why: str  # ``status --json``'s ``standby_why``: the one line the log says too
    memory_mib: int = 0  # what a ready one may hold on the device: its allocations are capped there
    host_mib: int = 0  # what a ready one may hold on the host beyond its imports: it holds only what fits there

    def env(self, train: dict[str, Any], options: WorkerOptions, report: Path) -> dict[str, str]:
        """What a standby of this kind is told beyond its rung's environment: for a ready one, what to build (the
        rung's train arguments, its loader's options), within what, and where to say what it holds."""
        if self.kind is not WorkerStart.READY:
            return {}
        loader = {"loader": options.loader, "start_method": options.start_method,
                  "persistent_workers": options.persistent_workers}
        return {ENV_READY: json.dumps({"train": train, "options": loader, "memory_mib": self.memory_mib,
                                       "host_mib": self.host_mib, "report": str(report)},
                                      default=str, sort_keys=True)}


def cuda_index(device: Any) -> int | None | str:
    """The CUDA device a ``[train] device`` names: its index, None for the CPU (or MPS), "several" for DDP."""
    text = str(device if device is not None else "").strip().lower().replace("cuda:", "")
    if text in ("cpu", "mps") or text.startswith("mps"):
        return None
    if text in ("", "none", "-1"):
        return 0  # Ultralytics' default: the first GPU where one exists
    parts = [p for p in text.split(",") if p.strip()]
    if len(parts) > 1:
        return "several"
    return int(parts[0]) if parts[0].strip().isdigit() else None


def nvml_free(index: int) -> int | None:
    try:
        import pynvml

        pynvml.nvmlInit()
        try:
            return int(pynvml.nvmlDeviceGetMemoryInfo(pynvml.nvmlDeviceGetHandleByIndex(index)).free)
        finally:
            pynvml.nvmlShutdown()
    except Exception:  # no pynvml, no driver, no such GPU: unknown, so no room assumed
        return None


def host_available() -> int:
    import psutil

    return int(psutil.virtual_memory().available)


def room(mode: str, needs_mib: int, train: dict[str, Any], ranks_standby: bool, host_percent: int = 50,
         gpu_free: Callable[[int], int | None] = nvml_free, cpu_free: Callable[[], int] = host_available) -> Room:
    """The kind of standby to make now and why; a ready one's host allowance, ``host_percent`` of the host's
    available memory."""
    if mode == "off":
        return Room(WorkerStart.IMPORTED, "[worker] standby_ready = \"off\"")
    if ranks_standby:
        return Room(WorkerStart.IMPORTED, "DDP: the ranks are forked at the launch, each builds its own model")
    index = cuda_index(train.get("device"))
    if index == "several":
        return Room(WorkerStart.IMPORTED, "several devices: the ranks are forked at the launch")
    where = "the host" if index is None else f"GPU {index}"
    free = cpu_free() if index is None else gpu_free(index)
    if free is None:
        return Room(WorkerStart.IMPORTED, f"the free memory of {where} is unknown (NVML unavailable)")
    if free < needs_mib * MIB:
        return Room(WorkerStart.IMPORTED, f"no room: {where} has {free // MIB} MiB free, a ready standby needs "
                                          f"{needs_mib} MiB ([worker] standby_memory_mib)")
    host = (free if index is None else cpu_free()) * host_percent // 100 // MIB
    return Room(WorkerStart.READY, f"{where} has {free // MIB} MiB free, {needs_mib} MiB needed; the host's "
                                   f"{host_percent} % of its available memory, {host} MiB, may hold the datasets",
                needs_mib, host)
