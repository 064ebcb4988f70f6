"""Where a hung worker tree was stuck: the stacks of every process in it, taken just before it is killed.

People used to spend hours per hang finding out whether it sat in a DataLoader worker or the main loop, in
the HIP runtime, right after validation. The tree is killed within seconds of the verdict, so this is the
only moment to look. For each process, in parallel:

1. ``/proc/PID/{stat,status,wchan,stack}`` and each thread's ``stat`` and ``wchan`` first: cheap, and they
   say what the kernel sees (a process asleep in the amdgpu driver shows its driver function there).
   ``cmdline`` and ``environ`` come after them because reading another process's memory takes its mmap
   lock, which a process stuck in a driver page fault may hold forever.
2. ``py-spy dump --json --native --locals`` for the Python and native frames of every Python thread; if that
   fails (no ptrace allowed), ``--nonblocking``, which only reads memory. A process that is stopped (state T)
   or in uninterruptible sleep (D) is not handed to py-spy: ptrace would wait for it.

The whole capture has one hard budget (3 s by default). Whatever is not done by then is abandoned and
noted, py-spy processes still running are killed, and the caller goes on to kill the tree. Nothing here
raises into the caller: every failure becomes a note.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable

from supervisor.decision.incident import Stacks

STACKS_FILE = "stacks.json"
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
        """The thread that says where the process is: not a parked helper; on CPU first, then the main one."""
        if not self.threads:
            return None
        candidates = [t for t in self.threads if not t.idle] or self.threads
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

    def summary_lines(self) -> list[str]:
        """One line per process: its role and the frame it waited in."""
        return [p.summary_line() for p in self.processes]

    def culprit(self) -> ProcessStacks | None:
        """The process the hang is best described by: a DataLoader worker stuck inside a sample, else a
        process in uninterruptible sleep, else a stopped one (a frozen DDP rank: the launcher above it only waits
        for its children, the other ranks for their peer), else the main process."""
        busy = [p for p in self.processes if p.busy_dataloader_worker]
        if busy:
            return min(busy, key=lambda p: (p.dataloader_worker_id is None, p.dataloader_worker_id or 0, p.pid))
        for states in (("D",), ("T", "t")):
            stuck = [p for p in self.processes if p.state in states]
            if stuck:
                return stuck[0]
        return next((p for p in self.processes if p.pid == self.main_pid), self.processes[0] if self.processes
                    else None)

    def where(self) -> str:
        """The grouping key of ``yolo-train incidents``: the same code hanging the same way gives the same key."""
        culprit = self.culprit()
        return culprit.where_key() if culprit else "no process"

    def to_dict(self) -> dict[str, Any]:
        culprit = self.culprit()
        return {"main_pid": self.main_pid, "seconds": round(self.seconds, 3), "budget": self.budget,
                "notes": self.notes, "where": self.where(), "summary": self.summary_lines(),
                "culprit": culprit.summary_line() if culprit else None, "gpu": self.gpu,
                "processes": [{**{k: v for k, v in asdict(p).items() if k != "stage"}, "waited_in": p.waited_in()}
                              for p in self.processes]}


def as_incident_stacks(capture: TreeCapture, state_dir: Path) -> Stacks:
    """What the incident keeps of a capture; the rest is in its stacks.json."""
    culprit = capture.culprit()
    return Stacks(where=capture.where(), summary=tuple(capture.summary_lines()),
                  culprit=culprit.summary_line() if culprit else None, seconds=round(capture.seconds, 3),
                  in_loader_worker=culprit is not None and culprit.busy_dataloader_worker,
                  path=str(capture.path.relative_to(state_dir)) if capture.path else None)


def find_py_spy() -> str | None:
    """py-spy next to this Python (a venv not on PATH, as under systemd), else on PATH."""
    beside = Path(sys.executable).parent / "py-spy"
    return str(beside) if os.access(beside, os.X_OK) else shutil.which("py-spy")


def capture_tree(main_pid: int, pids: list[int], dest: Path, budget: float = 3.0,
                 gpu_sample: Callable[[], Any] | None = None, py_spy: str | None = None) -> TreeCapture:
    """Stacks of ``pids`` (``main_pid`` among them) within ``budget`` seconds, written to ``dest/stacks.json``.

    Never raises; what failed or ran out of time is in the notes of the capture and of each process."""
    start = time.monotonic()
    deadline = start + budget
    notes: list[str] = []
    pids = list(dict.fromkeys([main_pid] + [p for p in pids if p != main_pid]))
    processes = {pid: ProcessStacks(pid) for pid in pids}
    try:
        exe = py_spy or find_py_spy()
        if exe is None:
            notes.append("py-spy not found beside this Python nor on PATH: /proc only; pip install py-spy")
        running: list[subprocess.Popen] = []
        lock = threading.Lock()
        threads = [threading.Thread(target=_capture_process, args=(p, exe, deadline, running, lock),
                                    name=f"stacks-{p.pid}", daemon=True) for p in processes.values()]
        gpu: dict[str, Any] = {}
        if gpu_sample is not None:
            threads.append(threading.Thread(target=_sample_gpu, args=(gpu_sample, gpu), name="stacks-gpu",
                                            daemon=True))
        for t in threads:
            t.start()
        for t in threads:
            t.join(max(0.0, deadline - time.monotonic()))
        with lock:
            leftovers = [p for p in running if p.poll() is None]
        for popen in leftovers:  # the threads waiting on them return at once
            try:
                popen.kill()
            except OSError:
                pass
        for p in processes.values():
            step = p.stage if p.stage != "done" else p.cut_short
            if step:
                p.add_note(f"abandoned at the {budget:g} s budget while {step}")
        if gpu_sample is not None and "sample" not in gpu and "error" not in gpu:
            notes.append(f"GPU sample abandoned at the {budget:g} s budget")
        _assign_roles(main_pid, processes)
        capture = TreeCapture(main_pid, list(processes.values()), time.monotonic() - start, budget, notes,
                              gpu.get("sample", gpu.get("error")))
    except Exception as e:  # never into the caller: it has a tree to kill
        notes.append(f"capture failed: {type(e).__name__}: {e}")
        capture = TreeCapture(main_pid, list(processes.values()), time.monotonic() - start, budget, notes)
    capture.path = _write(dest, capture)
    capture.seconds = time.monotonic() - start
    return capture


def _sample_gpu(gpu_sample: Callable[[], Any], out: dict[str, Any]) -> None:
    try:
        out["sample"] = gpu_sample()
    except Exception as e:
        out["error"] = f"GPU sample failed: {type(e).__name__}: {e}"


def _write(dest: Path, capture: TreeCapture) -> Path | None:
    target = Path(dest) / STACKS_FILE
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        tmp = target.with_name(f".{target.name}.{os.getpid()}.tmp")
        tmp.write_text(json.dumps(capture.to_dict(), indent=1, default=str))
        os.replace(tmp, target)
        return target
    except (OSError, TypeError, ValueError) as e:
        capture.notes.append(f"{target}: cannot write ({e})")
        return None


def _read(path: str) -> str | None:
    try:
        with open(path, "rb") as f:
            return f.read().decode(errors="replace")
    except OSError:
        return None


def _parse_stat(text: str | None) -> tuple[str, str, int | None]:
    """(name, state, ppid) from a /proc stat line; the name is in parentheses and may hold spaces."""
    if not text or ")" not in text:
        return "", "?", None
    name = text[text.index("(") + 1:text.rindex(")")]
    rest = text[text.rindex(")") + 2:].split()
    return name, rest[0] if rest else "?", int(rest[1]) if len(rest) > 1 else None


def _capture_process(p: ProcessStacks, exe: str | None, deadline: float, running: list, lock: threading.Lock) -> None:
    try:
        _read_proc(p)
        if p.stage == "gone":
            p.stage = "done"
            return
        if p.state in UNTRACEABLE_STATES:
            p.add_note(f"{UNTRACEABLE_STATES[p.state]} (state {p.state}): not traced, /proc only")
        elif exe is not None:
            _run_py_spy(p, exe, deadline, running, lock)
        p.stage = "reading its cmdline and environment"
        # Last: these read the process's memory under its mmap lock, which a process stuck in a fault holds.
        cmdline = _read(f"/proc/{p.pid}/cmdline")
        p.cmdline = (cmdline or "").replace("\0", " ").strip()[:300]
        environ = _read(f"/proc/{p.pid}/environ") or ""
        rank = next((v for k, _, v in (e.partition("=") for e in environ.split("\0")) if k == "RANK"), None)
        p.rank = int(rank) if rank is not None and rank.isdigit() else None
        p.stage = "done"
    except Exception as e:
        p.add_note(f"capture failed: {type(e).__name__}: {e}")
        p.stage = "done"


def _read_proc(p: ProcessStacks) -> None:
    p.stage = "reading /proc"
    stat = _read(f"/proc/{p.pid}/stat")
    if stat is None:
        p.add_note("exited before it could be read")
        p.stage = "gone"
        return
    p.name, p.state, p.ppid = _parse_stat(stat)
    p.wchan = (_read(f"/proc/{p.pid}/wchan") or "").strip()
    kernel_stack = _read(f"/proc/{p.pid}/stack")
    if kernel_stack is None:
        p.add_note("no /proc kernel stack (needs root)")
    else:
        p.kernel_stack = [line.split("] ", 1)[-1] for line in kernel_stack.splitlines() if line.strip()]
    try:
        tids = sorted(int(t) for t in os.listdir(f"/proc/{p.pid}/task"))
    except OSError:
        tids = [p.pid]
    for tid in tids:
        _, state, _ = _parse_stat(_read(f"/proc/{p.pid}/task/{tid}/stat"))
        wchan = (_read(f"/proc/{p.pid}/task/{tid}/wchan") or "").strip()
        p.threads.append(ThreadStack(tid, None, state, "" if wchan == "0" else wchan, None))


def _run_py_spy(p: ProcessStacks, exe: str, deadline: float, running: list, lock: threading.Lock) -> None:
    errors = []
    # --native needs ptrace (registers to unwind); --nonblocking only reads memory, which some setups allow
    # where ptrace is refused.
    for mode, flags in (("native", ["--native"]), ("nonblocking", ["--nonblocking"])):
        left = deadline - time.monotonic()
        if left <= 0:  # /proc took the budget (a slow machine, many threads): py-spy never ran
            p.cut_short = f"about to run py-spy ({mode})"
            break
        p.stage = f"running py-spy ({mode})"
        command = [exe, "dump", "--pid", str(p.pid), "--json", "--locals", *flags]
        try:
            with lock:
                popen = subprocess.Popen(command, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                         stderr=subprocess.PIPE, start_new_session=True)
                running.append(popen)
            try:
                out, err = popen.communicate(timeout=left)
            except subprocess.TimeoutExpired:
                popen.kill()
                popen.communicate()
                p.cut_short = p.stage  # the caller notes it as abandoned
                return
        except OSError as e:
            errors.append(f"{mode}: cannot run {exe} ({e.strerror})")
            break
        if popen.returncode == -signal.SIGKILL:
            p.cut_short = p.stage  # killed by capture_tree at the budget
            return
        dump = _parse_dump(out)
        if popen.returncode == 0 and dump is not None:
            _merge_dump(p, dump)
            if errors:
                p.add_note(f"py-spy without native frames ({errors[0]})")
            return
        message = (err.decode(errors="replace").strip().splitlines() or [f"exit status {popen.returncode}"])[-1]
        errors.append(f"{mode}: {message[:200]}")
    if errors:
        p.add_note("py-spy failed: " + "; ".join(errors))


def _parse_dump(out: bytes) -> list[dict] | None:
    try:
        dump = json.loads(out)
    except ValueError:
        return None
    return dump if isinstance(dump, list) else None


def _merge_dump(p: ProcessStacks, dump: list[dict]) -> None:
    by_tid = {t.tid: t for t in p.threads}
    threads = []
    for raw in dump:
        tid = raw.get("os_thread_id") or raw.get("thread_id")
        thread = by_tid.get(tid) or ThreadStack(tid, None, "?", "", None)
        thread.name = raw.get("thread_name")
        thread.active = raw.get("active")
        thread.frames = []
        for f in raw.get("frames", []):
            path = f.get("filename") or ""
            frame = Frame(function=f.get("name") or "?", file=os.path.basename(f.get("short_filename") or path),
                          line=int(f.get("line") or 0), path=path, native=f.get("module") is not None)
            thread.frames.append(frame)
            if frame.function == "_worker_loop" and p.dataloader_worker_id is None:
                p.dataloader_worker_id = _local_int(f.get("locals"), "worker_id")
        threads.append(thread)
    p.threads = threads  # threads py-spy does not list (no Python state: OpenMP, HIP) say nothing more here
    p.traced = True


def _local_int(local_vars: list[dict] | None, name: str) -> int | None:
    for var in local_vars or []:
        if var.get("name") == name:
            try:
                return int(var.get("repr"))
            except (TypeError, ValueError):
                return None
    return None


def _assign_roles(main_pid: int, processes: dict[int, ProcessStacks]) -> None:
    """"main" or "rank R"; "DataLoader worker N" for a process running torch's _worker_loop (N from its
    locals, else its place among its parent's workers by pid); "child of PID" otherwise."""
    workers_by_parent: dict[int | None, list[ProcessStacks]] = {}
    for p in processes.values():
        if p.pid != main_pid and p.is_dataloader_worker:
            workers_by_parent.setdefault(p.ppid, []).append(p)
    for siblings in workers_by_parent.values():
        for n, p in enumerate(sorted(siblings, key=lambda s: s.pid)):
            p.role = f"DataLoader worker {p.dataloader_worker_id if p.dataloader_worker_id is not None else n}"
    for p in processes.values():
        if p.role:
            continue
        parent = processes.get(p.ppid) if p.ppid is not None else None
        if p.rank is not None and (p.pid == main_pid or parent is None or parent.rank != p.rank):
            p.role = f"rank {p.rank}"  # a child that inherited its parent's RANK is not a rank of its own
        elif p.pid == main_pid:
            p.role = "main"
        else:
            p.role = f"child of {p.ppid}" if p.ppid else "child"
