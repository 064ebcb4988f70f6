"""The witness: a thread in the training process that says where its main thread waits, while it makes no progress.

From outside, a hang is judged by guesses (py-spy's frames by name, the tree's CPU share, /proc states). The process
itself knows: ``sys._current_frames()`` holds the watched thread's frames and, on them, the objects it waits on (the
DataLoader iterator and the batch it awaits, the lock, the socket). About twice a second (``INTERVAL``), once the
watched thread has made no progress for that long, the witness reads them, classifies the wait (``RULES``) and sends a
``contract.WaitReport`` through ``Heartbeat.wait``. The supervisor reads it as no progress. Where the watched thread
waits on a lock's kind (a join, a queue, a future, an event), the other threads' frames are read too, and the chain of
threads it waits on is followed to its end (worker/wait_chain.py); the report carries it, and the watched thread's
native id, by which the supervisor reads each thread's CPU time in /proc.

Progress is the heartbeat client's ``progress`` counter (the watched thread's beats and phases). While it grows, the
witness wakes every ``INTERVAL``, compares one int and sleeps again: nothing else. ``stalled`` is counted from the
wake-up that saw the counter change, so it is up to one interval short, never long.

It never stalls training: it shares no lock with the training thread (it sleeps on an Event of its own, reads the
frames under the GIL alone, and writes through the client's non-blocking ``_send``); an exception inside it loses
that one report (counted in ``lost``), never the training. It only imports torch's modules that are already loaded
and never initialises CUDA.

At fork (a loader's workers, forked from the training thread while it holds the GIL): the witness holds the GIL or
waits without holding anything a child inherits held: on its own Event's private waiter lock, in a write() to the
pipe, in the read() of a source line. CPython re-creates its own runtime locks in the child, glibc its malloc, stdio
and loader locks; the one glibc leaves held (``__exit_funcs_lock``, Ultralytics PR #26085) is taken by C++ first-use
statics, which the witness reaches only in the device query, made with the GIL held by torch's binding (see
``device_busy``). A forked child has no witness thread (fork copies the calling thread only) and never starts one.

Who gets it: our worker starts it in the training process (``worker/training/train.py``) and in every DDP rank
(``worker/distributed/ddp.py``) through ``Heartbeat.from_env(witness=True)``; the launching worker of a DDP run stops its own
once the ranks train (it only waits for them). A command worker's script asks for it the same way, or with
``hb.start_witness()``; a plain ``Heartbeat.from_env()`` starts no thread (a library that adds a thread to someone's
process unasked changes what their fork()s inherit), and an unsupervised client (no pipe) never starts one. It
watches the thread that starts it: the main thread, in our worker.
"""

from __future__ import annotations

import dis
import linecache
import os
import re
import socket
import struct
import sys
import threading
import time
import weakref
from dataclasses import dataclass, replace
from typing import Any, Callable, Protocol

from worker import wait_chain
from worker.wire.contract import BATCH_WAIT_FILE, BATCH_WAIT_FUNCTIONS, DDP_BACKWARD, WaitKind, WaitReport

INTERVAL = 0.5  # seconds between looks; also the stall after which the first report is sent
MAX_FRAMES = 200  # frames walked outward from the innermost; a deeper stack is classified by its innermost ones
_STDLIB = os.path.dirname(os.__file__)
_TOLERANCE = 0.001  # an Event's timeout ends at its deadline, measured by another call: float rounding, no more


class Client(Protocol):
    """What the witness needs of the heartbeat client (``worker.heartbeat.Heartbeat``)."""

    progress: int

    def wait(self, report: WaitReport) -> bool: ...


# Loaders by name ("train", "val"): id -> (weak reference to a DataLoader or an iterator, name). Written by the
# training thread only (name_loader); the witness reads a copy (tuple() of a dict is one step under the GIL).
_NAMES: dict[int, tuple[weakref.ref, str]] = {}


def name_loader(loader_or_iterator: Any, name: str) -> None:
    """Tell the witness which loader this is: its reports say ``loader = name`` for a wait on this DataLoader's
    iterator (``iterator`` as Ultralytics' loaders keep it, ``_iterator`` as torch's persistent ones), rebuilt ones
    included, or on this very iterator."""
    for key, (ref, _) in list(_NAMES.items()):
        if ref() is None:
            del _NAMES[key]
    try:
        _NAMES[id(loader_or_iterator)] = (weakref.ref(loader_or_iterator), name)
    except TypeError:
        pass  # not weakly referable (a loader holds no reference to the witness): its waits go unnamed


def loader_name(iterator: Any) -> str | None:
    for ref, name in tuple(_NAMES.values()):
        named = ref()
        if named is not None and (named is iterator or getattr(named, "iterator", None) is iterator
                                  or getattr(named, "_iterator", None) is iterator):
            return name
    return None


@dataclass(frozen=True)
class Stack:
    """The watched thread's frames as the rules read them: innermost first, and the innermost frame's line."""

    frames: tuple[Any, ...]  # frame objects, or anything with f_code (co_filename, co_name), f_lineno, f_locals
    line: str  # the innermost frame's current source line, stripped ("" where the source is not readable)
    device_busy: Callable[[], bool]  # whether a device of this process has queued work not done

    @classmethod
    def of(cls, frame: Any, device_busy: Callable[[], bool]) -> "Stack":
        frames = []
        while frame is not None and len(frames) < MAX_FRAMES:
            frames.append(frame)
            frame = frame.f_back
        line = linecache.getline(frames[0].f_code.co_filename, frames[0].f_lineno).strip() if frames else ""
        return cls(tuple(frames), line, device_busy)

    @property
    def innermost(self) -> Any:
        return self.frames[0]

    def where(self) -> str:
        f = self.innermost
        return f"{short_path(f.f_code.co_filename)}:{f.f_lineno} in {f.f_code.co_name}"

    def first(self, files: tuple[str, ...], functions: tuple[str, ...] | None = None) -> Any:
        """The innermost frame in one of ``files`` (path suffixes), in one of ``functions`` where given."""
        for f in self.frames:
            if f.f_code.co_filename.endswith(files) and (functions is None or f.f_code.co_name in functions):
                return f
        return None

    def named_on_line(self) -> dict[str, Any]:
        """The objects the innermost line names, by their dotted names (``lock`` in ``with lock:``, ``self.work`` in
        ``self.work.wait()``): from the frame's locals, then its globals, then instance or module dictionaries only,
        so that no property or ``__getattr__`` runs in the witness."""
        f, found = self.innermost, {}
        local, glob = getattr(f, "f_locals", None) or {}, getattr(f, "f_globals", None) or {}
        for dotted in re.findall(r"[A-Za-z_][\w.]*", self.line):
            head, *attrs = dotted.split(".")
            if head in local:
                value = local[head]
            elif head in glob:
                value = glob[head]
            else:
                continue
            found[head], path = value, head
            for attr in attrs:
                try:
                    value = object.__getattribute__(value, "__dict__")[attr]
                except (AttributeError, KeyError, TypeError):
                    break
                path = f"{path}.{attr}"
                found[path] = value
        return found


@dataclass(frozen=True)
class Match:
    function: str | None = None
    fields: tuple[tuple[str, Any], ...] = ()


@dataclass(frozen=True)
class Rule:
    kind: WaitKind
    why: str  # why a match means this kind of wait
    match: Callable[[Stack], Match | None]


def stdlib(*names: str) -> tuple[str, ...]:
    return tuple(os.path.join(_STDLIB, n) for n in names)


def short_path(path: str) -> str:
    return "/".join(path.replace(os.sep, "/").split("/")[-3:])


# --- the rules' matchers, each on the whole stack --------------------------------------------------------------



def loader_wait(stack: Stack) -> Match | None:
    frame = stack.first((BATCH_WAIT_FILE,), BATCH_WAIT_FUNCTIONS)
    if frame is None or any(_own(f) for f in stack.frames[:stack.frames.index(frame)]):
        return None  # code of the training's own run inside the wait (a signal's handler) waits on what it waits on
    it = frame.f_locals.get("self")
    module = sys.modules.get("torch.utils.data.dataloader")
    if module is None or not isinstance(it, module._MultiProcessingDataLoaderIter):
        return None  # a single-process iterator loads in this very thread: what it does is further in
    batch = it._rcvd_idx
    info = it._task_info.get(batch)  # (worker,) while outstanding; (worker, data) once arrived out of order
    worker = info[0] if info else None
    workers = it._workers
    sender = _sharing_worker(stack, workers)
    if sender is not None and sender != worker:
        # It reads another worker's batch than the one it awaits, arrived first: that worker holds it up. A worker
        # sends its batches in the order it was given them: this one is the oldest it owes.
        owed = [i for i, task in tuple(it._task_info.items()) if len(task) == 1 and task[0] == sender]
        worker, batch = sender, min(owed, default=batch)
    pid = workers[worker].pid if worker is not None and worker < len(workers) else None
    return Match(frame.f_code.co_name, (("loader", loader_name(it)), ("worker", worker), ("worker_pid", pid),
                                        ("batch_index", batch)))


def _own(frame: Any) -> bool:
    """A frame of neither torch nor Python's standard library: what a loader's wait is made of is only theirs."""
    path = frame.f_code.co_filename
    return not (_TORCH in path or path.startswith("<frozen ")
                or path.startswith(_STDLIB + os.sep) and "-packages" not in path)


_SHARER = stdlib(os.path.join("multiprocessing", "resource_sharer.py"))


def _sharing_worker(stack: Stack, workers: list[Any]) -> int | None:
    """The worker whose resource sharer the reading thread is connected to, or None. A batch's tensors come in shared
    memory whose descriptor the sending worker's resource sharer (a thread of that process) hands over while the
    batch is unpickled: a worker that is stopped, or holds its GIL in a C call, never answers, and the read waits
    there (multiprocessing/connection.py, beneath torch's queue read), on a Unix socket whose peer is that worker."""
    if stack.first(_SHARER) is None:
        return None
    connection = sys.modules.get("multiprocessing.connection")
    for f in stack.frames:
        if f.f_code.co_filename.endswith(_SHARER):
            return None
        for value in (getattr(f, "f_locals", None) or {}).values():
            if isinstance(value, socket.socket) or connection is not None and isinstance(value, connection.Connection):
                pid = _peer_pid(value)
                return next((i for i, w in enumerate(workers) if pid is not None and w.pid == pid), None)
    return None


def _peer_pid(endpoint: Any) -> int | None:
    """The process at the other end of a Unix socket (SO_PEERCRED), through a duplicate of its descriptor."""
    try:
        with socket.fromfd(endpoint.fileno(), socket.AF_UNIX, socket.SOCK_STREAM) as s:
            return struct.unpack("3i", s.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i")))[0]
    except (OSError, ValueError):
        return None


_C10D = ("torch/distributed/distributed_c10d.py",)
_TORCH = "/torch/"  # torch's own code: what runs inside a collective of its own (a device sync in a barrier)


_BACKWARD = ("torch/autograd/graph.py",)


def collective_wait(stack: Stack) -> Match | None:
    frame = stack.first(_C10D)
    inner = stack.frames[:stack.frames.index(frame)] if frame is not None else ()
    if frame is not None and all(_TORCH in f.f_code.co_filename for f in inner):
        # (other Python run from inside a collective, a signal's handler: waits on what it waits on)
        return Match(frame.f_code.co_name)
    if stack.first(_BACKWARD, ("_engine_run_backward",)) is stack.innermost and in_process_group():
        # DDP's reducer all-reduces the gradients from inside the autograd engine: on the CPU (gloo) backward returns
        # only when its peers sent theirs; on a GPU the all-reduce is queued on this rank's own stream, so the device
        # looks busy, but what it holds is the process group's: the rank waits for its peers either way. A rank whose
        # own kernel hangs in backward is named by its peers' words (all in a collective: the oldest progress).
        # Only where backward is the innermost frame: Python run from inside it (a hook, a signal's handler) waits
        # on what it waits on, not on the peers.
        return Match(DDP_BACKWARD)
    call = re.search(r"([A-Za-z_][\w.]*)\.wait\(", stack.line)
    if call and _type_named(stack.named_on_line().get(call.group(1)), "Work"):  # an async collective's Work.wait()
        return Match("wait")
    return None


def in_process_group() -> bool:
    """A torch.distributed process group of several ranks is up in this process (never imports it)."""
    dist = sys.modules.get("torch.distributed")
    try:
        return dist is not None and dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1
    except Exception:  # noqa: BLE001  (a group being torn down: no word on it)
        return False


_CUDA_SYNC = ("torch/cuda/__init__.py", "torch/cuda/streams.py")
# The instructions by which a frame is inside a native call (the innermost frame: no Python frame beyond it).
_NATIVE_OPS = {op for op in dis.opmap if op.startswith("CALL")} | {
    "BINARY_OP", "BINARY_SUBSCR", "STORE_SUBSCR", "COMPARE_OP", "CONTAINS_OP", "FOR_ITER", "GET_ITER"}


def in_native_call(frame: Any) -> bool:
    lasti = getattr(frame, "f_lasti", None)
    if lasti is None or lasti < 0:
        return True  # not a real frame (a test's), or not started: say nothing against it
    code = frame.f_code.co_code
    return lasti < len(code) and dis.opname[code[lasti]] in _NATIVE_OPS


def device_wait(stack: Stack) -> Match | None:
    frame = stack.first(_CUDA_SYNC, ("synchronize",))
    if frame is not None:
        return Match("synchronize")
    if in_native_call(stack.innermost) and stack.device_busy():
        call = re.search(r"\.?(\w+)\(", stack.line)
        return Match(call.group(1) if call else None)
    return None


_LOCK_FILES = stdlib("threading.py", "queue.py", os.path.join("multiprocessing", "synchronize.py"))
_LOCK_TYPES = ("lock", "RLock", "_RLock", "Lock", "Semaphore", "BoundedSemaphore", "Condition")


_BOOTSTRAP = ("run", "_bootstrap", "_bootstrap_inner")  # threading.py's frames under every thread it started


_WORK_ITEM = stdlib(os.path.join("concurrent", "futures", "thread.py"))


def started_on(stack: Stack) -> Any:
    """The C function a thread runs with no Python frame of its own: one it was started on (``Thread(target=
    lock.acquire)``, ``target=time.sleep``; its innermost frame is threading's ``run`` calling ``self._target``), or
    one an executor was given (``pool.submit(time.sleep, 6)``: concurrent.futures' ``_WorkItem.run`` calling
    ``self.fn``); None otherwise."""
    f = stack.innermost
    if f.f_code.co_name != "run":
        return None
    attribute = "_target" if f.f_code.co_filename.endswith(_LOCK_FILES[0]) else "fn" \
        if f.f_code.co_filename.endswith(_WORK_ITEM) else None
    if attribute is None:
        return None
    try:
        target = object.__getattribute__(f.f_locals.get("self"), "__dict__").get(attribute)
    except (AttributeError, TypeError):
        return None
    return target if type(target).__name__ == "builtin_function_or_method" else None


def lock_wait(stack: Stack) -> Match | None:
    frame = next((f for f in stack.frames if f.f_code.co_filename.endswith(_LOCK_FILES)
                  and not (f.f_code.co_filename.endswith(_LOCK_FILES[0]) and f.f_code.co_name in _BOOTSTRAP)), None)
    if frame is not None:
        return Match(frame.f_code.co_name)
    target = started_on(stack)
    if ".acquire(" in stack.line or target is not None and target.__name__ == "acquire" \
            and _type_named(getattr(target, "__self__", None), *_LOCK_TYPES):
        return Match("acquire")
    if stack.line.startswith("with ") and any(_type_named(v, *_LOCK_TYPES) for v in stack.named_on_line().values()):
        return Match("acquire")
    if _calls_lock(stack.innermost):
        return Match("acquire")
    return None


_LOADS = ("LOAD_FAST", "LOAD_DEREF", "LOAD_CLOSURE", "LOAD_NAME", "LOAD_GLOBAL")
_ATTRIBUTES = ("LOAD_ATTR", "LOAD_METHOD")
_TAKES = ("acquire", "__enter__")


def _calls_lock(frame: Any) -> bool:
    """The native call the frame is in takes a lock of this process, read from its bytecode, not its source: a lock
    taken through another name (``take = lock.acquire; take()``) or on a line no file holds (code compiled from a
    string, a callback of a notebook) waits in ``acquire`` all the same, with no frame of threading.py."""
    lasti, code = getattr(frame, "f_lasti", -1), getattr(getattr(frame, "f_code", None), "co_code", b"")
    if not 0 <= lasti < len(code) or not isinstance(code, bytes):
        return False
    op = dis.opname[code[lasti]]
    if not (op.startswith("CALL") or op == "BEFORE_WITH"):
        return False
    held = None  # the value the loads of the current call have reached, and the attribute that follows it
    for load, name in _loads_before(frame):
        if load in _LOADS:
            held = _named(frame, name)
        elif held is not None and held[1] is None:
            try:
                held = (object.__getattribute__(held[0], "__dict__")[name], None)
            except (AttributeError, KeyError, TypeError):
                held = (held[0], name)  # a builtin's attribute: its method, by name
        else:
            held = None
    if held is None:
        return False
    value, attribute = held
    if op == "BEFORE_WITH":
        return attribute is None and _type_named(value, *_LOCK_TYPES)
    if attribute is not None:
        return attribute in _TAKES and _type_named(value, *_LOCK_TYPES)
    owner = getattr(value, "__self__", None)  # a bound ``acquire`` of a lock, called by another name
    return getattr(value, "__name__", None) in _TAKES and owner is not None and _type_named(owner, *_LOCK_TYPES)


def _loads_before(frame: Any) -> list[tuple[str, str]]:
    """The loads of names and attributes the frame's current line made up to the instruction it is in: (op, name)."""
    code, lasti, line, loads = frame.f_code, frame.f_lasti, None, []
    for ins in dis.get_instructions(code):
        if ins.starts_line is not None:
            line = ins.starts_line
        if ins.offset >= lasti:
            break
        if line == frame.f_lineno and (ins.opname in _LOADS or ins.opname in _ATTRIBUTES):
            loads.append((ins.opname, ins.argval))
    return loads


def _named(frame: Any, name: str) -> tuple[Any, None] | None:
    for scope in (getattr(frame, "f_locals", None) or {}, getattr(frame, "f_globals", None) or {}):
        if name in scope:
            return scope[name], None
    return None


_IO_FILES = stdlib("socket.py", "ssl.py", "selectors.py", os.path.join("http", "client.py"),
                   os.path.join("multiprocessing", "connection.py")) + (os.path.join(_STDLIB, "urllib") + os.sep,)
_SUBPROCESS = stdlib("subprocess.py")
_IO_CALL = re.compile(r"(?:\.(read|readline|readlines|readinto|write|recv|recv_into|recvfrom|send|sendall|accept|"
                      r"connect|select|poll)|\b(open|urlopen|select)|\b(requests)\.\w+)\(")


def io_wait(stack: Stack) -> Match | None:
    for f in stack.frames:
        path = f.f_code.co_filename
        if path.endswith(_IO_FILES) or path.startswith(_IO_FILES[-1]):
            return Match(f.f_code.co_name)
        if path.endswith(_SUBPROCESS) and f.f_code.co_name in ("wait", "communicate", "_wait", "_communicate",
                                                               "_try_wait"):
            return Match(f.f_code.co_name)
    call = _IO_CALL.search(stack.line)
    if call:
        return Match(call.group(1) or call.group(2) or call.group(3))
    return None


def sleep_wait(stack: Stack) -> Match | None:
    return Match("sleep") if re.search(r"\bsleep\(", stack.line) or started_on(stack) is time.sleep else None


# First rule to match wins; each walks the stack from the innermost frame outward. The order matters where one wait
# is made of another: a loader's and a collective's waits are made of queue, lock and socket waits further in.
RULES = (
    Rule(WaitKind.LOADER, "torch's _MultiProcessingDataLoaderIter waits in _next_data/_get_data/_try_get_data for the "
         "batch _rcvd_idx, which _task_info says one worker owes: its own queue read or the pin thread's, inside; or "
         "it reads another worker's batch that came first, from that worker's resource sharer",
         loader_wait),
    Rule(WaitKind.COLLECTIVE, "every torch.distributed collective is a function of distributed_c10d.py (and waits "
         "in it, or in the Work it returned)", collective_wait),
    Rule(WaitKind.DEVICE, "torch.cuda's synchronize, or a native call (item(), cpu(), a copy) while a device's "
         "stream still has work: the host waits for the device", device_wait),
    Rule(WaitKind.LOCK, "threading, queue and multiprocessing.synchronize wait on locks of this process, and so "
         "does a lock's acquire on the innermost line", lock_wait),
    Rule(WaitKind.IO, "sockets, selectors, HTTP, a subprocess, a pipe to another process, a file: something "
         "outside this process's own threads", io_wait),
    Rule(WaitKind.SLEEP, "time.sleep: a wait the code chose", sleep_wait),
)


def classify(stack: Stack, stalled: float) -> WaitReport:
    for rule in RULES:
        found = rule.match(stack)
        if found is not None:
            return WaitReport(kind=rule.kind, where=stack.where(), stalled=round(stalled, 3),
                              function=found.function, **dict(found.fields))
    return WaitReport(kind=WaitKind.ELSEWHERE, where=stack.where(), stalled=round(stalled, 3),
                      function=native_call(stack))


def native_call(stack: Stack) -> str | None:
    """The native call the innermost frame is inside (its name on the line, or "native"); None: the thread runs
    Python there, a loop of its own. It tells the process's own spin, which no rung changes, from a busy wait in a
    native call (ROCm's lost completion), which an environment rung may."""
    if not in_native_call(stack.innermost):
        return None
    call = re.search(r"\.?(\w+)\(", stack.line)
    return call.group(1) if call else "native"


def device_busy() -> bool:
    """Whether a GPU this process uses has work queued on its stream that is not done. Never initialises CUDA and
    never touches a device without a context of this process (it would make one, and hold its memory). The query is
    cudaStreamQuery (hipStreamQuery under HIP) on the device's current stream as this thread sees it: the default
    one. torch's bindings of ``_cuda_getCurrentStream`` and ``Stream.query`` keep the GIL (``synchronize`` is the one
    that drops it), so no fork by the training thread runs beside them."""
    torch = sys.modules.get("torch")
    cuda = getattr(torch, "cuda", None) if torch is not None else None
    if cuda is None or not cuda.is_initialized():
        return False
    has_context = getattr(torch._C, "_cuda_hasPrimaryContext", None)
    if has_context is None:
        return False
    return any(has_context(i) and not cuda.current_stream(i).query() for i in range(cuda.device_count()))


def _classify_other(frame: Any) -> WaitReport:
    """Another thread's wait, for the chain: the same rules, without asking the device (that is the main thread's)."""
    return classify(Stack.of(frame, _no_device), 0.0)


def _no_device() -> bool:
    return False


def _type_named(value: Any, *names: str) -> bool:
    return any(t.__name__ in names for t in type(value).__mro__)


class Witness:
    """The thread. ``start()`` watches the calling thread; ``stop()`` ends it. ``reports`` counts those sent, ``lost``
    the looks that failed (an exception inside: swallowed)."""

    def __init__(self, client: Client, interval: float = INTERVAL, thread: int | None = None,
                 device: Callable[[], bool] = device_busy):
        self.client, self.interval, self.device = client, interval, device
        self.thread = thread if thread is not None else threading.get_ident()
        watched = threading._active.get(self.thread)  # (a dict read under the GIL: no lock of threading's taken)
        self.native_id = getattr(watched, "native_id", None)  # what /proc calls it: the supervisor reads its CPU
        self._clocks = wait_chain.Clocks()
        self.reports = self.lost = 0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    @property
    def alive(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def start(self) -> "Witness":
        self._thread = threading.Thread(target=self._run, name="yolo-train-witness", daemon=True)
        self._thread.start()
        return self

    def stop(self, timeout: float = 2.0) -> None:
        self._stop.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout)

    def look(self, stalled: float) -> WaitReport | None:
        """Where the watched thread is now, classified, with the chain of threads it waits on (a lock's wait);
        None when it is gone."""
        frames = sys._current_frames()
        frame = frames.get(self.thread)
        if frame is None:
            return None
        try:
            report = classify(Stack.of(frame, self.device), stalled)
            if report.kind == WaitKind.LOCK:
                chain = wait_chain.follow(frame, frames, {self.thread, threading.get_ident()}, _classify_other,
                                          self._clocks, time.monotonic())
                report = replace(report, chain=chain)
            return replace(report, tid=self.native_id)
        finally:
            del frame, frames  # frames hold their locals: keep none beyond the look

    def _run(self) -> None:
        stop, interval = self._stop, self.interval
        last, since = self.client.progress, time.monotonic()
        while not stop.wait(interval):
            progress, now = self.client.progress, time.monotonic()
            if progress != last:
                last, since = progress, now
                continue
            stalled = now - since
            if stalled + _TOLERANCE < interval:
                continue
            try:
                report = self.look(stalled)
                if report is not None and self.client.progress == last:  # no progress while it looked
                    self.client.wait(report)
                    self.reports += 1
            except Exception:  # a report lost, never the training
                self.lost += 1
