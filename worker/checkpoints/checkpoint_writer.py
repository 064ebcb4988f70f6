"""Mid-epoch checkpoints written off the training step: the loop copies what it must to host memory and goes on; a
thread serializes and writes the copy.

A synchronous mid-epoch save holds the loop for torch.save's pickling, the device-to-host copies, the write and its
fsync (bench/RESULTS.md, ``checkpoint_cost.py``). The copy is all the loop must wait for: the model, the EMA and
the optimizer change at the next step, so they are cloned to the host first (``to_host``); nothing the thread touches
is shared with the loop after that.

One write at a time, in order: ``wait()`` before the next save of any kind (a newer end-of-epoch ``last.pt`` must
never be overwritten by an older mid-epoch one finishing late), before a stop's save, and at the end of training.
The thread is not a daemon, so a worker that exits normally finishes its write; one that is killed leaves the
previous file, because every write is atomic (``worker/checkpoints/checkpointing.py``).
"""

from __future__ import annotations

import sys
import threading
from typing import Any, Callable


def to_host(value: Any) -> Any:
    """``value`` with every tensor in it (nested dicts, lists, tuples) copied to host memory, detached."""
    import torch

    if isinstance(value, torch.Tensor):
        return value.detach().to("cpu", copy=True)
    if isinstance(value, dict):
        return type(value)((k, to_host(v)) for k, v in value.items())
    if isinstance(value, (list, tuple)):
        return type(value)(to_host(v) for v in value)
    return value


class BackgroundWriter:
    """Runs one write at a time on a thread of its own."""

    def __init__(self) -> None:
        self._thread: threading.Thread | None = None

    @property
    def busy(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def submit(self, write: Callable[[], None]) -> None:
        """Start ``write`` once the previous one is done. Its exceptions are printed: training goes on."""
        self.wait()
        self._thread = threading.Thread(target=self._run, args=(write,), name="checkpoint-writer")
        self._thread.start()

    def wait(self) -> None:
        if self._thread is not None:
            self._thread.join()
            self._thread = None

    @staticmethod
    def _run(write: Callable[[], None]) -> None:
        try:
            write()
        except Exception as e:  # a previous checkpoint is intact (atomic writes); the next interval tries again
            print(f"yolo-train worker: checkpoint write failed ({type(e).__name__}: {e}); training goes on",
                  file=sys.stderr, flush=True)
