"""A heartbeat, step by step: who may speak, what it reports, whether it is progress, and what progress starts.

``received`` reads one message of the worker (worker/wire/contract.py) in named steps:

1. ``_accepted``: the worker's main process (or, under DDP, this host's first rank) counts; a DataLoader worker or
   a stray writer does not;
2. ``_report``: an error, the settings in force or a saved checkpoint is noted, and is not progress; a startup step
   (``_startup_step``) entered or progressing restarts that step's clock;
3. ``_note_position``: where the worker is (epoch, batch, losses), from any beat;
4. ``_time_gap``: the gap since the last progress feeds the watchdog's intervals, or an epoch end's or a
   mid-epoch checkpoint's bound;
5. ``_progressed``: the counter moved on: the last progress, the phase, a command's training run through;
6. kernel.progress_seen: a kernel line under suspicion was not about a hang of ours;
7. ``_diverged``: non-finite losses batch after batch stop the worker, restarted without AMP;
8. ``_trained_batch``: speed, the first batch of the attempt (``_first_batch``), then a probe when due.
"""

from __future__ import annotations

import math
from collections import deque
from typing import Any, Callable

from supervisor.decision import kernel, recovery
from supervisor.decision.learning import goodput
from supervisor.decision.model.actions import KeepVerifiedCopy, Log, PublishCheckpoint
from supervisor.decision.model.events import JobCheckpointRead, Now
from supervisor.decision.model.incident import Incident, RankStart
from supervisor.decision.model.persistence import span
from supervisor.decision.model.state import (THROUGHPUT_WINDOW, Attempt, CheckpointMark, Progress, RankView,
                                             Supervision, TrainingClock)
from supervisor.decision.recovery import probe, standby, stopping
from supervisor.decision.recovery.stopping import Stop
from supervisor.decision.stall import kernel_search, watchdog, witness
from supervisor.vocabulary import Reason, State, WorkerStart
from worker.wire.contract import HELD_LOADER_WORKERS, HELD_RESUMED_BATCHES, HeartbeatMessage, MessageKind, Phase, StartupStep, WaitKind

NAN_BEATS = 3  # training beats in a row with a non-finite loss before the run counts as diverged


def received(s: Supervision, m: HeartbeatMessage, now: Now, from_worker_tree: bool = False) -> list[Any]:
    if not _accepted(s, m, now, from_worker_tree):
        return []
    report = REPORTS.get(m.kind)
    if report is not None:
        return report(s, m, now)
    _note_position(s.current.progress, m)
    if m.progress <= s.current.progress_counter:
        return []  # a beat without progress is not progress
    _time_gap(s, m, now)
    _progressed(s, m, now)
    actions = kernel.progress_seen(s) + recovery.on_event(s, m, now)  # a tier's proof: the next batch
    if not (m.kind == MessageKind.BEAT and m.phase == Phase.TRAIN):
        s.current.last_beat_sent = None  # (a phase said: the next training beat's gap is no batch's)
        return actions
    diverged = _diverged(s, now)
    if diverged:
        return actions + diverged
    return actions + _trained_batch(s, m, now)


def _accepted(s: Supervision, m: HeartbeatMessage, now: Now, from_worker_tree: bool) -> bool:
    """The message counts: it comes while a worker is watched, from the process whose word is the run's."""
    a = s.current
    if s.state not in (State.STARTING, State.HEALTHY) and not s.saving():
        return False
    if m.rank is not None:
        if not _rank_alive(s, m, now):
            return False
    elif m.pid != a.worker_pid and not (from_worker_tree and a.progress_pid in (None, m.pid)):
        # A DataLoader worker or a stray writer never counts as progress. A descendant does when it is the first of
        # the tree to speak (``./run.sh`` running python): the worker's main process is then a wrapper.
        s.messages_ignored += 1
        return False
    if m.pid != a.progress_pid:  # another sender (the launcher, then rank 0): its own counter
        a.progress_pid, a.progress_counter = m.pid, -1
    return True


def _rank_alive(s: Supervision, m: HeartbeatMessage, now: Now) -> bool:
    """Every rank's beats keep its own liveness; only this host's first rank's (rank 0, or local rank 0 of a host
    among several) go on to count as the run's progress. A rank is the pid that first spoke for it: its DataLoader
    workers inherit RANK and must not speak for it."""
    view = s.current.ranks.setdefault(m.rank, RankView(pid=m.pid, local_rank=m.local_rank,
                                                        first_word_at=sent_at(m, now)))
    if view.pid != m.pid:
        s.messages_ignored += 1
        return False
    own = RANK_REPORTS.get(m.kind)
    if own is not None and not own(s, view, m, now):
        return False  # the rank's alone: no progress, and not the run's report
    speaks_for_the_run = (m.rank if m.local_rank is None else m.local_rank) == 0
    if m.progress > view.progress:
        view.progress, view.last_progress_at = m.progress, now.mono
        if not speaks_for_the_run:  # (the run's rank's word is read by its progress first: _progressed)
            s.current.waits.pop(m.rank, None)
    return speaks_for_the_run


def _rank_in_force(s: Supervision, view: RankView, m: HeartbeatMessage, now: Now) -> bool:
    if m.in_force:
        view.device = m.in_force.device or None
    return True


def _rank_error(s: Supervision, view: RankView, m: HeartbeatMessage, now: Now) -> bool:
    if m.rank != 0:
        s.current.last_error = f"rank {m.rank}: {(m.error or '')[:480]}"
        s.current.first_error = s.current.first_error or s.current.last_error
    return True


def _rank_wait(s: Supervision, view: RankView, m: HeartbeatMessage, now: Now) -> bool:
    """Every rank's word is kept: the one that tells the stall is chosen at need."""
    s.current.waits[m.rank] = witness.heard(s.current.waits.get(m.rank), m.wait, now.mono, m.rank)
    return False


def _rank_step(s: Supervision, view: RankView, m: HeartbeatMessage, now: Now) -> bool:
    """A rank's startup step, timed in its own view for the restart's parts by rank (``rank_starts``); the rank's
    alone: the run's startup steps are the launching worker's, whose ``checkpoint`` step bounds the ranks' start."""
    if m.step != view.step:
        at = sent_at(m, now)
        _rank_step_ended(view, at)
        view.step, view.step_entered = m.step, at
    return False


def _rank_step_ended(view: RankView, at: float) -> None:
    if view.step is not None and view.step_entered is not None:
        key = view.step.value
        view.step_seconds[key] = view.step_seconds.get(key, 0.0) + max(0.0, at - view.step_entered)


def rank_starts(a: Attempt, at: float) -> tuple[RankStart, ...]:
    """Each rank's share of the restart, at the run's first batch (``at``, monotonic): from the attempt's spawn or
    take-over to the rank's first word, then each startup step it said, the one it is in counted to ``at``."""
    starts = []
    for rank, view in sorted(a.ranks.items()):
        parts: dict[str, float] = {}
        start = None if view.first_word_at is None else span(a.spawned_at, view.first_word_at)
        if start is not None:
            parts["start"] = round(max(0.0, start), 3)
        seconds = dict(view.step_seconds)
        if view.step is not None and view.step_entered is not None:
            seconds[view.step.value] = seconds.get(view.step.value, 0.0) + max(0.0, at - view.step_entered)
        parts.update({step: round(value, 3) for step, value in seconds.items()})
        starts.append(RankStart(rank, parts))
    return tuple(starts)


def _rank_alone(read: Callable[[Supervision, HeartbeatMessage, Now], list[Any]]
                ) -> Callable[[Supervision, RankView, HeartbeatMessage, Now], bool]:
    """A tier's report, read from any rank, and the rank's alone."""
    def rank_report(s: Supervision, view: RankView, m: HeartbeatMessage, now: Now) -> bool:
        read(s, m, now)
        return False
    return rank_report


def _error(s: Supervision, m: HeartbeatMessage, now: Now) -> list[Any]:
    s.current.last_error = (m.error or "")[:500]
    s.current.first_error = s.current.first_error or s.current.last_error
    return []


def _in_force(s: Supervision, m: HeartbeatMessage, now: Now) -> list[Any]:
    s.current.in_force = m.in_force
    return []


def _wait(s: Supervision, m: HeartbeatMessage, now: Now) -> list[Any]:
    s.current.waits[None] = witness.heard(s.current.waits.get(None), m.wait, now.mono)
    s.current.witness_heard = True
    s.current.training_tid = m.wait.tid if m.wait.tid is not None else s.current.training_tid
    return []

def _startup_step(s: Supervision, m: HeartbeatMessage, now: Now) -> list[Any]:
    """Before the first batch: a step entered, or progress in it (other items done than last said). Either is news
    that ends a stretch of the step the worker was in, which this run has then seen, and starts the step's clock
    again: a long scan that progresses is never a hang. The same word again is no news."""
    a = s.current
    if s.state != State.STARTING or m.step is None or (m.step == a.startup_step and m.done == a.step_done):
        return []
    # Timed when sent: the steps of a second come in one read of the pipe, but were not made at once.
    at = now.mono if m.sent is None else min(now.mono, max(m.sent, a.step_since or m.sent))
    _close_step_stretch(s, at)
    entered = m.step != a.startup_step
    if entered:
        _step_ended(a, at)
    a.startup_step, a.step_since, a.step_done, a.step_total = m.step, at, m.done, m.total
    if entered:
        a.search = None  # a search's news was the step's it ran in
    # news: a stall is judged afresh (watchdog.tree_reading_from)
    a.idle_since, a.waits_outside, a.stopped = None, frozenset(), frozenset()
    a.thread_idle_since, a.spun_beside = None, ()
    a.waits.pop(m.rank, None)  # and a word said in an earlier step is of a wait that is over (as after progress)
    return standby.prepared(s, at) if entered and m.step == StartupStep.FIRST_BATCH else []


def _step_ended(a: Attempt, at: float) -> None:
    """The startup step the worker was in ended at ``at``: its seconds, for the restart's parts."""
    if a.step_entered is not None:
        key = a.startup_step.value
        a.step_seconds[key] = a.step_seconds.get(key, 0.0) + (span(a.step_entered, at) or 0.0)
    a.step_entered = at


def restart_parts(last: Incident, a: Attempt) -> dict[str, float]:
    """Where a restart's seconds went, from the verdict to the first batch: the kill, the rest until the next
    worker's spawn or take-over (stacks, backoff), then each startup step of that worker. What a ready standby held
    is named so: its model step loads the checkpoint into the model built ahead (``model_load``, not ``model``); with
    the training loader's workers started ahead, the first batch is only loaded (``first_batch_held``), and where
    they were fed at the verdict, loading since then (``first_batch_primed``: what is left of it at the launch); a
    dataset it held is not built (no ``dataset`` part where it held both)."""
    parts = {"kill": last.kill.seconds} if last.kill is not None else {}
    to_spawn = span(last.time, a.spawned_wall)
    if to_spawn is not None:
        parts["to_spawn"] = round(max(0.0, to_spawn - parts.get("kill", 0.0)), 3)
    held = (a.in_force.held if a.in_force is not None else None) or ()
    first_batch = "first_batch_primed" if HELD_RESUMED_BATCHES in held else "first_batch_held"
    for step, seconds in a.step_seconds.items():
        name = "model_load" if step == StartupStep.MODEL.value and a.start is WorkerStart.READY \
            else first_batch if step == StartupStep.FIRST_BATCH.value and HELD_LOADER_WORKERS in held else step
        parts[name] = round(seconds, 3)
    return parts


def _close_step_stretch(s: Supervision, at: float) -> None:
    """The stretch of the current startup step since its clock started ended in news at ``at`` (monotonic): this run
    has seen it."""
    a = s.current
    if a.step_since is not None:
        key = watchdog.step_key(s, a.startup_step)
        # A step that searched is kept whole from before the search's first line (kernel_search.py): an attempt
        # that finds its results cached goes through it without a word.
        searched = kernel_search.of_step(a)
        since = a.step_since if searched is None else searched.stretch_since
        s.startup_steps_seen[key] = max(s.startup_steps_seen.get(key, 0.0), span(since, at))


def _checkpoint_saved(s: Supervision, m: HeartbeatMessage, now: Now) -> list[Any]:
    """A complete checkpoint: the point a restart resumes from, so the work before it is safe."""
    if not m.path:
        return []
    if s.saving():
        s.stop.saved = True
    a, epoch, batch = s.current, m.epoch or s.current.progress.epoch, m.batch or 0
    # Written in the background, it is said a few batches after the position it holds: those batches follow it,
    # and the training it keeps ends at its own batch's beat (the throughput window's times), not at this message.
    behind = _batches_after(a.progress, epoch, batch) if m.epoch is not None and m.batch is not None else 0
    at = a.throughput[-1 - behind][0] if 0 < behind < len(a.throughput) else now.mono
    at = min(at, now.mono)
    s.checkpoint = CheckpointMark(m.path, epoch, batch, now.wall - (now.mono - at), at, m.seconds or 0.0)
    if m.seconds is not None:
        s.hang_history.checkpoint_hold(m.seconds)
    a.batches_since_checkpoint = behind
    mark = s.checkpoint
    shared = [PublishCheckpoint(mark.path, mark.epoch, mark.batch, mark.seconds)] \
        if s.config.distributed.several_hosts else []
    return [KeepVerifiedCopy(m.path), *shared]


def job_checkpoint(s: Supervision, event: JobCheckpointRead, now: Now) -> list[Any]:
    """Several hosts: the checkpoint another host's rank 0 saved is this host's too, where its ranks resume from;
    its age is read from the wall clock, so one saved before this attempt's spawn counts as older."""
    own = event.node_rank == s.config.distributed.node_rank
    known = s.checkpoint
    if not s.config.distributed.several_hosts or own or \
            known is not None and (event.epoch, event.batch, event.wall) <= (known.epoch, known.batch, known.wall):
        return []
    s.checkpoint = CheckpointMark(event.path, event.epoch, event.batch, event.wall,
                                  now.mono - max(0.0, now.wall - event.wall), event.seconds)
    s.hang_history.checkpoint_hold(event.seconds)
    s.current.batches_since_checkpoint = _batches_after(s.current.progress, event.epoch, event.batch)
    return []


def _batches_after(p: Progress, epoch: int, batch: int) -> int:
    """Training batches done after the position (epoch, batch): 0 where the worker has not said an epoch's length."""
    return max(0, (p.epoch - epoch) * p.batches + p.batch - batch) if p.batches else 0


def _note_position(p: Progress, m: HeartbeatMessage) -> None:
    for key in ("epoch", "epochs", "batch", "batches"):
        value = getattr(m, key)
        if value is not None:
            setattr(p, key, value)
    if m.losses is not None:
        p.losses = dict(m.losses)
    if m.lr is not None:
        p.lr = m.lr


def _time_gap(s: Supervision, m: HeartbeatMessage, now: Now) -> None:
    a = s.current
    gap = None if a.last_progress_at is None else now.mono - a.last_progress_at
    if m.kind == MessageKind.PHASE and m.phase == Phase.SAVE and a.progress.phase != Phase.SAVE.value:
        p = a.progress  # (its position noted already: the batch the save follows)
        a.save_mid_epoch = bool(p.batches) and (p.batch or 0) < p.batches
    if gap is not None and (a.progress.phase == Phase.SAVE.value or a.train_resuming):
        # A gap of a save stretch, up to the next batch: an epoch's end (validation's set-up, the save, the next
        # epoch's loader start) or a mid-epoch checkpoint (its hold). Neither has a batch rhythm, nor the other's
        # length: each bounds the next of its kind (watchdog.phase_timeout), not the batch intervals.
        a.save_gap = max(a.save_gap, gap)
        if m.kind == MessageKind.BEAT and m.phase == Phase.TRAIN:  # observed whole, up to the next batch
            if a.recovery is not None:
                pass  # a stretch a recovery tier closed holds its stall: no epoch end nor checkpoint is that long
            elif a.save_mid_epoch:
                s.checkpoint_seen = max(s.checkpoint_seen or 0.0, a.save_gap)
            else:
                s.epoch_end_seen = max(s.epoch_end_seen or 0.0, a.save_gap)
            a.save_gap, a.save_mid_epoch = 0.0, False
    elif m.kind == MessageKind.BEAT and gap is not None and s.state == State.HEALTHY and a.recovery is None \
            and kernel_search.in_stall(s) is None:  # (nor a batch a kernel search held: a search is no rhythm)
        # (the first batch of an attempt is startup: CUDA's warm-up and the loader's start are no batch interval; nor
        # is the gap a recovery tier closes, whose stall would make every later timeout ten times longer)
        window = a.intervals.setdefault(m.phase.value, deque(maxlen=s.config.watchdog.auto_window))
        window.append(gap)


def _progressed(s: Supervision, m: HeartbeatMessage, now: Now) -> None:
    a, p = s.current, s.current.progress
    resuming = a.train_resuming  # the stall this progress ends is the save stretch's, up to its next batch
    a.train_resuming = s.state == State.HEALTHY and m.kind == MessageKind.PHASE and m.phase == Phase.TRAIN
    if s.kind.exit_0_finishes and m.phase == Phase.TRAIN and p.epochs and p.batches and p.epoch >= p.epochs \
            and (p.batch or 0) >= p.batches:
        # A command says no "done"; its bar at its very end does. What follows is its exit, watched as our
        # worker's after "done" is: one that never comes ends the run succeeded, nothing to restart.
        a.trained_through = True
    said = a.waits.get(m.rank)  # the word of the process whose progress this is (None outside DDP)
    if said is not None and s.state == State.HEALTHY and a.recovery is None and a.last_progress_at is not None \
            and p.phase in witness.RHYTHM_PHASES and kernel_search.in_stall(s) is None:
        # A device wait that ended: the device's own rhythm in this phase (from the stall's start: never shorter);
        # a stall held at one place that ended: that loop's own (a long legitimate one is not killed at its length);
        # a batch owed by a loader worker that came: the loader's own. Not a save stretch's one place (a mid-epoch
        # checkpoint's hold, up to the next batch): a spin right after the next save would get ten times that hold
        seen = s.device_waits_seen if witness.WAITS[said.report.kind].rhythm else \
            s.one_place_seen if said.place is not None and not resuming else None
        if said.report.kind == WaitKind.LOADER and said.report.batch_index:  # (a new iterator's first: its start)
            seen = s.loader_waits_seen
        if seen is not None:
            seen[p.phase] = max(seen.get(p.phase, 0.0), now.mono - a.last_progress_at)
    a.progress_counter, a.last_progress_at, a.idle_since = m.progress, now.mono, None
    if a.training is not None:
        a.training.progressed(sent_at(m, now))
    a.waits_outside, a.stopped, a.thread_idle_since, a.spun_beside = frozenset(), frozenset(), None, ()
    a.waits.pop(m.rank, None)  # a word said before this progress is of a stall that is over
    if m.rank is not None:
        # and the launching worker's last word too: it stopped its witness as it started its ranks (worker/training/train.py)
        # and makes no progress of its own that would end that word, which would otherwise tell its ranks' stalls
        a.waits.pop(None, None)
    p.phase = Phase.DONE.value if a.trained_through else m.phase.value


def sent_at(m: HeartbeatMessage, now: Now) -> float:
    """When the message was sent (the sender's monotonic clock, the supervisor's too on one host), or read where
    it does not say: never later than now."""
    return now.mono if m.sent is None else min(now.mono, m.sent)


def _diverged(s: Supervision, now: Now) -> list[Any]:
    a, p = s.current, s.current.progress
    if not p.losses:
        return []
    a.nan_beats = a.nan_beats + 1 if not all(math.isfinite(v) for v in p.losses.values()) else 0
    amp = a.in_force.amp if a.in_force else None
    if a.nan_beats >= NAN_BEATS and s.state == State.HEALTHY and amp is not False:
        return stopping.begin(s, now, Stop(Reason.NAN, "train", remedy={"amp": False}, failure="nan",
                                           detail=f"non-finite losses in {a.nan_beats} batches in a row ({p.losses})"))
    return []


def _trained_batch(s: Supervision, m: HeartbeatMessage, now: Now) -> list[Any]:
    a, sent = s.current, sent_at(m, now)
    # Timed when sent: beats read in a burst (a backlog, the pipe's rests) arrive together but were not made so.
    a.throughput.append((sent, m.samples or 0))
    paced: list[Any] = []
    if s.state == State.HEALTHY and a.recovery is None and a.last_beat_sent is not None:
        a.batch_times.append(sent - a.last_beat_sent)  # a batch's time, two training beats in a row
        paced = s.paced(sent - a.last_beat_sent)
    a.last_beat_sent = sent if a.recovery is None else None
    a.batches_since_checkpoint += 1
    a.train_beats += 1
    if a.train_beats % THROUGHPUT_WINDOW == 0:  # a fresh window of this rung's speed
        s.record_rung_speed()
    if s.state == State.STARTING:
        return paced + _first_batch(s, now, sent)
    if s.state == State.HEALTHY:
        return paced + (probe.check(s, now) or standby.reviewed(s, now.mono))
    return paced


def _first_batch(s: Supervision, now: Now, sent: float) -> list[Any]:
    """The attempt trains: its start is measured, and the incident that restarted it is complete."""
    a = s.current
    s.state = State.HEALTHY
    s.consecutive_crashes = 0
    a.healthy_since, a.training = now.mono, TrainingClock(sent, sent)
    s.startup_failure = None
    a.startup_seconds = span(a.spawned_at, now.mono) or 0.0
    _close_step_stretch(s, now.mono)
    _step_ended(a, now.mono)
    s.rung_record(s.rung).started(a.startup_seconds)
    if a.in_force is not None and a.in_force.amp:  # its AMP check passed: the next attempts' need not run
        s.amp_passed = True
    last = s.incidents[-1] if s.incidents else None
    resumed = last is not None and not last.recorded and last.reason != Reason.STOP  # the incident it restarts after
    if resumed:
        last = s.amend(last, restart_seconds=span(last.time, now.wall), restart_start=a.start,
                       restart_start_why=a.start_why,
                       restart_parts=restart_parts(last, a), rank_parts=rank_starts(a, now.mono))
        if last.reason == Reason.HANG and last.restart_seconds is not None:
            s.hang_history.restarted(last.restart_seconds)
    if last is not None and not last.recorded and s.goodput.lost_from is not None:
        s.amend(last, loss=goodput.resumed_loss(s, last.rung))
    actions: list[Any] = [*(s.resumed_after(last) if resumed else s.record_complete()),
                          Log("info", f"attempt {s.attempt}: first training batch {a.startup_seconds:.1f} s after "
                                      f"spawn")]
    return actions + standby.prepared(s, now.mono)


# The recovery tiers' own reports (the in-place tier's loader starts): read from every rank, whether or not a tier
# is under way.
TIER_REPORTS = {kind: read for tier in recovery.TIERS for kind, read in tier.reports.items()}
# What a rank's message of each kind does before its progress is read (``_rank_alive``): False, it is the rank's alone
# (a tier's report: every rank's loader workers are the in-place tier's to replace; a wait); True, it goes on.
RANK_REPORTS: dict[MessageKind, Callable[[Supervision, RankView, HeartbeatMessage, Now], bool]] = {
    MessageKind.IN_FORCE: _rank_in_force, MessageKind.ERROR: _rank_error, MessageKind.WAIT: _rank_wait,
    MessageKind.STEP: _rank_step,
    **{kind: _rank_alone(read) for kind, read in TIER_REPORTS.items()},
}
# Each report of the worker that is no progress, and the rule that reads it.
REPORTS: dict[MessageKind, Callable[[Supervision, HeartbeatMessage, Now], list[Any]]] = {
    MessageKind.ERROR: _error, MessageKind.IN_FORCE: _in_force, MessageKind.STEP: _startup_step,
    MessageKind.WAIT: _wait, MessageKind.CHECKPOINT: _checkpoint_saved, **TIER_REPORTS,
}
