"""The ladder of ever safer settings a hung worker is restarted with.

Rung 0 is the configured ``[train]`` as it is. Each later rung adds its settings on top of the rungs
below it, so rung k is "everything that rungs 1..k changed". The default ladder is what the seeds' users
did by hand, with the rungs that cost no speed first: under a ROCm build of torch, ``HSA_ENABLE_SDMA=0``, on a gfx12
card ``TORCH_BLAS_PREFER_HIPBLASLT=0`` (weighed only by a GPU reset or page fault in training: hang_evidence.py), then
DataLoader workers forked from a forkserver instead of from the training process (first of all under a CUDA build
training on a GPU), then ``HSA_ENABLE_INTERRUPT=0`` (after both: it turns every wait into a busy one); then halve
``workers`` down to 1, ``persistent_workers = false``, the thread loader (no worker processes, most of their
speed), ``workers = 0`` (no loader concurrency at all), then ``val = false``. Each rung's reason is beside it in ``default_ladder``. Which rung
a hang moves to, and which one a probe tries, is ``rung_choice.py``'s: this module only says what the rungs are.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Ladder:
    rungs: tuple[dict[str, Any], ...]  # rungs[0] == {}: each entry is that rung's own change

    def __len__(self) -> int:
        return len(self.rungs)

    def settings(self, rung: int) -> dict[str, Any]:
        """The overrides in force at ``rung``: the changes of rungs 1..rung, later ones winning."""
        merged: dict[str, Any] = {}
        for change in self.rungs[: rung + 1]:
            for key, value in change.items():  # tables (env, args) add up key by key, like the rungs themselves
                merged[key] = {**merged[key], **value} if isinstance(value, dict) and isinstance(merged.get(key), dict) \
                    else value
        return merged

    def label(self, rung: int) -> str:
        """The rung as people see it (logs, status, metrics, systemd's STATUS=): environment variables by name only,
        since their values may be secrets and those places are readable by any local user."""
        settings = self.settings(rung)
        if not settings:
            return "as configured"
        return ", ".join(_shown(k, v) for k, v in settings.items())

    def cost(self, before: int, after: int) -> str:
        """What moving from rung ``before`` to ``after`` costs, where a variable it sets has a known cost (COSTS)."""
        was, now = self.settings(before).get("env", {}), self.settings(after).get("env", {})
        return "; ".join(f"{name}={now[name]}: {COSTS[name]}" for name in COSTS if name in now and was.get(name) != now[name])

    def next(self, rung: int) -> int:
        """One rung safer; the top rung stays where it is (the ladder is exhausted)."""
        return min(rung + 1, len(self.rungs) - 1)

    def exhausted(self, rung: int) -> bool:
        return rung >= len(self.rungs) - 1


# Cures for ROCm runtime hangs, each keeping the variables of the one below it. A lost SDMA copy completion
# (ROCm/rocm-libraries#8847; hipMemcpy hangs on APUs; the busy-wait hang of
# ROCm/TheRock#7832): copies by blit kernels instead of the DMA engines. Training's host-to-device copies are a few MB
# a batch, so the cost is small, and no wait changes its kind.
# Field data for its first place: an APU (Radeon 780M, gfx1103) that had 5 hangs and 9 resets in one night on a stack
# without it, about one hang every 2-3 days on the stack with it (legacy-rocm-build#6386; that night's stack changed
# ROCm too).
ROCM_SDMA_RUNG: dict[str, Any] = {"env": {"HSA_ENABLE_SDMA": "0"}}
# Training on gfx12 (RX 9060/9070, Radeon AI PRO R9700) resets the GPU or faults ("Memory access fault by GPU node-1
# ... Reason: Page not present") in hipBLASLt's GEMMs, which PyTorch prefers there (ROCm/pytorch#2153): AMD's
# workaround is hipBLAS instead (ROCm/TheRock#7699; traced to hipBLASLt's Tensile code reading past an operand,
# legacy-rocm-build#6413, rocm-libraries#7992). It costs GEMM speed, so only that evidence weighs it.
HIPBLASLT = "TORCH_BLAS_PREFER_HIPBLASLT"
ROCM_HIPBLASLT_RUNG: dict[str, Any] = {"env": {HIPBLASLT: "0"}}
GFX12 = ("gfx1200", "gfx1201")
# What a rung's environment variable costs, said in the log where a rung that sets it is taken.
COSTS = {HIPBLASLT: "its matrix products go through hipBLAS instead of hipBLASLt: slower GEMMs (YOLO's convolutions "
                    "are MIOpen's and keep their speed, but with the conv fallback on every convolution is a GEMM); "
                    "the rung's own speed is measured as it trains"}
# A lost completion interrupt in the HIP runtime: the host sleeps forever in rocr::core::InterruptSignal::WaitRelaxed
# on a kernel that finished (ROCm issue 6530). Polling the signals instead cures it, but it turns
# every wait into rocr::core::BusyWaitSignal::WaitRelaxed: a core at 100% for as long as a wait lasts, and a
# completion lost any other way spins there for ever, a tree that never looks idle (the idle floor cannot shorten
# its bound). Hence after the rungs that change no wait: the SDMA rung and the forkserver.
ROCM_INTERRUPT_RUNG: dict[str, Any] = {"env": {"HSA_ENABLE_SDMA": "0", "HSA_ENABLE_INTERRUPT": "0"}}
ROCM_ENV_RUNGS: tuple[dict[str, Any], ...] = (ROCM_SDMA_RUNG, ROCM_INTERRUPT_RUNG)


def default_ladder(workers: int, rocm: bool = False, cuda: bool = False, gfx: tuple[str, ...] = ()) -> Ladder:
    """The default ladder for a configured ``workers`` count; ``rocm``: torch is a ROCm build (env rungs first);
    ``cuda``: a CUDA build training on a GPU (forkserver workers first); ``gfx``: the training GPUs' architectures."""
    rungs: list[dict[str, Any]] = [{}]
    if rocm:
        rungs.append(ROCM_SDMA_RUNG)
    if rocm and any(g in GFX12 for g in gfx):
        rungs.append(ROCM_HIPBLASLT_RUNG)
    if (rocm or cuda) and workers > 0:
        # The same worker processes forked from a forkserver (a fresh interpreter that imported torch, cv2 and
        # Ultralytics' data modules, started before the trainer touches the GPU; by the standby while it waits)
        # instead of from the training process: none inherits the HIP or CUDA runtime's state (not fork-safe:
        # threads, locks, device handles), and no page of the training process's is shared copy-on-write, whose
        # first write makes the kernel invalidate the GPU's mappings of it (the amdgpu userptr restore worker of the
        # seeds' kernel line). Same batches for the same seed; its first batch about as soon as forked workers', where
        # "spawn" has each worker import torch and Ultralytics anew. "spawn" stays available as a rung of one's own.
        rungs.append({"start_method": "forkserver"})
    if rocm:
        rungs.append(ROCM_INTERRUPT_RUNG)
    # Fewer DataLoader worker processes: less shared memory and fewer forked HIP/CUDA contexts to deadlock; the
    # seeds' first cure, and cheap while the workers left still outrun the GPU.
    w = workers // 2
    while w >= 1:
        rungs.append({"workers": w})
        w //= 2
    if workers > 0:
        # Worker processes made anew every epoch: the deadlocks that build up over epochs of one pool.
        rungs.append({"persistent_workers": False})
        # No worker processes at all (no fork, no shared-memory queues): the same dataset and augmentation read by
        # a pool of threads (the CPU count) in the training process, which keeps most of the speed of workers > 0.
        rungs.append({"loader": "threads"})
        # The last loader rung: no loader concurrency at all, the training thread reads every sample itself.
        rungs.append({"loader": "process", "workers": 0})
    # No validation between epochs (the last epoch still validates): hangs in validation's own loader or NMS.
    rungs.append({"val": False})
    return Ladder(tuple(rungs))


def build_ladder(configured: tuple[dict[str, Any], ...] | None, workers: int, default: bool = True,
                 rocm: bool = False, cuda: bool = False, gfx: tuple[str, ...] = ()) -> Ladder:
    """The configured rungs after rung 0; unconfigured, the default ladder, or none where the worker's kind has no
    ``default`` (a [worker] command: what would make an unknown script safer is for its author to say, as env and args
    rungs; worker_kind.py). ``rocm``, ``cuda``: the installed build, as ``default_ladder`` takes them (read by the
    shell: host/torch_build.py)."""
    if configured is None:
        return default_ladder(workers, rocm, cuda, gfx) if default else Ladder(({},))
    return Ladder(({},) + tuple(configured))


def _shown(key: str, value: Any) -> str:
    if key == "env" and isinstance(value, dict):
        return f"env={'+'.join(sorted(value))}"  # names only: values may be secrets
    if key == "args" and isinstance(value, dict):
        return "args=" + " ".join(f"{flag} {v}" for flag, v in value.items())
    return f"{key}={_toml(value)}"


def _toml(value: Any) -> str:
    return str(value).lower() if isinstance(value, bool) else str(value)
