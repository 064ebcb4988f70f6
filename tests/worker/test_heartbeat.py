"""The heartbeat protocol over real pipes: atomic, non-blocking, garbage-proof."""

import json
import os
import signal
import subprocess
import sys
import time

import pytest

from tests.helpers import ROOT
from worker.heartbeat import Heartbeat
from worker.wire.heartbeat_protocol import MAX_MESSAGE_BYTES, Decoder, encode, parse, read_available


def drain(fd: int) -> bytes:
    os.set_blocking(fd, False)
    return read_available(fd) or b""


def test_beats_and_phases_carry_a_growing_progress_counter():
    r, w = os.pipe()
    hb = Heartbeat(w)
    hb.phase("train", epoch=1, epochs=3)
    hb.beat(epoch=1, epochs=3, batch=1, batches=10, losses={"box_loss": 1.5}, lr=0.01)
    hb.ping()
    messages = Decoder().feed(drain(r))
    assert [(m.kind.value, m.phase.value, m.progress) for m in messages] == [
        ("phase", "train", 1), ("beat", "train", 2), ("beat", "train", 2)]  # a ping is no progress
    assert messages[1].losses == {"box_loss": 1.5} and messages[1].pid == os.getpid()
    assert 0 <= time.monotonic() - messages[1].sent < 5  # when it was sent, by the clock the supervisor reads too


def test_a_full_pipe_drops_beats_instead_of_blocking():
    r, w = os.pipe()
    hb = Heartbeat(w)
    started = time.monotonic()
    results = [hb.beat(batch=i, losses={f"l{j}": 1.0 for j in range(50)}) for i in range(2000)]
    assert time.monotonic() - started < 30  # it returned at all: a blocking write would hang here forever
    assert results.count(False) == hb.dropped > 0
    assert hb.sent + hb.dropped == 2000
    messages = Decoder().feed(drain(r))
    assert len(messages) == hb.sent and Decoder().malformed == 0


SENDER = """
import sys, time
from worker.heartbeat import Heartbeat
hb = Heartbeat(int(sys.argv[1]))
while True:
    hb.beat()
    time.sleep(0.01)
"""


def test_a_sender_whose_supervisor_is_gone_stops_instead_of_training_beside_the_next_one():
    r, w = os.pipe()
    sender = subprocess.Popen([sys.executable, "-c", SENDER, str(w)], pass_fds=(w,), cwd=ROOT)
    os.close(w)
    try:
        assert os.read(r, 100)  # it beats
        os.close(r)  # the supervisor is gone
        assert sender.wait(timeout=30) == -signal.SIGKILL
    finally:
        sender.kill()


def test_a_descriptor_the_script_closed_only_stops_the_beats():
    r, w = os.pipe()
    hb = Heartbeat(w)
    os.close(w)
    assert hb.beat() is False and hb.enabled is False
    assert hb.beat() is False  # and training goes on
    os.close(r)


def test_unsupervised_heartbeat_is_a_no_op(monkeypatch):
    monkeypatch.delenv("YOLO_TRAIN_HEARTBEAT_FD", raising=False)
    hb = Heartbeat.from_env()
    assert not hb.enabled and hb.beat() is False


def test_messages_fit_in_pipe_buf_shedding_optional_fields():
    huge = {f"loss_{i}": float(i) for i in range(1000)}
    data = encode({"v": 1, "pid": 1, "kind": "beat", "phase": "train", "progress": 1, "losses": huge})
    assert len(data) <= MAX_MESSAGE_BYTES
    assert "losses" not in json.loads(data)


def test_garbage_and_oversized_lines_are_counted_and_skipped():
    decoder = Decoder()
    good = encode({"v": 1, "pid": 7, "kind": "beat", "phase": "train", "progress": 3})
    stream = (b"\x00\xff garbage\n" + b"{not json}\n" + b'{"v": 2, "pid": 1}\n' + b"x" * 10_000 + b"\n"
              + b'{"v":1,"pid":7,"kind":"beat","phase":"train","progress":-1}\n' + good)
    messages = []
    for i in range(0, len(stream), 777):  # arbitrary chunking, as reads from a pipe come
        messages += decoder.feed(stream[i:i + 777])
    assert [m.progress for m in messages] == [3]
    assert decoder.malformed == 4 and decoder.oversized == 1


@pytest.mark.parametrize("line", [b"[]", b"null", b'{"v":1}', b'{"v":1,"pid":"x","kind":"beat","phase":"train",'
                                  b'"progress":1}', b'{"v":1,"pid":1,"kind":"beat","phase":"nap","progress":1}',
                                  b'{"v":1,"pid":1,"kind":"beat","phase":"train","progress":true}'])
def test_invalid_messages_are_rejected(line):
    assert parse(line) is None


def test_concurrent_writers_never_interleave():
    r, w = os.pipe()
    children = []
    for n in range(4):
        pid = os.fork()
        if pid == 0:
            os.close(r)
            hb = Heartbeat(w)
            os.set_blocking(w, True)  # block here, so every message is written whole and none dropped
            for i in range(300):
                hb.beat(batch=i, losses={f"l{j}": float(n) for j in range(120)})  # ~3 KB, near PIPE_BUF
            os._exit(0)
        children.append(pid)
    os.close(w)
    decoder, messages = Decoder(), []
    while True:
        chunk = os.read(r, 65536)
        if not chunk:
            break
        messages += decoder.feed(chunk)
    for pid in children:
        os.waitpid(pid, 0)
    assert decoder.malformed == 0 and decoder.oversized == 0
    assert len(messages) == 1200
    for m in messages:  # each message is one writer's, whole
        assert set(m.losses.values()) == {float(children.index(m.pid))}
