"""A hung tree's stacks, read ahead of the verdict: the restart's kill waits for nothing.

The stacks are the incident's record (py-spy's native frames name a runtime's busy wait), not the verdict's
evidence where the witness spoke; read between the verdict and the kill, they delayed every restart by their capture
(``dump --native`` of a CUDA training process loads libtorch_cuda's symbols, which takes seconds). So the
watchdog asks for them once the stall has lasted its bound less a lead (``Stall.stacks_at``, kept on ``Supervision.watch``)::

    stall at bound - lead --ReadStacksAhead--> the shell reads the tree, left running, as a kill would
      --StacksReadAhead--> kept on the attempt while that stall goes on
    progress, news, a startup step (the stall is over) --> forgotten, their file removed (DropStacksAhead)
    the stall's hang verdict --> its incident takes them (``taken``): the shell moves their file into the
    incident's directory and kills at once

A stall the in-place tier would take is not read ahead: that tier reads its own stacks, or needs none.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from supervisor.decision.model.actions import DropStacksAhead, Log, ReadStacksAhead
from supervisor.decision.model.events import Now, StacksReadAhead
from supervisor.decision.model.incident import Stacks
from supervisor.decision.model.state import StacksAhead, Supervision
from supervisor.decision.stall import watchdog, witness
from supervisor.vocabulary import State


def ask(s: Supervision, now: Now, stall: watchdog.Stall) -> list[Any]:
    """``stall`` nears its verdict (its ``stacks_at`` is due): read its stacks now."""
    a = s.current
    a.stacks_ahead = StacksAhead(stall.since, now.mono)  # asked: not again for this stall unless its bound grows
    hung = witness.rank_fields(a.ranks, a.waits, a.loaders, a.stopped).get("hung_rank")
    return [ReadStacksAhead(s.attempt, stall.since, tuple(a.loaders), {v.pid: r for r, v in a.ranks.items()}, hung)]


def read(s: Supervision, event: StacksReadAhead, now: Now) -> list[Any]:
    """The shell read them: kept while their stall goes on; a stall over already (it cannot be, the shell answers
    before any other event, but a pause moves every clock) has them dropped at once."""
    a, since = s.current, _since(s)
    if a.stacks_ahead is None or since is None or not event.since == since == a.stacks_ahead.since:
        return [DropStacksAhead(event.stacks.path)]
    a.stacks_ahead = StacksAhead(event.since, event.at, event.stacks)
    due = s.watch.deadline.at  # the last decision's: stacks kept do not move the verdict
    left = f", {due - now.mono:.1f} s before its verdict is due" if due is not None else ""
    return [Log("info", f"read the stacks of the stall ahead of its verdict in {event.stacks.seconds:.2f} s "
                        f"(no progress for {event.at - event.since:.1f} s{left}): {event.stacks.where}")]


def taken(s: Supervision, now: Now, stall: watchdog.Stall | None) -> Stacks | None:
    """At a hang's verdict on ``stall``: the stacks read ahead of it, for its incident, with how long before it they
    were read (``Stacks.ahead``); None: none (the kill reads them). The attempt keeps them no more."""
    a = s.current
    ahead, a.stacks_ahead = a.stacks_ahead, None
    if ahead is None or ahead.stacks is None or stall is None or ahead.since != stall.since:
        a.stacks_ahead = ahead  # (``stale`` drops them after this event)
        return None
    return replace(ahead.stacks, ahead=round(now.mono - ahead.at, 3))


def where(s: Supervision, stall: watchdog.Stall | None) -> str | None:
    """Where the stacks read ahead of ``stall`` put the training process (``Stacks.where``); None: unread."""
    ahead = s.current.stacks_ahead
    if ahead is None or ahead.stacks is None or stall is None or ahead.since != stall.since:
        return None
    return ahead.stacks.where


def stale(s: Supervision) -> list[Any]:
    """After every event: stacks read ahead for a stall that is over (progress, news, a startup step, a stop, an
    in-place recovery that took the verdict) are forgotten and their file removed."""
    ahead = s.current.stacks_ahead
    if ahead is None:
        return []
    since = _since(s)
    if since is not None and since == ahead.since:
        return []
    s.current.stacks_ahead = None
    return [DropStacksAhead(ahead.stacks.path)] if ahead.stacks is not None else []


def _since(s: Supervision) -> float | None:
    """When the current stall began, without judging it again: stacks read ahead are matched by it."""
    return watchdog.stall_since(s) if s.state in (State.STARTING, State.HEALTHY) else None
