"""Failure signatures: lines in the worker's output that say what went wrong, and what helps.

The seeds lost days to failures that are recognisable from one line. Each signature names its remedy:

- ``rocm_mismatch``: the torch build does not fit the ROCm runtime or the GPU (HIPBLAS_STATUS_ALLOC_FAILED,
  no code object for the GPU). Restarting cannot help: the supervisor exits with the configuration-error
  status and says what fits. ``missing_module`` (a ModuleNotFoundError) likewise.
- ``disk_full``: a write failed with ENOSPC (a checkpoint save, results.csv). A safer rung writes the same
  files, so every retry would fail again and leave another torn ``last.pt``: stop and say to free space.
- ``gpu_oom``: out of GPU memory. Restart from last.pt with half the batch size, down to a floor.
- ``rocr_gpu_hang``, ``rocr_memory_error``, ``rocr_page_fault``: ROCr (the HSA runtime under HIP) says the GPU hung,
  that it could not free memory the GPU still uses, or that the GPU faulted on a page, and aborts the process
  (SIGABRT). The exit is read as the GPU hang it is:
  the incident's reason is a hang, and the restart climbs the ladder as after any hang, not as after a crash.
- ``peer_lost``: with several hosts, a rank lost its peer on another host mid-collective (gloo's connection reset,
  NCCL's remote error): the other host's failure. Restarted at once (reason ``peer``): no crash counted, no backoff.
- ``miopen_kdb_missing``: MIOpen has no kernel database for the GPU; a worker that then hangs before its
  first batch is searching kernels forever. The next attempt turns the Conv2d fallback on.
- NaN or inf losses come through the heartbeat, not the output: restart from last.pt with AMP off.

A crash acts only on the signature of the failure that ended the worker (its last error, else its last line):
an optional logger's ModuleNotFoundError or one failed write earlier in the output does not make a later crash
of another cause a configuration error. A hang has no last words: a warning seen before it counts.

Patterns are the real messages of PyTorch, HIP and MIOpen (cited per entry); they are searched per line,
only in lines the worker prints, so the cost is one regex scan per output line.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from supervisor.patterns import CatalogueEntry
from supervisor.vocabulary import Remedy


@dataclass(frozen=True)
class Signature(CatalogueEntry):
    remedy: Remedy
    advice: str


SIGNATURES: tuple[Signature, ...] = (
    # hipBLAS's status text as torch raises it: "RuntimeError: HIPBLAS_STATUS_ALLOC_FAILED when calling
    # `hipblasCreate(handle)`": a torch wheel built for another ROCm than the one installed (gfx1100 + torch
    # 2.5.1 on ROCm < 6.3 in the seeds' case).
    Signature("rocm_mismatch", re.compile(r"HIPBLAS_STATUS_ALLOC_FAILED|HIPBLAS_STATUS_NOT_INITIALIZED"),
              Remedy.CONFIG_ERROR,
              "this torch build does not fit the installed ROCm: install the torch wheel built for your ROCm "
              "version (on gfx1100, torch 2.5.1 needs ROCm >= 6.3); `yolo-train doctor` shows the versions here"),
    # HIP runtime: "hipErrorNoBinaryForGpu: Unable to find code object for all current devices!", and torch's
    # "HIP error: invalid device function": the wheel has no kernels for this GPU architecture.
    Signature("rocm_mismatch", re.compile(r"hipErrorNoBinaryForGpu|HIP error: invalid device function|"
                                          r"no kernel image is available for execution on the device"),
              Remedy.CONFIG_ERROR,
              "this torch build has no kernels for this GPU: set [worker] env HSA_OVERRIDE_GFX_VERSION to a "
              "supported architecture (e.g. \"10.3.0\" for gfx1010/gfx1030) or install a matching torch; "
              "`yolo-train doctor` checks it"),
    # Python's own: a module the worker imports is missing from its environment (seen on a GPU machine whose
    # image lacked polars, which Ultralytics needs to write results.csv): every restart would fail the same way.
    Signature("missing_module", re.compile(r"ModuleNotFoundError: No module named '[^']+'"), Remedy.CONFIG_ERROR,
              "a module the worker imports is missing from its Python environment: install it into the "
              "environment of [worker] python (pip install ...), then run again"),
    # errno 28 as Python prints it: "OSError: [Errno 28] No space left on device: '.../last.pt'" (strerror of
    # ENOSPC in glibc), and torch's zip writer: "PytorchStreamWriter failed writing file data/0: file write failed"
    # (caffe2/serialize/inline_container.cc, raised when fwrite comes up short, which a full disk causes).
    Signature("disk_full", re.compile(r"No space left on device|\[Errno 28\]|"
                                      r"PytorchStreamWriter failed writing file .*: file write failed"),
              Remedy.CONFIG_ERROR,
              "the disk is full: free space on the filesystem of the state directory (checkpoints are in "
              "train/weights), then run again; a safer rung writes the same files, so restarting cannot help"),
    # torch.OutOfMemoryError: "HIP out of memory. Tried to allocate ..." / "CUDA out of memory. ..."
    Signature("gpu_oom", re.compile(r"(?:HIP|CUDA) out of memory|OutOfMemoryError|HIP_ERROR_OUT_OF_MEMORY|"
                                    r"hipErrorOutOfMemory"),
              Remedy.HALVE_BATCH, "out of GPU memory: restarting with half the batch size"),
    # worker/distributed/multinode.py's check_hosts_agree: ranks of several hosts found their [train] tables, ladders or run
    # directories differ. Restarting would meet the same configs.
    Signature("hosts_disagree", re.compile(r"yolo-train: the hosts' configurations differ"), Remedy.CONFIG_ERROR,
              "the hosts of this job run different configs: give every host the same [train], [ladder] and "
              "[distributed] (all but node_rank), then run again"),
    # torch's own bound on a collective ended a rank: the hang of a peer, not a crash of another cause.
    # ProcessGroupNCCL.cpp's watchdog (TORCH_NCCL_ASYNC_ERROR_HANDLING): "[rank0]:[E1218 20:27:21.426415540
    # ProcessGroupNCCL.cpp:629] [Rank 0] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=1,
    # OpType=BROADCAST, NumelIn=131072000, NumelOut=131072000, Timeout(ms)=600000) ran for 600081 milliseconds before
    # timing out.", then "Some NCCL operations have failed or timed out. ... we are taking the entire process down."
    # and SIGABRT; its heartbeat monitor: "ProcessGroupNCCL's watchdog got stuck for 480 seconds without making
    # progress in monitoring enqueued collectives." / "Heartbeat monitor timed out! Process will be terminated after
    # dumping debug info." (the Flight Recorder's dump, where TORCH_NCCL_TRACE_BUFFER_SIZE is set). Gloo raises in
    # the waiting rank: "RuntimeError: [../third_party/gloo/gloo/transport/tcp/unbound_buffer.cc:78] Timed out
    # waiting 3000ms for recv operation to complete" (seen here with torch 2.14's gloo at a 3 s timeout).
    Signature("collective_timeout", re.compile(
        r"Watchdog caught collective operation timeout|Some NCCL operations have failed or timed out|"
        r"ProcessGroupNCCL's watchdog got stuck|Heartbeat monitor timed out|"
        r"gloo/transport/tcp/unbound_buffer\.cc:\d+\] Timed out waiting \d+ms for (?:recv|send) operation"),
        Remedy.COLLECTIVE_HANG,
        "torch's collective timeout ended a rank that waited for a hung peer: the hang, restarted from the newest "
        "checkpoint as one"),
    # Several hosts: a rank lost its peer on another host mid-collective (that host's ranks were killed for a hang,
    # crashed, or its supervisor went). Gloo's pair.cc, seen here when the other host's frozen rank was SIGKILLed:
    # "RuntimeError: [/__w/pytorch/pytorch/third_party/gloo/gloo/transport/tcp/pair.cc:545] Read error
    # [127.0.0.1]:43440: Connection reset by peer. This is typically caused by a remote worker hanging or bugs in the
    # application." (and its "Connection closed by peer"); NCCL through torch: "torch.distributed.DistBackendError:
    # NCCL error in: .../ProcessGroupNCCL.cpp:1347, remote process exited or there was a network error, NCCL version
    # 2.18.5" / "ncclRemoteError: A call failed possibly due to a network error or a remote process exiting
    # prematurely." (NVIDIA/nccl #934, #2076), and the communicator torch aborted on it: "NCCL communicator was
    # aborted on rank 0." Read as such only with several hosts and only as the worker's last words (core._exited):
    # on one host the supervisor kills the whole tree itself, and a rank's own crash says so first.
    Signature("peer_lost", re.compile(
        r"gloo/transport/tcp/pair\.cc:\d+\] .*Connection (?:reset|closed) by peer|"
        r"remote process exited or there was a network error|ncclRemoteError|NCCL communicator was aborted"),
        Remedy.PEER_LOST,
        "a rank of this host lost its peer on another host (that host's ranks hung and were killed, crashed, or its "
        "supervisor went): that host's failure, not this one's; restarted at once, from the newest checkpoint"),
    # ROCr's own last words before std::abort(), from rocr-runtime's core/runtime/runtime.cpp. Runtime::
    # HwExceptionHandler, on the KFD's HW exception event when no system event handler took it:
    #   fprintf(stderr, "HW Exception by GPU node-%u (Agent handle: %p) reason :%s\n", exception.NodeId, ...,
    #           (exception.ResetCause == HSA_EVENTID_HW_EXCEPTION_ECC) ? "ECC" : "GPU Hang");
    # e.g. "HW Exception by GPU node-1 (Agent handle: 0x55cf74a379c0) reason :GPU Hang" (ROCm/ROCm #4021: axolotl
    # on MI300X, one line per process of the job). The ECC reason is a memory error, not a hang: not matched here.
    Signature("rocr_gpu_hang", re.compile(r"HW Exception by GPU node-\d+ \(Agent handle: 0x[0-9a-fA-F]+\) "
                                          r"reason :GPU Hang"),
              Remedy.GPU_HANG,
              "the GPU stopped answering and the driver reset it (amdgpu's job timeout), so ROCr aborted the "
              "worker: a GPU hang, restarted from the newest checkpoint as any hang is, the ladder choosing the rung "
              "(if it recurs at every rung: try HSA_ENABLE_SDMA=0, or a lower power cap on an overclocked card)"),
    # Runtime::FreeMemory, when hsaKmtFreeMemory refuses to free an allocation (the GPU still maps it):
    #   fprintf(stderr, "Memory critical error by agent node-%u (Agent handle: %p) on address %p. Reason: "
    #           "Memory in use. \n", agentOwner->node_id(), ...);
    # e.g. "Memory critical error by agent node-0 (Agent handle: 0x5eac2930) on address 0x7fbb51601000. Reason:
    # Memory in use." Seen when a queue was left hung by a reset (ROCm/ROCm #6182 on gfx1151), and at model load in
    # containers whose SELinux policy denies mmap of /dev/kfd (node-0 is then the CPU agent).
    Signature("rocr_memory_error", re.compile(r"Memory critical error by agent node-\d+ \(Agent handle: "
                                              r"0x[0-9a-fA-F]+\) on address 0x[0-9a-fA-F]+\. Reason: Memory in use"),
              Remedy.GPU_HANG,
              "ROCr could not free memory the GPU still holds (a queue left hung, usually after a GPU reset) and "
              "aborted the worker: read as a GPU hang, restarted from the newest checkpoint as any hang is; if it "
              "happens at the very start inside a container, SELinux denies mapping /dev/kfd: "
              "setsebool -P container_use_devices on"),
    # Runtime::VMFaultHandler, on the GPU's page fault (the kernel's "[gfxhub] page fault" beside it):
    #   fprintf(stderr, "Memory access fault by GPU node-%u (Agent handle: %p) on address %p%s. Reason: %s.\n", ...)
    # e.g. "Memory access fault by GPU node-1 (Agent handle: 0x5d8b398786a0) on address 0x774546a00000. Reason: Page
    # not present or supervisor privilege." (pytorch#146809 training on a 7900 XTX; on gfx12 the hipBLASLt fault of
    # ROCm/TheRock#7699), then abort(). An ECC failure is a memory error, not a page fault: not matched here.
    Signature("rocr_page_fault", re.compile(r"Memory access fault by GPU node-\d+ \(Agent handle: 0x[0-9a-fA-F]+\) on "
                                            r"address (?:0x[0-9a-fA-F]+|\(nil\)).*\. Reason: (?!ECC)"),
              Remedy.GPU_HANG,
              "the GPU faulted on a page and ROCr aborted the worker: read as a GPU hang, restarted from the newest "
              "checkpoint as any hang is; on gfx12 (RX 9060/9070, AI PRO R9700) the ladder's "
              "TORCH_BLAS_PREFER_HIPBLASLT=0 rung is AMD's workaround (ROCm/TheRock#7699)"),
    # MIOpen: "MIOpen(HIP): Warning [SQLiteBase] Missing system database file: gfx1030_40.kdb Performance may
    # degrade. Please follow instructions to install: https://github.com/ROCm/MIOpen#installing-miopen-kernels-package"
    Signature("miopen_kdb_missing", re.compile(r"MIOpen\(HIP\): Warning \[SQLiteBase\] Missing system database file"),
              Remedy.CONV_FALLBACK, "MIOpen has no kernel database for this GPU: turning the Conv2d fallback on"),
)


ANY_SIGNATURE = re.compile("|".join(f"(?:{signature.regex.pattern})" for signature in SIGNATURES))


def scan(line: str) -> Signature | None:
    """The first signature a line of worker output shows, if any."""
    if ANY_SIGNATURE.search(line) is None:
        return None  # the common case: one regex scan
    return next(signature for signature in SIGNATURES if signature.finds(line))
