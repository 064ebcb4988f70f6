"""A DDP rank's stand-in (run as a script: ``python -u worker/standby/rank_stub.py ARGV...``): it asks the rank server of its
launching worker (worker/standby/rank_server.py) to fork, from an interpreter whose imports are done, the process that runs
``python ARGV...``, and stands for it: the signals it gets are passed on, and it exits as that process exits (the
same status, or the same signal). Without a server it becomes that process itself (exec), as a cold start would.

It imports the standard library's smallest modules only and no package of this project (it is run by path, from
torch.distributed.run, whose children start from a bare interpreter).
"""

from __future__ import annotations

import array
import json
import os
import signal
import socket
import struct
import sys

ENV_ADDRESS = "YOLO_TRAIN_RANK_SERVER"  # the path of the server's socket (worker/standby/rank_server.py sets it)
PASSED_ON = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGQUIT, signal.SIGUSR1, signal.SIGUSR2)


def connect(address: str) -> socket.socket | None:
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        s.connect(address)
    except OSError:
        s.close()
        return None
    return s


def main(argv: list[str]) -> int:
    address = os.environ.get(ENV_ADDRESS, "")
    conn = connect(address) if address else None
    if conn is None:  # no server (gone, or never started): a cold start, in this very process
        os.execv(sys.executable, [sys.executable, "-u", *argv])
    request = json.dumps({"argv": argv, "env": dict(os.environ), "cwd": os.getcwd()}).encode()
    conn.sendmsg([struct.pack("!I", len(request)), request],
                 [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", [0, 1, 2]))])
    pid = int(_line(conn) or 0)
    if not pid:
        print("yolo-train rank stub: the rank server did not start the process", file=sys.stderr, flush=True)
        return 1
    for sig in PASSED_ON:
        signal.signal(sig, lambda s, _f: _pass_on(pid, s))
    status = _line(conn)  # the process's wait status; none: the server is gone (and with it the process)
    if not status:
        return 1
    status_code = int(status)
    if os.WIFSIGNALED(status_code):
        sig = os.WTERMSIG(status_code)
        signal.signal(sig, signal.SIG_DFL)
        try:
            import resource

            resource.setrlimit(resource.RLIMIT_CORE, (0, 0))  # the process dumped its own core, if any
        except (ImportError, OSError, ValueError):
            pass
        os.kill(os.getpid(), sig)
        return 128 + sig
    return os.waitstatus_to_exitcode(status_code)


def _pass_on(pid: int, sig: int) -> None:
    try:
        os.kill(pid, sig)
    except ProcessLookupError:
        pass


def _line(conn: socket.socket) -> str:
    data = b""
    while not data.endswith(b"\n"):
        chunk = conn.recv(64)
        if not chunk:
            return ""
        data += chunk
    return data.decode().strip()


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
