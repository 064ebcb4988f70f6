"""The watchdog: when it fires next (``deadline``), and how long the current phase may go without progress.

The timeouts are pure functions of the configuration and the intervals observed in the current attempt. An ``auto``
timeout is max(auto_floor, auto_factor x the slowest of the recent intervals of that phase), so it
tracks the machine and the rung (``workers = 0`` is several times slower per batch than ``workers = 8``)
without anyone tuning it. Intervals are kept per attempt for that reason. While the worker's whole process tree
does nothing at all (``TreeActivity``), ``idle_floor`` stands for ``auto_floor`` (``current_stall``): a training that
works runs, so a stall in which nothing runs is a hang well before 10 s. The witness's word comes first
(witness.py): a batch owed by a known loader worker, a device wait or the main thread held at one place is bounded so
whatever the tree does, a wait on something outside the worker's processes never is.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, replace
from enum import Enum
from typing import Callable, Iterable

from supervisor.config import AUTO, WatchdogConfig
from supervisor.decision.model.state import Supervision
from supervisor.decision.stall import kernel_search, witness
from supervisor.vocabulary import STARTUP_PHASE, State
from worker.wire.contract import Phase, StartupStep, WaitKind, split_rung

# Whether a verdict now, in a phase and with the witness's word on the stall, would go to a recovery tier that reads
# the stall's stacks itself or needs none (``RecoveryTier.reads_own_stacks``, asked by recovery/__init__.py, where the
# tiers are known): then none are read ahead of it.
OwnStacks = Callable[[Supervision, str, witness.Word], bool]


class DeadlineKind(Enum):
    """Which timeout the next deadline is; the agent sleeps until it, ``core._tick`` acts on its kind."""
    BACKOFF = "backoff"  # the wait after a crash is over: spawn
    STARTUP = "startup"  # a startup step (spawn to the first training batch) made no progress in its bound
    PHASE = "phase"  # no progress within the current phase's timeout
    KERNEL_CONFIRM = "kernel confirm"  # a kernel line's confirm window passed without progress
    SAVE = "save"  # a stop's checkpoint did not come within save_timeout
    SAVE_STALLED = "save stalled"  # while asked to save, the worker stopped progressing: it is hung
    RECOVERY = "recovery"  # a recovery tier's deadline for its proof (tier.py) passed: escalate to the next
    SURVIVORS = "survivors"  # survivors of SIGKILL waited for (survivors.py) are still there: the run ends
    STACKS_AHEAD = "stacks ahead"  # a stall nears its verdict: its stacks are read now, not between it and the kill


@dataclass(frozen=True)
class Deadline:
    at: float | None  # monotonic; None: nothing is due
    kind: DeadlineKind | None = None
    label: str = ""  # for display only: "train auto", "startup_timeout", ...


def auto_timeout(cfg: WatchdogConfig, intervals: Iterable[float], floor: float | None = None) -> float:
    """max(floor, auto_factor x the slowest interval); the floor is ``auto_floor`` unless an idle tree lowers it."""
    slowest = max(intervals, default=0.0)
    return max(cfg.auto_floor if floor is None else floor, cfg.auto_factor * slowest)


def startup_step_timeout(cfg: WatchdogConfig, step: str, seen: float | None,
                         floor: float | None = None) -> tuple[float | None, str]:
    """A startup step since its clock started (its entry, or its last progress): ``startup_timeout`` until this run
    has seen that step once, then max(auto_floor, auto_factor x its slowest seen), never more than
    ``startup_timeout`` (the seeds' most frequent hang came at the same point before the first batch on every resume:
    the first batch's own bound finds it, whatever the scan or the imports before it took)."""
    if seen is None or cfg.startup_timeout is None:
        return cfg.startup_timeout, "startup_timeout"
    observed = auto_timeout(cfg, [seen], floor)
    return (observed, f"{step} auto") if observed < cfg.startup_timeout else (cfg.startup_timeout, "startup_timeout")


def phase_timeout(cfg: WatchdogConfig, phase: str, intervals: dict[str, deque],
                  epoch_end_seen: float | None = None, checkpoint_seen: float | None = None,
                  floor: float | None = None) -> tuple[float | None, str]:
    """Seconds the worker may spend in ``phase`` since its last progress, and how that was decided.

    The end of an epoch (``save``: the epoch's last batch, validation's set-up, the save, the next epoch's loader)
    has no rhythm of its own: ``save_timeout`` holds until one epoch end has been observed, then the longest gap
    seen there bounds it like a batch interval. A mid-epoch checkpoint is bounded alike by the longest seen of its
    own (``checkpoint_seen``, given only for one), and until then as an epoch's end: a hold of 0.1 s must not bound
    an epoch's end, nor wait for one to be seen. ``floor`` replaces ``auto_floor`` over a phase's own intervals
    only: validation's first batch, bounded by training's, keeps it, and so does an attempt's first batch interval,
    with none seen yet (a step of 4 s, the host asleep in its device wait, is no hang at 3 s in every attempt)."""
    if phase == "save" and checkpoint_seen is not None and cfg.save_timeout is not None:
        observed = auto_timeout(cfg, [checkpoint_seen], floor)
        return (observed, "checkpoint auto") if observed < cfg.save_timeout else (cfg.save_timeout, "save_timeout")
    if phase == "train":
        configured, samples = cfg.stall_timeout, intervals.get("train", ())
        floor = floor if samples else None
    elif phase == "val":
        configured = cfg.val_timeout
        samples = intervals.get("val") or intervals.get("train", ())
        floor = floor if intervals.get("val") else None
    elif phase == "save" and epoch_end_seen is not None and cfg.save_timeout is not None:
        observed = auto_timeout(cfg, [epoch_end_seen], floor)
        return (observed, "save auto") if observed < cfg.save_timeout else (cfg.save_timeout, "save_timeout")
    elif phase in ("save", "ending", "done"):
        # The ending (best.pt's load and the final validation's set-up here, another host's final validation for a
        # host trained through) is seen once per run: nothing observed bounds it, the configured save_timeout does.
        return cfg.save_timeout, "save_timeout"
    else:  # setup: only before the first training batch, which the startup timeout covers
        return cfg.startup_timeout, "startup_timeout"
    if configured == AUTO:
        return auto_timeout(cfg, samples, floor), f"{phase} auto"
    return configured, f"{phase} timeout"


def due(s: Supervision, stall: Stall | None) -> Deadline:
    """When the watchdog fires next with ``stall`` under way (``current_stall``), and which timeout that is."""
    if s.state == State.BACKOFF:
        return Deadline(s.backoff_until, DeadlineKind.BACKOFF, "backoff")
    if s.state == State.STOPPING and s.stop is not None and s.stop.survivors_until is not None:
        return Deadline(s.stop.survivors_until, DeadlineKind.SURVIVORS, "survivor_timeout")
    if s.saving():
        # Waiting for the checkpoint asked for; a worker that stalls meanwhile is hung and cannot save.
        a = s.current
        at = Deadline(s.stop.save_until, DeadlineKind.SAVE, "stop save_timeout")
        if a.last_progress_at is not None:
            t, _ = phase_timeout(s.config.watchdog, a.progress.phase, a.intervals, s.epoch_end_seen)
            if t is not None and a.last_progress_at + t < at.at:
                at = Deadline(a.last_progress_at + t, DeadlineKind.SAVE_STALLED, "stop stalled")
        return at
    r = s.current.recovery
    if s.state == State.HEALTHY and r is not None:
        bound = r.tier.deadline(s, r)
        if bound is None:
            return Deadline(None)  # waiting for the shell, which answers at once
        return Deadline(bound[0], DeadlineKind.RECOVERY, f"{r.tier.name.label} bound")
    return _confirmed(s, stall.bound if stall is not None else Deadline(None))


def _judged(s: Supervision, stall: Stall) -> Deadline:
    """The stall's bound as its verdict is due: its own (``Stall.deadline``), shortened by the witness's evidence,
    else by an idle tree, or by a witness fallen silent."""
    a, w, word = s.current, s.config.watchdog, stall.word
    at = stall.deadline
    if stall.searching:
        return at  # a kernel search's: the witness and the tree say nothing of it
    if stall.owed is not None:  # the judge's doubt at this point: the phase's own bound, as a search's gets its own
        return replace(at, label=f"{at.label}, {point_bound_phrase(stall.owed)}")
    evidence = witness_bound(s, stall)
    if evidence is not None:
        bound, why, start = evidence
        # A new iterator's first batch is its workers' start, which the phase's rhythm says nothing of (validation's
        # first batch has none yet: auto_floor): its start's bound holds, longer or shorter (issue 57.9).
        at = Deadline(bound, at.kind, f"{at.label}, {why}") if at.at is None or bound < at.at or start else at
    elif stall.idle_bound is not None and word.idle_since is not None:  # the tree's activity decides the floor
        idle_bound, floor = stall.idle_bound, w.idle_floor
        if word.seen is not None and witness.end_of(word.seen.report) == WaitKind.LOCK \
                and (named := named_floor(s, evidence_phase(s))) < floor:
            idle_bound = floor = named  # a lock nobody else will end, in a training of short batches: theirs
        bound = max(stall.since + idle_bound, word.idle_since + floor)
        why = "idle" if word.idle_since == a.idle_since else f"witness: {word.seen.report.kind.value}"
        at = Deadline(bound, at.kind, f"{at.label}, {why}") if bound < at.at else at
    if word.silent is not None and (at.at is None or at.at >= word.silent):
        at = silent_bound(s, stall, word.silent)  # the witness did not speak through to its verdict
    return at


def _confirmed(s: Supervision, at: Deadline) -> Deadline:
    """``at``, or a kernel line's confirm window where that ends first."""
    a = s.current
    if a.suspicion is not None and s.state in (State.STARTING, State.HEALTHY):
        confirm = a.suspicion.since + s.config.kernel_log.confirm_window
        if at.at is None or confirm < at.at:
            return Deadline(confirm, DeadlineKind.KERNEL_CONFIRM, "kernel confirm window")
    return at


def silent_bound(s: Supervision, stall: Stall, silent: float) -> Deadline:
    """A stall the witness fell silent in (C code holds the GIL) is judged by the training thread's own CPU time
    (``Attempt.thread_idle_since``): running, it works until the phase's own bound; idle (and no process of the tree
    waiting on the world), it is a hang at the idle floor, in every phase."""
    a, own, floor = s.current, stall.deadline, s.config.watchdog.idle_floor
    if a.thread_idle_since is not None and floor is not None and not a.waits_outside:
        at = max(silent, a.thread_idle_since + floor)
        if own.at is None or at < own.at:
            return Deadline(at, own.kind, f"{own.label}, witness silent, idle")
    return own


def _stacks_at(s: Supervision, stall: Stall, due: Deadline, own_stacks: OwnStacks) -> float | None:
    """When the stacks of ``stall`` are read ahead of its verdict (stacks_ahead.py): once it has lasted its
    bound less a lead, the capture's budget (``[incidents] stacks_budget``) at most half the bound (an idle floor of
    3 s reads them at 1.5 s), so the verdict kills at once. Only where that verdict would read them before its kill
    (``[incidents] stacks``, a hang's stall that goes to the restart, not to the in-place tier, which reads its own
    or needs none), and once per stall: again only where its bound grew past the reading by more than the lead.
    None: not in this stall, or read already. ``due``: the watchdog's deadline with this stall; ``own_stacks``: the
    tiers' answer (``RecoveryTier.reads_own_stacks``)."""
    a = s.current
    if not s.config.incidents.stacks or s.state not in (State.STARTING, State.HEALTHY) or a.worker_pid is None \
            or a.recovery is not None:
        return None
    if due.at is None or due.kind not in (DeadlineKind.PHASE, DeadlineKind.STARTUP):
        return None
    phase = STARTUP_PHASE if s.state == State.STARTING else a.progress.phase
    if own_stacks(s, phase, stall.word):
        return None
    at = due.at - min(s.config.incidents.stacks_budget, (due.at - stall.since) / 2)
    read = a.stacks_ahead
    if read is not None and read.since == stall.since and read.at >= at:
        return None
    return at


def witness_bound(s: Supervision, stall: Stall) -> tuple[float, str, bool] | None:
    """When ``stall`` is a hang by the witness's evidence, that evidence in a phrase, and whether it is a loader's
    start (a bound of its own, not a shortening of the phase's); None: the evidence bounds nothing (no word, a wait
    outside the tree, a lock or a collective: the tree decides).

    The evidence is bounded as in training or validation (``evidence_phase``) whatever the phase the stall began in:
    an epoch's end, a mid-epoch checkpoint's save, the next epoch's first batch (the one place only once "train" is
    said again). A batch owed by a named loader worker
    is its loader's rhythm (``loader_wait_bound``) once its iterator gave a batch, a loader start's before
    (``witness.loader_start_bound``, from this attempt's own starts); a device wait the device's; the main thread held
    at one place that loop's. An attempt's first batch (STARTING) and validation's first keep their own bounds: no
    rhythm is known there yet."""
    a, since, seen, culprit = s.current, stall.since, stall.word.seen, stall.word.culprit
    if seen is None or s.state != State.HEALTHY:
        return None
    phase = evidence_phase(s)
    if culprit is not None:
        if culprit in a.waits_outside:
            return None  # it waits on the world (a socket, a remote file): the phase's own bound
        if seen.report.batch_index:
            return since + loader_wait_bound(s, phase), f"witness: {seen.report.kind.value}", False
        w = s.config.watchdog
        return since + witness.loader_start_bound(a.loader_start_seen, w.idle_floor, w.startup_timeout), \
            "witness: a loader start", True
    if not a.intervals.get(phase):
        return None  # the attempt's second batch, validation's first: a first step's kernels, no rhythm yet
    if witness.WAITS[seen.report.kind].rhythm:
        return since + device_wait_bound(s, phase), f"witness: {seen.report.kind.value}", False
    if stall.one_place is not None:
        # Held at one place to the bound only where the witness said so lately: a word older than HELD_FRESH may be
        # its last before C code took the GIL (a pickle.dumps after a loop), which its silence then judges.
        bound = since + one_place_bound(s, phase)
        if bound > seen.at + witness.HELD_FRESH:
            bound = max(bound, seen.at + witness.SILENT_AFTER)
        return bound, "witness: one place", False
    return None


def held_place(s: Supervision, seen: witness.WaitSeen | None, culprit: int | None) -> str | None:
    """Where the witness held the main thread for the whole stall, bounded as training's or validation's
    (``witness.held_at``); None: not so. Not while the save stretch is said: validation's set-up and the save hold one
    place for seconds after a resume; from the next "train" on (the next epoch's first forward, after
    a mid-epoch checkpoint) it is training's. Nor once trained through (the ending, done): a rank's teardown holds one
    place while its peers end theirs (rank 1 in Ultralytics' ``_clear_memory`` while rank 0 validates best.pt), seen
    once per run; ``save_timeout`` bounds it."""
    if s.current.progress.phase in (Phase.SAVE.value, Phase.ENDING.value, Phase.DONE.value):
        return None
    return witness.held_at(seen, culprit, s.state, evidence_phase(s))


def evidence_phase(s: Supervision) -> str:
    """The phase whose rhythm bounds the witness's evidence in the current stall: validation's in validation,
    training's everywhere else once the attempt trains (an epoch's end and a save are training's stretches too: a
    process spinning after a save is no save)."""
    return Phase.VAL.value if s.current.progress.phase == Phase.VAL.value else Phase.TRAIN.value


def stall_phase(s: Supervision) -> str:
    """The phase the current stall is bounded as: an epoch's end (``save``) until the next epoch's first batch."""
    return Phase.SAVE.value if s.current.train_resuming else s.current.progress.phase


def device_wait_bound(s: Supervision, phase: str) -> float:
    """A device wait the witness reports in ``phase`` (training's, validation's: never a first step, whose kernel
    search keeps its startup bound, nor validation's first batch, which has no rhythm yet) is bounded by the device
    waits this run has seen end in that phase: ``auto_factor`` x the longest, at least ``named_floor`` (the idle
    floor, lowered by short batches). The waits under the witness's interval are never seen: a kernel that never
    ends in a phase whose syncs take milliseconds is found at the floor, whether the host spins or sleeps."""
    return _rhythm_bound(s, s.device_waits_seen, phase, named_floor(s, phase))


def one_place_bound(s: Supervision, phase: str) -> float:
    """A stall in ``phase`` for whose whole the witness put the main thread at one place (``witness.held_at``: a
    loop in Python, a native busy wait; training's and validation's, as ``device_wait_bound``'s, with its
    exceptions) is bounded by the stalls held at one place this run has seen end in that phase: ``auto_factor`` x
    the longest, at least ``idle_floor``. A training process spinning for ever is found at the floor though its
    tree is busy; a long legitimate loop, once seen to end, is not killed at its length again."""
    return _rhythm_bound(s, s.one_place_seen, phase)


def loader_wait_bound(s: Supervision, phase: str) -> float:
    """A batch owed by a named loader worker whose iterator has given batches (the witness's ``batch_index`` past
    0) is bounded by the waits for such batches this run has seen end in ``phase``: ``auto_factor`` x the longest, at
    least ``named_floor``. Not by the batch intervals: an attempt's first steps are slow for the model's sake, and a
    loader hang in its first epoch was found at 10 x those."""
    return _rhythm_bound(s, s.loader_waits_seen, phase, named_floor(s, phase))


NAMED_LEAST = 1.5  # seconds: a named wait's floor never under this (three of the witness's intervals)
NAMED_EVIDENCE = 20  # batch intervals of the phase in this attempt before they may lower a named wait's floor


def named_floor(s: Supervision, phase: str) -> float:
    """The floor of a wait the witness names (a batch owed by a loader worker, the device, a lock nobody else will
    end) in ``phase`` (issue 59.3): each such wait that ended inside a batch was shorter than that batch, so where
    this attempt has ``NAMED_EVIDENCE`` batch intervals of the phase, ``auto_factor`` x the slowest of them, at least
    ``NAMED_LEAST`` and at most the idle floor (a fast GPU's batches: below the idle floor); else the idle floor
    (``auto_floor`` with ``idle_floor = "off"``). Waits of the kind seen to end longer raise its bound over this
    (``device_wait_bound``, ``loader_wait_bound``)."""
    w = s.config.watchdog
    if w.idle_floor is None:
        return w.auto_floor
    intervals = s.current.intervals.get(phase) or ()
    if len(intervals) < NAMED_EVIDENCE:
        return w.idle_floor
    return min(w.idle_floor, max(NAMED_LEAST, w.auto_factor * max(intervals)))


def _rhythm_bound(s: Supervision, seen: dict[str, float], phase: str, floor: float | None = None) -> float:
    w = s.config.watchdog
    if floor is None:
        floor = w.idle_floor if w.idle_floor is not None else w.auto_floor
    return max(floor, w.auto_factor * seen.get(phase, 0.0))


@dataclass(frozen=True)
class Stall:
    """The stretch without news the watchdog bounds now, judged once per decision (``current_stall``): a startup
    step, or a phase since its last progress. The tick carries it to its verdict, the verdict to the recovery tier
    (``tier.Verdict``), and the tier to the hang's incident (``tier.witness_fields``)."""
    since: float  # monotonic: when its clock started
    deadline: Deadline  # its own bound (the phase's or the startup step's) over auto_floor
    idle_bound: float | None  # its bound over idle_floor, where that is shorter: an idle tree's, from ``since``
    # Several hosts: the idle bound a stall would get with a rank of this host stopped, where none is as far as the
    # core knows; the tree is read for it (``tree_reading_from``). None: none to get.
    frozen_bound: float | None = None
    # the witness's word on it: the word that tells it, the loader worker it names (the culprit), from when the stall
    # counts as an idle tree's, from when the witness is silent (a kernel search's: the word and its culprit only)
    word: witness.Word = witness.Word(None, None, None)
    searching: bool = False  # once training: a kernel search spoke in this stall (kernel_search.in_stall)
    # the verdicts in a row at this very point for this very wait, each short of the phase's own bound: the phase's
    # own bound is the point's now (``owed_here``); None: no such point
    owed: int | None = None
    one_place: str | None = None  # where the witness held the main thread for the whole stall (``held_place``)
    bound: Deadline = Deadline(None)  # its verdict's: ``deadline`` judged with the word and the tree (``_judged``)
    stacks_at: float | None = None  # when its stacks are read ahead of the verdict (``_stacks_at``); None: not


def current_stall(s: Supervision, own_stacks: OwnStacks) -> Stall | None:
    """The stall under way, judged: its clock, its bounds, the witness's word on it, its verdict's bound and when
    its stacks are read ahead (not where ``own_stacks`` says a tier would read its own). None outside a startup step
    or a phase being watched (a stop, the backoff, a recovery tier under way)."""
    stall = _bounded(s)
    if stall is None:
        return None
    stall = replace(stall, one_place=held_place(s, stall.word.seen, stall.word.culprit))
    stall = replace(stall, owed=owed_here(s, stall))
    stall = replace(stall, bound=_judged(s, stall))
    return replace(stall, stacks_at=_stacks_at(s, stall, _confirmed(s, stall.bound), own_stacks))


@dataclass(frozen=True)
class Watch:
    """What a decision leaves the shell to watch until the next one: the state changes only inside ``decide``, so the
    stall is judged once, at its end (``watch``; and at a restore), and the loop, the tick, the status and the stacks
    read this record instead of working any of it out again. Not persisted."""
    stall: Stall | None  # the stall under way, judged (``current_stall``); None: none
    deadline: Deadline  # the watchdog's (``due``): what a Tick judges
    wake: Deadline  # the loop's next wake-up: the deadline, or the stacks read ahead where that comes first
    tree_from: float | None  # from when the shell reads the worker's tree for activity (``tree_reading_from``)
    stacks_at: float | None  # when the stall's stacks are read ahead of its verdict (``Stall.stacks_at``)


def watch(s: Supervision, own_stacks: OwnStacks) -> Watch:
    """The one judgement of a decision: the stall, its deadline, the wake-up, the tree's and the stacks' readings."""
    stall = current_stall(s, own_stacks)
    at = due(s, stall)
    ahead = stall.stacks_at if stall is not None else None
    wake = Deadline(ahead, DeadlineKind.STACKS_AHEAD, "stacks ahead") \
        if ahead is not None and (at.at is None or ahead < at.at) else at
    r = s.current.recovery if s.state == State.HEALTHY else None
    tree_from = tree_reading_from(s, stall) if r is None else r.tier.reads_tree_from(r)
    return Watch(stall, at, wake, tree_from, ahead)


def _bounded(s: Supervision) -> Stall | None:
    """The stall's clock, its own bounds and the witness's word on it."""
    a, w, clock = s.current, s.config.watchdog, _clock(s)
    if clock is None:
        return None
    of, since = clock
    if of == "search":
        t = w.startup_timeout  # bounded as a search, from its last line (kernel_search.py)
        said, culprit = witness.telling(a.waits, a.loaders)  # (its word bounds nothing: the search's does)
        return Stall(since, Deadline(None if t is None else since + t, DeadlineKind.PHASE,
                                     "kernel search, startup_timeout"), None,
                     word=witness.Word(said, culprit, None), searching=True)
    if of == "step":
        step, seen = a.startup_step.value, startup_step_seen(s)
        (t, label), idle = startup_step_timeout(w, step, seen), startup_step_timeout(w, step, seen, w.idle_floor)[0]
        kind = DeadlineKind.STARTUP
    else:
        phase = stall_phase(s)  # an epoch's end until the first batch
        checkpoint = s.checkpoint_seen if a.save_mid_epoch else None
        t, label = phase_timeout(w, phase, a.intervals, s.epoch_end_seen, checkpoint)
        idle = phase_timeout(w, phase, a.intervals, s.epoch_end_seen, checkpoint, w.idle_floor)[0]
        kind = DeadlineKind.PHASE
    word = witness.word_on(a, stall_since=since, state=s.state, phase=stall_phase(s))
    if of == "phase" and phase == Phase.SAVE.value and own_lock(word):
        # An idle tree (no CPU, no disk, none in the disk's sleep) whose training process waits on a lock of its
        # own is bounded as in training, not by the epoch's end (ten times the longest seen): a save that writes is
        # never idle (issue 48.4).
        trained = phase_timeout(w, Phase.TRAIN.value, a.intervals, floor=w.idle_floor)[0]
        idle = trained if trained is not None and (idle is None or trained < idle) else idle
    if t is None:
        return Stall(since, Deadline(None, kind, label), None, word=word)
    shorter = idle is not None and idle < t and w.idle_floor is not None
    if shorter and s.config.distributed.several_hosts and not rank_stopped(s):
        # A rank waiting for another host is idle: with several hosts the idle floor is only for a stall of this
        # host's own making, a rank of it stopped (SIGSTOP to the tree, a debugger), which waits for nobody.
        return Stall(since, Deadline(since + t, kind, label), None, idle, word)
    return Stall(since, Deadline(since + t, kind, label), idle if shorter else None, word=word)


def wait_of(word: witness.Word) -> str | None:
    """The witness's word as a hang's point keeps it: its kind and frame ("lock at threading.py:_wait_for_tstate_lock",
    the line left out); None: no word."""
    if word.seen is None:
        return None
    return f"{word.seen.report.kind.value} at {witness.place_of(word.seen.report.where)}"


def short_of_own(stall: Stall) -> bool:
    """The stall's verdict came before the phase's own bound for it (the idle floor, a witness's bound)."""
    own, judged = stall.deadline.at, stall.bound.at
    return judged is not None and (own is None or judged < own)


def owed_here(s: Supervision, stall: Stall) -> int | None:
    """Verdicts in a row at the point this stall sits at (phase, epoch, batch), for the wait the witness says now,
    each short of the phase's own bound for it (``HangHistory.owed_point``): a wait the judge got wrong would be
    killed there in every attempt, so the point gets the phase's own bound, as a kernel search's point gets a
    search's. None: no such point, or not this one."""
    owed = s.hang_history.owed_point()
    a = s.current
    if owed is None or s.state != State.HEALTHY or stall.searching or a.recovery is not None:
        return None
    point, verdicts = owed
    here = (a.progress.phase, a.progress.epoch, a.progress.batch)
    return verdicts if (point.phase, point.epoch, point.batch) == here and wait_of(stall.word) == point.wait else None


def point_bound_phrase(verdicts: int) -> str:
    """The log's, the label's and the incident's words."""
    return f"this point gets the phase's bound after {verdicts} verdicts here"


def own_lock(word: witness.Word) -> bool:
    """The witness puts the training process's main thread on a lock, condition, event or queue of its own process
    (``WaitKind.LOCK``), no loader worker named."""
    return word.seen is not None and word.culprit is None and word.seen.report.kind == WaitKind.LOCK


def _clock(s: Supervision) -> tuple[str, float] | None:
    """Which stall is under way ("step": a startup step; "search": a kernel search once training; "phase": a phase
    since its last progress) and when its clock started; None: none."""
    a = s.current
    if s.state == State.STARTING and a.step_since is not None:
        return "step", a.step_since
    if (search := kernel_search.in_stall(s)) is not None:
        return "search", search.at
    if s.state == State.HEALTHY and a.last_progress_at is not None and a.recovery is None:
        return "phase", a.last_progress_at
    return None


def stall_since(s: Supervision) -> float | None:
    """When the current stall's clock started (``Stall.since``), without judging it: what stacks read ahead are
    matched with. None: no stall."""
    clock = _clock(s)
    return clock[1] if clock is not None else None


def counted_threads(s: Supervision) -> dict[int, tuple[int, frozenset[int]]]:
    """By the pid of each process the witness spoke for (the training process; a rank's under DDP): its training
    thread and the threads that count in the tree's activity, the training thread and those on its chain in this stall
    (``TreeActivity``; the training thread alone where the witness said nothing in it). A process not named counts
    every thread but a device runtime's spinning ones."""
    a, counted = s.current, {}
    if a.training_tid is not None and a.progress_pid is not None:
        counted[a.progress_pid] = (a.training_tid, frozenset({a.training_tid}))
    for rank, seen in a.waits.items():
        pid = a.progress_pid if rank is None else getattr(a.ranks.get(rank), "pid", None)
        tids = witness.chain_threads(seen.report)
        if pid is not None and tids:
            counted[pid] = (seen.report.tid, tids)
    return counted


def rank_stopped(s: Supervision) -> bool:
    """A rank of this host's worker is stopped, as /proc shows (TreeActivity): this host's tree is frozen, or that
    rank, and the others wait for it."""
    return bool(witness.stopped_ranks(s.current.ranks, s.current.stopped))


IDLE_READING_AFTER = 0.5  # seconds of a stall before its tree is read: a training's gaps between batches are shorter


def tree_reading_from(s: Supervision, stall: Stall | None) -> float | None:
    """From when the shell reads the worker's tree for activity (``TreeActivity``) in ``stall``: once it has lasted so
    long that idle_floor more of an idle tree reaches its idle bound, and at least ``IDLE_READING_AFTER``, so a
    training whose batches come costs nothing; None: an idle tree cannot shorten this stall's bound. (Its clock and
    its own bounds decide, not its verdict's.)"""
    if stall is None or s.current.worker_pid is None:
        return None
    if stall.frozen_bound is not None:  # several hosts: read whether a rank of this host is stopped
        return stall.since + max(IDLE_READING_AFTER, stall.frozen_bound - s.config.watchdog.idle_floor)
    if stall.searching:
        return None
    if stall.word.culprit is not None or stall.word.silent is not None:  # a named worker's bound is the loader's
        return stall.since + IDLE_READING_AFTER  # rhythm or a start's (does it wait on the world?); a silent
    if stall.idle_bound is None:  # witness's is the tree's
        return None
    return stall.since + max(IDLE_READING_AFTER, stall.idle_bound - s.config.watchdog.idle_floor)


def step_key(s: Supervision, step: StartupStep) -> str:
    """Where this run keeps what it has seen of ``step`` at the current rung. The first batch of spawned loader
    workers (each a fresh interpreter importing torch and Ultralytics, far slower than forked ones) is kept
    apart: a hang's climb to such a rung must not meet the bound of forked workers."""
    spawned = split_rung(s.ladder.settings(s.rung)).options.start_method == "spawn"
    return f"{step.value} spawn" if step == StartupStep.FIRST_BATCH and spawned else step.value


def startup_step_seen(s: Supervision) -> float | None:
    """The longest stretch this run has seen in the current attempt's startup step; None: not seen yet."""
    return s.startup_steps_seen.get(step_key(s, s.current.startup_step))


def startup_step_bound(s: Supervision) -> tuple[float | None, str]:
    """Seconds the current startup step may go without news, and how that was decided."""
    return startup_step_timeout(s.config.watchdog, s.current.startup_step.value, startup_step_seen(s))
