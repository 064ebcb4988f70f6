"""Issue 57.1: the DDP ranks' server (worker/standby/rank_server.py) runs whatever script a connection names, as the training's
user. It listened on an abstract socket and checked no peer: uid 65534, sending what worker/standby/rank_stub.py sends, made
it run the payload as root. A real server, forked by a stand-in for the launching worker; a real second uid."""

import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from tests.helpers import ROOT

NOBODY = 65534

# The launching worker: it starts the server in the state directory, then runs a stub of its own tree (what
# torch.distributed.run's is), whose payload must run; it prints the server's address first.
LAUNCHER = """
import os, subprocess, sys, time
from pathlib import Path
from worker.standby import rank_server
from worker.standby.rank_stub import ENV_ADDRESS
rank_server.start(Path(sys.argv[1]))
print(os.environ[ENV_ADDRESS], flush=True)
subprocess.run([sys.executable, "-u", rank_server.STUB, sys.argv[2], sys.argv[3]], check=True)
print("served", flush=True)
time.sleep(300)
"""
# What the payload does if it runs: it writes its uid, as whoever the server ran it as.
PAYLOAD = "import os, sys\nopen(sys.argv[1], 'w').write(str(os.getuid()))\n"
# Any local user's client: the stub's own connect, then its request (a length, stdio by SCM_RIGHTS, argv, env, cwd).
CLIENT = """
import array, json, socket, struct, sys
import rank_stub
address, payload, marker = sys.argv[1:4]
conn = rank_stub.connect(address)
if conn is None:
    print("no connection", flush=True)
    sys.exit(0)
request = json.dumps({"argv": [payload, marker], "env": {}, "cwd": "/"}).encode()
try:
    conn.sendmsg([struct.pack("!I", len(request)), request],
                 [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", [0, 1, 2]))])
    answer = rank_stub._line(conn)
except OSError:  # closed by the server before the request was all sent
    answer = ""
print("answered:", answer or "nothing", flush=True)
"""


@pytest.fixture
def scripts():
    """A directory user nobody can read (the checkout may be in a home it cannot enter): the client beside a copy
    of the stub, the payload, and a directory its marker may be written to by any uid."""
    with tempfile.TemporaryDirectory() as work:
        work = Path(work)
        shutil.copy(ROOT / "worker" / "standby" / "rank_stub.py", work / "rank_stub.py")
        (work / "client.py").write_text(CLIENT)
        (work / "payload.py").write_text(PAYLOAD)
        (work / "marks").mkdir()
        for path in [work, *work.iterdir()]:
            path.chmod(0o777 if path.name == "marks" else 0o755 if path.is_dir() else 0o644)
        yield work


@pytest.fixture
def server(scripts):
    """The launching worker's stand-in with its server up (its own stub served), and its state directory, 0700 as
    the supervisor makes it; yields (process, socket path, state directory)."""
    state = scripts / "state"
    state.mkdir(mode=0o700)
    proc = subprocess.Popen([sys.executable, "-c", LAUNCHER, str(state), str(scripts / "payload.py"),
                             str(scripts / "marks" / "own")], cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)},
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        address = proc.stdout.readline().strip()
        assert proc.stdout.readline() == "served\n", proc.stderr.read()
        assert (scripts / "marks" / "own").read_text() == str(os.getuid())  # its own tree's stub is served
        yield proc, address, state
    finally:
        proc.kill()
        proc.wait()


def client(scripts: Path, address: str, marker: str, as_nobody: bool) -> str:
    prefix = ["setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups"] if as_nobody else []
    done = subprocess.run([*prefix, sys.executable, "-E", "-s", "-S", "client.py", address, str(scripts / "payload.py"),
                           str(scripts / "marks" / marker)], cwd=scripts, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


def refusals(proc: subprocess.Popen) -> list[str]:
    proc.kill()
    return [line for line in proc.communicate(timeout=30)[1].splitlines() if "rank server" in line]


def test_another_user_neither_reaches_the_rank_server_nor_is_served_where_it_could(scripts, server):
    proc, address, state = server
    assert Path(address).parent == state and (state / Path(address).name).is_socket()
    assert client(scripts, address, "blocked", as_nobody=True) == "no connection"  # the 0700 directory
    # A directory and a socket loosened (by an admin, a group's mode): the peer's uid is checked itself.
    state.chmod(0o711)
    Path(address).chmod(0o777)
    assert client(scripts, address, "loosened", as_nobody=True) == "answered: nothing"
    assert not (scripts / "marks" / "blocked").exists() and not (scripts / "marks" / "loosened").exists()
    [line] = refusals(proc)
    assert line.startswith("yolo-train rank server: refused pid ") and line.endswith(
        f" of uid {NOBODY}: not the training's user (uid {os.getuid()}); nothing run")


def test_a_process_of_the_same_user_outside_the_launching_workers_tree_is_refused(scripts, server):
    proc, address, _ = server
    assert client(scripts, address, "outside", as_nobody=False) == "answered: nothing"
    assert not (scripts / "marks" / "outside").exists()
    [line] = refusals(proc)
    assert line.startswith("yolo-train rank server: refused pid ") and line.endswith(
        f" (uid {os.getuid()}): not of the launching worker's process tree (pid {proc.pid}); nothing run")
