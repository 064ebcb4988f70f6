"""Hangs of issue 38's kinds, made from outside the project (no fault flag), for bench/in_place.py and bench/burst.py.

- ``loader_blocked``, ``loader_spinning``, ``loader_stopped``: one training loader worker blocks on a lock taken
  twice, spins at 100% CPU, or stops (SIGSTOP to itself); the training process then waits for the batch it owes;
- ``main_spinning``, ``main_blocked``: the training process's main thread spins in Python or blocks on a lock;
- ``tree``: every process of the worker's tree gets SIGSTOP (how a driver hang leaves a training);
- ``val_loader_spinning``: one validation loader worker spins (issue 48's night);
- ``loader_twice``: a training loader worker blocks, and so does one of the loader rebuilt in its place (the bench
  calls ``again`` until it has): in place escalates, and the restart climbs the loader's rungs. A hang a rung cures.
- ``device_hang`` (a GPU only): the training process queues a kernel that never ends on its current device (its next
  wait for the device never returns), as a driver's lost kernel leaves it.

The first five come from a ``sitecustomize.py`` put on the training's PYTHONPATH (``install``): a SIGUSR2 handler in
every Python process of the run (loader workers inherit it, forked, from the forkserver or spawned) that reads what to
do from a file the bench writes. ``make`` writes it, then signals the worker and its whole tree: the training process
takes a ``main_*`` kind, and the first training loader worker to handle the signal (a mark file, created exclusively)
takes a ``loader_*`` kind; a validation loader's workers (their dataset does not augment) and every other process
ignore it. It is the user's environment that hangs, as a dataset or a callback would, not the project's code.
"""

from __future__ import annotations

import os
import signal
from pathlib import Path

KINDS = ("loader_blocked", "loader_spinning", "loader_stopped", "main_spinning", "main_blocked", "tree",
         "val_loader_spinning", "loader_twice", "device_hang")


def in_trainer(kind: str) -> bool:
    """The kinds the training process itself takes (not a loader worker)."""
    return kind.startswith("main_") or kind == "device_hang"

SITECUSTOMIZE = '''
import os, signal, threading

def _bench_hang(signum, frame):
    try:
        kind, trainer, mark = open(os.environ["BENCH_HANG_FILE"]).read().split()
    except (KeyError, OSError, ValueError):
        return
    if kind.startswith("main_") or kind == "device_hang":
        if os.getpid() != int(trainer):
            return
        if kind == "device_hang":
            import torch
            if torch.cuda.is_initialized():
                torch.cuda._sleep(1 << 46)  # cycles: days at any clock, on the current device's stream
            return
    else:
        try:
            from torch.utils.data import get_worker_info
        except ImportError:
            return
        info = get_worker_info()
        if info is None or (getattr(info.dataset, "augment", True) is False) != kind.startswith("val_"):
            return  # not a loader worker, or not of the loader asked for (validation's dataset does not augment)
        try:
            os.close(os.open(mark, os.O_CREAT | os.O_EXCL | os.O_WRONLY))
        except OSError:
            return  # another worker took it
    what = kind.rsplit("_", 1)[1]
    if what == "stopped":
        os.kill(os.getpid(), signal.SIGSTOP)
    elif what == "blocked":
        lock = threading.Lock()
        lock.acquire()
        lock.acquire()
    elif what == "spinning":
        while True:
            pass

if "BENCH_HANG_FILE" in os.environ and threading.current_thread() is threading.main_thread():
    signal.signal(signal.SIGUSR2, _bench_hang)
'''


class Hangs:
    """Makes hangs of ``KINDS`` in a run whose environment ``install`` prepared."""

    def __init__(self, folder: Path):
        self.folder = folder
        self.file = folder / "bench-hang"
        self.made = 0
        self.twice: tuple[int, set[int]] | None = None  # loader_twice: (worker pid, its tree when first hung)

    @classmethod
    def install(cls, folder: Path, extra: str = "") -> Hangs:
        """Put the handler on this process's PYTHONPATH, inherited by the supervisor and its worker; ``extra``: more
        of a bench's own for that ``sitecustomize`` (one is imported: bench/threads_night.py's hooks)."""
        hook = folder / "bench-hang-hook"
        hook.mkdir(parents=True, exist_ok=True)
        (hook / "sitecustomize.py").write_text(SITECUSTOMIZE + extra)
        hangs = cls(folder)
        os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (str(hook), os.environ.get("PYTHONPATH", "")) if p)
        os.environ["BENCH_HANG_FILE"] = str(hangs.file)
        return hangs

    def make(self, kind: str, worker_pid: int) -> bool:
        """A hang of ``kind`` in the worker ``worker_pid``'s tree; False when there was nothing to hang."""
        import psutil

        if kind not in KINDS:
            raise ValueError(f"unknown hang kind {kind!r}: one of {', '.join(KINDS)}")
        try:
            processes = [psutil.Process(worker_pid)] + psutil.Process(worker_pid).children(recursive=True)
        except psutil.NoSuchProcess:
            return False
        if kind == "loader_twice":
            self.twice, kind = (worker_pid, {p.pid for p in processes}), "loader_blocked"
        self.made += 1
        sig = signal.SIGSTOP if kind == "tree" else signal.SIGUSR2
        if kind != "tree":
            self.file.write_text(f"{kind} {worker_pid} {self.folder / f'bench-hang-mark-{self.made}'}\n")
            # SIGUSR2 ends a process without the handler: only Python processes get it, the trainer alone for its own
            processes = processes[:1] if in_trainer(kind) else [p for p in processes if _is_python(p)]
        sent = 0
        for process in processes:
            try:
                os.kill(process.pid, sig)
                sent += 1
            except ProcessLookupError:
                pass
        return sent > 0

    def again(self) -> bool:
        """loader_twice: once the rebuilt loader's new workers are there, one of them blocks too; True when done (or
        nothing is left to do: the worker is gone)."""
        import psutil

        if self.twice is None:
            return True
        worker_pid, before = self.twice
        try:
            now = {p.pid for p in psutil.Process(worker_pid).children(recursive=True)}
        except psutil.NoSuchProcess:
            self.twice = None
            return True
        if not now - before:
            return False
        self.twice = None
        return self.make("loader_blocked", worker_pid)


def _is_python(process) -> bool:
    import psutil

    try:
        return "python" in os.path.basename(process.exe())
    except psutil.Error:
        return False


def parse_kinds(text: str, gpu: bool) -> list[str]:
    """The kinds asked for; a one-line refusal for an unknown one, and for ``device_hang`` without a GPU (its kernel
    needs a device to hang: on the CPU no hang would come, and the bench would wait for an incident that never is)."""
    kinds = [k.strip() for k in text.split(",") if k.strip()]
    unknown = [k for k in kinds if k not in KINDS]
    if unknown:
        raise SystemExit(f"--kinds: unknown {', '.join(unknown)}; the kinds are {', '.join(KINDS)}")
    if "device_hang" in kinds and not gpu:
        raise SystemExit("--kinds: device_hang needs the training on a GPU (--gpu); on the CPU there is no kernel to "
                         "hang: leave it out")
    return kinds
