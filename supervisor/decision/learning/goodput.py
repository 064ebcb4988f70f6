"""The goodput account: the training each attempt kept, and the training a failure threw away.

An attempt trains from its first batch to its last progress; when it ends, that time moves into the totals
(``close_attempt``). What followed the newest checkpoint is lost when the attempt ends without a save: the next
worker resumes from that checkpoint. A stop that waits for a save loses it only if the save fails (``count_lost``).
A command resumes from a checkpoint of its own that the supervisor does not see: its loss is known once the next
attempt shows where it resumed (``resumed_loss``). The ratio itself is ``Goodput.ratio`` (state.py).
"""

from __future__ import annotations

import math
from typing import Any

from supervisor.decision.model.incident import Loss
from supervisor.decision.model.state import THROUGHPUT_WINDOW, Supervision


def close_attempt(s: Supervision, lost: bool) -> tuple[Loss | None, dict[str, Any] | None, tuple[float, int]]:
    """Move this attempt's progress into the totals; when it ends without a save, what followed the newest
    checkpoint is lost (the next worker resumes from there). Returns the loss and that checkpoint, for the incident,
    and the part after the checkpoint (seconds, batches) either way: a stop that waits for a save loses it if the
    save fails."""
    a, g = s.current, s.goodput
    trained_here = s.trained() - g.trained_seconds
    if trained_here > 0:
        s.rung_record(s.rung).seconds += trained_here
    g.trained_seconds = s.trained()
    if a.train_beats % THROUGHPUT_WINDOW >= 2:  # the attempt's last, partial window counts too
        s.record_rung_speed()
    loss, g.lost_from, unsaved = None, None, (0.0, 0)  # an earlier attempt's loss not resolved by now stays unknown
    if lost and not s.kind.reports_checkpoints and s.checkpoint is None and a.healthy_since is not None:
        # A command resumes from its own checkpoint, which we do not see: the next attempt's first position tells.
        g.lost_from = a.progress.batches_done()
        loss = Loss(None, None)
    elif a.healthy_since is not None and a.last_progress_at is not None:
        saved_at = s.checkpoint.mono if s.checkpoint is not None else -math.inf
        unsaved = (max(0.0, a.last_progress_at - max(a.healthy_since, saved_at)), a.batches_since_checkpoint)
        lost_seconds, lost_batches = unsaved if lost else (0.0, 0)
        g.lost_seconds += lost_seconds
        g.lost_batches += lost_batches
        loss = Loss(round(lost_seconds, 3), lost_batches)
    a.healthy_since, a.training = None, None
    resumes_from = None if s.checkpoint is None else {"epoch": s.checkpoint.epoch, "batch": s.checkpoint.batch,
                                                        "path": s.checkpoint.path}
    return loss, resumes_from, unsaved


def count_lost(s: Supervision, seconds: float, batches: int) -> None:
    """A save asked for did not come: the stop's at-risk training is lost after all, in the totals and its incident."""
    s.goodput.lost_seconds += seconds
    s.goodput.lost_batches += batches
    incident = s.stop.incident
    if incident is not None:
        before = incident.loss or Loss(0.0, 0)
        s.amend(incident, loss=Loss(round((before.seconds or 0.0) + seconds, 3), (before.batches or 0) + batches))


def resumed_loss(s: Supervision, rung: int) -> Loss:
    """A command's lost work, from where it was when it failed down to where its next attempt resumed: the first
    position it shows (a resumed bar draws its initial position before any batch). Unknown without positions."""
    g = s.goodput
    lost_from, resumed_at, g.lost_from = g.lost_from, s.current.progress.batches_done(), None
    if lost_from is None or resumed_at is None:
        return Loss(None, None)
    batches = max(0, lost_from - resumed_at)
    speed = s.rungs[rung].speed() if rung in s.rungs else None  # the failed attempt's
    seconds = round(batches / speed, 3) if speed else None
    g.lost_batches += batches
    g.lost_seconds += seconds or 0.0
    return Loss(seconds, batches)


def saved_since_spawn(s: Supervision) -> bool:
    """The attempt that just failed wrote a complete checkpoint: the next one resumes past where this one began."""
    return s.checkpoint is not None and s.current.spawned_at is not None and s.checkpoint.mono >= s.current.spawned_at
