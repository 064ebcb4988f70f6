"""A kernel search is news of the startup step it runs in: MIOpen's exhaustive search, timing candidate kernels for
each new convolution, prints as it goes and may take many minutes (unsloth#11636), and
on gfx1100 its results are not cached (TheRock#7958), so every attempt searches again. Bounded as any step, a search
longer than ``startup_timeout`` would be killed in every attempt, a loop; so each of its lines restarts the step's
clock, as a dataset scan's progress does, and a search that goes silent for the step's bound is judged as any step
that does. The lines are read from the worker's output by the shell (``attempt/search_lines.py``): ``SearchNews``.

The stretch of a step that searched is kept from before the search's first line to the step's end, whole: a later
attempt that finds the search's results cached goes through the same step without a word, and must not be bounded by
the gaps between one search's lines.

Once training, a search comes whenever a new shape meets a convolution (an epoch's last, smaller batch, validation's
batch size, ``multi_scale``, ``rect``), and its results are written only when it ends: a search killed mid-training
would be killed at the same point in every attempt. So its lines are news in every phase too: the stall is counted
from the search's last line (``in_stall``), bounded as a search (``startup_timeout``, the step's bound), not by the
phase's batch rhythm nor by the witness (the main thread sits in one convolution for the whole search), and the batch
interval it ends is not one of the phase's rhythm. A search silent for that bound is a hang, said so in its incident.

All this only where a search can happen (``miopen``, from miopen_modes.py): under our worker's flags (Ultralytics'
``deterministic``, ``benchmark`` never set) a torch that asks MIOpen for immediate mode, or for a find that
MIOPEN_FIND_MODE and MIOPEN_FIND_ENFORCE keep from tuning, searches nothing, and a line in a search's format is no
news: the step and the stall keep their own bounds. A [worker] command sets its own flags, so its searches count.
"""

from __future__ import annotations

from typing import Any

from supervisor.decision.model import miopen_modes
from supervisor.decision.model.events import Now, SearchNews
from supervisor.decision.model.miopen_modes import MiopenSetting
from supervisor.decision.model.state import Attempt, SearchSeen, Supervision
from supervisor.vocabulary import State


def news(s: Supervision, event: SearchNews, now: Now) -> list[Any]:
    """Before the first batch: the step's clock starts again; once training: the stall's (``in_stall``); unless the
    line says nothing new (the same count)."""
    a = s.current
    if not can_search(s):
        return []
    if s.state == State.HEALTHY and a.last_progress_at is not None and a.recovery is None:
        seen = in_stall(s)
        if seen is not None and event.runs_left is not None and event.runs_left == seen.runs_left:
            return []
        a.search = SearchSeen(a.startup_step, seen.stretch_since if seen is not None else a.last_progress_at,
                              event.library, event.runs_left, now.mono, (seen.lines + 1) if seen is not None else 1)
        a.idle_since = None  # news: a stall's idleness is judged afresh
        return []
    if s.state != State.STARTING or a.step_since is None:
        return []
    seen = of_step(a)
    if seen is not None and event.runs_left is not None and event.runs_left == seen.runs_left:
        return []  # the same word again is no news
    stretch_since = seen.stretch_since if seen is not None else a.step_since
    a.search = SearchSeen(a.startup_step, stretch_since, event.library, event.runs_left, now.mono,
                          (seen.lines + 1) if seen is not None else 1)
    a.step_since = now.mono
    a.idle_since = None  # news: a stall's idleness is judged afresh (watchdog.tree_reading_from)
    return []


def miopen(s: Supervision) -> MiopenSetting | None:
    """The MIOpen mode the current attempt's settings give: Ultralytics' flags (its ``deterministic``, default on;
    ``benchmark`` it never sets), the inherited MIOPEN_ variables, [worker] env and the rung's env; None without a
    ROCm build or for a [worker] command (its flags are its own)."""
    if s.miopen is None or not s.kind.reads_launch_record:
        return None
    env = {**s.miopen.inherited, **s.config.worker_env, **s.ladder.settings(s.rung).get("env", {})}
    return miopen_modes.setting(s.miopen.torch, bool(s.config.train.get("deterministic", True)), False, False, env)


def can_search(s: Supervision) -> bool:
    """Whether a kernel search can happen in this attempt (unknown: it can)."""
    setting = miopen(s)
    return setting is None or setting.searches


def in_step(s: Supervision) -> SearchSeen | None:
    """Before the first batch: the search of the startup step the worker is in, if one said anything in it."""
    return of_step(s.current) if s.state == State.STARTING else None


def in_stall(s: Supervision) -> SearchSeen | None:
    """Once training: the search that said something since the last progress (the stall is then a search's)."""
    a = s.current
    if s.state != State.HEALTHY or a.search is None or a.last_progress_at is None or a.recovery is not None \
            or a.search.at < a.last_progress_at:
        return None
    return a.search


def of_step(a: Attempt) -> SearchSeen | None:
    """The search that said something in the attempt's current (or last) startup step."""
    return a.search if a.search is not None and a.search.step == a.startup_step else None


def describe(seen: SearchSeen) -> str:
    """``MIOpen search, 243 runs left`` (status, incidents)."""
    left = f", {seen.runs_left} runs left" if seen.runs_left is not None else ""
    return f"{seen.library} search{left}"


def silent(seen: SearchSeen, now: Now) -> str:
    """For a startup hang's incident: the search the worker was in, and how long it had said nothing."""
    return f"{describe(seen)} ({seen.lines} lines), silent for {now.mono - seen.at:.1f} s"
