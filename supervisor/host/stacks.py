"""Where a hung worker tree was stuck: the stacks of every process in it, taken just before it is killed.

Whether a hang sat in a DataLoader worker or the main loop, in the HIP runtime, right after validation, takes hours
to find out by hand. The tree is killed within seconds of the verdict, so this is the
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
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any, Callable, Collection

from supervisor.decision import UNTRACEABLE_STATES, Frame, ProcessStacks, ThreadStack, TreeCapture

STACKS_FILE = "stacks.json"

def find_py_spy() -> str | None:
    """py-spy next to this Python (a venv not on PATH, as under systemd), else on PATH."""
    beside = Path(sys.executable).parent / "py-spy"
    return str(beside) if os.access(beside, os.X_OK) else shutil.which("py-spy")


def capture_tree(main_pid: int, pids: list[int], dest: Path, budget: float = 3.0,
                 gpu_sample: Callable[[], Any] | None = None, py_spy: str | None = None,
                 loader_pids: Collection[int] = (), rank_pids: dict[int, int] | None = None,
                 hung_pid: int | None = None) -> TreeCapture:
    """Stacks of ``pids`` (``main_pid`` among them) within ``budget`` seconds, written to ``dest/stacks.json``.
    ``loader_pids``: the loader worker processes the worker reported, so named even where no Python stack says so
    (a stopped or D-state process is read from /proc only). ``rank_pids``: each DDP rank's pid, as its heartbeats say
    (pid -> rank): a rank forked by the rank server (worker/standby/rank_server.py) has the server's /proc/PID/environ, its
    RANK only in its stub's. ``hung_pid``: the rank the witnesses named hung, the culprit where nothing worse is seen.

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
        _assign_roles(main_pid, processes, set(loader_pids), rank_pids or {})
        capture = TreeCapture(main_pid, list(processes.values()), time.monotonic() - start, budget, notes,
                              gpu.get("sample", gpu.get("error")), hung_pid=hung_pid)
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
        comm, state, _ = _parse_stat(_read(f"/proc/{p.pid}/task/{tid}/stat"))
        wchan = (_read(f"/proc/{p.pid}/task/{tid}/wchan") or "").strip()
        p.threads.append(ThreadStack(tid, None, state, "" if wchan == "0" else wchan, None, comm=comm))


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


def _assign_roles(main_pid: int, processes: dict[int, ProcessStacks], loader_pids: Collection[int] = (),
                  rank_pids: dict[int, int] | None = None) -> None:
    """"main" or "rank R"; "DataLoader worker N" for a process running torch's _worker_loop or one the worker
    reported as its loader's (N from its locals, else its place among its parent's workers by pid); "child of PID"
    otherwise. ``rank_pids`` (pid -> rank, from the ranks' heartbeats) name the ranks first: a process whose
    environment says RANK R while another is rank R's is R's stand-in (worker/standby/rank_stub.py): "stub of rank R"."""
    rank_pids = rank_pids or {}
    for pid, rank in rank_pids.items():
        if pid in processes:
            processes[pid].rank = rank
    known = set(rank_pids.values())
    workers_by_parent: dict[int | None, list[ProcessStacks]] = {}
    for p in processes.values():
        if p.pid != main_pid and (p.is_dataloader_worker or p.pid in loader_pids):
            workers_by_parent.setdefault(p.ppid, []).append(p)
    for siblings in workers_by_parent.values():
        for n, p in enumerate(sorted(siblings, key=lambda s: s.pid)):
            p.role = f"DataLoader worker {p.dataloader_worker_id if p.dataloader_worker_id is not None else n}"
    for p in processes.values():
        if p.role:
            continue
        parent = processes.get(p.ppid) if p.ppid is not None else None
        if p.rank is not None and p.rank in known and p.pid not in rank_pids:
            p.role = f"stub of rank {p.rank}"
        elif p.rank is not None and (p.pid == main_pid or parent is None or parent.rank != p.rank):
            p.role = f"rank {p.rank}"  # a child that inherited its parent's RANK is not a rank of its own
        elif p.pid == main_pid:
            p.role = "main"
        else:
            p.role = f"child of {p.ppid}" if p.ppid else "child"
