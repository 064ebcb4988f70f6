"""Processes that outlived SIGKILL: where the kernel holds them says what follows.

A process SIGKILL does not end within ``kill_timeout`` sleeps uninterruptibly in the kernel, and the function it sleeps
in (``/proc/PID/task/*/wchan``, read by the shell: ``host/process_tree.py``) tells whose wait it is:

- a file system's (a FUSE request its daemon has read and not answered, an NFS or RPC call to a server that is slow or
  gone): it ends when the file system answers, and the process dies then. Those survivors are waited for within
  ``[watchdog] survivor_timeout``, and the next worker starts once they are gone; still there at the bound, the run
  ends with exit 1 (the mount does not answer: nothing here can fix it, a later run can).
- the GPU driver's: only a reboot frees it (exit 3, no new worker on that GPU).
- a wait named by neither is waited for like a file system's; at the bound, it is taken for the driver's on a run
  that trains on a GPU (the old presumption: exit 3), and never said to be a GPU's where the run has none (exit 1).
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

# Kernel functions a task sleeps in while a file system owes it an answer (/proc/PID/wchan prints the function).
FILE_SYSTEM_WAITS = (
    "request_wait_answer",  # fs/fuse/dev.c: a FUSE request its daemon read and has not answered: waits it out
    "fuse_",  # fs/fuse/: fuse_wait_on_page_writeback(), fuse_wait_aborted(), fuse_get_req() ...
    "nfs_",  # fs/nfs/: nfs_wait_bit_killable(), nfs_wait_on_request(), nfs_page_group_lock_wait() ...
    "nfs4_",  # fs/nfs/nfs4proc.c: nfs4_wait_clnt_recover(), nfs4_delay() ...
    "rpc_",  # net/sunrpc/sched.c: rpc_wait_bit_killable(), rpc_wait_for_completion_task() ...
    "__rpc_",  # net/sunrpc/sched.c: __rpc_wait_for_completion_task(), __rpc_execute()
)
# ... and while a GPU driver does (amdgpu and its KFD, TTM, DRM's fences; NVIDIA's open kernel modules).
DRIVER_WAITS = (
    "amdgpu_", "kfd_", "kgd_", "svm_range_", "amdttm_", "ttm_", "drm_", "dma_fence_", "dma_resv_",
    "nvidia_", "nv_", "_nv", "os_acquire_", "uvm_",
)


class KernelWait(str, Enum):
    """Whose wait a survivor of SIGKILL sleeps in, by its kernel function."""
    FILE_SYSTEM = "file system"
    DRIVER = "driver"
    UNKNOWN = "unknown"


@dataclass(frozen=True)
class Survivor:
    """A process still there ``kill_timeout`` after SIGKILL, as the shell read it from /proc."""
    pid: int
    name: str
    status: str  # psutil's: "disk-sleep", "zombie" ...
    waits: tuple[str, ...] = ()  # the kernel functions its threads sleep in (wchan), "request_wait_answer"; () unknown

    @property
    def wait(self) -> KernelWait:
        def named(prefixes: tuple[str, ...]) -> bool:
            return any(w.startswith(prefixes) for w in self.waits)
        return KernelWait.DRIVER if named(DRIVER_WAITS) else KernelWait.FILE_SYSTEM if named(FILE_SYSTEM_WAITS) \
            else KernelWait.UNKNOWN

    def describe(self) -> str:
        """"pid 123 (python, disk-sleep, in request_wait_answer)": the incident's and the exit's words."""
        where = f", in {', '.join(self.waits)}" if self.waits else ""
        return f"pid {self.pid} ({self.name}, {self.status}{where})"


def describe(survivors: tuple[Survivor, ...]) -> str:
    return "; ".join(s.describe() for s in survivors)


def waits_out(survivors: tuple[Survivor, ...]) -> bool:
    """None of them is held by a driver: the file system (or whatever holds them) may yet let them go."""
    return all(s.wait != KernelWait.DRIVER for s in survivors)


def driver_bound(survivors: tuple[Survivor, ...], on_gpu: bool) -> bool:
    """At the bound: whether what still holds them is taken for the GPU driver (only a reboot frees it)."""
    return any(s.wait == KernelWait.DRIVER or s.wait == KernelWait.UNKNOWN and on_gpu for s in survivors)
