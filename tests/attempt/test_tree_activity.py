"""Whether a real process tree does anything (supervisor/attempt/tree_activity.py): sleepers, a stopped tree, a spinner,
a process started, a window too long to judge. The sampler is given its clock; the processes are real."""

import math
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from supervisor.decision import core
from supervisor.host import process_tree
from supervisor.attempt.tree_activity import ActivitySampler, state, stopped, tasks
from tests.helpers import ROOT
from tests.helpers.supervised import quiet_config, read_incidents, yolo_train

SLEEPER = "import time; print('ready', flush=True); time.sleep(600)"
SPINNER = "import os, signal; print('ready', flush=True); os.kill(os.getpid(), signal.SIGSTOP)\nwhile True: pass"


def start(code: str) -> subprocess.Popen:
    child = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    assert child.stdout.readline().strip() == "ready"
    return child


def settled(pid: int, timeout: float = 30.0) -> None:
    """Wait until the process has stopped using CPU (its start's last instructions after 'ready' are done)."""
    process, deadline = psutil.Process(pid), time.monotonic() + timeout
    before = sum(process.cpu_times()[:2])
    while True:
        time.sleep(0.1)
        now = sum(process.cpu_times()[:2])
        if now == before and process.status() in (psutil.STATUS_SLEEPING, psutil.STATUS_STOPPED):
            return
        assert time.monotonic() < deadline, f"pid {pid} never settled"
        before = now


def test_a_sleeping_tree_goes_idle_from_the_first_quiet_window_and_is_reported_once():
    child = start(SLEEPER)
    try:
        settled(child.pid)
        sampler, tree = ActivitySampler(), process_tree.tree(child.pid)
        assert sampler.sample(child.pid, tree, 100.0) is None  # a first reading judges nothing
        assert sampler.sample(child.pid, tree, 101.0) == core.TreeActivity(idle_since=100.0)
        assert sampler.sample(child.pid, tree, 102.0) is None  # still idle since 100: nothing new to say
        assert sampler.sample(child.pid, tree, 112.0) == core.TreeActivity(idle_since=None)  # a late window
    finally:
        child.kill()
        child.wait()


def test_a_stopped_tree_is_idle_and_the_same_tree_spinning_is_busy():
    """The bench's freeze (SIGSTOP to every process) against a loop that never ends at 100% CPU. The stopped process
    is named as such from the first reading (under DDP: a rank stopped, every rank stopped a tree frozen)."""
    child = start(SPINNER)  # it stops itself once started: no CPU from here on
    try:
        settled(child.pid)
        sampler, tree = ActivitySampler(), process_tree.tree(child.pid)
        halted = frozenset({child.pid})
        assert sampler.sample(child.pid, tree, 10.0) == core.TreeActivity(idle_since=None, stopped=halted)
        assert sampler.sample(child.pid, tree, 11.0) == core.TreeActivity(idle_since=10.0, stopped=halted)
        process = psutil.Process(child.pid)
        spent = sum(process.cpu_times()[:2])
        os.kill(child.pid, signal.SIGCONT)
        deadline = time.monotonic() + 30
        while sum(process.cpu_times()[:2]) - spent < 0.2:  # it has run for a fifth of a second, however loaded
            assert time.monotonic() < deadline, "the spinner never ran"
            time.sleep(0.05)
        assert sampler.sample(child.pid, tree, 12.0) == core.TreeActivity(idle_since=None)
    finally:
        child.kill()
        child.wait()


WRITER = ("import os, signal, sys, time\n"
          "def write(*_):\n"
          "    with open(sys.argv[1], 'ab') as f:\n"
          "        f.write(os.urandom(1 << 20)); f.flush(); os.fsync(f.fileno())\n"
          "    print('written', flush=True)\n"
          "signal.signal(signal.SIGUSR1, write)\n"
          "print('ready', flush=True)\n"
          "while True: time.sleep(600)\n")


def test_a_tree_that_writes_to_the_disk_is_busy_though_it_uses_next_to_no_cpu(tmp_path):
    """A checkpoint written to a slow disk: the bytes move while the CPU waits."""
    child = subprocess.Popen([sys.executable, "-c", WRITER, str(tmp_path / "written")], stdout=subprocess.PIPE,
                             text=True)
    try:
        assert child.stdout.readline().strip() == "ready"
        settled(child.pid)
        sampler, tree, process = ActivitySampler(), process_tree.tree(child.pid), psutil.Process(child.pid)
        sampler.sample(child.pid, tree, 0.0)
        assert sampler.sample(child.pid, tree, 1.0) == core.TreeActivity(idle_since=0.0)
        cpu = sum(process.cpu_times()[:2])
        child.send_signal(signal.SIGUSR1)
        assert child.stdout.readline().strip() == "written"
        if sum(process.cpu_times()[:2]) - cpu >= 0.05 * 2:  # under 5% of a core over the 2 s window below
            pytest.skip("the write took 0.1 s of CPU on this machine: the test would not tell the disk from the CPU")
        assert sampler.sample(child.pid, tree, 3.0) == core.TreeActivity(idle_since=None)
    finally:
        child.kill()
        child.wait()


def test_a_process_started_is_activity_and_a_new_worker_starts_afresh():
    first, second = start(SLEEPER), start(SLEEPER)
    try:
        settled(first.pid)
        settled(second.pid)
        sampler = ActivitySampler()
        sampler.sample(first.pid, [psutil.Process(first.pid)], 0.0)
        both = [psutil.Process(first.pid), psutil.Process(second.pid)]
        assert sampler.sample(first.pid, both, 1.0) is None  # the second appeared: busy, as before
        assert sampler.sample(first.pid, both, 2.0) == core.TreeActivity(idle_since=1.0)
        assert sampler.due(second.pid, 2.1)  # another worker: due at once, and nothing known of it
        assert sampler.sample(second.pid, [psutil.Process(second.pid)], 2.1) is None
        assert not sampler.due(second.pid, 2.5)
    finally:
        for child in (first, second):
            child.kill()
            child.wait()


def test_a_thread_in_uninterruptible_sleep_is_read_from_the_stat_line():
    """A D state cannot be made on demand here: the state letter is read from a real stat line, with a command name
    that holds ") " itself, and D put in its place."""
    line = Path(f"/proc/{os.getpid()}/stat").read_bytes()
    assert state(line) in "RS"
    end = line.rfind(b")")
    tricky = line[:line.find(b"(") + 1] + b"a) S (b" + line[end:end + 2] + b"D" + line[end + 3:]
    assert state(tricky) == "D"
    child = start(SLEEPER)
    try:
        settled(child.pid)
        assert [t.state for t in tasks(child.pid).values()] == ["S"]  # asleep in the kernel, interruptibly
    finally:
        child.kill()
        child.wait()


HANGS_ONCE = f"""
import os, sys, time
sys.path.insert(0, {str(ROOT)!r})
from worker.heartbeat import Heartbeat
hb = Heartbeat.from_env()
hb.phase("train")
first = not os.path.exists("hung-once")
for step in range(1, 201):
    until = time.monotonic() + 0.03
    while time.monotonic() < until:  # a step of work: the tree is busy while it trains
        pass
    hb.beat(epoch=1, epochs=1, batch=step, batches=200)
    if first and step == 40:
        open("hung-once", "w").close()
        if sys.argv[1] == "sleep":
            time.sleep(600)  # the seeds' hang: waiting for what never comes, nothing runs
        while True:  # a loop that never ends: no progress either, but the tree is busy
            pass
"""


@pytest.mark.parametrize("hang", ["sleep", "spin"])
def test_a_supervised_script_that_hangs_asleep_is_found_at_the_idle_floor_a_spinning_one_at_auto_floor(
        hang, write_config, tmp_path):
    (tmp_path / "train.py").write_text(HANGS_ONCE)
    config = write_config(f'[worker]\ncommand = ["{sys.executable}", "train.py", "{hang}"]\ncwd = "{tmp_path}"\n',
                          quiet_config())
    result = yolo_train("run", "--config", str(config), "--state-dir", str(tmp_path / "state"), timeout=180)
    assert result.returncode == 0, result.stderr[-3000:]
    [incident] = read_incidents(tmp_path / "state")
    assert incident["reason"] == "hang" and incident["batch"] == 40
    if hang == "sleep":  # idle_floor (3 s) over the factor's 10 x 0.03 s, once the sampler saw the tree idle
        assert "(train auto, idle " in incident["detail"] and incident["seconds_since_progress"] < 10
    else:
        assert ", idle" not in incident["detail"] and incident["seconds_since_progress"] >= 10


def test_the_next_reading_is_due_one_interval_after_the_last_whatever_wakes_the_loop():
    """A frozen tree sends nothing that wakes the agent's loop: it wakes for the sampler, or a window spans two."""
    child = start(SLEEPER)
    try:
        settled(child.pid)
        sampler = ActivitySampler(interval=1.0)
        assert sampler.next_at() == -math.inf and sampler.due(child.pid, 0.0)
        sampler.sample(child.pid, process_tree.tree(child.pid), 5.0)
        assert sampler.next_at() == 6.0 and not sampler.due(child.pid, 5.99) and sampler.due(child.pid, 6.0)
        assert sampler.sample(child.pid, process_tree.tree(child.pid), 6.0) == core.TreeActivity(idle_since=5.0)
        sampler.forget()  # the stall ended: the next one's first reading is a window's start, nothing is reported
        assert sampler.due(child.pid, 6.1) and sampler.sample(child.pid, process_tree.tree(child.pid), 6.1) is None
    finally:
        child.kill()
        child.wait()


# A tracer named as it is told: it attaches with ptrace (the tracee enters state t, as under py-spy's --native dump or
# a debugger's breakpoint), says so, and detaches when its stdin closes.
TRACER = """
import ctypes, os, sys
libc = ctypes.CDLL(None, use_errno=True)
libc.prctl(15, sys.argv[2].encode(), 0, 0, 0)  # PR_SET_NAME: its /proc/PID/comm
pid = int(sys.argv[1])
if libc.ptrace(16, pid, None, None) != 0:  # PTRACE_ATTACH
    print("denied", ctypes.get_errno(), flush=True)
    sys.exit(0)
os.waitpid(pid, 0)  # the tracee stopped: state t
print("attached", flush=True)
sys.stdin.read()
libc.ptrace(17, pid, None, None)  # PTRACE_DETACH
"""


@pytest.mark.parametrize("tracer, counts", [("py-spy", False), ("gdb", True)])
def test_a_process_held_by_a_py_spy_reading_is_not_stopped_and_one_held_by_a_debugger_is(tracer, counts):
    """py-spy's --native dump holds each process it reads in state t for a second or so: the supervisor's own reading
    of the stacks, ahead of a verdict, must not make the training process look stopped (its word would be dropped)."""
    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    holder = subprocess.Popen([sys.executable, "-c", TRACER, str(sleeper.pid), tracer], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, text=True)
    try:
        said = holder.stdout.readline().split()
        if said[:1] == ["denied"]:
            pytest.skip(f"ptrace is not allowed here (errno {said[1]})")
        assert said == ["attached"]
        assert state(Path(f"/proc/{sleeper.pid}/stat").read_bytes()) == "t"
        assert stopped(sleeper.pid) is counts
    finally:
        holder.stdin.close()
        holder.wait(timeout=30)
        sleeper.kill()
        sleeper.wait()
