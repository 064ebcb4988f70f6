"""The witness's word: where the training process's main thread waits while it makes no progress (worker/witness.py
reads it from the process's own frames and sends a ``WaitReport`` about twice a second), and what the watchdog and
the tiers make of it. Pure.

The witness is judged first; the tree's activity and the stacks come after it:

- a batch awaited from a loader worker this attempt reported: that worker's hang whatever its state (blocked,
  spinning, stopped): its stall is bounded by the loader's own rhythm (``watchdog.loader_wait_bound``: the idle
  floor until longer waits were seen to end) once that iterator gave a batch, as a loader start before
  (``loader_start_bound``), and the in-place tier replaces that worker without reading the stacks;
- a device wait once the attempt trains (not before the first batch: a first step, a cuDNN or MIOpen search keep
  their own bound): bounded by the device's own rhythm, whether the host spins or sleeps; the restart, since no
  loader is to blame;
- a wait on something outside the worker's processes (a socket, a file, a subprocess) or a sleep it chose, or a batch
  owed by a loader worker that itself waits on a socket or a remote or FUSE file (``TreeActivity.outside``): the
  phase's own bound, never the idle floor, whatever the tree does;
- a wait on another thread of the process (a join, a queue, a future, an event, a lock: ``WaitReport.chain``) is
  judged by the end of its chain (``end_of``): a thread that waits outside or sleeps, as above; one that runs code, or
  is blocked on a lock in turn (a deadlock), by the activity of the training thread and the chain's threads only;
- the main thread held at one place (``ELSEWHERE`` at one file and function, every word of the stall: a loop in
  Python, a native busy wait): bounded as an idle tree's, over the longest such stretch this run has seen end in
  that phase (``watchdog.one_place_bound``), whether the tree spins or sleeps; the restart;

each of these three is bounded as training's (validation's in validation: ``watchdog.evidence_phase``) whether the
stall began in training, in a mid-epoch checkpoint's save, at an epoch's end or at the next epoch's first batch;
- a lock, a collective, anything else: the tree's activity decides the floor, as without a witness; the restart;
- no word in this stall (a plain script, a stopped process): as without a witness;
- a witness that spoke in this attempt and then fell silent in this stall after a word of running code (``ELSEWHERE``)
  or none (``silent_from``): C code holds the GIL and the witness thread cannot run, so its last word does not stand
  for the silent stretch; the stretch is judged by the training thread's own CPU time: running, it is work until the
  phase's own bound; idle, a hang at the idle floor (``watchdog.due``), and its incident names the frame the
  stacks saw. A word of one place not said again within ``HELD_FRESH`` stands for nothing either.

The tree's activity is its threads': a device runtime's thread that spins (``contract.RUNTIME_THREADS``), and in the
training process every thread off the training thread's chain, is neither work nor the culprit; the incident says it
spun beside the hang (``beside``).
"""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass
from typing import Protocol

from supervisor.decision.model.state import Attempt, WaitSeen
from supervisor.vocabulary import State
from worker.wire.contract import DDP_BACKWARD, ChainLink, Phase, Via, WaitKind, WaitReport



@dataclass(frozen=True)
class Wait:
    """What one kind of wait means to the supervisor: a row of ``WAITS``."""
    words: str  # how a report of it is told ("waits {words} (function) at where"; a loader's names its worker)
    telling: int  # its order among the senders' words: the lowest tells the stall best
    hung: int | None  # its order as a rank's evidence of being the hung one (``SAYS_NOTHING`` between); None: a rank
    # so waiting waits for its peers, and is never the hung one
    outside: bool = False  # a wait on the world, or chosen: never an idle tree's bound, whatever the tree does
    rhythm: bool = False  # in a phase with a batch rhythm, bounded by the waits of its kind seen to end there
    # (``Supervision.device_waits_seen``), whatever the tree does
    weighs: frozenset[str] | None = None  # the rung settings that can change a hang it tells (None: any rung)
    weighs_why: str = ""  # what that says, for the log line of the rung a hang moves to
    names_loader: bool = False  # it blames a loader worker: the in-place tier's, and the stacks agree where they do
    ends: str = "work"  # what a chain of waits whose last thread waits so is: "work", "a deadlock" (a lock in turn,
    # nobody else to end it), "I/O", "a sleep" (``outside``: the phase's own bound)


LOADER_KEYS = frozenset({"workers", "persistent_workers", "loader", "threads", "start_method"})
RUNTIME_KEYS = frozenset({"env", "start_method"})
SAYS_NOTHING = 2  # a rank that says nothing while another spoke: stopped, or in native code that holds the GIL

# Every wait kind the witness reports, and what it means here. A new kind is its row here and the worker's rule that
# reports it (worker/witness.py). A batch owed by a known loader worker names the culprit; a device wait the next; a
# rank in a collective or on a lock is most often waiting for another rank.
WAITS: dict[WaitKind, Wait] = {
    WaitKind.LOADER: Wait("for a batch from a loader worker", 0, 0, weighs=LOADER_KEYS,
                          weighs_why="the loader's rungs", names_loader=True),
    WaitKind.DEVICE: Wait("for the device", 1, 1, rhythm=True, weighs=RUNTIME_KEYS,
                          weighs_why="the rungs that change the device's runtime"),
    WaitKind.ELSEWHERE: Wait("in no known wait", 2, 3, weighs=frozenset({"env"}),
                             weighs_why="only an environment rung (a native busy wait looks so)"),
    WaitKind.LOCK: Wait("on a lock", 3, 4, weighs=frozenset(), weighs_why="no rung changes it", ends="a deadlock"),
    WaitKind.COLLECTIVE: Wait("in a collective", 4, None),
    WaitKind.IO: Wait("on I/O outside its processes", 5, 5, outside=True, weighs=frozenset(),
                      weighs_why="no rung changes it", ends="I/O"),
    WaitKind.SLEEP: Wait("in a sleep", 6, 6, outside=True, ends="a sleep"),
}
OUTSIDE = frozenset(k for k, w in WAITS.items() if w.outside)
TRAINING_THREAD = "main"  # how a chain names the thread the witness watches (the training's, in our worker)
# How a thread of a chain waits on the next (contract.Via), in words: "main joins thread 'upload'"
VIA_WORDS = {Via.JOIN: "joins thread {}", Via.FUTURE: "waits for the future thread {} runs",
             Via.HOLDER: "waits on the lock thread {} holds",
             Via.STANDS_IN: "waits on what any thread may end; thread {} stands for its other end"}


def end_of(report: WaitReport) -> WaitKind:
    """The kind a wait is judged by: the last thread's of its chain where it waits on others, else its own."""
    return report.chain[-1].kind if report.chain else report.kind


def chain_threads(report: WaitReport | None) -> frozenset[int]:
    """The native ids of the training thread and the threads its wait's chain holds: the threads that count in the
    training process's activity (``TreeActivity``)."""
    if report is None or report.tid is None:
        return frozenset()
    return frozenset({report.tid, *(link.tid for link in report.chain if link.tid is not None)})
# The phases with a batch rhythm, where a device wait or one place is bounded by its own (watchdog.device_wait_bound):
# never an epoch's end (validation's set-up and its imports, the save), whose stretch is one of its kind
RHYTHM_PHASES = (Phase.TRAIN.value, Phase.VAL.value)
IMPORTING = "<frozen importlib."  # the innermost frame of an import under way: work, at no place of its own




def heard(before: WaitSeen | None, report: WaitReport, at: float, rank: int | None = None) -> WaitSeen:
    """A sender's word as received, after ``before`` (its word before in this stall; None: its first)."""
    place = place_of(report.where) if report.kind == WaitKind.ELSEWHERE and not report.where.startswith(IMPORTING) \
        else None
    if before is not None and before.place != place:
        place = None
    return WaitSeen(report, at, rank, place)


def place_of(where: str) -> str:
    """``where`` without its line number: "sitecustomize.py:32 in _bench_hang" -> "sitecustomize.py:_bench_hang"."""
    match = re.fullmatch(r"(.*):\d+ in (.*)", where)
    return f"{match[1]}:{match[2]}" if match else where


SILENT_AFTER = 1.5  # seconds: three of the witness's intervals (worker/witness.py INTERVAL) without a word
HELD_FRESH = 1.0  # seconds: a word of one place older than two intervals at its bound may be the witness's last


def silent_from(a: Attempt, stall_since: float, state: State, phase: str) -> float | None:
    """When the training process's witness fell silent in this stall (its thread cannot run: C code holds the GIL),
    or None: not training, or in a first batch of its phase (no rhythm of its own yet, as for idle_floor); it never
    spoke in this attempt (no witness); its process is stopped (/proc says so); or its last word is of a wait that
    releases the GIL (a loader, the device, a lock, a collective, I/O, a sleep), which it keeps saying. Outside DDP:
    a rank's silence is the ranks' naming's."""
    seen = a.waits.get(None)  # its word in this stall (None: none yet; it speaks after one interval of a stall)
    if state != State.HEALTHY or phase in RHYTHM_PHASES and not a.intervals.get(phase) or not a.witness_heard \
            or a.ranks or {a.progress_pid, a.worker_pid} & a.stopped \
            or seen is not None and seen.report.kind != WaitKind.ELSEWHERE:
        return None
    return max(stall_since, seen.at if seen is not None else stall_since) + SILENT_AFTER


def silence(seconds: float, idle: bool) -> str:
    """The phrase of a stall the witness fell silent in, for the verdict's detail and the incident's ``witness``."""
    thread = "idle" if idle else "busy"
    return (f"the training process's witness said nothing for the last {seconds:.1f} s (C code holding the GIL: its "
            f"thread cannot run), the training thread {thread}")


def held_at(seen: WaitSeen | None, culprit: int | None, state: State, phase: str) -> str | None:
    """The place (``place_of``) where the training process's main thread has been held for the whole of this stall
    in ``phase`` (its evidence's: ``watchdog.evidence_phase``), by the word that tells it, once it trains and in a phase of
    ``RHYTHM_PHASES``; None: not so."""
    if seen is None or culprit is not None or state != State.HEALTHY or seen.report.kind != WaitKind.ELSEWHERE \
            or phase not in RHYTHM_PHASES:
        return None
    return seen.place


def still_said(waits: dict[int | None, WaitSeen], ranks: dict[int, Rank], progress_pid: int | None,
               stopped: frozenset[int]) -> dict[int | None, WaitSeen]:
    """The words whose sender /proc does not show stopped (TreeActivity's ``stopped``): a rank's process under DDP,
    else the training process (the sender of its progress, ``progress_pid``). A stopped sender's word is from before
    the stop (a SIGSTOP, a debugger): its stall is a stopped process's, said by /proc, not where it last waited."""
    def sender(seen: WaitSeen) -> int | None:
        return progress_pid if seen.rank is None else getattr(ranks.get(seen.rank), "pid", None)
    return {r: seen for r, seen in waits.items() if sender(seen) not in stopped}




def telling(waits: dict[int | None, WaitSeen], loaders: dict[int, tuple[int | None, str]]
            ) -> tuple[WaitSeen | None, int | None]:
    """The word that tells this stall best among the senders' (one outside DDP, one a rank under it), and the loader
    worker it names as the culprit (None: none). ``waits`` holds a sender's word since its last progress only."""
    best, culprit = None, None
    for seen in waits.values():
        named = loader_culprit(seen.report, loaders)
        rank = (0, 0) if named is not None else (1, WAITS[seen.report.kind].telling)
        if best is None or rank < best[0]:
            best, culprit = (rank, seen), named
    return (best[1] if best else None), culprit


def loader_culprit(report: WaitReport | None, loaders: dict[int, tuple[int | None, str]]) -> int | None:
    """The loader worker process the main thread waits for, where this attempt reported it; None otherwise."""
    if report is None or not WAITS[report.kind].names_loader or report.worker_pid not in loaders:
        return None
    return report.worker_pid


@dataclass(frozen=True)
class Word:
    """The witness's word on the stall under way, read once for it: the word that tells it best (None: none said),
    the loader worker that word names (None: none), and from when the stall counts as an idle tree's for the idle
    floor (None: never in this stall). Where it holds the main thread at one place is the watchdog's to bound
    (``watchdog.Stall.one_place``), by the evidence's phase rather than the stall's."""
    seen: WaitSeen | None
    culprit: int | None
    idle_since: float | None
    silent: float | None = None  # from when the training process's witness is silent in it (``silent_from``)


def word_on(a: Attempt, *, stall_since: float, state: State, phase: str) -> Word:
    """The witness's word on attempt ``a``'s stall since ``stall_since``, in ``phase`` (the stall's: a device wait
    counts as an idle tree's in ``RHYTHM_PHASES`` only). A culprit among the tree's processes seen waiting on a socket
    or a remote file (``Attempt.waits_outside``) waits on the world."""
    seen, culprit = telling(a.waits, a.loaders)
    held = held_at(seen, culprit, state, phase)
    report = seen.report if seen is not None else None
    if report is None:
        idle = a.idle_since
    elif end_of(report) in OUTSIDE or culprit is not None and culprit in a.waits_outside:
        idle = None
    elif culprit is not None or held is not None or WAITS[report.kind].rhythm and state == State.HEALTHY \
            and phase in RHYTHM_PHASES:
        idle = stall_since
    else:
        idle = a.idle_since
    return Word(seen, culprit, idle, silent_from(a, stall_since, state, phase))


class Rank(Protocol):
    """What the ranks' naming reads of a rank (decision/model/state.py's RankView)."""
    pid: int
    last_progress_at: float | None


@dataclass(frozen=True)
class RankWait:
    """Where one rank waits in this stall, as status --json (``watchdog.ranks``) and the incident (``ranks``) say."""
    rank: int
    pid: int | None
    waiting: str | None  # its witness's word since its last progress (``describe``); None: it said nothing
    waiting_kind: str | None  # that wait's kind: loader, collective, device, lock, io, sleep, elsewhere, STOPPED


STOPPED = "stopped"  # a rank's waiting_kind where /proc shows its process stopped (state T or t) and it said nothing


def by_rank(ranks: dict[int, Rank], waits: dict[int | None, WaitSeen],
            stopped: frozenset[int] = frozenset()) -> list[RankWait]:
    """Every rank that spoke in this attempt, in rank order, with its word in this stall; one that said nothing and
    whose process ``stopped`` holds (TreeActivity) is said to be stopped."""
    out = []
    for r, view in sorted(ranks.items()):
        seen = waits.get(r)
        if seen is None and view.pid in stopped:
            out.append(RankWait(r, view.pid, f"rank {r} (pid {view.pid}) is stopped", STOPPED))
            continue
        out.append(RankWait(r, view.pid, None if seen is None else describe(seen),
                            None if seen is None else seen.report.kind.value))
    return out


def stopped_ranks(ranks: dict[int, Rank], stopped: frozenset[int]) -> list[int]:
    """The ranks whose process /proc shows stopped (TreeActivity's ``stopped``), in rank order."""
    return [r for r, view in sorted(ranks.items()) if view.pid in stopped]


def all_stopped(ranks: dict[int, Rank], stopped: frozenset[int]) -> bool:
    """Every rank's process is stopped: the whole tree frozen (SIGSTOP from outside, a debugger), no rank hung."""
    return bool(ranks) and len(stopped_ranks(ranks, stopped)) == len(ranks)


FROZEN = "every rank's process is stopped (the whole tree frozen)"




def hung_rank(ranks: dict[int, Rank], waits: dict[int | None, WaitSeen],
              loaders: dict[int, tuple[int | None, str]], stopped: frozenset[int] = frozenset()) -> int | None:
    """The rank the others wait for. A rank in a collective waits for its peers, so the hung one is among the others:
    first a rank whose loader worker owes its batch, then a device wait, then a rank that says nothing while another
    spoke (stopped, or in native code that holds the GIL: its witness cannot run), then elsewhere, a lock, I/O, a
    sleep; between ranks alike, the one whose progress is the oldest. A rank whose process is ``stopped`` counts as one
    that says nothing, whether another spoke or not. When every rank waits in a collective (or every rank is stopped):
    the one whose progress is the oldest. None outside DDP."""
    if not ranks:
        return None
    said = {r: w for r, w in waits.items() if r is not None and r in ranks}

    def oldest(r: int) -> float:
        at = ranks[r].last_progress_at
        return float("-inf") if at is None else at

    candidates = []
    for r in ranks:
        seen = said.get(r)
        if seen is None:
            order = SAYS_NOTHING if said or ranks[r].pid in stopped else None
        else:
            order = WAITS[seen.report.kind].hung
        if order is not None:
            candidates.append((order, oldest(r), r))
    if candidates:
        return min(candidates)[2]
    return min(ranks, key=lambda r: (oldest(r), r))


def ranks_phrase(ranks: dict[int, Rank], waits: dict[int | None, WaitSeen],
                 loaders: dict[int, tuple[int | None, str]], stopped: frozenset[int] = frozenset()) -> str | None:
    """The ranks named, the hung one first: "rank 1 waits for the device (synchronize) at ...; rank 0 waits in a
    collective (all_reduce) at ... for rank 1"; "every rank's process is stopped (the whole tree frozen): rank 0
    (pid N), rank 1 (pid M)". None without DDP, or when no rank said anything and none is stopped."""
    if all_stopped(ranks, stopped):
        return f"{FROZEN}: " + ", ".join(f"rank {r} (pid {ranks[r].pid})" for r in sorted(ranks))
    hung = hung_rank(ranks, waits, loaders)
    if hung is None or not any(r in ranks for r in waits if r is not None) and not stopped_ranks(ranks, stopped):
        return None
    parts = []
    for r in [hung, *(r for r in sorted(ranks) if r != hung)]:
        seen = waits.get(r)
        if seen is None and ranks[r].pid in stopped:
            parts.append(f"rank {r} (pid {ranks[r].pid}) is stopped (/proc says so)")
            continue
        if seen is None:
            parts.append(f"rank {r} (pid {ranks[r].pid}) says nothing: stopped, or in native code that holds the GIL")
            continue
        waiting_for = f" for rank {hung}" if r != hung and WAITS[seen.report.kind].hung is None else ""
        parts.append(describe(seen) + waiting_for)
    return "; ".join(parts)


def rank_fields(ranks: dict[int, Rank], waits: dict[int | None, WaitSeen], loaders: dict[int, tuple[int | None, str]],
                stopped: frozenset[int] = frozenset()) -> dict:
    """An incident's ``hung_rank``, ``ranks`` and ``witness`` under DDP (``tier.witness_fields``, for every tier):
    {} without DDP, or when no rank said anything in this stall and none is stopped. Every rank stopped (the whole
    tree frozen): ``hung_rank`` is the one whose progress is the oldest, as when every rank waits in a collective."""
    said = any(r in ranks for r in waits if r is not None)
    if not ranks or not said and not stopped_ranks(ranks, stopped):
        return {}
    return {"hung_rank": hung_rank(ranks, waits, loaders, stopped),
            "ranks": tuple(asdict(w) for w in by_rank(ranks, waits, stopped)),
            "witness": ranks_phrase(ranks, waits, loaders, stopped)}


START_FACTOR = 2.0  # x the longest loader start of this run: what a new iterator may take for its first batch
START_FLOOR = 10.0  # seconds: the least bound of a loader start with ``idle_floor = "off"``


def loader_start_bound(seen: float | None, idle_floor: float | None, unseen: float | None) -> float:
    """Seconds a loader's new workers may take to their first batch: ``START_FACTOR`` x the longest start this
    attempt has seen (``Attempt.loader_start_seen``: its rung's start method and worker count), at least
    ``idle_floor``; before any was seen, ``unseen``: the startup's bound (``startup_timeout``), since a "spawn"
    worker is an interpreter importing torch, seconds on an idle machine and many more under load (``START_FLOOR``
    with it off). It bounds an in-place rebuild (no batch within it: the restart) and a batch owed by a new
    iterator's workers before its first (per-pass workers, validation's first), whatever the phase's own bound."""
    if not seen:
        return START_FLOOR if unseen is None else unseen
    return max(START_FLOOR if idle_floor is None else idle_floor, START_FACTOR * seen)


def describe(seen: WaitSeen) -> str:
    """One phrase for logs, status and incidents: "rank 1 waits for a batch from train loader worker 3 (pid 1234,
    batch 57) at dataloader.py:1300 in _try_get_data"."""
    who = "" if seen.rank is None else f"rank {seen.rank} "
    return who + _waits(seen.report)


def _waits(report: WaitReport) -> str:
    if WAITS[report.kind].names_loader:
        which = f"{report.loader} " if report.loader else ""
        return (f"waits for a batch from {which}loader worker {report.worker} (pid {report.worker_pid}, batch "
                f"{report.batch_index}) at {report.where}")
    if report.kind == WaitKind.COLLECTIVE and report.function == DDP_BACKWARD:
        return f"waits in {DDP_BACKWARD} at {report.where}"
    call = f" ({report.function})" if report.function else ""
    return f"waits {WAITS[report.kind].words}{call} at {report.where}" + "".join(
        _link(before.thread if before else TRAINING_THREAD, link, last=link is report.chain[-1])
        for before, link in zip((None, *report.chain), report.chain))


def _link(before: str, link: ChainLink, last: bool) -> str:
    """"; main joins thread 'upload'; 'upload' waits on a socket to 127.0.0.1:18765 (recv) at ..." """
    if link.kind == WaitKind.IO and link.peer:
        what = f"waits on a socket to {link.peer}"
    elif link.kind == WaitKind.ELSEWHERE:
        what = "runs on a CPU" if link.busy else "runs code"
    else:
        what = f"waits {WAITS[link.kind].words}"
    call = f" ({link.function})" if link.function else ""
    end = f"; the chain ends in {WAITS[link.kind].ends}" if last else ""
    return (f"; {before} {VIA_WORDS[link.via].format(repr(link.thread))}; '{link.thread}' {what}{call} at "
            f"{link.where}{end}")


def beside(spun: tuple[str, ...]) -> str:
    """The threads that spun beside a hang, for its incident's ``witness``; "" where none did."""
    return (f"; beside it, thread {', '.join(spun)} spun on a CPU: a runtime's or off the training thread's chain, "
            f"neither work nor the culprit") if spun else ""
