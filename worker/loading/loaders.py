"""DataLoader patches: ``persistent_workers = false`` for real, the workers' start method (and the forkserver they
fork from), and fault hooks inside loader workers.

Ultralytics' InfiniteDataLoader keeps one iterator, and so one set of worker processes, for the whole run,
whatever ``persistent_workers`` says. A ladder rung that asks for fresh workers every epoch (the seeds' fix
for workers that deadlock after a few epochs) needs a loader that really makes them anew.
"""

from __future__ import annotations

import atexit
import ctypes
import functools
import multiprocessing
import os
import signal
import sys
from typing import Any, Callable

import torch
from ultralytics.data.build import InfiniteDataLoader

from worker.loading.thread_loader import in_loader_thread

PR_SET_PDEATHSIG = 1
PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL = 47, 4


def die_with_parent() -> None:
    """Ask the kernel to SIGKILL this process when its parent dies, so no orphan outlives a killed tree."""
    try:
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    except OSError:
        pass


def drop_ambient_capabilities() -> None:
    """The service grants the supervisor CAP_SYSLOG for /dev/kmsg; training has no use for it."""
    try:
        ctypes.CDLL(None, use_errno=True).prctl(PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0)
    except OSError:
        pass


class EpochWorkersDataLoader(InfiniteDataLoader):
    """An InfiniteDataLoader whose worker processes live for one epoch: made at its start, shut down at its end."""

    closes_each_pass = True  # worker/loading/loader_recovery.py: an iterator made anew mid-pass is shut down at its end too

    def __iter__(self):
        self.iterator = self._get_iterator()
        try:
            for _ in range(len(self)):
                yield next(self.iterator)
        finally:
            self.close()
            self.iterator = None


def make_epoch_workers(loader: InfiniteDataLoader) -> InfiniteDataLoader:
    if loader.num_workers > 0:
        loader.__class__ = EpochWorkersDataLoader
    return loader


class ChainedWorkerInit:
    """A loader's worker_init_fn followed by ``extra``: a picklable object, not a closure, so that worker processes
    started with "spawn" (which pickle it to each) run it as forked ones do."""

    def __init__(self, original: Callable[[int], None] | None, extra: Callable[[], None]):
        self.original, self.extra = original, extra

    def __call__(self, worker_id: int) -> None:
        if self.original is not None:
            self.original(worker_id)
        self.extra()


def chain_worker_init(loader: Any, extra: Callable[[], None]) -> None:
    """Run ``extra`` in every DataLoader worker process after the loader's own worker_init_fn."""
    loader.worker_init_fn = ChainedWorkerInit(loader.worker_init_fn, extra)


# What a loader worker needs before its first sample, imported once in the forkserver: every worker forked from it
# starts with them (seconds each otherwise, as a spawned worker pays them). None of them touches a GPU.
FORKSERVER_PRELOAD = ("torch", "cv2", "numpy", "ultralytics.data.build", "ultralytics.data.dataset",
                      "ultralytics.data.augment", "worker.loading.loaders", "worker.supervision.faults")


def start_forkserver(fork: bool = False) -> None:
    """Start this process's forkserver with ``FORKSERVER_PRELOAD`` (at once; it imports in its own process), for
    loader workers started "forkserver". It is a fresh interpreter, not a fork of this process: it and its children
    inherit no GPU runtime state, whenever it is started; started early, its imports are done by the first batch.
    Idempotent: a server running is kept.

    ``fork``: a process that has touched no GPU and runs one thread (a DDP rank at its first line, whose imports are
    done) forks its server instead, ready at once: the same guarantees (no GPU runtime state to inherit, no page the
    GPU maps), none of the seconds of a new interpreter's imports, which a rank's first batch waited for (two of
    them at once with two ranks). Elsewhere, the new interpreter."""
    context = multiprocessing.get_context("forkserver")
    context.set_forkserver_preload(list(FORKSERVER_PRELOAD))
    from multiprocessing import forkserver

    if fork and forkserver._forkserver._forkserver_pid is None and _fork_is_safe() \
            and _fork_forkserver(forkserver._forkserver):
        return
    forkserver.ensure_running()


FORKED_SERVER_ARGS = {"listener_fd", "alive_r", "preload", "main_path", "sys_path", "authkey_r"}


def _fork_is_safe() -> bool:
    """One thread (a fork copies no lock another holds) and no CUDA runtime in this process."""
    try:
        if len(os.listdir("/proc/self/task")) != 1:
            return False
    except OSError:
        return False
    return not torch.cuda.is_initialized()


def _fork_forkserver(server: Any) -> bool:
    """What multiprocessing's ``ForkServer.ensure_running`` does, the server forked from this process instead of a
    new interpreter's ``-c 'from multiprocessing.forkserver import main; main(...)'``; False where this Python's
    ``main`` takes arguments it does not know."""
    import inspect
    import socket
    from multiprocessing import connection, forkserver, resource_tracker, util

    params = set(inspect.signature(forkserver.main).parameters)
    if params - FORKED_SERVER_ARGS:
        return False
    with server._lock:
        resource_tracker.ensure_running()
        listener = socket.socket(socket.AF_UNIX)
        address = connection.arbitrary_address("AF_UNIX")
        listener.bind(address)
        if not util.is_abstract_socket_namespace(address):
            os.chmod(address, 0o600)
        listener.listen()
        alive_r, alive_w = os.pipe()  # every client holds the write end: at its last one's end the server exits
        authkey_r = authkey_w = None
        if "authkey_r" in params:
            authkey_r, authkey_w = os.pipe()
        for stream in (sys.stdout, sys.stderr):
            stream.flush()
        pid = os.fork()
        if pid == 0:
            keep = [listener.fileno(), alive_r] + ([] if authkey_r is None else [authkey_r])
            _serve_forked(keep, {} if authkey_r is None else {"authkey_r": authkey_r})
        listener.close()
        os.close(alive_r)
        if authkey_r is not None:
            os.close(authkey_r)
            key = os.urandom(getattr(forkserver, "_AUTHKEY_LEN", 32))
            os.write(authkey_w, key)
            os.close(authkey_w)
            server._forkserver_authkey = key
        server._forkserver_address, server._forkserver_alive_fd, server._forkserver_pid = address, alive_w, pid
    return True


def _serve_forked(keep: list[int], kwargs: dict[str, int]) -> None:
    """In the forked server: what a new interpreter's would hold (standard streams, the descriptors passed, default
    SIGUSR1 where a rank set its own), then multiprocessing's server loop. Never returns."""
    from multiprocessing import forkserver

    code = 1
    try:
        die_with_parent()
        signal.signal(signal.SIGUSR1, signal.SIG_DFL)
        low = 3
        for fd in sorted(keep):
            os.closerange(low, fd)
            low = fd + 1
        os.closerange(low, os.sysconf("SC_OPEN_MAX"))
        forkserver.main(keep[0], keep[1], list(FORKSERVER_PRELOAD), **kwargs)
    except SystemExit:  # the last client is gone
        code = 0
    except BaseException:  # noqa: BLE001  (said as the server's own interpreter would)
        import traceback

        traceback.print_exc()
    finally:
        os._exit(code)


def forkserver_pid() -> int | None:
    """The pid of this process's forkserver, None before it is started."""
    from multiprocessing import forkserver

    return forkserver._forkserver._forkserver_pid


def start_workers_with(loader: Any, start_method: str | None) -> None:
    """Start the loader's worker processes with ``start_method`` (None: torch's default, fork on Linux)."""
    if start_method is None or loader.num_workers == 0:
        return
    loader.multiprocessing_context = start_method
    if start_method == "forkserver":
        start_forkserver()  # started already where it could be earlier (train.py, a standby); a DDP rank's is here
    if start_method == "spawn":
        chain_worker_init(loader, exit_without_finalizing)


def exit_without_finalizing() -> None:
    """End this spawned worker as multiprocessing ends a forked one, with ``os._exit``. A worker shut down while busy
    puts its last batch and exits at once, its queue's feeder thread still pickling that batch in torch's C++
    (shareFd); the interpreter's finalization ends that thread with pthread_exit, whose unwinding through C++ calls
    std::terminate ("terminate called without an active exception", SIGABRT: most spawned workers of Ultralytics'
    dataset at 640 px), and the training process's loader turns that into a RuntimeError that
    ends the training. Exit status 0: a worker that dies early is told by the loader from its liveness, not this."""
    def end() -> None:
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except (AttributeError, OSError, ValueError):
                pass
        os._exit(0)

    atexit.register(end)


def worker_start_method(loader: Any) -> str | None:
    """How the loader's worker processes start; None where it has none (``workers = 0``, the threads loader)."""
    if loader.num_workers == 0:
        return None
    if loader.multiprocessing_context is not None:
        return loader.multiprocessing_context.get_start_method()
    # The platform's default, first of the list (fork on Linux up to Python 3.13), without fixing it as asking does.
    return multiprocessing.get_start_method(allow_none=True) or multiprocessing.get_all_start_methods()[0]


def _hooked_getitem(self, index):
    if torch.utils.data.get_worker_info() is not None or in_loader_thread():
        self._sample_hook()
    return self._dataset_class.__getitem__(self, index)


def _hooked_reduce(self):
    # The hooked class is made at run time and cannot be found by name: pickled (to a spawned loader worker) as its
    # dataset class, hooked again on arrival, then its state (after the object, as the dataset's transforms refer
    # back to it).
    return _new_hooked, (self._dataset_class,), self.__getstate__()


@functools.cache
def _hooked_class(base: type) -> type:
    """``base`` with the sample hook before its own ``__getitem__``; a subclass adding nothing to its layout, so that
    an existing dataset's ``__class__`` can become it."""
    return type(f"Hooked{base.__name__}", (base,),
                {"__getitem__": _hooked_getitem, "__reduce__": _hooked_reduce, "_dataset_class": base})


def _new_hooked(base: type) -> Any:
    hooked = _hooked_class(base)
    return hooked.__new__(hooked)


def hook_samples(dataset: Any, in_worker: Callable[[], None]) -> None:
    """Call ``in_worker`` before each sample a loader worker loads: a DataLoader worker process (forked or spawned)
    or a thread loader's thread (the threads rung's workers), never the training thread itself (``workers = 0``).
    ``in_worker`` must pickle for spawned workers: a module-level function or a bound method."""
    dataset._sample_hook = in_worker
    dataset.__class__ = _hooked_class(type(dataset))
