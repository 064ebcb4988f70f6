"""Real hung processes, captured by the real py-spy: the capture names the right process and frame, in time."""

import json
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import psutil
import pytest

from supervisor.decision.stall.stack_reading import ProcessStacks, as_incident_stacks
from supervisor.host.stacks import STACKS_FILE, _capture_process, capture_tree, find_py_spy

ROOT = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.skipif(find_py_spy() is None, reason="py-spy is installed with the project (make install)")

# A torch DataLoader whose two workers hang in the repo's own fault injection on their first sample.
DATALOADER_HANG = """
import sys, time
from torch.utils.data import DataLoader, Dataset
from worker.supervision.faults import FaultInjector

class Hanging(Dataset):
    def __init__(self, injector):
        self.injector = injector
    def __len__(self):
        return 8
    def __getitem__(self, i):
        print("worker hanging", flush=True)
        self.injector.in_dataloader_worker()
        return i

if __name__ == "__main__":
    flag = sys.argv[1]
    open(flag, "w").close()
    for batch in DataLoader(Hanging(FaultInjector([], 1, flag)), num_workers=2, batch_size=1):
        pass
"""

# The main loop hangs one of three ways; it says so just before.
MAIN_HANG = """
import ctypes, sys
from worker.supervision.faults import hang_forever, spin_forever

def train_step(kind):
    print("hanging", flush=True)
    if kind == "sleep":
        hang_forever()
    elif kind == "spin":
        spin_forever()
    elif kind == "native":
        ctypes.CDLL(None).pause()  # blocks inside C until a signal

train_step(sys.argv[1])
"""


@pytest.fixture
def start(tmp_path):
    """Start a script, wait until it printed `ready` `count` times, give it `settle` s to reach its hang."""
    started: list[subprocess.Popen] = []

    def run(script: str, *args: str, ready: str = "hanging", count: int = 1, settle: float = 0.3):
        path = tmp_path / f"run{len(started)}" / "hang.py"  # same file name: same code, another process
        path.parent.mkdir()
        path.write_text(textwrap.dedent(script))
        proc = subprocess.Popen([sys.executable, str(path), *args], stdout=subprocess.PIPE, text=True, cwd=ROOT,
                                env={**os.environ, "PYTHONPATH": str(ROOT)})
        started.append(proc)
        output = ""
        deadline = threading.Timer(60, proc.kill)  # a line that never comes fails the test, not the whole suite
        deadline.start()
        try:
            while output.count(ready) < count:  # counted in the text: two workers' lines may share one
                line = proc.stdout.readline()
                assert line, f"{path} exited before hanging (rc {proc.poll()}), after {output!r}"
                output += line
        finally:
            deadline.cancel()
        time.sleep(settle)
        return proc

    yield run
    for proc in started:
        for p in tree(proc.pid):
            p.kill()
        proc.kill()
        proc.wait()


def tree(pid: int) -> list[psutil.Process]:
    try:
        root = psutil.Process(pid)
        return [root] + root.children(recursive=True)
    except psutil.Error:
        return []


def capture(proc: subprocess.Popen, dest: Path, **kwargs):
    return capture_tree(proc.pid, [p.pid for p in tree(proc.pid)], dest, **kwargs)


def test_dataloader_worker_hang_names_each_worker_and_the_fault_frame(start, tmp_path):
    proc = start(DATALOADER_HANG, str(tmp_path / "flag"), ready="worker hanging", count=2)
    gpu = {"gpus": [{"index": 0, "utilization_ratio": 0.0}]}
    cap = capture(proc, tmp_path / "incident", gpu_sample=lambda: gpu)

    roles = {p.role: p for p in cap.processes}
    assert set(roles) == {"main", "DataLoader worker 0", "DataLoader worker 1"}, cap.summary_lines()
    for n in (0, 1):
        worker = roles[f"DataLoader worker {n}"]
        line = worker.summary_line()
        assert line.startswith(f"DataLoader worker {n} (pid {worker.pid}) ") and worker.ppid == proc.pid, line
        assert "in sleep" in line and "faults.py" in line and "hang_forever" in line, line
        assert "__getitem__" in [f.function for t in worker.threads for f in t.frames]
    assert "dataloader.py" in roles["main"].summary_line(), roles["main"].summary_line()
    assert cap.where().startswith("DataLoader worker in sleep at hang_forever (faults.py)"), cap.where()
    assert as_incident_stacks(cap, tmp_path).in_loader_worker  # the core climbs to the loader's rungs on it

    written = json.loads((tmp_path / "incident" / STACKS_FILE).read_text())
    assert written["where"] == cap.where() and written["summary"] == cap.summary_lines()
    assert written["gpu"] == gpu
    assert {p["role"] for p in written["processes"]} == set(roles)


@pytest.mark.parametrize("kind, waited, frame", [
    ("sleep", "in sleep (clock_nanosleep)", "faults.py:"),
    ("spin", "running on CPU", "faults.py:"),
    ("native", "in pause", "train_step"),
])
def test_main_loop_hang_names_the_wait_and_the_frame(start, tmp_path, kind, waited, frame):
    proc = start(MAIN_HANG, kind)
    cap = capture(proc, tmp_path)
    [main] = cap.processes
    line = main.summary_line()
    assert line.startswith(f"main (pid {proc.pid}) {waited}"), line
    assert frame in line, line
    assert main.note == "", main.note
    if kind != "native":  # the other two wait in the fault module's functions, called from train_step
        assert ("hang_forever" if kind == "sleep" else "spin_forever") in line
    assert "train_step" in cap.where() and not as_incident_stacks(cap, tmp_path).in_loader_worker
    # The key does not depend on pid or line numbers: the same hang in another process gives the same key.
    again = capture(start(MAIN_HANG, kind), tmp_path / "again")
    assert again.where() == cap.where()


def test_stopped_process_is_read_from_proc_not_traced(start, tmp_path):
    proc = start(MAIN_HANG, "sleep")
    os.kill(proc.pid, signal.SIGSTOP)
    deadline = time.monotonic() + 5  # the signal is delivered asynchronously: wait until the kernel says T
    while psutil.Process(proc.pid).status() != psutil.STATUS_STOPPED:
        assert time.monotonic() < deadline, "the process never stopped"
        time.sleep(0.01)
    began = time.monotonic()
    cap = capture(proc, tmp_path, budget=3.0)
    took = time.monotonic() - began
    [main] = cap.processes
    assert took < 1.0, f"a stopped process must not wait for the budget ({took:.2f} s)"
    assert main.state == "T" and not main.traced
    assert "stopped (state T): not traced, /proc only" in main.note
    assert main.summary_line().startswith(f"main (pid {proc.pid}) stopped"), main.summary_line()
    assert main.threads and main.threads[0].tid == proc.pid  # what /proc could tell is there


def test_uninterruptible_sleep_is_read_from_proc_not_traced(tmp_path):
    # A vfork parent sleeps in D until its child execs or exits: a real D-state process without root.
    source = tmp_path / "vfork.c"
    source.write_text("#include <unistd.h>\nint main(void) { if (vfork() == 0) { pause(); _exit(0); } return 0; }\n")
    binary = tmp_path / "vfork"
    if subprocess.run(["cc", "-o", str(binary), str(source)], capture_output=True).returncode != 0:
        pytest.skip("no C compiler")
    proc = subprocess.Popen([str(binary)])
    try:
        deadline = time.monotonic() + 5
        while psutil.Process(proc.pid).status() != psutil.STATUS_DISK_SLEEP:
            assert time.monotonic() < deadline, "the vfork parent never reached D state"
            time.sleep(0.02)
        children = psutil.Process(proc.pid).children()
        # and its child in pause(): right after the vfork it still runs on the CPU for a moment
        while [c.status() for c in children] != [psutil.STATUS_SLEEPING]:
            assert time.monotonic() < deadline, "the vfork child never slept in pause()"
            time.sleep(0.02)
        children = [c.pid for c in children]
        began = time.monotonic()
        cap = capture_tree(proc.pid, [proc.pid, *children], tmp_path / "d")
        assert time.monotonic() - began < 1.0
        main = next(p for p in cap.processes if p.pid == proc.pid)
        assert main.state == "D" and not main.traced
        assert "in uninterruptible sleep (state D): not traced" in main.note
        assert main.summary_line().startswith(f"main (pid {proc.pid}) uninterruptible sleep in "), main.summary_line()
        child = next(p for p in cap.processes if p.pid != proc.pid)
        assert child.role == f"child of {proc.pid}"
        assert "pause" in child.summary_line()  # not Python: py-spy fails, /proc's wchan still tells
        assert "py-spy failed" in child.note
        assert cap.where().startswith("main uninterruptible sleep in")
    finally:
        for p in tree(proc.pid):
            p.kill()
        proc.wait()


def test_budget_abandons_what_is_not_done_and_returns_on_time(start, tmp_path):
    proc = start(DATALOADER_HANG, str(tmp_path / "flag"), ready="worker hanging", count=2)
    pids = [p.pid for p in tree(proc.pid)]
    began = time.monotonic()
    cap = capture_tree(proc.pid, pids, tmp_path, budget=0.05, gpu_sample=lambda: time.sleep(5))
    took = time.monotonic() - began
    assert took < 0.05 + 0.3, f"capture took {took:.2f} s on a 0.05 s budget"
    assert all("abandoned at the 0.05 s budget" in p.note for p in cap.processes if not p.traced), \
        [p.note for p in cap.processes]
    assert any(not p.traced for p in cap.processes)
    assert "GPU sample abandoned at the 0.05 s budget" in cap.notes
    assert len(cap.summary_lines()) == len(pids)
    time.sleep(0.2)
    assert not [p for p in psutil.Process().children(recursive=True) if "py-spy" in p.name()], \
        "py-spy processes outlived the capture"
    assert json.loads((tmp_path / STACKS_FILE).read_text())["notes"] == cap.notes


def test_a_process_whose_py_spy_the_budget_left_no_time_for_is_noted_as_abandoned(tmp_path):
    """Reading /proc can take the whole budget (a slow machine, a process of many threads): py-spy never runs, the
    rest of the capture finishes, and the note must still say the budget cut it short."""
    sleeper = subprocess.Popen([sys.executable, "-c", "import time; print('asleep', flush=True); time.sleep(60)"],
                               stdout=subprocess.PIPE, text=True)
    try:
        assert sleeper.stdout.readline() == "asleep\n"  # past its start, whose disk waits (state D) are not traced
        p = ProcessStacks(sleeper.pid)
        _capture_process(p, find_py_spy() or "py-spy", time.monotonic(), [], threading.Lock())
        assert (p.stage, p.traced, p.cut_short) == ("done", False, "about to run py-spy (native)")
        cap = capture_tree(sleeper.pid, [sleeper.pid], tmp_path, budget=0)
        assert not cap.processes[0].traced and "abandoned at the 0 s budget" in cap.processes[0].note
    finally:
        sleeper.kill()
        sleeper.wait()


def test_failures_become_notes_never_exceptions(tmp_path):
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    unwritable = tmp_path / "file"
    unwritable.write_text("")
    cap = capture_tree(gone.pid, [gone.pid], unwritable / "sub", gpu_sample=lambda: 1 / 0)
    assert cap.processes[0].note == "exited before it could be read"
    assert cap.path is None and any("cannot write" in n for n in cap.notes)
    assert cap.gpu.startswith("GPU sample failed: ZeroDivisionError")
    cap = capture_tree(os.getpid(), [], tmp_path, py_spy=str(tmp_path / "no-such-py-spy"))
    assert "py-spy failed" in cap.processes[0].note and "cannot run" in cap.processes[0].note


# A launcher (torchrun's place) waiting for two ranks, each waiting in a poll as a rank waits for its peers.
RANKS = """
import os, subprocess, sys
child = "import select, sys\\nprint('rank hanging', flush=True)\\nselect.select([sys.stdin], [], [])"
ranks = [subprocess.Popen([sys.executable, "-c", child], env={**os.environ, "RANK": str(r)}, stdin=subprocess.PIPE)
         for r in range(2)]
for rank in ranks:
    rank.wait()
"""


def test_a_stopped_rank_is_the_culprit_not_the_launcher_that_waits_for_it(start, tmp_path):
    proc = start(RANKS, ready="rank hanging", count=2)
    rank_1 = max(psutil.Process(proc.pid).children(), key=lambda p: p.pid)
    rank_1.send_signal(signal.SIGSTOP)
    deadline = time.monotonic() + 5
    while rank_1.status() != psutil.STATUS_STOPPED:
        assert time.monotonic() < deadline, "the rank never stopped"
        time.sleep(0.01)
    cap = capture(proc, tmp_path)
    assert cap.culprit().pid == rank_1.pid, cap.summary_lines()
    assert cap.culprit().summary_line().startswith(f"rank 1 (pid {rank_1.pid}) stopped"), cap.summary_lines()
    assert cap.where().startswith("rank stopped")


def test_a_stopped_loader_worker_the_worker_reported_is_named_so_though_no_python_stack_says_it(tmp_path):
    """Issue 41: a stopped loader worker is read from /proc only (no frames), and was labelled "child of PID"."""
    parent = subprocess.Popen([sys.executable, "-c", "import subprocess, time; subprocess.Popen(['sleep', '60']); "
                                                     "time.sleep(60)"])
    try:
        deadline = time.monotonic() + 10
        while not psutil.Process(parent.pid).children():
            assert time.monotonic() < deadline, "the child never started"
            time.sleep(0.02)
        [child] = [c.pid for c in psutil.Process(parent.pid).children()]
        os.kill(child, signal.SIGSTOP)
        while psutil.Process(child).status() != psutil.STATUS_STOPPED:
            assert time.monotonic() < deadline, "the child never stopped"
            time.sleep(0.01)
        unreported = capture_tree(parent.pid, [parent.pid, child], tmp_path / "a", budget=5.0)
        assert next(p for p in unreported.processes if p.pid == child).role == f"child of {parent.pid}"
        reported = capture_tree(parent.pid, [parent.pid, child], tmp_path / "b", budget=5.0, loader_pids=[child])
        named = next(p for p in reported.processes if p.pid == child)
        assert named.role == "DataLoader worker 0" and named.state == "T"
        assert reported.culprit().pid == child and reported.where().startswith("DataLoader worker stopped")
    finally:
        for p in tree(parent.pid):
            p.kill()
        parent.wait()


# The rank server's layout (worker/standby/rank_server.py): the launcher starts a stub per rank, whose environment has RANK;
# the ranks themselves are forked by a server, and their /proc/PID/environ is the server's, with no RANK.
SERVED_RANKS = """
import os, subprocess, sys
env = {k: v for k, v in os.environ.items() if k != "RANK"}
stub = "import time\\nprint('stub waiting', flush=True)\\ntime.sleep(600)"
server = ("import os, select, sys, time\\n"
          "for r in range(2):\\n"
          "    if os.fork() == 0:\\n"
          "        print('rank hanging', flush=True)\\n"
          "        select.select([sys.stdin], [], [])\\n"
          "        os._exit(0)\\n"
          "time.sleep(600)")
stubs = [subprocess.Popen([sys.executable, "-c", stub], env={**env, "RANK": str(r)}) for r in range(2)]
subprocess.Popen([sys.executable, "-c", server], env=env, stdin=subprocess.PIPE).wait()
"""


def test_a_rank_forked_by_the_rank_server_is_named_by_its_heartbeat_pid_and_the_stub_as_its_stand_in(start, tmp_path):
    """py-spy's record named the stub "rank 1" and the culprit "main ... in wait for a child": the ranks' pids from
    their heartbeats name them, and the rank the witnesses named hung is the culprit."""
    proc = start(SERVED_RANKS, ready="rank hanging", count=2)
    children = psutil.Process(proc.pid).children()
    server = next(c for c in children if c.children())
    rank_0, rank_1 = sorted(c.pid for c in server.children())  # forked in rank order
    stubs = {c.pid: c for c in children if c.pid != server.pid}
    unnamed = capture(proc, tmp_path / "before")  # from /proc/PID/environ alone: the stubs take the ranks' names
    assert sorted(p.role for p in unnamed.processes if p.pid in stubs) == ["rank 0", "rank 1"]
    cap = capture(proc, tmp_path / "after", rank_pids={rank_0: 0, rank_1: 1}, hung_pid=rank_1)
    roles = {p.pid: p.role for p in cap.processes}
    assert (roles[rank_0], roles[rank_1]) == ("rank 0", "rank 1")
    assert sorted(roles[pid] for pid in stubs) == ["stub of rank 0", "stub of rank 1"]
    assert cap.culprit().summary_line().startswith(f"rank 1 (pid {rank_1}) in "), cap.summary_lines()
