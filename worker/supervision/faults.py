"""Built-in fault injection: fires the faults of the launch record and of ``YOLO_TRAIN_FAULT`` (their kinds and spec:
worker/wire/fault_spec.py) at the points the worker calls it from.
"""

from __future__ import annotations

import os
import signal
import time

from worker.wire.fault_spec import Fault


def hang_forever() -> None:
    while True:
        time.sleep(3600)


def block_in_native_code() -> None:
    import ctypes

    libc = ctypes.CDLL(None)
    while True:
        libc.pause()  # returns only after a signal handler ran (the supervisor's SIGUSR1): block again


def queue_a_kernel_that_never_ends() -> None:
    import torch

    if not torch.cuda.is_initialized():
        raise RuntimeError("fault device_hang: the training is not on a GPU")
    torch.cuda._sleep(1 << 46)  # cycles: days at any clock; the batch after it waits for the device for ever


def spin_forever() -> None:
    x = 0
    while True:
        x += 1


class FaultInjector:
    """Fires the faults that apply to this attempt at the points the worker calls it from."""

    def __init__(self, faults: list[Fault], attempt: int, flag_path: str, rank: int | None = None):
        self.faults = [f for f in faults if f.applies_to(attempt, rank)]
        # Created when DataLoader workers must hang; they check for it per sample. One per rank, so a hang meant
        # for one rank's workers never reaches another's.
        self.flag_path = flag_path if rank is None else f"{flag_path}.rank{rank}"
        self.train_batches = 0
        self.val_batches = 0

    def kinds(self) -> set[str]:
        return {f.kind for f in self.faults}

    def before_first_batch(self) -> None:
        if "before_first_batch" in self.kinds():
            print(f"yolo-train fault injection: hanging before the first batch (pid {os.getpid()})", flush=True)
            hang_forever()

    def after_train_batch(self) -> None:
        self.train_batches += 1
        for fault in self.faults:
            if fault.at_batch != self.train_batches:
                continue
            print(f"yolo-train fault injection: {fault.kind} after batch {self.train_batches}", flush=True)
            if fault.kind == "dataloader_hang":
                with open(self.flag_path, "w") as f:
                    f.write(str(os.getpid()))
            elif fault.kind == "main_hang":
                hang_forever()
            elif fault.kind == "spin":
                spin_forever()
            elif fault.kind == "freeze":
                os.kill(os.getpid(), signal.SIGSTOP)
            elif fault.kind == "native_hang":
                block_in_native_code()
            elif fault.kind == "device_hang":
                queue_a_kernel_that_never_ends()
            elif fault.kind == "stop_request":
                os.kill(os.getpid(), signal.SIGUSR1)
            elif fault.kind == "exception":
                raise RuntimeError(f"injected fault after batch {self.train_batches}")
            elif fault.kind == "segfault":
                os.kill(os.getpid(), signal.SIGSEGV)
            elif fault.kind == "sigkill":
                os.kill(os.getpid(), signal.SIGKILL)

    def after_done(self) -> None:
        if "exit_hang" in self.kinds():
            print(f"yolo-train fault injection: exit_hang (pid {os.getpid()})", flush=True)
            hang_forever()

    def after_val_batch(self) -> None:
        self.val_batches += 1
        if "val_hang" in self.kinds() and self.val_batches == 1:
            print("yolo-train fault injection: val_hang", flush=True)
            hang_forever()

    def in_dataloader_worker(self) -> None:
        """Called for every sample a DataLoader worker process loads."""
        if os.path.exists(self.flag_path):
            hang_forever()
