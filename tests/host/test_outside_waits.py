"""host/outside_waits.py on real processes: a read on a socket, blocking or polled, waits outside the tree; a lock, a
pipe of its own, a spin, a stop do not."""

import socket
import subprocess
import sys
import time

import pytest

from supervisor.host.outside_waits import file_system, waits_outside

WAITS = {
    "recv": "s = socket.create_connection(('127.0.0.1', PORT)); s.sendall(b'x'); s.recv(1)",
    "polled recv": "s = socket.create_connection(('127.0.0.1', PORT), timeout=60); s.sendall(b'x'); s.recv(1)",
    "lock": "import threading; l = threading.Lock(); l.acquire(); sys.stdout.write('x'); sys.stdout.flush(); "
            "l.acquire()",
    "pipe": "r, w = os.pipe(); sys.stdout.write('x'); sys.stdout.flush(); os.read(r, 1)",
    "spin": "sys.stdout.write('x'); sys.stdout.flush()\nwhile True: pass",
}


@pytest.mark.parametrize("what", list(WAITS))
def test_a_socket_read_waits_outside_and_nothing_else_does(what):
    with socket.create_server(("127.0.0.1", 0)) as server:
        code = "import os, socket, sys\n" + WAITS[what].replace("PORT", str(server.getsockname()[1]))
        child = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE)
        try:
            if "recv" in what:
                connection, _ = server.accept()
                connection.recv(1)  # it sent, and now waits for the answer
            else:
                child.stdout.read(1)  # it is about to wait
            deadline = time.monotonic() + 10
            while not waits_outside(child.pid) and time.monotonic() < deadline and "recv" in what:
                time.sleep(0.05)  # (from its send to its receive: a few bytecodes)
            time.sleep(0.3)
            assert waits_outside(child.pid) == ("recv" in what)
        finally:
            child.kill()
            child.wait()


def test_a_files_file_system_is_its_longest_mount_point():
    assert file_system("/proc/self/status") == "proc"
    assert waits_outside(2 ** 22 + 12345) is False  # no such process: nothing known, nothing outside
