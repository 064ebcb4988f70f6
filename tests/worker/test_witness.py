"""The witness in real training processes (tests/fixtures/witness_process.py: torch DataLoaders with worker processes,
a heartbeat FIFO read here), and its rules on stacks made by hand where a real one needs what this machine lacks (a
GPU, a process group).

No test waits a fixed time for a state: each waits for the state itself (a marker file the scenario writes where it
blocks, a report on the pipe), bounded by a generous timeout that only a broken witness reaches.
"""

import json
import os
import select
import signal
import socket
import subprocess
import sys
import threading
import time
from contextlib import contextmanager
from pathlib import Path
from types import SimpleNamespace

import pytest

from tests.helpers import ROOT
from worker import witness
from worker.wire.contract import MessageKind, WaitKind, WaitReport
from worker.heartbeat import Heartbeat
from worker.wire.heartbeat_protocol import Decoder, read_available
from worker.witness import RULES, Stack, Witness, classify, device_busy

FIXTURE = ROOT / "tests" / "fixtures" / "witness_process.py"
BLOCK_AT = 3  # the fixture's
BOUND = 60.0  # seconds: what only a broken witness or a dead scenario reaches, on a loaded 2-core VM


def fixture_line(name: str) -> int:
    return next(i for i, text in enumerate(FIXTURE.read_text().splitlines(), 1) if f"# WAIT:{name}" in text)


@pytest.fixture(scope="module")
def trainer():
    """The fixture process: torch imported once; each scenario a fork of it."""
    proc = subprocess.Popen([sys.executable, str(FIXTURE)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                            cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)})
    yield proc
    proc.stdin.close()
    proc.kill()
    proc.wait()


class Scenario:
    def __init__(self, fd: int, pid: int, marker: Path):
        self.fd, self.pid, self.marker = fd, pid, marker
        self.decoder, self.seen = Decoder(), []

    def read_until(self, done, bound: float = BOUND):
        """Messages until ``done(message)``; that message."""
        deadline = time.monotonic() + bound
        while time.monotonic() < deadline:
            select.select([self.fd], [], [], 0.2)
            data = read_available(self.fd)
            for message in self.decoder.feed(data or b""):
                self.seen.append(message)
                if done(message):
                    return message
            if data == b"":
                break
        raise AssertionError(f"not seen within {bound} s; seen: {[(m.kind, m.wait) for m in self.seen][-10:]}")

    def wait_for(self, kind: WaitKind, where: str | None = None, **fields) -> WaitReport:
        def matches(m):
            return (m.kind == MessageKind.WAIT and m.wait.kind == kind and (where is None or m.wait.where == where)
                    and all(getattr(m.wait, k) == v for k, v in fields.items()))
        return self.read_until(matches).wait

    def file(self, path: Path, bound: float = BOUND) -> str:
        deadline = time.monotonic() + bound
        while not path.exists():
            assert time.monotonic() < deadline, f"{path} not written within {bound} s"
            time.sleep(0.02)
        return path.read_text()


@contextmanager
def scenario(trainer, tmp_path: Path, **line):
    fifo, marker = tmp_path / "heartbeat", tmp_path / "marker"
    os.mkfifo(fifo)
    fd = os.open(fifo, os.O_RDONLY | os.O_NONBLOCK)
    trainer.stdin.write(json.dumps({"fifo": str(fifo), "marker": str(marker), **line}) + "\n")
    trainer.stdin.flush()
    pid = int(trainer.stdout.readline())
    try:
        yield Scenario(fd, pid, marker)
    finally:
        try:
            os.killpg(pid, signal.SIGKILL)  # the scenario and its loader workers, stopped or spinning ones too
        except ProcessLookupError:
            pass
        os.close(fd)


@pytest.mark.parametrize("pin", [False, True], ids=["no_pin", "pin_memory"])
@pytest.mark.parametrize("how", ["event", "spin", "stop"])
def test_a_wait_for_a_stuck_loader_worker_names_the_worker_and_the_batch(trainer, tmp_path, how, pin):
    with scenario(trainer, tmp_path, kind="loader", how=how, pin=pin) as s:
        held = json.loads(s.file(s.marker))  # the worker process is at the blocking sample, every batch before it read
        report = s.wait_for(WaitKind.LOADER, worker=held["worker"])
        assert report.worker_pid == held["pid"]
        assert report.batch_index == BLOCK_AT
        assert report.loader == "train"
        assert report.function in ("_try_get_data", "_get_data", "_next_data")
        assert report.stalled >= 0.5
        # where: the innermost frame, the queue read beneath torch's (the pin thread's queue.Queue with pin memory)
        assert ("threading.py" if pin else "selectors.py") in report.where, report.where


def test_a_batch_read_from_a_stopped_worker_names_that_worker_not_the_batch_awaited(trainer, tmp_path):
    """A batch's tensors come in shared memory the sending worker's resource sharer hands over: the training process,
    awaiting BLOCK_AT - 1 from a worker that is slow, reads BLOCK_AT first, from a worker that stops as it is asked for
    that batch's memory. The wait is that worker's, for BLOCK_AT, though torch awaits the other's."""
    with scenario(trainer, tmp_path, kind="loader", how="stop_sharing", pin=False) as s:
        held = json.loads(s.file(s.marker))
        report = s.wait_for(WaitKind.LOADER, batch_index=BLOCK_AT)
        assert (report.worker, report.worker_pid) == (held["worker"], held["pid"])
        assert report.loader == "train" and report.function in ("_try_get_data", "_get_data", "_next_data")
        assert "multiprocessing/connection.py" in report.where and report.where.endswith(" in _recv"), report.where


def test_a_wait_of_its_own_run_inside_the_loaders_wait_is_that_wait_not_the_loaders(trainer, tmp_path):
    """A signal's handler that blocks on a lock runs on top of the loader's frames (the main thread waited there for a
    batch): the training process waits on the lock, which no loader rung changes. Seen in CI: a rank hung this way
    was called a loader wait, and its peer's rank-0 test failed on the word."""
    with scenario(trainer, tmp_path, kind="loader", how="handler", pin=False) as s:
        s.file(s.marker)  # a worker holds BLOCK_AT: the training process waits in the loader
        s.wait_for(WaitKind.LOADER, batch_index=BLOCK_AT)
        os.kill(s.pid, signal.SIGUSR2)
        report = s.wait_for(WaitKind.LOCK)
        assert report.where == f"tests/fixtures/witness_process.py:{fixture_line('handler')} in handler"


def test_a_main_thread_on_a_lock_of_its_own_is_seen_on_the_lock(trainer, tmp_path):
    with scenario(trainer, tmp_path, kind="main", how="lock") as s:
        report = s.wait_for(WaitKind.LOCK)
        assert report.where == f"tests/fixtures/witness_process.py:{fixture_line('lock')} in main_thread"
        assert report.function == "acquire"


@pytest.mark.parametrize("how, where", [
    ("lock_renamed", f"tests/fixtures/witness_process.py:{fixture_line('lock_renamed')} in main_thread"),
    ("lock_unreadable", "<callback>:3 in callback")])
def test_a_bare_lock_is_a_lock_however_it_was_taken(trainer, tmp_path, how, where):
    """``acquire`` under another name, or on a line whose source no file holds: the bytecode names the lock (issue
    58.5: "no known wait (native)" before, which weighed the device runtime's rungs)."""
    with scenario(trainer, tmp_path, kind="main", how=how) as s:
        report = s.wait_for(WaitKind.LOCK)
        assert (report.where, report.function) == (where, "acquire")


def test_a_main_thread_spinning_in_python_is_elsewhere_at_its_line(trainer, tmp_path):
    spin = fixture_line("spin")
    with scenario(trainer, tmp_path, kind="main", how="spin") as s:
        report = s.wait_for(WaitKind.ELSEWHERE)
        # the loop's body, or its test line (the jump back is the while's)
        assert report.where in {f"tests/fixtures/witness_process.py:{n} in main_thread" for n in (spin, spin - 1)}
        assert report.function is None


def test_a_main_thread_inside_a_native_call_is_elsewhere_and_named_by_the_call(trainer, tmp_path):
    """A busy wait in native code (ROCm's lost completion) is told from a loop of Python, which has no function."""
    with scenario(trainer, tmp_path, kind="main", how="native") as s:
        report = s.wait_for(WaitKind.ELSEWHERE)
        assert report.where == f"tests/fixtures/witness_process.py:{fixture_line('native')} in main_thread"
        assert report.function == "pause"


def test_a_main_thread_in_time_sleep_sleeps(trainer, tmp_path):
    with scenario(trainer, tmp_path, kind="main", how="sleep") as s:
        report = s.wait_for(WaitKind.SLEEP)
        assert report.where == f"tests/fixtures/witness_process.py:{fixture_line('sleep')} in main_thread"


def test_a_main_thread_waiting_for_a_server_waits_on_io_until_it_answers(trainer, tmp_path):
    server = socket.create_server(("127.0.0.1", 0))
    seen = threading.Event()

    def answer_late():  # once the witness has said where the client waits (or at the bound)
        conn, _ = server.accept()
        with conn:
            seen.wait(BOUND)
            conn.sendall(b"late")

    thread = threading.Thread(target=answer_late, daemon=True)
    thread.start()
    try:
        with scenario(trainer, tmp_path, kind="main", how="socket", port=server.getsockname()[1]) as s:
            report = s.wait_for(WaitKind.IO)
            seen.set()
            assert report.function == "recv"
            assert report.where == f"tests/fixtures/witness_process.py:{fixture_line('socket')} in main_thread"
            assert s.file(Path(f"{s.marker}.answer")) == "late"
    finally:
        seen.set()
        server.close()


def test_reports_stop_once_progress_resumes(trainer, tmp_path):
    with scenario(trainer, tmp_path, kind="main", how="resume") as s:
        s.wait_for(WaitKind.SLEEP, function="sleep")
        Path(f"{s.marker}.go").touch()
        s.read_until(lambda m: m.kind == MessageKind.PHASE and m.phase.value == "done")
    resumed = next(i for i, m in enumerate(s.seen) if m.kind == MessageKind.BEAT and m.progress > 1)
    beats_after = [m for m in s.seen[resumed:] if m.kind == MessageKind.BEAT]
    assert len(beats_after) == 300
    # After it, a report only where the process really made no progress for an interval (a loaded machine may
    # stop it so): none while beats come.
    last_beat = s.seen[resumed].sent
    for m in s.seen[resumed:]:
        if m.kind == MessageKind.WAIT:
            assert m.sent - last_beat >= 0.45, (m.sent - last_beat, m.wait)
        else:
            last_beat = m.sent


# --- the rules on stacks made by hand ---------------------------------------------------------------------------

def frame(path: str, function: str, line: int = 1, back=None, **locals_):
    return SimpleNamespace(f_code=SimpleNamespace(co_filename=path, co_name=function), f_lineno=line, f_back=back,
                           f_locals=locals_, f_globals={})


def stack(*frames, line: str = "", busy: bool = False) -> Stack:
    return Stack(tuple(frames), line, lambda: busy)


TORCH = "/venv/lib/python3.11/site-packages/torch"


def test_every_rule_says_why():
    assert [r.kind for r in RULES] == [WaitKind.LOADER, WaitKind.COLLECTIVE, WaitKind.DEVICE, WaitKind.LOCK,
                                       WaitKind.IO, WaitKind.SLEEP]
    assert all(len(r.why) > 20 for r in RULES)


def test_a_device_synchronize_is_a_device_wait_whatever_the_query_says():
    s = stack(frame(f"{TORCH}/cuda/__init__.py", "synchronize", 1290), frame("/job/train.py", "step", 40))
    report = classify(s, 0.7)
    assert (report.kind, report.function, report.where) == (WaitKind.DEVICE, "synchronize",
                                                            "torch/cuda/__init__.py:1290 in synchronize")


def test_a_native_call_while_the_device_has_work_is_a_device_wait_and_without_work_is_not():
    inner = frame("/job/train.py", "step", 41)
    busy = classify(stack(inner, line="loss_value = loss.item()", busy=True), 1.0)
    assert (busy.kind, busy.function) == (WaitKind.DEVICE, "item")
    assert classify(stack(inner, line="loss_value = loss.item()", busy=False), 1.0).kind == WaitKind.ELSEWHERE


def test_a_collective_is_named_by_its_function_and_an_async_one_by_its_work():
    s = stack(frame(f"{TORCH}/distributed/distributed_c10d.py", "all_reduce", 2800),
              frame(f"{TORCH}/distributed/c10d_logger.py", "wrapper", 81), frame("/job/train.py", "step", 50))
    assert (classify(s, 2.0).kind, classify(s, 2.0).function) == (WaitKind.COLLECTIVE, "all_reduce")

    class Work:  # as torch._C._distributed_c10d.Work is named
        pass

    waiting = frame("/job/train.py", "step", 51, handle=SimpleNamespace(work=Work()))
    report = classify(stack(waiting, line="handle.work.wait()"), 2.0)
    assert (report.kind, report.function) == (WaitKind.COLLECTIVE, "wait")
    assert classify(stack(frame("/job/train.py", "step", 51, work=object()), line="work.wait()"), 2.0).kind \
        == WaitKind.ELSEWHERE


def test_a_collective_outranks_the_device_and_the_loader_outranks_the_queue_beneath_it():
    s = stack(frame(f"{TORCH}/cuda/streams.py", "synchronize"), frame(f"{TORCH}/distributed/distributed_c10d.py",
                                                                      "barrier"))
    assert classify(s, 1.0).kind == WaitKind.COLLECTIVE
    not_multiprocessing = frame(f"{TORCH}/utils/data/dataloader.py", "_next_data", self=object())
    s = stack(frame(os.path.join(os.path.dirname(os.__file__), "selectors.py"), "select"), not_multiprocessing)
    assert classify(s, 1.0).kind == WaitKind.IO  # a loader without worker processes is no wait for a worker


def test_a_file_read_on_the_innermost_line_is_io():
    report = classify(stack(frame("/job/train.py", "load", 7), line="blob = f.read()"), 0.5)
    assert (report.kind, report.function) == (WaitKind.IO, "read")


class FakeCuda:
    def __init__(self, initialized: bool, busy_devices: set[int]):
        self.initialized, self.busy, self.queried = initialized, busy_devices, []

    def is_initialized(self):
        return self.initialized

    def device_count(self):
        return 2

    def current_stream(self, index):
        self.queried.append(index)
        return SimpleNamespace(query=lambda: index not in self.busy)


def test_the_device_query_never_initialises_cuda_nor_touches_a_device_without_a_context(monkeypatch):
    cuda = FakeCuda(initialized=False, busy_devices={0, 1})
    torch = SimpleNamespace(cuda=cuda, _C=SimpleNamespace(_cuda_hasPrimaryContext=lambda i: i == 1))
    monkeypatch.setitem(sys.modules, "torch", torch)
    assert device_busy() is False and cuda.queried == []
    cuda.initialized = True
    assert device_busy() is True and cuda.queried == [1]
    cuda.busy = {0}
    assert device_busy() is False


def test_without_torch_loaded_there_is_no_device_to_wait_for(monkeypatch):
    monkeypatch.delitem(sys.modules, "torch", raising=False)
    assert device_busy() is False


def test_a_failing_report_is_lost_and_the_witness_goes_on():
    class Failing:
        progress, calls = 0, 0

        def wait(self, report):
            self.calls += 1
            raise OSError("no")

    release = threading.Event()
    watched = threading.Thread(target=release.wait, daemon=True)
    watched.start()
    client = Failing()
    w = Witness(client, interval=0.05, thread=watched.ident).start()
    try:
        deadline = time.monotonic() + BOUND
        while w.lost < 2:
            assert time.monotonic() < deadline
            time.sleep(0.01)
        assert w.alive and w.reports == 0
    finally:
        w.stop()
        release.set()
    assert not w.alive


def test_an_unsupervised_client_starts_no_witness_and_a_plain_one_none_unasked(monkeypatch):
    monkeypatch.delenv("YOLO_TRAIN_HEARTBEAT_FD", raising=False)
    monkeypatch.delenv("YOLO_TRAIN_HEARTBEAT_PATH", raising=False)
    assert Heartbeat.from_env(witness=True).witness is None
    r, w = os.pipe()
    try:
        monkeypatch.setenv("YOLO_TRAIN_HEARTBEAT_FD", str(w))
        assert Heartbeat.from_env().witness is None
        hb = Heartbeat.from_env(witness=True)
        assert hb.witness.alive and hb.start_witness() is hb.witness
        hb.stop_witness()
        assert hb.witness is None
    finally:
        os.close(r)
        os.close(w)


def test_loaders_are_named_by_themselves_or_by_the_iterator_they_hold():
    class Loader:
        pass

    loader, persistent = Loader(), Loader()
    loader.iterator, persistent._iterator = object(), object()
    witness.name_loader(loader, "train")
    witness.name_loader(persistent, "val")
    assert witness.loader_name(loader.iterator) == "train" and witness.loader_name(persistent._iterator) == "val"
    loader.iterator = object()  # rebuilt in place (worker/loading/loader_recovery.py)
    assert witness.loader_name(loader.iterator) == "train" and witness.loader_name(object()) is None
    witness.name_loader(object(), "val")  # not weakly referable: left unnamed, never an error in training


def test_backward_under_a_process_group_waits_for_the_peers_even_while_the_device_holds_the_all_reduce(monkeypatch):
    """On a GPU, DDP's all-reduce is queued on the waiting rank's own stream: the device looks busy, yet the rank
    waits for its peers, never for a device of its own (issue 49: rank 0 in run_backward was named over rank 1)."""
    from worker import witness

    backward = stack(frame(f"{TORCH}/autograd/graph.py", "_engine_run_backward", 869),
                     frame(f"{TORCH}/_tensor.py", "backward", 626), frame("/job/train.py", "step", 60),
                     line="return Variable._execution_engine.run_backward(", busy=True)
    monkeypatch.setattr(witness, "in_process_group", lambda: True)
    for busy in (True, False):
        s = Stack(backward.frames, backward.line, lambda: busy)
        report = classify(s, 2.0)
        assert (report.kind, report.function) == (WaitKind.COLLECTIVE, "DDP's backward all-reduce")
    # Python run from inside backward (a hook, a signal's handler) waits on its own: here a lock
    handler = stack(frame("/hook/sitecustomize.py", "_hang", 30), *backward.frames, line="lock.acquire()")
    assert classify(handler, 2.0).kind == WaitKind.LOCK
    in_broadcast = stack(frame("/hook/sitecustomize.py", "_hang", 30),
                         frame(f"{TORCH}/distributed/distributed_c10d.py", "broadcast", 3787), line="lock.acquire()")
    assert classify(in_broadcast, 2.0).kind == WaitKind.LOCK
    monkeypatch.setattr(witness, "in_process_group", lambda: False)  # one process: its backward waits for its device
    assert classify(backward, 2.0).kind == WaitKind.DEVICE
