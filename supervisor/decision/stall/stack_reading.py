"""What a capture of a hung tree's stacks says, read without I/O: the records of each process and thread, the
frames that matter, where the main thread waits, which process is the culprit. ``supervisor/host/stacks.py`` takes
the capture (``/proc`` and py-spy); everything that interprets it is here, so it is tested on recorded dumps.
"""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from supervisor.decision.model.incident import Stacks
from supervisor.patterns import CatalogueEntry
from worker.wire.contract import RUNTIME_THREADS

PYTHON_FRAMES_SHOWN = 3
NATIVE_FRAMES_SHOWN = 2
UNTRACEABLE_STATES = {"T": "stopped", "t": "stopped by a tracer", "D": "in uninterruptible sleep",
                      "Z": "a zombie", "X": "dead"}

# Kernel functions a thread sleeps in (its wchan), in the words of the one-line summary. Prefix matches.
KERNEL_WAITS = (
    ("futex", "futex wait"),
    ("hrtimer_nanosleep", "sleep"), ("do_nanosleep", "sleep"), ("common_nsleep", "sleep"),
    ("poll_schedule_timeout", "poll"), ("do_sys_poll", "poll"), ("do_poll", "poll"),
    ("do_select", "select"), ("core_sys_select", "select"), ("ep_poll", "epoll wait"), ("do_epoll_wait", "epoll wait"),
    ("pipe_read", "pipe read"), ("pipe_wait", "pipe read"), ("pipe_write", "pipe write"),
    ("unix_stream", "socket read"), ("sk_wait", "socket wait"), ("wait_woken", "socket wait"),
    ("do_wait", "wait for a child"), ("kernel_wait", "wait for a child"),
    ("__do_sys_pause", "pause"), ("sys_pause", "pause"),
    ("do_sigtimedwait", "signal wait"), ("sigsuspend", "signal wait"), ("do_signal_stop", "stopped"),
)
GPU_DRIVER_WORDS = ("amdgpu", "kfd", "drm", "ttm", "dma_fence", "nvidia", "uvm")

# Threads that wait in these frames are parked by design and say nothing about a hang.
IDLE_THREAD_FRAMES = (
    ("_feed", "multiprocessing/queues.py"),  # a multiprocessing.Queue's feeder thread
    ("_pin_memory_loop", "torch/utils/data/_utils/pin_memory.py"),
    ("run", "tqdm/_monitor.py"),
    ("_handle_workers", "multiprocessing/pool.py"), ("_handle_tasks", "multiprocessing/pool.py"),
    ("_handle_results", "multiprocessing/pool.py"),
)
DATALOADER_WORKER_FRAME = ("_worker_loop", "torch/utils/data/_utils/worker.py")
# Native frames that are only the road from Python into a C function: not worth a place in the summary.
NATIVE_PLUMBING = re.compile(r"libpython|libffi|_ctypes|lib-dynload|/python3\.\d+$|^python")
HEX_ADDRESS = re.compile(r"^0x[0-9a-f]+$")


@dataclass(frozen=True)
class NativeSignature(CatalogueEntry):
    """A native frame that names a known hang (``regex``: the frame's function, where a thread of the hung tree
    waits in py-spy's native frames), what causes that wait, and what cures it. Told in the incident
    (``native_signature``)."""
    cause: str
    remedy: str


# The GPU runtime's waits a hang was reported in, innermost frames first as py-spy's --native shows them.
NATIVE_SIGNATURES: tuple[NativeSignature, ...] = (
    NativeSignature(
        "rocr_busy_wait", re.compile(r"\bBusyWaitSignal::WaitRelaxed\b"),
        "the host spins at 100% of a core on a completion signal that never comes while the GPU is idle: a lost SDMA "
        "copy completion, or a pageable host copy under memory pressure (ROCm/TheRock#7832, rocm-systems#11170, "
        "#7896); with HSA_ENABLE_INTERRUPT=0 every lost completion waits here",
        "HSA_ENABLE_SDMA=0 (copies by blit kernels: the ladder's first ROCm rung), pinned host memory for the "
        "copies (pin_memory) and free host RAM; HSA_ENABLE_INTERRUPT=0 does not cure it, it makes every wait "
        "this one"),
    NativeSignature(
        "rocr_lost_interrupt", re.compile(r"\bInterruptSignal::WaitRelaxed\b"),
        "the host sleeps on a completion interrupt that was lost: the kernel finished, nothing wakes the waiter "
        "(ROCm issue 6530)",
        "HSA_ENABLE_INTERRUPT=0 (the signals polled instead: the ladder's ROCm rung after HSA_ENABLE_SDMA=0), at the "
        "cost of a busy host thread"),
    NativeSignature(
        "hsakmt_va_map", re.compile(r"\bhsaKmtMemoryVaMap\b"),
        "mapping GPU memory into the process's address space does not return: PyTorch's caching allocator with "
        "expandable_segments:True on ROCm 7.14 (pytorch/pytorch#192259)",
        "turn expandable segments off: unset expandable_segments:True in PYTORCH_HIP_ALLOC_CONF (and "
        "PYTORCH_CUDA_ALLOC_CONF), or set [worker] env PYTORCH_HIP_ALLOC_CONF = \"expandable_segments:False\""),
)


def native_signature(frames: list[Frame]) -> NativeSignature | None:
    """The first signature any native frame of a thread shows, innermost frame first."""
    for f in frames:
        if f.native:
            for signature in NATIVE_SIGNATURES:
                if signature.finds(f.function):
                    return signature
    return None


@dataclass
class Frame:
    function: str
    file: str  # basename
    line: int
    path: str
    native: bool

    def text(self, with_line: bool = True) -> str:
        return f"{self.file}:{self.line} {self.function}" if with_line and self.line else f"{self.function} ({self.file})"


@dataclass
class ThreadStack:
    tid: int
    name: str | None
    state: str  # the kernel's one-letter state of this thread
    wchan: str
    active: bool | None  # py-spy: on CPU when sampled
    frames: list[Frame] = field(default_factory=list)  # innermost first, native and Python mixed as py-spy gives
    comm: str = ""  # its kernel name (/proc/PID/task/TID/comm): a device runtime's spinning thread is known by it

    @property
    def python_frames(self) -> list[Frame]:
        return [f for f in self.frames if not f.native]

    @property
    def idle(self) -> bool:
        return any(_matches(f, pattern) for f in self.python_frames for pattern in IDLE_THREAD_FRAMES)

    def native_top(self) -> list[Frame]:
        """Named native frames inside the innermost Python frame (where the C code waits), innermost first."""
        top = []
        for f in self.frames:
            if not f.native:
                break
            if not HEX_ADDRESS.match(f.function) and not NATIVE_PLUMBING.search(f.path or f.file):
                top.append(f)
        return top


@dataclass
class ProcessStacks:
    pid: int
    role: str = ""
    state: str = "?"  # the kernel's one-letter state: R S D T t Z
    wchan: str = ""
    kernel_stack: list[str] = field(default_factory=list)  # /proc/PID/stack, root only
    threads: list[ThreadStack] = field(default_factory=list)
    note: str = ""
    ppid: int | None = None
    name: str = ""
    cmdline: str = ""
    rank: int | None = None  # RANK from its environment (torchrun, DDP)
    dataloader_worker_id: int | None = None  # from _worker_loop's locals, when py-spy gave them
    traced: bool = False  # py-spy produced stacks
    stage: str = "starting"  # what it was doing, for the note when the budget ends
    cut_short: str | None = None  # the step the budget ended, when the rest of the capture still finished

    def add_note(self, text: str) -> None:
        self.note = f"{self.note}; {text}" if self.note else text

    @property
    def is_dataloader_worker(self) -> bool:
        return any(_matches(f, DATALOADER_WORKER_FRAME) for t in self.threads for f in t.python_frames)

    @property
    def busy_dataloader_worker(self) -> bool:
        """A DataLoader worker inside a sample (not parked on its index queue)."""
        for t in self.threads:
            python = t.python_frames
            for i, f in enumerate(python):
                if _matches(f, DATALOADER_WORKER_FRAME):
                    return i > 0 and not (python[i - 1].function == "get" and python[i - 1].file == "queues.py")
        return False

    def waiting_thread(self) -> ThreadStack | None:
        """The thread that says where the process is: not a parked helper, nor a device runtime's thread that spins
        beside whatever hangs (``RUNTIME_THREADS``); on CPU first, then the main one."""
        if not self.threads:
            return None
        candidates = [t for t in self.threads if not t.idle and t.comm not in RUNTIME_THREADS] \
            or [t for t in self.threads if t.comm not in RUNTIME_THREADS] or self.threads
        for pick in (lambda t: bool(t.active), lambda t: t.tid == self.pid):
            chosen = [t for t in candidates if pick(t)]
            if chosen:
                return chosen[0]
        return candidates[0]

    def kernel_wait(self, thread: ThreadStack | None) -> str:
        state = thread.state if thread and thread.state != "?" else self.state
        wchan = thread.wchan if thread and thread.wchan else self.wchan
        return describe_kernel_wait(state, wchan)

    def waited_in(self) -> str:
        """``in futex wait (pthread_cond_wait), worker.py:301 fetch <- mosaic.py:88 load``"""
        thread = self.waiting_thread()
        text = self.kernel_wait(thread)
        if thread is None:
            return text
        native = [f.function for f in thread.native_top()[:NATIVE_FRAMES_SHOWN]]
        if native and native != [text.removeprefix("in ")]:
            text += f" ({' <- '.join(native)})"
        python = shown_python_frames(thread.python_frames)
        if python:
            text += ", " + " <- ".join("..." if f is None else f.text() for f in python)
        return text

    def summary_line(self) -> str:
        line = f"{self.role or 'process'} (pid {self.pid}) {self.waited_in()}"
        return f"{line} [{self.note}]" if self.note else line

    def where_key(self) -> str:
        """Stable across pids and line numbers of the same code: role kind, kernel wait, functions and files."""
        kind = re.sub(r" \d+$", "", self.role or "process")
        kind = re.sub(r"^child of \d+", "child", kind)
        thread = self.waiting_thread()
        frames = [f.text(with_line=False) for f in shown_python_frames(thread.python_frames) if f] if thread else []
        if not frames and thread is not None:
            frames = [f.text(with_line=False) for f in thread.native_top()[:NATIVE_FRAMES_SHOWN]]
        key = f"{kind} {self.kernel_wait(thread)}"
        return f"{key} at {' < '.join(frames)}" if frames else key


def describe_kernel_wait(state: str, wchan: str) -> str:
    wchan = "" if wchan in ("0", "") else wchan
    if state == "R":
        return "running on CPU"
    if state in ("T", "t"):
        return "stopped" + (" (by a tracer)" if state == "t" else "")
    words = next((words for prefix, words in KERNEL_WAITS if wchan.startswith(prefix)), None)
    if words is None and wchan:
        words = (f"GPU driver {wchan}" if any(w in wchan for w in GPU_DRIVER_WORDS) else f"kernel {wchan}")
    if state == "D":
        return f"uninterruptible sleep in {wchan or '?'}"
    if state == "Z":
        return "exited (zombie)"
    return f"in {words}" if words else "asleep"


def shown_python_frames(frames: list[Frame]) -> list[Frame | None]:
    """The innermost Python frame, then the next frames outside the standard library, then (after ``None``,
    shown as "...") the innermost frame of the program itself if it is not among them yet."""
    if not frames:
        return []
    shown: list[Frame | None] = [frames[0]]
    for f in frames[1:]:
        if len(shown) >= PYTHON_FRAMES_SHOWN:
            break
        if not _stdlib(f.path):
            shown.append(f)
    own = next((f for f in frames if not _stdlib(f.path) and not _library(f.path)), None)
    if own is not None and own not in shown:
        shown += [None, own]
    return shown


def _stdlib(path: str) -> bool:
    return path.startswith("<frozen") or ("/lib/python3." in path and "-packages/" not in path)


def _library(path: str) -> bool:
    return "/torch/" in path or "/multiprocessing/" in path


def _matches(frame: Frame, pattern: tuple[str, str]) -> bool:
    function, path_suffix = pattern
    return frame.function == function and frame.path.endswith(path_suffix)


@dataclass
class TreeCapture:
    main_pid: int
    processes: list[ProcessStacks]
    seconds: float
    budget: float
    notes: list[str] = field(default_factory=list)
    gpu: Any = None
    path: Path | None = None  # where stacks.json was written; None if it could not be
    hung_pid: int | None = None  # under DDP: the rank the witnesses named hung (witness.hung_rank), by its pid

    def summary_lines(self) -> list[str]:
        """One line per process: its role and the frame it waited in."""
        return [p.summary_line() for p in self.processes]

    def culprit(self) -> ProcessStacks | None:
        """The process the hang is best described by: a DataLoader worker stuck inside a sample, else a
        process in uninterruptible sleep, else the rank the witnesses named hung (``hung_pid``: the launcher above
        it only waits for its children, the other ranks for their peer), else a stopped one (a frozen DDP rank),
        else the main process."""
        busy = [p for p in self.processes if p.busy_dataloader_worker]
        if busy:
            return min(busy, key=lambda p: (p.dataloader_worker_id is None, p.dataloader_worker_id or 0, p.pid))
        stuck = [p for p in self.processes if p.state == "D"]
        if stuck:
            return stuck[0]
        hung = next((p for p in self.processes if p.pid == self.hung_pid), None)
        if hung is not None:
            return hung
        stuck = [p for p in self.processes if p.state in ("T", "t")]
        if stuck:
            return next((p for p in stuck if p.role.startswith("rank ")), stuck[0])
        return next((p for p in self.processes if p.pid == self.main_pid), self.processes[0] if self.processes
                    else None)

    def native_signature(self) -> str | None:
        """A known hang named by a native frame (``NATIVE_SIGNATURES``), in the culprit first, then the main process,
        then any other: ``rocr_busy_wait in pid 123 (rocr::core::BusyWaitSignal::WaitRelaxed): CAUSE; remedy: ...``."""
        culprit = self.culprit()
        order = sorted(self.processes, key=lambda p: (p is not culprit, p.pid != self.main_pid))
        for p in order:
            for thread in p.threads:
                found = native_signature(thread.frames)
                if found is not None:
                    frame = next(f.function for f in thread.frames if f.native and found.finds(f.function))
                    return f"{found.name} in pid {p.pid} ({frame}): {found.cause}; remedy: {found.remedy}"
        return None

    def where(self) -> str:
        """The grouping key of ``yolo-train incidents``: the same code hanging the same way gives the same key."""
        culprit = self.culprit()
        return culprit.where_key() if culprit else "no process"

    def to_dict(self) -> dict[str, Any]:
        culprit = self.culprit()
        return {"main_pid": self.main_pid, "seconds": round(self.seconds, 3), "budget": self.budget,
                "notes": self.notes, "where": self.where(), "summary": self.summary_lines(),
                "culprit": culprit.summary_line() if culprit else None, "native_signature": self.native_signature(),
                "gpu": self.gpu,
                "processes": [{**{k: v for k, v in asdict(p).items() if k != "stage"}, "waited_in": p.waited_in()}
                              for p in self.processes]}


def as_incident_stacks(capture: TreeCapture, state_dir: Path) -> Stacks:
    """What the incident keeps of a capture; the rest is in its stacks.json."""
    culprit = capture.culprit()
    return Stacks(where=capture.where(), summary=tuple(capture.summary_lines()),
                  culprit=culprit.summary_line() if culprit else None, seconds=round(capture.seconds, 3),
                  in_loader_worker=culprit is not None and culprit.busy_dataloader_worker,
                  native_signature=capture.native_signature(),
                  path=str(capture.path.relative_to(state_dir)) if capture.path else None)
