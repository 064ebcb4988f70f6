"""Killing a real process tree: sleepers, stopped processes, SIGTERM-ignorers, runaway grandchildren."""

import os
import signal
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

import psutil

from supervisor.host import process_tree

TREE = textwrap.dedent("""
    import os, signal, subprocess, sys, time
    # a child that ignores SIGTERM, a stopped child, and a grandchild in its own session
    subprocess.Popen([sys.executable, "-c", "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(600)"])
    stopped = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    os.kill(stopped.pid, signal.SIGSTOP)
    subprocess.Popen([sys.executable, "-c", "import os, subprocess, sys, time; os.setsid(); "
                      "subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(600)']); time.sleep(600)"])
    print("ready", flush=True)
    time.sleep(600)
""")


def wait_for_tree(root: int, count: int) -> list[int]:
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        pids = [p.pid for p in process_tree.tree(root)]
        if len(pids) >= count:
            return pids
        time.sleep(0.1)
    raise AssertionError(f"tree of {root} never reached {count} processes")


def test_the_whole_tree_dies_including_stopped_and_sigterm_ignoring_processes():
    root = subprocess.Popen([sys.executable, "-c", TREE], stdout=subprocess.PIPE, start_new_session=True)
    assert root.stdout.readline() == b"ready\n"
    pids = wait_for_tree(root.pid, 5)
    rows = process_tree.snapshot([psutil.Process(p) for p in pids], sample_seconds=0.05)
    assert {r["state"] for r in rows} >= {"sleeping", "stopped"}
    report = process_tree.kill_tree(root.pid, grace=0.5, timeout=5)
    assert sorted(report.killed) == sorted(pids) and report.survivors == []
    root.wait(timeout=5)
    assert [p for p in pids if psutil.pid_exists(p) and psutil.Process(p).status() != "zombie"] == []


def test_orphans_are_found_through_the_subreaper():
    script = ("import subprocess, sys, time; subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(600)']);"
              "print('ready', flush=True)")
    code = textwrap.dedent(f"""
        import subprocess, sys, time
        from supervisor.host import process_tree
        assert process_tree.become_subreaper()
        parent = subprocess.Popen([sys.executable, "-c", {script!r}], stdout=subprocess.PIPE)
        parent.stdout.readline(); parent.wait()  # the parent is gone: its child is now ours
        orphans = process_tree.tree()
        report = process_tree.kill_tree(parent.pid, grace=0.5, timeout=5, adopt_orphans=True)
        print(len(orphans), len(report.killed), len(process_tree.tree()))
    """)
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert result.stdout.split() == ["1", "1", "0"], result.stderr


def test_a_snapshot_after_the_stacks_takes_its_cpu_window_from_before_them_and_waits_for_none(monkeypatch):
    """The incident's CPU% is read over the stacks' capture (a sample taken before it): no wait of its own before
    the kill. A process the sample did not see has no CPU%, rather than its whole life's."""
    busy = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    late = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    try:
        since = process_tree.cpu_sample([psutil.Process(busy.pid)])
        time.sleep(0.3)  # the stacks' capture, here; and until the busy process has run, however loaded the machine
        deadline = time.monotonic() + 30
        while sum(psutil.Process(busy.pid).cpu_times()[:2]) <= since.seconds[busy.pid] and time.monotonic() < deadline:
            time.sleep(0.05)
        waits = []
        monkeypatch.setattr(process_tree.time, "sleep", waits.append)
        rows = process_tree.snapshot([psutil.Process(busy.pid), psutil.Process(late.pid)], since=since)
        assert waits == [0.0]
        cpu = {r["pid"]: r["cpu_percent"] for r in rows}
        assert cpu[busy.pid] > 0 and cpu[late.pid] is None
    finally:
        for p in (busy, late):
            p.kill()
            p.wait()


def test_a_process_held_by_a_fuse_request_survives_sigkill_named_by_its_wait_and_is_seen_to_go():
    """A real FUSE mount (tests/helpers/fuse_hold.py) whose daemon holds a request: the process waiting for it
    survives SIGKILL in request_wait_answer, the kill report says so, and its pidfd tells when the answer lets it go."""
    import select

    import pytest

    from supervisor.decision.model.survivors import KernelWait
    from tests.helpers.fuse_hold import FuseHold

    if not FuseHold.available():
        pytest.skip("needs root and /dev/fuse")
    mountpoint = Path(tempfile.mkdtemp(prefix="fusehold-"))
    with FuseHold(mountpoint) as fuse:
        code = f"import os, subprocess, sys; print('ready', flush=True); os.stat({str(mountpoint / 'images')!r})"
        root = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, start_new_session=True)
        assert root.stdout.readline() == b"ready\n"
        fuse.wait_for_request()
        report = process_tree.kill_tree(root.pid, grace=0.2, timeout=1.0)
        assert [s.pid for s in report.survivors] == [root.pid]
        survivor = report.survivors[0]
        assert survivor.waits == ("request_wait_answer",) and survivor.status == "disk-sleep"
        assert survivor.wait == KernelWait.FILE_SYSTEM
        fds = process_tree.exit_fds([root.pid])
        assert list(fds.values()) == [root.pid]
        assert select.select(list(fds), [], [], 0.5)[0] == []  # still held
        fuse.release()
        assert select.select(list(fds), [], [], 10)[0] == list(fds)  # the answer came: SIGKILL takes it
        assert root.wait(timeout=10) in (-signal.SIGTERM, -signal.SIGKILL)  # (both were pending)
        for fd in fds:
            os.close(fd)
    os.rmdir(mountpoint)
