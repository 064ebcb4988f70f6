"""The worker's startup, step by step, as the supervisor bounds it: each step reported as it is entered, and the
dataset step's progress while labels are scanned or images cached (``contract.StartupStep``).

One reporter per process (``STEPS``), given the heartbeat when the worker has one (``attach``); the trainer enters
the steps at Ultralytics' own seams (worker/training/trainer.py), and ``install`` reaches the two that are no trainer method:
the AMP check and the dataset's progress bars. Quiet after the first batch: steps are the startup's only.
"""

from __future__ import annotations

import contextlib
import time
from typing import Any, Iterator

from worker.wire.contract import StartupStep
from worker.heartbeat import Heartbeat

PROGRESS_EVERY = 1.0  # seconds between two progress reports of one step (the first item of a pass is said at once)
# torch's CPU threads while the model is built: its CPU forward (the strides) and the checkpoint's casts are small, and
# an OpenMP region waits for its slowest thread. With every core in the pool, one core busy elsewhere (the standby's
# forkserver importing, py-spy, the killed tree's teardown) made a restart's model step several times as long as when
# nothing else ran (bench/RESULTS.md, the device hang part by part).
MODEL_STEP_THREADS = 4


class StartupSteps:
    def __init__(self) -> None:
        self.hb: Heartbeat | None = None
        self.current: StartupStep | None = None
        self.finished = False
        self.reported_at = 0.0
        self.entered: list[tuple[StartupStep, float]] = []  # each step and when (monotonic), for the report

    def attach(self, hb: Heartbeat) -> None:
        self.hb, self.current, self.finished, self.entered = hb, None, False, []

    def enter(self, step: StartupStep) -> None:
        if self.hb is None or self.finished or step == self.current:
            return
        self.current = step
        self.entered.append((step, time.monotonic()))
        self.hb.step(step.value)
        if step == StartupStep.FIRST_STEP:
            self.finished = True  # the last step: what follows it is training, which the supervisor's phases bound

    def trained(self) -> str:
        """The first batch is trained: the startup is over, and no progress is said of it again. Returned: the
        seconds each step took ("steps: checkpoint 0.5, model 0.3, ..."), for the worker's startup report."""
        self.current = None
        ends = [at for _, at in self.entered[1:]] + [time.monotonic()]
        return "steps: " + ", ".join(f"{step.value} {end - at:.1f}" for (step, at), end in zip(self.entered, ends))

    def progress(self, done: int, total: int | None) -> None:
        """``done`` items of this pass (a progress bar) over the step's items: news that the step is not hung."""
        if self.hb is None or self.current is None:
            return
        now = time.monotonic()
        if done == 1 or now - self.reported_at >= PROGRESS_EVERY:
            self.reported_at = now
            self.hb.step(self.current.value, done=done, total=total)


STEPS = StartupSteps()


@contextlib.contextmanager
def few_cpu_threads(most: int = MODEL_STEP_THREADS) -> Iterator[None]:
    """torch's intra-op threads at most ``most`` inside, as they were after (MODEL_STEP_THREADS says why)."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(min(before, most))
    try:
        yield
    finally:
        torch.set_num_threads(before)


def install() -> None:
    """Report the AMP check as a step, and the progress of Ultralytics' dataset scans and image caching (their TQDM
    bars, counted as iterated whether or not they draw). Once per process."""
    from ultralytics.data import base, dataset
    from ultralytics.engine import trainer

    if not getattr(trainer.check_amp, "reports_step", False):
        check = trainer.check_amp

        def check_amp(*args: Any, **kwargs: Any) -> Any:
            STEPS.enter(StartupStep.AMP_CHECK)
            return check(*args, **kwargs)

        check_amp.reports_step = True
        trainer.check_amp = check_amp
    for module in (base, dataset):
        if not issubclass(module.TQDM, ScanProgress):
            module.TQDM = _progress_bar(module.TQDM)


class ScanProgress:
    """Marks a progress bar class that reports its items as the dataset step's progress."""


def _progress_bar(bar: type) -> type:
    def __iter__(self):
        total = getattr(self, "total", None)
        for done, item in enumerate(bar.__iter__(self), 1):
            STEPS.progress(done, total)
            yield item

    return type(f"Reported{bar.__name__}", (bar, ScanProgress), {"__iter__": __iter__})
