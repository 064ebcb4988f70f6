"""Which rungs of the ladder can change a hang, by where the training process said it waited (the witness,
witness.py): the ladder climbs where the evidence points (issue 38). Pure.

- a batch owed by a loader worker: the loader's rungs (workers, persistent workers, the threads loader, the start
  method);
- a device wait: the rungs that change the device's runtime (environment rungs, the forkserver, whose loader workers
  inherit no GPU runtime state), and ``val = false`` when it hung in validation;
- no known wait (a native call: ROCm's lost completion leaves the host spinning in a busy wait the witness cannot
  name): the environment rungs, and ``val = false`` in validation;
- the training process's own lock, or I/O outside its processes: no rung changes it, and it counts against no rung's
  record;
- a sleep (the wait the code chose says nothing of what it waits for: the faults that stand for the seeds' hangs in
  the training loop sleep), a collective, or no word at all: any rung, as without a witness.

A hang whose rungs the ladder lacks above the current one leaves the run where it is; one that no rung of the
ladder can change counts against none (its hang is not added to the rung's record).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from supervisor.decision.model.state import Supervision
from supervisor.decision.stall import witness
from worker.contract import Phase

LOADER_KEYS, RUNTIME_KEYS = witness.LOADER_KEYS, witness.RUNTIME_KEYS  # the loader's settings, the runtime's


@dataclass(frozen=True)
class Evidence:
    keys: frozenset[str] | None  # the rung settings that can change this hang; None: unknown, any rung
    why: str  # for the log line: "", or what the witness said and which rungs that weighs

    def changes(self, before: dict, after: dict) -> bool:
        """Whether moving from settings ``before`` to ``after`` changes what this hang depends on."""
        return self.keys is None or any(before.get(k) != after.get(k) for k in self.keys)


def of(s: Supervision) -> Evidence:
    """What the witness said of the hang under way (at its verdict: the attempt's words are still there)."""
    a = s.current
    seen, _ = witness.telling(a.waits, a.loaders)
    if seen is None:
        return Evidence(None, "")
    wait = witness.WAITS[seen.report.kind]  # the rungs its kind weighs
    if wait.weighs is None:
        return Evidence(None, "")
    val = frozenset({"val"}) if wait.weighs and a.progress.phase == Phase.VAL.value else frozenset()
    return Evidence(wait.weighs | val, f"the training process {witness.describe(seen)}: {wait.weighs_why}")


def eligible(s: Supervision, evidence: Evidence) -> Callable[[int], bool]:
    """Whether rung k changes what this hang depends on, against the current rung."""
    here = s.ladder.settings(s.rung)
    return lambda k: evidence.changes(here, s.ladder.settings(k))


def counts(s: Supervision, evidence: Evidence) -> bool:
    """Whether the hang counts against the current rung's record: some rung of the ladder could change it."""
    can = eligible(s, evidence)
    return evidence.keys is None or any(can(k) for k in range(len(s.ladder)) if k != s.rung)
