"""The catalogue of kernel messages the watchdog acts on, and the event each one becomes.

A kernel log line (from ``/dev/kmsg`` or the journal) or a GPU uevent becomes a ``KernelEvent`` of one
of four kinds:

- ``stall``: the kernel saw a CPU or a task make no progress (amdkfd's work hogging a CPU: not amdgpu's
  display code nor any other driver's, a task blocked in D state, a soft or hard lockup, an RCU stall). The worker comes under
  suspicion; only a worker that then makes no progress is killed.
- ``gpu_fault``: the GPU driver reported a fault it may recover from (ring/job timeout, VM page fault,
  MES not answering, a GPU reset beginning or succeeding, an NVIDIA Xid that a restarted
  application survives). Handled like a stall.
- ``gpu_lost``: the GPU is gone until a reboot or an out-of-band reset (reset failed, device fell off
  the bus, an Xid whose documented remedy is a GPU reset or a reboot). No new worker on that GPU.
- ``oom``: the OOM killer killed a process (the pid says which).

A catalogue entry may also have the kind ``ignore``: a line it matches becomes no event, which lets a
user silence a harmless line that a built-in pattern would catch (user entries are tried first).

Patterns are searched (``re.search``) in the message text, so a line with a dmesg ``[  12.3]`` or a
journalctl ``host kernel:`` prefix classifies the same as the bare message. A pattern's named group
``pid`` (if any) gives the pid the message names: the blocked task, the OOM victim, the process whose
GPU job faulted. The first matching entry wins.

Where each format comes from is cited per entry; the formats were read in the Linux sources
(drivers/gpu/drm/amd/amdgpu, drivers/gpu/drm/amd/amdkfd, drivers/gpu/drm/drm_drv.c, kernel/workqueue.c,
kernel/hung_task.c, kernel/watchdog.c, mm/oom_kill.c) and NVIDIA's Xid catalogue
(https://docs.nvidia.com/deploy/xid-errors/analyzing-xid-catalog.html), and checked against the lines users posted
to ROCm's trackers: ROCm/TheRock (where ROCm's issues are filed now) and ROCm/legacy-rocm-build (the older ones).
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass
from typing import NamedTuple

from supervisor.patterns import IGNORE, KINDS, CatalogueError, Pattern, validate_patterns  # noqa: F401 (re-exported)



@dataclass(frozen=True)
class KernelEvent:
    """One classified kernel message or GPU device event, as the decision core sees it."""

    kind: str  # "stall" | "gpu_fault" | "gpu_lost" | "oom"
    message: str  # the log line, or a one-line rendering of a uevent
    source: str  # "kmsg" | "journal" | "udev"
    seq: int | None  # kmsg sequence number / journal sequence number (cursor "i="), None for udev
    pid: int | None  # a pid named in the message (blocked task, OOM victim, faulting process)
    pattern: str  # name of the catalogue entry that matched
    monotonic_us: int | None  # kernel timestamp (usec since boot) when known
    from_kernel: bool = True  # False: a record user space wrote to /dev/kmsg (facility != kern): anyone can forge it
    reset_source: str | None = None  # a GPU reset's line: what reset it ("job timeout", "MES" ...), where it says
    devcoredump: bool = False  # a line after which the GPU's devcoredump may be in sysfs (DEVCOREDUMP_LINES)


class Classification(NamedTuple):
    kind: str
    pattern: str
    pid: int | None


# Xid codes whose immediate action in NVIDIA's Xid catalogue is RESTART_BM (79: reboot the machine) or
# RESET_GPU (46, 62, 64, 95, 109, 110, 119, 120, 136, 140, 143, 155, 156, 158), plus 48 (double-bit ECC
# error, WORKFLOW_XID_48: the GPU must be reset before its memory is trusted again). The supervisor can
# reset neither, so for it these GPUs are lost. 74 (NVLink) is a workflow where only fatal link errors
# need a reset, so it stays a fault.
XID_GPU_LOST = (79, 48, 46, 62, 64, 95, 109, 110, 119, 120, 136, 140, 143, 155, 156, 158)
# Xids the catalogue marks informational, with no effect on running work (63: row remapping recorded,
# 92: high single-bit ECC rate, 93: InfoROM wear, 106/107: SMBPBI test messages, 162-165: power
# smoothing circuitry state).
XID_INFORMATIONAL = (63, 92, 93, 106, 107, 162, 163, 164, 165)

# enum AMDGPU_RESET_SRCS (drivers/gpu/drm/amd/amdgpu/amdgpu_reset.h), as "GPU reset begin!. Source:  %d" prints it;
# a number not here (a later kernel's) is shown as "source N".
_RESET_SOURCES = {0: "unknown", 1: "job timeout", 2: "RAS", 3: "MES", 4: "hws", 5: "user", 6: "user queue"}
_RESET_SOURCE = re.compile(r"GPU reset begin!\. Source: +(\d+)")
# The lines after which the GPU's devcoredump may be in sysfs: the supervisor copies it before it is deleted.
DEVCOREDUMP_LINES = frozenset({"amdgpu_reset_begin", "amdgpu_reset_succeeded", "amdgpu_coredump_created"})


NO_SOURCE = "not said"  # "GPU reset begin!" of a kernel older than the source's number


def reset_source(line: str) -> str:
    """What reset the GPU, as a "GPU reset begin!. Source:  N" line names it."""
    found = _RESET_SOURCE.search(line)
    if found is None:
        return NO_SOURCE
    number = int(found.group(1))
    return _RESET_SOURCES.get(number, f"source {number}")


_XID = r"NVRM: Xid \((?:PCI:)?[0-9A-Fa-f:.]+\): "
_XID_PID = r"(?:, pid=(?P<pid>\d+))?"


def _codes(codes: Iterable[int]) -> str:
    return "(?:" + "|".join(str(c) for c in codes) + r")\b"


# amdkfd's work items, as %ps prints them (the function, then " [amdgpu]" where amdgpu is a module): the compute
# stack's own work (kfd_svm.c svm_range_restore_work(), svm_range_deferred_list_work(); kfd_process.c
# kfd_process_wq_release(), evict_process_worker(), restore_process_worker(); kfd_interrupt.c interrupt_wq();
# amdgpu_amdkfd_gpuvm.c amdgpu_amdkfd_restore_userptr_worker()). The two generic names only with amdgpu's module.
_AMDKFD_WORK = (r"(?:(?:amdgpu_amdkfd_|kfd_|svm_range_)\w+(?: \[amdgpu\])?"
                r"|(?:evict_process_worker|restore_process_worker|interrupt_wq) \[amdgpu\])")
# wq_cpu_intensive_report()'s line: any threshold (10000 us, scaled up by 4000/BogoMIPS below 4000 BogoMIPS:
# 10666, 13333, 20000 ...) and any count (4, 8, 16 ... before 6.9; 4, 5, 7, 11, 19 ... with
# workqueue.cpu_intensive_warning_thresh), or none where a log quotes the line short.
_HOG = r" hogged CPU for >\d+us(?: \d+ times)?"

BUILTIN: tuple[tuple[str, str, str, str], ...] = (
    # --- stall ---------------------------------------------------------------------------------------
    (
        "amdkfd_workqueue_hog",
        r"workqueue: " + _AMDKFD_WORK + _HOG,
        "stall",
        'kernel/workqueue.c wq_cpu_intensive_report(): "workqueue: %ps hogged CPU for >%luus %llu times, consider '
        'switching to WQ_UNBOUND", for amdkfd\'s work: svm_range_restore_work(), svm_range_deferred_list_work() '
        "(kfd_svm.c), kfd_process_wq_release(), evict_process_worker(), restore_process_worker() (kfd_process.c), "
        "interrupt_wq() (kfd_interrupt.c), amdgpu_amdkfd_restore_userptr_worker() (amdgpu_amdkfd_gpuvm.c); any "
        "threshold (10000 us, scaled by 4000/BogoMIPS on slower CPUs: 10666, 13333, 20000 ...: "
        "wq_cpu_intensive_thresh_init()) and count (4, 5, 7, 11, 19 ...: cnt + 1 - "
        "workqueue.cpu_intensive_warning_thresh a power of 2; 4, 8, 16 ... in kernels before that parameter). The "
        "counts grow before a GPU "
        "page fault (ROCm/legacy-rocm-build#5952, #4515, #5933)",
    ),
    (
        "workqueue_hog_not_amdkfd",
        r"workqueue: \S+(?: \[\w+\])?" + _HOG,
        IGNORE,
        "kernel/workqueue.c wq_cpu_intensive_report() for any other work: amdgpu's display code "
        '("workqueue: dm_irq_work_func [amdgpu] hogged CPU for >13333us 11 times", amdgpu_dm_hpd_low_irq(), '
        "dm_handle_vmin_vmax_update(): amdgpu_dm_irq.c, hot plug and vblank interrupts, legacy-rocm-build#5933), "
        "DRM helpers, network and storage drivers: a CPU busy in a driver that is not the compute stack says nothing "
        "of the training",
    ),
    (
        "hung_task",
        r"INFO: task (?P<comm>.+):(?P<pid>\d+) blocked for more than \d+ seconds",
        "stall",
        'kernel/hung_task.c check_hung_task(): "INFO: task %s:%d blocked for more than %ld seconds."',
    ),
    (
        "soft_lockup",
        r"BUG: soft lockup - CPU#\d+ stuck for \d+s! \[(?P<comm>.+):(?P<pid>\d+)\]",
        "stall",
        'kernel/watchdog.c watchdog_timer_fn(): "BUG: soft lockup - CPU#%d stuck for %us! [%s:%d]"',
    ),
    (
        "hard_lockup",
        r"Watchdog detected hard LOCKUP on cpu \d+",
        "stall",
        'kernel/watchdog.c watchdog_hardlockup_check(): "Watchdog detected hard LOCKUP on cpu %d"',
    ),
    (
        "rcu_stall",
        r"rcu: INFO: \w+ (?:self-)?detected stalls? on CPU",
        "stall",
        'kernel/rcu/tree_stall.h: "INFO: %s detected stalls on CPUs/tasks:", "%s self-detected stall on CPU"',
    ),
    # --- gpu_lost (before the faults: "GPU reset(1) failed" must not read as a reset) ---------------
    (
        "amdgpu_reset_failed",
        r"GPU reset\(\d+\) failed|GPU reset end with ret = -?\d+",
        "gpu_lost",
        'amdgpu_device.c amdgpu_device_gpu_recover()/sched_resume(): "GPU reset(%d) failed", '
        '"GPU reset(%d) failed with error %d", "GPU reset end with ret = %d" (printed only when r != 0)',
    ),
    (
        "amdgpu_recovery_failed",
        r"GPU Recovery Failed",
        "gpu_lost",
        'amdgpu_job.c amdgpu_job_timedout(): "GPU Recovery Failed: %d"',
    ),
    (
        "amdgpu_lost_from_bus",
        r"amdgpu.*device lost from bus",
        "gpu_lost",
        'amdgpu_device.c amdgpu_device_health_check(): "device lost from bus!"',
    ),
    (
        "drm_wedged_needs_recovery",
        r"\[drm\] device wedged, needs recovery",
        "gpu_lost",
        'drm_drv.c drm_dev_wedged_event(): "device wedged, %s" with "needs recovery" (method != none)',
    ),
    (
        "nvidia_xid_gpu_lost",
        _XID + _codes(XID_GPU_LOST) + r".*?" + _XID_PID,
        "gpu_lost",
        "NVIDIA Xid catalogue: immediate action RESTART_BM (79) or RESET_GPU; "
        'driver format "NVRM: Xid (PCI:%04x:%02x:%02x): %d, pid=%d, name=%s, ..."',
    ),
    (
        "nvidia_recovery_action_reset",
        _XID + r"154, GPU recovery action changed from .*? to 0x[12467]\b",
        "gpu_lost",
        "NVIDIA Xid 154: recovery action changed to GPU reset (1), node reboot (2), drain and reset (4), "
        "bus reset (6) or system reboot (7)",
    ),
    (
        "nvidia_fallen_off_bus",
        r"NVRM: GPU (?:at PCI:)?[0-9A-Fa-f:.]+: GPU has fallen off the bus",
        "gpu_lost",
        'NVIDIA driver: "NVRM: GPU 0000:01:00.0: GPU has fallen off the bus." (accompanies Xid 79)',
    ),
    (
        "pci_device_inaccessible",
        r"(?:amdgpu|nvidia) [0-9a-f:.]+: Unable to change power state from \w+ to D0, device inaccessible",
        "gpu_lost",
        'drivers/pci/pci.c pci_power_up(): "Unable to change power state from %s to D0, device inaccessible"',
    ),
    # --- ignored (before the generic Xid fault) -------------------------------------------------------
    (
        "nvidia_xid_informational",
        _XID + r"(?:" + _codes(XID_INFORMATIONAL) + r"|154, GPU recovery action changed from .*? to 0x0\b)",
        IGNORE,
        "NVIDIA Xid catalogue: immediate action IGNORE, informational",
    ),
    (
        "amdkfd_queue_evicted",
        r"Freeing queue vital buffer 0x[0-9a-fA-F]+, queue evicted",
        IGNORE,
        'amdkfd kfd_svm.c svm_range_unmap_from_cpu(): "Freeing queue vital buffer 0x%lx, queue evicted" (pr_warn): '
        "memory a user queue needs was unmapped and the process's queues quiesced. Seen after resets and SVM "
        "failures (legacy-rocm-build#5952, #6413), whose own lines are acted on, but also printed by every killed or "
        "crashed GPU process's teardown (the kernel's own fix calls it a false positive there), so the next worker "
        "of a restart would be suspected by its predecessor's exit: no event",
    ),
    # --- gpu_fault ------------------------------------------------------------------------------------
    (
        "amdgpu_ring_timeout",
        r"ring \S+ timeout(?:, signaled seq=\d+, emitted seq=\d+|, but soft recovered)",
        "gpu_fault",
        'amdgpu_job.c amdgpu_job_timedout(): "ring %s timeout, signaled seq=%u, emitted seq=%u" '
        '(DRM_ERROR "[drm:amdgpu_job_timedout [amdgpu]] *ERROR* ..." in older kernels, dev_err later), '
        '"ring %s timeout, but soft recovered"',
    ),
    (
        "amdgpu_ring_reset",
        r"Ring \S+ reset fail(?:ed|ure)|Starting \S+ ring reset",
        "gpu_fault",
        'amdgpu_job.c amdgpu_job_timedout(): "Starting %s ring reset", "Ring %s reset failed"; '
        "a failed ring reset escalates to a full GPU reset",
    ),
    (
        "amdgpu_ring_reset_succeeded",
        r"Ring \S+ reset succeeded",
        "gpu_fault",
        'amdgpu_job.c amdgpu_job_timedout(): "Ring %s reset succeeded" (a per-queue reset after a ring timeout, '
        'followed by "device wedged, but recovered through reset"): the GPU lives on, the guilty job was cancelled, '
        "so a process may survive it; judged by progress (ROCm/legacy-rocm-build#6273, #6658)",
    ),
    (
        "amdgpu_recovery_disabled",
        r"\bGPU recovery disabled\.",
        "gpu_fault",
        'amdgpu_device.c amdgpu_device_should_recover_gpu(): "GPU recovery disabled." (amdgpu.gpu_recovery=0, or -1 '
        "on an ASIC without default recovery) after a ring timeout: nothing resets the GPU, the hung job stays hung",
    ),
    (
        "amdgpu_page_fault",
        r"\[(?:gfxhub|mmhub)\w*\] (?:(?:no-)?retry )?page fault \(src_id:\d+ ring:\d+ vmid:\d+ pasid:\d+"
        r"(?:, for process .+? pid (?P<pid>\d+))?",
        "gpu_fault",
        'gmc_v9_0.c/gmc_v10_0.c/gmc_v11_0.c process_interrupt(): "[%s] %s page fault (src_id:%u ring:%u '
        'vmid:%u pasid:%u[, for process %s pid %d thread %s pid %d])"',
    ),
    (
        "amdgpu_fault_process",
        r"amdgpu.*(?:Process information: process| [Ii]n process| Process) (?P<comm>.+?) pid (?P<pid>\d+)\b",
        "gpu_fault",
        'amdgpu_job.c "Process information: process %s pid %d thread %s pid %d"; amdgpu_vm.c '
        'amdgpu_vm_print_task_info(): " Process %s pid %d thread %s pid %d" (after a timeout or page fault)',
    ),
    (
        "amdgpu_l2_protection_fault",
        r"\b(?:GC|MM)VM_L2_PROTECTION_FAULT_STATUS:0x[0-9A-Fa-f]{8}\b",
        "gpu_fault",
        "gfxhub_v2_0.c ... gfxhub_v12_0.c gfxhub_v*_print_l2_protection_fault_status(), mmhub_v2_0.c ... "
        'mmhub_v*_print_l2_protection_fault_status(): "GCVM_L2_PROTECTION_FAULT_STATUS:0x%08X", '
        '"MMVM_L2_PROTECTION_FAULT_STATUS:0x%08X" (after a page fault; legacy-rocm-build#5952, #6269, #6374)',
    ),
    (
        "amdgpu_utcl2_client",
        r"Faulty UTCL2 client ID: ",
        "gpu_fault",
        'gfxhub_v2_0.c ... gfxhub_v12_0.c, mmhub_v*.c *_print_l2_protection_fault_status(): "\\t Faulty UTCL2 client '
        'ID: %s (0x%x)" ("0x%lx" in older kernels) after the L2 protection fault status: the engine that faulted (CPF, '
        "TCP, SQC, SDMA0 ...; an SDMA client points at HSA_ENABLE_SDMA=0; legacy-rocm-build#5952)",
    ),
    (
        "amdgpu_vm_fault_legacy",
        r"amdgpu.*GPU fault detected: \d+ 0x[0-9a-fA-F]+",
        "gpu_fault",
        'gmc_v7_0.c/gmc_v8_0.c gmc_v8_0_process_interrupt(): "GPU fault detected: %d 0x%08x" (GCN 2-4 cards)',
    ),
    (
        "amdgpu_mes_no_response",
        r"MES(?:\(\d+\))? failed to respond to msg=",
        "gpu_fault",
        'amdgpu_mes.c/mes_v11_0.c mes_submit_pkt_and_poll_completion(): "MES failed to respond to msg=%s", '
        '"MES(%d) failed to respond to msg=%s (%s)"',
    ),
    (
        "amdkfd_mes_remove_queue_failed",
        r"failed to remove hardware queue from MES, doorbell=0x[0-9a-fA-F]+|"
        r"MES might be in unrecoverable state, issue a GPU reset",
        "gpu_fault",
        'amdkfd kfd_device_queue_manager.c remove_queue_mes(): "failed to remove hardware queue from MES, '
        'doorbell=0x%x" ("%s failed to remove ... queue: %d, caller: %s" in newer kernels), then "MES might be in '
        'unrecoverable state, issue a GPU reset" (after "MES failed to respond to msg=REMOVE_QUEUE": #4515)',
    ),
    (
        "amdgpu_reset_begin",
        r"GPU reset begin!",
        "gpu_fault",
        'amdgpu_device.c amdgpu_device_gpu_recover(): "GPU %s begin!. Source:  %d" ("reset"; the source, after two '
        "spaces, from enum AMDGPU_RESET_SRCS in amdgpu_reset.h: " + ", ".join(f"{n} {name}" for n, name in
        sorted(_RESET_SOURCES.items())) + '; plain "GPU reset begin!" in older kernels); the source is kept in the '
        "incident (``gpu_reset``)",
    ),
    (
        "amdgpu_reset_succeeded",
        r"GPU reset\(\d+\) succeeded!|GPU reset succeeded, trying to resume",
        "gpu_fault",
        'amdgpu_device.c: "GPU reset(%d) succeeded!", "GPU reset succeeded, trying to resume"; the '
        "worker's GPU context did not survive it",
    ),
    (
        "amdgpu_coredump_created",
        r"AMDGPU device coredump file has been created",
        "gpu_fault",
        'amdgpu_dev_coredump.c amdgpu_coredump(): "AMDGPU device coredump file has been created", "Check your '
        '/sys/class/drm/card%d/device/devcoredump/data" (drm_info): at a job timeout (before its ring reset) or after '
        "a GPU reset; drivers/base/devcoredump.c deletes the dump 5 minutes later (DEVCD_TIMEOUT), so the supervisor "
        "copies it at once (supervisor/kernel/devcoredump.py)",
    ),
    (
        "amdgpu_vram_lost",
        r"VRAM is lost due to GPU reset",
        "gpu_fault",
        'amdgpu_device.c amdgpu_device_reinit_after_reset(): "VRAM is lost due to GPU reset!"',
    ),
    (
        "drm_wedged_recovered",
        r"\[drm\] device wedged, but recovered through reset",
        "gpu_fault",
        'drm_drv.c drm_dev_wedged_event(): "device wedged, but recovered through reset" (method none)',
    ),
    (
        "amdkfd_preemption_failed",
        r"qcm fence wait loop timeout expired|The cp might be in an unrecoverable state due to an "
        r"unsuccessful queues preemption|Failed to evict process queues",
        "gpu_fault",
        "amdkfd kfd_device_queue_manager.c: queue preemption timed out, the CP may be hung",
    ),
    (
        "nvidia_xid",
        _XID + r"(?P<code>\d+)" + _XID_PID,
        "gpu_fault",
        "NVIDIA Xid catalogue: immediate action RESTART_APP and the rest; "
        'driver format "NVRM: Xid (PCI:%04x:%02x:%02x): %d, pid=%d, name=%s, ..."',
    ),
    # --- oom ------------------------------------------------------------------------------------------
    (
        "oom_killed_process",
        r"(?:Out of memory|Memory cgroup out of memory): Killed process (?P<pid>\d+) \(",
        "oom",
        'mm/oom_kill.c __oom_kill_process(): "%s: Killed process %d (%s) total-vm:%lukB, anon-rss:%lukB, ..."',
    ),
    (
        "oom_kill_summary",
        r"oom-kill:constraint=\w+,.*?,task=(?P<comm>.*?),pid=\s*(?P<pid>\d+),",
        "oom",
        'mm/oom_kill.c dump_oom_victim(): "oom-kill:constraint=%s,nodemask=%*pbl,...,task=%s,pid=%d,uid=%d"',
    ),
)


BUILTIN_PATTERNS: tuple[Pattern, ...] = tuple(
    Pattern(name, re.compile(regex), kind, origin) for name, regex, kind, origin in BUILTIN
)


class Catalogue:
    """The patterns in force: the user's (tried first, so they can override or ignore) then the built-ins."""

    def __init__(self, extra: object = None, where: str = "[kernel_log] patterns"):
        self.extra = validate_patterns(extra, where)
        self.patterns: tuple[Pattern, ...] = self.extra + BUILTIN_PATTERNS

    def classify(self, line: str) -> Classification | None:
        for pattern in self.patterns:
            match = pattern.regex.search(line)
            if match is None:
                continue
            if pattern.kind == IGNORE:
                return None
            pid = match.groupdict().get("pid")
            return Classification(pattern.kind, pattern.name, int(pid) if pid else None)
        return None

    def event(
        self, line: str, source: str, seq: int | None = None, monotonic_us: int | None = None,
        from_kernel: bool = True,
    ) -> KernelEvent | None:
        """The event a log line becomes, or None for a line the catalogue does not act on."""
        found = self.classify(line)
        if found is None:
            return None
        return KernelEvent(found.kind, line, source, seq, found.pid, found.pattern, monotonic_us, from_kernel,
                           reset_source(line) if found.pattern == "amdgpu_reset_begin" else None,
                           found.pattern in DEVCOREDUMP_LINES)


DEFAULT = Catalogue()


def classify(line: str) -> Classification | None:
    """(kind, pattern name, pid or None) for a kernel log line under the built-in catalogue, or None."""
    return DEFAULT.classify(line)


def markdown_table(patterns: Iterable[Pattern] = BUILTIN_PATTERNS) -> str:
    """The catalogue as a Markdown table (name, kind, where the format comes from), for docs/kernel_messages.md."""
    rows = ["| pattern | kind | message format (source) |", "| --- | --- | --- |"]
    for p in patterns:
        rows.append(f"| `{p.name}` | {p.kind} | {p.origin.replace('|', '/')} |")
    return "\n".join(rows)
