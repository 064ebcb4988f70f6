"""What a worker reports in force reaches the supervisor as a typed record, never as a dict of string keys."""

import os
import re

from worker.wire.contract import InForce, MessageKind
from worker.heartbeat import Heartbeat
from worker.wire.heartbeat_protocol import Decoder


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



def test_startup_steps_cross_the_pipe_typed_with_the_scans_progress_and_the_trainers_seams_report_them(monkeypatch):
    """The worker's reporter: each step once as entered, the AMP check and Ultralytics' dataset progress bars reached
    by ``install``, the first step's forward, quiet after the first batch; an unknown step is no message."""
    from ultralytics.data import base, dataset
    from ultralytics.engine import trainer

    from worker.startup import startup_steps
    from worker.wire.contract import StartupStep

    r, w = os.pipe()
    steps = startup_steps.STEPS
    monkeypatch.setattr(trainer, "check_amp", lambda model: True)  # the check worker/patches/amp_check installs
    monkeypatch.setattr(steps, "hb", None)
    steps.attach(Heartbeat(w))
    startup_steps.install()
    startup_steps.install()  # once per process, however often asked
    steps.enter(StartupStep.MODEL)
    steps.enter(StartupStep.MODEL)  # the same step again is not said again
    assert trainer.check_amp(None) is True
    steps.enter(StartupStep.DATASET)
    for _ in dataset.TQDM(range(3), total=3):  # a label scan's bar: its first item at once, then once a second
        pass
    assert issubclass(base.TQDM, startup_steps.ScanProgress)
    steps.enter(StartupStep.FIRST_BATCH)
    steps.enter(StartupStep.FIRST_STEP)
    steps.progress(1, 2)  # its forward ran (worker/training/trainer.py): news within the first step
    steps.enter(StartupStep.LOADERS)  # no step after the first step
    report = steps.trained()
    assert re.fullmatch(r"steps: model \d+\.\d, amp_check \d+\.\d, dataset \d+\.\d, first_batch \d+\.\d, "
                        r"first_step \d+\.\d", report), report  # each step's seconds, in the worker's startup line
    for _ in dataset.TQDM(range(3), total=3):  # the first batch trained: quiet
        pass
    Heartbeat(w).step("no such step")
    os.close(w)
    messages = Decoder().feed(os.read(r, 65536))
    os.close(r)
    assert [(m.kind, m.step, m.done, m.total) for m in messages] == [
        (MessageKind.STEP, StartupStep.MODEL, None, None), (MessageKind.STEP, StartupStep.AMP_CHECK, None, None),
        (MessageKind.STEP, StartupStep.DATASET, None, None), (MessageKind.STEP, StartupStep.DATASET, 1, 3),
        (MessageKind.STEP, StartupStep.FIRST_BATCH, None, None), (MessageKind.STEP, StartupStep.FIRST_STEP, None, None),
        (MessageKind.STEP, StartupStep.FIRST_STEP, 1, 2)]
    assert messages[0].progress == 0  # a step is not progress: the supervisor's step clock is what it moves
