"""The standby worker's environment: which rung the next attempt's worker is made for, ahead of a hang.

A standby serves only a launch in the environment it began in (a rung's variables are read at import), so it is made
for where a hang would move the run (``choices.after_a_hang``). That choice changes as the attempt trains: a rung's
hang rate falls with every hang-free minute (rung_choice.py), so a standby made for the next rung at the first batch
can be the wrong one by the hang, which then starts cold (several times slower to its first batch). The choice is
reviewed every ``REVIEW_EVERY`` seconds of training, and a standby for the new one asked for when it changed.

When: once the attempt's own start is done, as it enters its ``first_batch`` step (imports, trainer, CUDA, model,
dataset and loaders behind it; its loader's workers make the batch). Not sooner: even a start the standby served,
its imports done, is slowed by a new standby's imports beside it (they share the CPUs, its CUDA initialisation
first). Not later: the seeds' most frequent hang is a first batch that never runs, and its restart then finds a
standby waiting instead of starting cold (bench/RESULTS.md has the figures).
"""

from __future__ import annotations

from typing import Any

from supervisor.decision.learning import choices
from supervisor.decision.model.actions import PrepareStandby
from supervisor.decision.model.state import Supervision
from worker.wire.contract import split_rung

REVIEW_EVERY = 5.0  # seconds of training between two reviews of the standby's rung


def prepared(s: Supervision, mono: float) -> list[Any]:
    """A standby for the rung a hang would move to now, unless the one asked for in this attempt is made for it; the
    next review counts from now (monotonic ``mono``)."""
    if not s.kind.standby:
        return []
    settings = {**s.ladder.settings(choices.after_a_hang(s).rung), **s.remedies}
    here = {**s.ladder.settings(s.rung), **s.remedies}
    # What a ready standby holds (the datasets, the loader's workers) is for the current rung where a launch at it
    # would take this standby too (the same environment): a hang this prediction climbs for, without its evidence,
    # mostly keeps the rung once its evidence is read (a spin, a lock, a frozen tree: no rung changes them), and a
    # loader's own hang is replaced in place. A standby that serves only the other rung holds that rung's.
    held = here if split_rung(here).env == split_rung(settings).env else settings
    a = s.current
    a.standby_reviewed_at = mono
    if (settings, held) == (a.standby_settings, a.standby_held):
        return []
    a.standby_settings, a.standby_held = settings, held
    return [PrepareStandby(settings, None if held == settings else held)]


def reviewed(s: Supervision, mono: float) -> list[Any]:
    """While the attempt trains: the standby's rung checked again, at most every ``REVIEW_EVERY`` seconds."""
    a = s.current
    if a.standby_settings is None or mono - a.standby_reviewed_at < REVIEW_EVERY:
        return []
    return prepared(s, mono)
