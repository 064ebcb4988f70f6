"""The mid-epoch checkpoint writer: the loop's copy is its own, writes happen one at a time and in order, a failed
write is said and does not stop the next."""

import threading
import time

import torch

from worker.checkpoints.checkpoint_writer import BackgroundWriter, to_host


def test_the_host_copy_does_not_change_with_the_training_state():
    weight = torch.ones(3)
    state = {"model": {"w": weight}, "grads": [weight * 2, None], "step": (torch.tensor(5), 7), "lr": 0.01}
    copy = to_host(state)
    weight.add_(1)  # the next optimizer step, in place
    state["grads"][0].zero_()
    assert torch.equal(copy["model"]["w"], torch.ones(3)) and torch.equal(copy["grads"][0], torch.full((3,), 2.0))
    assert copy["grads"][1] is None and copy["step"][1] == 7 and copy["lr"] == 0.01
    assert isinstance(copy["step"], tuple) and copy["step"][0].device.type == "cpu"


def test_writes_run_off_the_calling_thread_one_at_a_time_in_order(capfd):
    writer, done, threads = BackgroundWriter(), [], set()
    gate = threading.Event()

    def slow(name):
        def write():
            threads.add(threading.current_thread().name)
            gate.wait(5)
            done.append(name)
        return write

    started = time.monotonic()
    writer.submit(slow("first"))
    assert time.monotonic() - started < 0.5 and writer.busy and done == []  # the caller went on at once
    threading.Timer(0.3, gate.set).start()
    writer.submit(slow("second"))  # waits for the first: an older write never lands after a newer one
    assert done[:1] == ["first"]  # (the second may be done too: its gate is open)
    writer.wait()
    assert done == ["first", "second"] and not writer.busy
    assert threads == {"checkpoint-writer"}

    def failing():
        raise OSError(28, "No space left on device")

    writer.submit(failing)
    writer.submit(slow("third"))
    writer.wait()
    assert done[-1] == "third"
    assert "checkpoint write failed (OSError: [Errno 28] No space left on device); training goes on" in \
        capfd.readouterr().err
