"""What a worker reports in force reaches the supervisor as a typed record, never as a dict of string keys."""

import os

from worker.contract import InForce, MessageKind
from worker.heartbeat import Decoder, Heartbeat


def test_the_in_force_report_crosses_a_real_pipe_as_a_typed_record():
    r, w = os.pipe()
    sent = InForce(workers=2, persistent_workers=True, loader="process", start_method="fork", amp=False, batch=16,
                   imgsz=64, device="cpu", start_epoch=1, forced={"workers": 2}, conv_fallback=False,
                   versions={"torch": "2.5.1", "hip": None})
    Heartbeat(w).settings(sent.to_wire())
    Heartbeat(w).settings({"batch": "16", "amp": 0, "device": "cuda:1", "unknown": 1})  # a hand-written sender
    os.close(w)
    first, second = Decoder().feed(os.read(r, 65536))
    os.close(r)
    assert (first.kind, first.in_force) == (MessageKind.IN_FORCE, sent)
    assert second.in_force == InForce(device="cuda:1")  # a field of another type is not guessed at
