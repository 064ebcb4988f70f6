"""The witness's word: where the training process's main thread waits while it makes no progress (worker/witness.py
reads it from the process's own frames and sends a ``WaitReport`` about twice a second), and what the watchdog and
the tiers make of it. Pure.

The witness is judged first; the tree's activity and the stacks come after it:

- a batch awaited from a loader worker this attempt reported: that worker's hang whatever its state (blocked,
  spinning, stopped): its stall is bounded as an idle tree's (``idle_floor``) and the in-place tier replaces that
  worker without reading the stacks;
- a device wait in training or validation (not before the first batch: a first step, a cuDNN or MIOpen search keep
  their own bound): bounded as an idle tree's too, over the phase's own intervals, whether the host spins or
  sleeps; the restart, since no loader is to blame;
- a wait on something outside the worker's processes (a socket, a file, a subprocess) or a sleep it chose, or a batch
  owed by a loader worker that itself waits on a socket or a remote or FUSE file (``TreeActivity.outside``): the
  phase's own bound, never the idle floor, whatever the tree does;
- a lock, a collective, anything else: the tree's activity decides the floor, as without a witness; the restart;
- no word in this stall (a plain script, a native call that holds the GIL, a stopped process): as without a witness.
"""

from __future__ import annotations

from dataclasses import dataclass

from supervisor.vocabulary import State
from worker.contract import WaitKind, WaitReport

OUTSIDE = frozenset({WaitKind.IO, WaitKind.SLEEP})  # waits on the world, or chosen: never an idle tree's bound


@dataclass(frozen=True)
class WaitSeen:
    """A report as the supervisor received it: from which rank (None outside DDP), and when (monotonic)."""
    report: WaitReport
    at: float
    rank: int | None = None


# The order in which the ranks' words tell a stall: a batch owed by a known loader worker names the culprit; a
# device wait the next; a rank in a collective or on a lock is most often waiting for another rank.
TELLING = (WaitKind.LOADER, WaitKind.DEVICE, WaitKind.ELSEWHERE, WaitKind.LOCK, WaitKind.COLLECTIVE, WaitKind.IO,
           WaitKind.SLEEP)


def telling(waits: dict[int | None, WaitSeen], loaders: dict[int, tuple[int | None, str]]
            ) -> tuple[WaitSeen | None, int | None]:
    """The word that tells this stall best among the senders' (one outside DDP, one a rank under it), and the loader
    worker it names as the culprit (None: none). ``waits`` holds a sender's word since its last progress only."""
    best, culprit = None, None
    for seen in waits.values():
        named = loader_culprit(seen.report, loaders)
        rank = (0, 0) if named is not None else (1, TELLING.index(seen.report.kind))
        if best is None or rank < best[0]:
            best, culprit = (rank, seen), named
    return (best[1] if best else None), culprit


def loader_culprit(report: WaitReport | None, loaders: dict[int, tuple[int | None, str]]) -> int | None:
    """The loader worker process the main thread waits for, where this attempt reported it; None otherwise."""
    if report is None or report.kind != WaitKind.LOADER or report.worker_pid not in loaders:
        return None
    return report.worker_pid


def idle_since(report: WaitReport | None, stall_since: float, tree_idle_since: float | None, state: State,
               culprit: int | None, outside: frozenset[int] = frozenset()) -> float | None:
    """From when the stall counts as an idle tree's for the idle floor (None: never in this stall). ``outside``: the
    tree's processes seen waiting on a socket or a remote file (a culprit among them waits on the world)."""
    if report is None:
        return tree_idle_since
    if report.kind in OUTSIDE or culprit is not None and culprit in outside:
        return None
    if culprit is not None or report.kind == WaitKind.DEVICE and state == State.HEALTHY:
        return stall_since
    return tree_idle_since


START_FACTOR = 2.0  # x the longest loader start of this run: what a new iterator may take for its first batch
START_UNSEEN = 10.0  # seconds: the bound before this run has seen a loader start (or with ``idle_floor = "off"``)


def loader_start_bound(seen: float | None, idle_floor: float | None) -> float:
    """Seconds a loader's new workers may take to their first batch: ``START_FACTOR`` x the longest start this run
    has seen, at least ``idle_floor``; ``START_UNSEEN`` before any was seen. It bounds an in-place rebuild (no batch
    within it: the restart) and a batch owed by workers made for a new pass (per-pass workers, validation's first)."""
    if not seen:
        return START_UNSEEN
    return max(START_UNSEEN if idle_floor is None else idle_floor, START_FACTOR * seen)


def describe(seen: WaitSeen) -> str:
    """One phrase for logs, status and incidents: "rank 1 waits for a batch from train loader worker 3 (pid 1234,
    batch 57) at dataloader.py:1300 in _try_get_data"."""
    who = "" if seen.rank is None else f"rank {seen.rank} "
    return who + _waits(seen.report)


def _waits(report: WaitReport) -> str:
    if report.kind == WaitKind.LOADER:
        which = f"{report.loader} " if report.loader else ""
        return (f"waits for a batch from {which}loader worker {report.worker} (pid {report.worker_pid}, batch "
                f"{report.batch_index}) at {report.where}")
    what = {WaitKind.COLLECTIVE: "in a collective", WaitKind.DEVICE: "for the device", WaitKind.LOCK: "on a lock",
            WaitKind.IO: "on I/O outside its processes", WaitKind.SLEEP: "in a sleep",
            WaitKind.ELSEWHERE: "in no known wait"}[report.kind]
    call = f" ({report.function})" if report.function else ""
    return f"waits {what}{call} at {report.where}"
