"""The DDP ranks' standby: a process forked from the standby worker once its imports are done, which forks each
process of the next DDP launch (torch.distributed.run, then every rank) from that imported interpreter, so that none
of them imports torch, Ultralytics and our trainer again (worker/standby/rank_stub.py stands for each in the launch).

Why a fork and not a process per rank made ahead: the ranks' environment (RANK, WORLD_SIZE, MASTER_PORT, the c10d
rendezvous's TORCHELASTIC_* variables) is known only when torch.distributed.run starts them, and torch.distributed.run
stays the launcher (its rendezvous, over one host or several, is untouched): it starts a stub per rank, and the stub
hands this server its argv, environment, working directory and standard descriptors (SCM_RIGHTS). The server forks;
the child takes them and runs the script as ``python -u SCRIPT`` would (``runpy``), then exits as an interpreter
does. The server reports the child's pid, then its wait status, to the stub; a stub that goes (SIGKILLed by its
launcher) takes its process along.

Fork safety: the server is forked before the worker touches a GPU or starts a thread pool of its own (in ``stand_by``,
right after the imports, before the loader's forkserver), and it starts neither: its children initialise CUDA and
their OpenMP pools as fresh processes do. It is single-threaded (a selector over its socket, its stubs and a SIGCHLD
wake-up pipe), so a fork copies no lock held by another thread.

What an import fixed before the rank's environment existed is put right in the child (``adopt_rank``): Ultralytics'
``RANK``, ``LOCAL_RANK`` and ``WORLD_SIZE`` (module constants read at import, copied into every module that imported
them), its logger's level (ERROR off rank 0), and torch's intra-op threads (``OMP_NUM_THREADS``, 1 for the ranks).

A rank's /proc/PID/environ is the server's (the kernel keeps the environment a process was exec'd with): the rank's
RANK is in its stub's, and the supervisor knows each rank's pid from its heartbeats.

Who may ask: the server runs what a connection names, as the training's user, so only the launch may connect. Its
socket is a file, ``STATE_DIR/ranks-PID.sock`` (PID: the launching worker's), 0600 in the 0700 state directory: no
other user reaches it. And each connection's peer (SO_PEERCRED, the connecting process) must be of the server's uid
and of the launching worker's process tree: the worker itself or a descendant, by the parents /proc names, up from
the peer. That tree holds every legitimate stub: torch.distributed.run's is the worker's child (Ultralytics' DDP
command), each rank's a child of the launcher the server forked (a child of the server, itself the worker's). Any
other peer is refused in one line on the server's stderr (the standby's, in the supervisor's log) and nothing runs.
A stub whose launcher died is reparented to the supervisor (a subreaper), out of the tree: refused too, rightly.
"""

from __future__ import annotations

import array
import atexit
import json
import logging
import os
import runpy
import selectors
import signal
import socket
import struct
import sys
import traceback
from pathlib import Path

from worker.loading.loaders import die_with_parent
from worker.standby.rank_stub import ENV_ADDRESS

STUB = str(Path(__file__).with_name("rank_stub.py"))
# Imported by the server while it waits, in its own process: what a rank imports beyond the standby's imports.
# Not torch.distributed.run itself: runpy warns when it runs a module already imported.
PRELOAD = ("torch.distributed.launcher.api", "torch.distributed.elastic.agent.server.local_elastic_agent",
           "torch.nn.parallel", "cloudpickle", "ultralytics.utils.dist", "ultralytics.data.build",
           "ultralytics.models.yolo.detect", "ultralytics.utils.patches", "cv2")
RANK_GLOBALS = ("RANK", "LOCAL_RANK", "WORLD_SIZE")
SUN_PATH_MAX = 107  # bytes of a Unix socket's path (sun_path holds 108 with its NUL)
TREE_DEPTH_MAX = 64  # parents walked up from a peer: deeper than any launch, bounded against a loop of reused pids


def start(directory: Path) -> int | None:
    """Fork the server from this process (which must not have touched a GPU), listening in ``directory`` (the state
    directory); return its pid. This process and its later children find it through ``YOLO_TRAIN_RANK_SERVER``. None
    where the socket's path is too long for AF_UNIX: the ranks start cold, as without a server."""
    launcher = os.getpid()
    path = directory / f"ranks-{launcher}.sock"
    _remove_stale(directory)
    if len(os.fsencode(path)) > SUN_PATH_MAX:
        print(f"yolo-train rank server: {path} is longer than a Unix socket's {SUN_PATH_MAX} bytes: the ranks start "
              f"cold; choose a shorter state_dir", file=sys.stderr, flush=True)
        return None
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    path.unlink(missing_ok=True)  # a server of an earlier process of this pid
    listener.bind(str(path))
    os.chmod(path, 0o600)  # before listen(): no connection is taken before the mode holds
    listener.listen(64)
    sys.stdout.flush()
    sys.stderr.flush()
    pid = os.fork()
    if pid == 0:
        code = 0
        try:
            _serve(listener, launcher)
        except BaseException:  # noqa: BLE001  (the server's end is its own; its parent never sees this frame)
            traceback.print_exc()
            code = 1
        os._exit(code)
    listener.close()
    os.environ[ENV_ADDRESS] = str(path)
    return pid


def _remove_stale(directory: Path) -> None:
    """The sockets of servers whose launching worker is gone (killed with its tree, nobody removed them)."""
    for stale in directory.glob("ranks-*.sock"):
        pid = stale.name[len("ranks-"):-len(".sock")]
        if not pid.isdigit():
            continue
        try:
            os.kill(int(pid), 0)
        except ProcessLookupError:
            stale.unlink(missing_ok=True)
        except PermissionError:
            pass  # a process of another user has the pid now: not ours to judge; the file is harmless


def through_server(cmd: list[str]) -> list[str]:
    """A ``python -m torch.distributed.run ... SCRIPT`` command whose launcher and ranks the server forks: the
    stub in front of the launcher and of the script. Unchanged without a server."""
    if not os.environ.get(ENV_ADDRESS):
        return cmd
    python, *launcher, script = cmd
    return [python, "-u", STUB, *launcher, STUB, script]


def _serve(listener: socket.socket, launcher: int) -> None:
    die_with_parent()
    os.setpgid(0, 0)  # not in the launching worker's group: a Ctrl-C there is the launcher's to pass on
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)  # the standby's stdin is the supervisor's pipe for the launch line, not ours
    os.close(null)
    wake_r, wake_w = os.pipe()
    os.set_blocking(wake_r, False)
    os.set_blocking(wake_w, False)
    signal.set_wakeup_fd(wake_w)
    signal.signal(signal.SIGCHLD, lambda *_: None)
    for sig in (signal.SIGUSR1, signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, signal.SIG_DFL if sig != signal.SIGUSR1 else signal.SIG_IGN)
    _preload()
    selector = selectors.DefaultSelector()
    selector.register(listener, selectors.EVENT_READ)
    selector.register(wake_r, selectors.EVENT_READ)
    stubs: dict[int, socket.socket] = {}  # child pid -> its stub's connection
    while True:
        for key, _ in selector.select():
            if key.fileobj is listener:
                conn, _ = listener.accept()
                refusal = _refusal(conn, launcher)
                if refusal is not None:
                    print(f"yolo-train rank server: {refusal}; nothing run", file=sys.stderr, flush=True)
                    conn.close()
                    continue
                pid = _fork_for(conn, listener, selector, wake_r, wake_w, stubs)
                if pid is None:
                    conn.close()
                    continue
                stubs[pid] = conn
                selector.register(conn, selectors.EVENT_READ, pid)
            elif key.fileobj == wake_r:
                _drain(wake_r)
                _reap(stubs, selector)
            else:  # a stub's end: it is gone (its launcher killed it): its process goes too
                conn = key.fileobj
                if not conn.recv(1):
                    selector.unregister(conn)
                    try:
                        os.kill(key.data, signal.SIGKILL)
                    except ProcessLookupError:
                        pass


def _refusal(conn: socket.socket, launcher: int) -> str | None:
    """Why the peer of ``conn`` may not ask (in words), or None: of this uid and of the launching worker's tree."""
    pid, uid, _ = struct.unpack("3i", conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i")))
    if uid != os.getuid():
        return f"refused pid {pid} of uid {uid}: not the training's user (uid {os.getuid()})"
    if not _descends_from(pid, launcher):
        return f"refused pid {pid} (uid {uid}): not of the launching worker's process tree (pid {launcher})"
    return None


def _descends_from(pid: int, ancestor: int) -> bool:
    for _ in range(TREE_DEPTH_MAX):
        if pid == ancestor:
            return True
        if pid <= 1:
            return False
        try:
            with open(f"/proc/{pid}/stat", "rb") as f:
                pid = int(f.read().rsplit(b")", 1)[1].split()[1])  # after the name: state, then the parent's pid
        except (OSError, IndexError, ValueError):
            return False
    return False


def _preload() -> None:
    import importlib

    for name in PRELOAD:
        try:
            importlib.import_module(name)
        except Exception:  # noqa: BLE001  (a module a rank would import anyway: it fails there, said there)
            pass


def _drain(fd: int) -> None:
    try:
        while os.read(fd, 512):
            pass
    except BlockingIOError:
        pass


def _reap(stubs: dict[int, socket.socket], selector: selectors.BaseSelector) -> None:
    while True:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        conn = stubs.pop(pid, None)
        if conn is None:
            continue
        try:
            selector.unregister(conn)
        except (KeyError, ValueError):
            pass
        try:
            conn.sendall(f"{status}\n".encode())
        except OSError:
            pass
        conn.close()


def _fork_for(conn: socket.socket, *inherited: object) -> int | None:
    """Read one stub's request and fork its process; its pid (sent to the stub too), or None for a bad request."""
    header, fds, _, _ = conn.recvmsg(4, socket.CMSG_SPACE(3 * array.array("i").itemsize))
    descriptors = array.array("i")
    for level, kind, data in fds:
        if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
            descriptors.frombytes(data[:len(data) - len(data) % descriptors.itemsize])
    if len(header) != 4 or len(descriptors) != 3:
        for fd in descriptors:
            os.close(fd)
        return None
    (size,) = struct.unpack("!I", header)
    body = b""
    while len(body) < size:
        chunk = conn.recv(size - len(body))
        if not chunk:
            break
        body += chunk
    request = json.loads(body)
    sys.stdout.flush()
    sys.stderr.flush()
    pid = os.fork()
    if pid == 0:
        _become(request, list(descriptors), conn, inherited)
    for fd in descriptors:
        os.close(fd)
    conn.sendall(f"{pid}\n".encode())
    return pid


def _become(request: dict, descriptors: list[int], conn: socket.socket, inherited: tuple) -> None:
    """In the forked child: the process the stub asked for. Never returns."""
    code = 1
    try:
        listener, selector, wake_r, wake_w, stubs = inherited
        signal.set_wakeup_fd(-1)
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        signal.signal(signal.SIGINT, signal.default_int_handler)
        selector.close()
        for fd in (wake_r, wake_w):
            os.close(fd)
        listener.close()
        conn.close()
        for other in stubs.values():
            other.close()
        os.setpgid(0, 0)
        die_with_parent()  # the server: it dies with the launching worker, or SIGKILLs this when the stub goes
        for target, fd in enumerate(descriptors):
            os.dup2(fd, target)
            os.close(fd)
        os.chdir(request["cwd"])
        os.environ.clear()
        os.environ.update(request["env"])
        for stream in (sys.stdout, sys.stderr):
            stream.reconfigure(line_buffering=True)  # `python -u`: what a rank prints is out before it dies
        adopt_rank()
        code = _run(request["argv"])
    except SystemExit as e:
        code = _exit_code(e)
    except BaseException:  # noqa: BLE001  (the process's own uncaught exception: printed as python prints it)
        traceback.print_exc()
        code = 1
    try:
        atexit._run_exitfuncs()
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)


def _run(argv: list[str]) -> int:
    args = [a for a in argv if a != "-u"]
    try:
        if args[0] == "-m":
            sys.argv = [args[1], *args[2:]]
            runpy.run_module(args[1], run_name="__main__", alter_sys=True)
        else:
            sys.argv = list(args)
            sys.path[0] = os.path.dirname(os.path.abspath(args[0]))
            runpy.run_path(args[0], run_name="__main__")
    except SystemExit as e:
        return _exit_code(e)
    return 0


def _exit_code(e: SystemExit) -> int:
    if e.code is None:
        return 0
    if isinstance(e.code, int):
        return e.code
    print(e.code, file=sys.stderr)
    return 1


def adopt_rank() -> None:
    """Ultralytics' module constants read from the environment at import, made this rank's."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    values = {"WORLD_SIZE": world,
              "RANK": int(os.environ.get("RANK", "-1")) if world > 1 else -1,
              "LOCAL_RANK": int(os.environ.get("LOCAL_RANK", "-1")) if world > 1 else -1}
    threads = os.environ.get("OMP_NUM_THREADS", "")
    torch = sys.modules.get("torch")
    if threads.isdigit() and int(threads) > 0 and torch is not None:
        torch.set_num_threads(int(threads))  # read by torch at its import, which was the server's (without it)
    utils = sys.modules.get("ultralytics.utils")
    if utils is None:
        return
    before = {name: getattr(utils, name, None) for name in RANK_GLOBALS}
    for name, module in list(sys.modules.items()):
        if module is None or not (name.startswith(("ultralytics", "worker")) or name == "__main__"):
            continue
        for attr in RANK_GLOBALS:
            if type(module.__dict__.get(attr)) is int and module.__dict__[attr] == before[attr]:
                module.__dict__[attr] = values[attr]
    if values["RANK"] not in (-1, 0):
        level = logging.ERROR
        logger = getattr(utils, "LOGGER", None)
        if logger is not None:
            logger.setLevel(level)
            for handler in logger.handlers:
                handler.setLevel(level)
