"""Which rungs of the ladder can change a hang, by where the training process said it waited (the witness,
witness.py): the ladder climbs where the evidence points (issue 38). Pure.

- a batch owed by a loader worker: the loader's rungs (workers, persistent workers, the threads loader, the start
  method);
- a device wait: the rungs that change the device's runtime (environment rungs, the forkserver, whose loader workers
  inherit no GPU runtime state), and ``val = false`` when it hung in validation;
- no known wait inside a native call (ROCm's lost completion leaves the host spinning in a busy wait the witness
  cannot name), its tree busy: the environment rungs, and ``val = false`` in validation; its tree idle (asleep in
  the call, as a lost completion interrupt leaves it): the rungs that change the device's runtime;
- the training process's own lock, its own loop of Python (no known wait, in no native call), or I/O outside its
  processes: no rung changes it, and it counts against no rung's record;
- the tree frozen (/proc shows the training process, under DDP the hung rank's, stopped: SIGSTOP from outside, a
  debugger): no rung changes it either;
- a sleep (the wait the code chose says nothing of what it waits for: the faults that stand for the seeds' hangs in
  the training loop sleep), a collective, or no word at all: any rung, as without a witness.

Under DDP the evidence is the hung rank's word (witness.hung_rank), never its peers', which wait for it in a collective.

Some of a rung's environment variables are weighed by their own evidence alone, whatever the hang's word (``GATED``):
``TORCH_BLAS_PREFER_HIPBLASLT=0`` (gfx12's rung) only by a GPU reset or page fault while the attempt trained (a kernel
line, ``RESET_OR_PAGE_FAULT``, or ROCr aborting on one, ``ROCR_FAULTS``), since it costs GEMM speed and cures nothing
else.

A hang whose rungs the ladder lacks above the current one leaves the run where it is; one that no rung of the
ladder can change counts against none (its hang is not added to the rung's record).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, Callable

from supervisor.decision.model.ladder import HIPBLASLT
from supervisor.decision.model.state import Supervision
from supervisor.decision.stall import witness
from worker.wire.contract import Phase, WaitKind

LOADER_KEYS, RUNTIME_KEYS = witness.LOADER_KEYS, witness.RUNTIME_KEYS  # the loader's settings, the runtime's

GATED = frozenset({HIPBLASLT})  # environment variables only their own evidence weighs
# kernel/catalogue.py's entries for a GPU reset (begun, done, a ring's) or a page fault (its status lines with it)
RESET_OR_PAGE_FAULT = frozenset({
    "amdgpu_reset_begin", "amdgpu_reset_succeeded", "amdgpu_vram_lost", "amdgpu_ring_reset",
    "amdgpu_ring_reset_succeeded", "amdgpu_page_fault", "amdgpu_l2_protection_fault", "amdgpu_utcl2_client",
    "amdgpu_vm_fault_legacy"})
ROCR_FAULTS = frozenset({"rocr_page_fault", "rocr_gpu_hang"})  # signatures.py: ROCr aborted on a fault, on a reset


@dataclass(frozen=True)
class Evidence:
    keys: frozenset[str] | None  # the rung settings that can change this hang; None: unknown, any rung
    why: str  # for the log line: "", or what the witness said and which rungs that weighs
    gated: frozenset[str] = frozenset()  # the GATED variables this hang's own evidence weighs

    def changes(self, before: dict, after: dict) -> bool:
        """Whether moving from settings ``before`` to ``after`` changes what this hang depends on (a GATED variable
        only where ``gated`` names it, whatever ``keys`` says)."""
        was, now = _ungated(before), _ungated(after)
        if any(was[1].get(k) != now[1].get(k) for k in self.gated):
            return True
        return self.keys is None and was[0] != now[0] or \
            self.keys is not None and any(was[0].get(k) != now[0].get(k) for k in self.keys)


def _ungated(settings: dict) -> tuple[dict[str, Any], dict[str, Any]]:
    """A rung's settings without the GATED variables in its env, and those variables."""
    env = settings.get("env") or {}
    plain = {k: v for k, v in settings.items() if k != "env"}
    rest = {k: v for k, v in env.items() if k not in GATED}
    if rest:
        plain["env"] = rest
    return plain, {k: v for k, v in env.items() if k in GATED}


def of(s: Supervision, kernel_said: bool = False) -> Evidence:
    """What the hang under way weighs: the witness's word (``witnessed``), and a GPU reset or page fault in training
    the hipBLASLt rung too."""
    evidence, fault = witnessed(s, kernel_said), s.current.gpu_fault
    if fault is None:
        return evidence
    said = f"a GPU reset or page fault in training ({fault}): {HIPBLASLT}=0"
    return replace(evidence, gated=frozenset({HIPBLASLT}), why=f"{evidence.why}; {said}" if evidence.why else said)


def witnessed(s: Supervision, kernel_said: bool = False) -> Evidence:
    """What the witness said of the hang under way (at its verdict: the attempt's words are still there).
    ``kernel_said``: the kernel reported the GPU hung, so a stopped tree is the driver's doing, not a stop from outside."""
    a = s.current
    if frozen(s) and not kernel_said:
        if a.ranks and not witness.all_stopped(a.ranks, a.stopped):
            return Evidence(frozenset(), f"rank {hung(s)}'s process is stopped (frozen from outside) while its peers "
                                         f"wait for it: no rung changes it")
        return Evidence(frozenset(), "every process of the training is stopped (the tree frozen from outside): no "
                                     "rung changes it")
    seen = told(s)
    if seen is None:
        return Evidence(None, "")
    wait = witness.WAITS[seen.report.kind]  # the rungs its kind weighs
    said = witness.describe(seen) if seen.rank is not None else f"the training process {witness.describe(seen)}"
    if seen.report.kind == WaitKind.ELSEWHERE and seen.report.function is None:
        return Evidence(frozenset(), f"{said}, a loop of its own: no rung changes it")
    if wait.weighs is None:
        return Evidence(None, "")
    weighs, why = wait.weighs, wait.weighs_why
    if seen.report.kind == WaitKind.ELSEWHERE:  # inside a native call: a busy wait only where the tree was busy
        if a.idle_since is not None:  # asleep in the call, as ROCm's lost completion interrupt leaves a wait:
            # polling the signals (an environment rung) or another runtime cures that, no loader setting does
            weighs, said, why = witness.RUNTIME_KEYS | {"env"}, f"{said}, its tree idle (no busy wait)", \
                "the rungs that change the device's runtime"
        else:
            said += ", its tree busy"
    val = frozenset({"val"}) if weighs and a.progress.phase == Phase.VAL.value else frozenset()
    return Evidence(weighs | val, f"{said}: {why}")


def frozen(s: Supervision) -> bool:
    """/proc shows the training process stopped: under DDP the hung rank's (its peers then wait for it in a
    collective; a process is only stopped by a signal or a debugger, which no rung changes), else the sender of its
    progress."""
    a = s.current
    if a.ranks:
        return hung(s) in witness.stopped_ranks(a.ranks, a.stopped)
    return a.progress_pid is not None and a.progress_pid in a.stopped


def hung(s: Supervision) -> int | None:
    """Under DDP the rank the others wait for (witness.hung_rank); None outside DDP."""
    a = s.current
    return witness.hung_rank(a.ranks, a.waits, a.loaders, a.stopped)


def told(s: Supervision) -> witness.WaitSeen | None:
    """The word that tells the hang: under DDP the hung rank's (None where it said nothing), else the best said."""
    a = s.current
    if a.ranks:
        return a.waits.get(hung(s))
    return witness.telling(a.waits, a.loaders)[0]


def eligible(s: Supervision, evidence: Evidence) -> Callable[[int], bool]:
    """Whether rung k changes what this hang depends on, against the current rung."""
    here = s.ladder.settings(s.rung)
    return lambda k: evidence.changes(here, s.ladder.settings(k))


def counts(s: Supervision, evidence: Evidence) -> bool:
    """Whether the hang counts against the current rung's record: some rung of the ladder could change it."""
    can = eligible(s, evidence)
    return evidence.keys is None or any(can(k) for k in range(len(s.ladder)) if k != s.rung)


def fault_seen(s: Supervision, name: str) -> None:
    """A GPU reset or page fault (a catalogue entry's or a signature's name): kept as the attempt's evidence where it
    came while the attempt trained."""
    a = s.current
    if a.gpu_fault is None and a.last_progress_at is not None and (name in RESET_OR_PAGE_FAULT or name in ROCR_FAULTS):
        a.gpu_fault = name
