"""The faults a supervisor may ask a worker to inject, their spec (worker/supervision/faults.py fires them): real
hangs and crashes, off unless asked for.

A fault is asked for in the config (``[[faults]]``) or in the environment
(``YOLO_TRAIN_FAULT="dataloader_hang,at_batch=6,attempt=1"``; several separated by ``;``).

kinds:
- ``dataloader_hang``: every DataLoader worker process sleeps forever from the moment the training loop
  finishes batch ``at_batch``; the loop then drains the prefetched batches and waits on them forever,
  the deadlock the seeds saw with ``workers>0``. Cannot fire with ``workers=0``, which is why that rung helps.
- ``main_hang``: the training loop sleeps forever after batch ``at_batch``.
- ``spin``: the training loop busy-spins at 100% CPU after batch ``at_batch``.
- ``stop_request``: the worker gets the supervisor's "save and exit" (SIGUSR1) after batch ``at_batch``, so it saves
  at the next batch boundary and exits 0 (at_batch one short of an epoch's end: a checkpoint at the end's edge).
- ``freeze``: the training process stops itself with SIGSTOP after batch ``at_batch``, as a freeze from outside
  does, but at a batch chosen in advance (a test's freeze then never lands at an epoch's end by chance).
- ``device_hang``: a kernel that never ends is queued on the training's GPU after batch ``at_batch``
  (``torch.cuda._sleep``, CUDA and HIP builds alike); the next wait for the device never returns, as a lost
  completion leaves the host. Needs the training on a GPU.
- ``native_hang``: the training loop blocks inside a C call (libc ``pause()``) after batch ``at_batch``, as a
  loop stuck in the HIP runtime or a driver call does: no Python frame moves.
- ``before_first_batch``: the attempt's first batch is loaded, and its step never runs (the seeds' post-resume hang:
  "the first batch never runs", in the startup's ``first_step``).
- ``val_hang``: validation sleeps forever after its first batch.
- ``exit_hang``: the worker sleeps forever after it said training is done (its last checkpoint written), as a
  process stuck in the GPU runtime's teardown at exit does.
- ``exception``, ``segfault``, ``sigkill``: the loop raises RuntimeError, dies of SIGSEGV, or SIGKILLs itself
  after batch ``at_batch``.

``at_batch`` counts training batches of the current worker process (1-based), so a fault that fires on every
attempt recurs after each resume. ``attempt = N`` fires only on attempt N (1 is the first); 0, the default,
fires on every attempt. Under DDP a fault fires in every rank unless ``rank = R`` names one
(``YOLO_TRAIN_FAULT="dataloader_hang,at_batch=6,rank=1"``); a fault that names a rank never fires outside DDP.
"""

from __future__ import annotations

import os
from dataclasses import asdict, dataclass
from typing import Any

FAULT_KINDS = ("dataloader_hang", "main_hang", "spin", "freeze", "native_hang", "device_hang", "stop_request", "before_first_batch",
               "val_hang", "exit_hang", "exception", "segfault", "sigkill")
ENV_FAULT = "YOLO_TRAIN_FAULT"


class FaultError(ValueError):
    pass


@dataclass(frozen=True)
class Fault:
    kind: str
    at_batch: int = 1
    attempt: int = 0
    rank: int | None = None  # the DDP rank it fires in; None: every process that trains

    @classmethod
    def from_dict(cls, raw: Any) -> "Fault":
        if not isinstance(raw, dict):
            raise FaultError(f'expected a table like {{ kind = "dataloader_hang", at_batch = 6 }}, got {raw!r}')
        unknown = set(raw) - {"kind", "at_batch", "attempt", "rank"}
        if unknown:
            raise FaultError(f"unknown key {sorted(unknown)[0]!r}; expected kind, at_batch, attempt, rank")
        kind = raw.get("kind")
        if kind not in FAULT_KINDS:
            raise FaultError(f"kind: expected one of {', '.join(FAULT_KINDS)}, got {kind!r}")
        for key in ("at_batch", "attempt"):
            value = raw.get(key, 1 if key == "at_batch" else 0)
            if not isinstance(value, int) or isinstance(value, bool) or value < (1 if key == "at_batch" else 0):
                raise FaultError(f"{key}: expected a whole number >= {1 if key == 'at_batch' else 0}, got {value!r}")
        rank = raw.get("rank")
        if rank is not None and (not isinstance(rank, int) or isinstance(rank, bool) or rank < 0):
            raise FaultError(f"rank: expected a whole number >= 0 (a DDP rank), got {rank!r}")
        return cls(kind=kind, at_batch=raw.get("at_batch", 1), attempt=raw.get("attempt", 0), rank=rank)

    @classmethod
    def parse(cls, spec: str) -> "Fault":
        """``kind[,at_batch=N][,attempt=N][,rank=N]`` as used by ``--fault`` and YOLO_TRAIN_FAULT."""
        kind, *options = [part.strip() for part in spec.split(",")]
        raw: dict[str, Any] = {"kind": kind}
        for option in options:
            key, sep, value = option.partition("=")
            if not sep or not value.strip().isdigit():
                raise FaultError(f"{option!r} in {spec!r}: expected key=number, e.g. at_batch=6")
            raw[key.strip()] = int(value)
        return cls.from_dict(raw)

    def applies_to(self, attempt: int, rank: int | None = None) -> bool:
        return self.attempt in (0, attempt) and self.rank in (None, rank)

    def to_dict(self) -> dict[str, Any]:
        return {k: v for k, v in asdict(self).items() if v is not None}


def faults_from_env(environ=os.environ) -> list[Fault]:
    value = environ.get(ENV_FAULT, "").strip()
    return [Fault.parse(spec) for spec in value.split(";") if spec.strip()] if value else []
