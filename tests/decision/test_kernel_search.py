"""MIOpen's kernel search is news of the startup step it runs in (decision/stall/kernel_search.py), in the pure core with a
chosen clock: a search that prints keeps its step alive past ``startup_timeout``; one that goes silent for the step's
bound is a hang whose incident names the search; status says "first_step: MIOpen search, N runs left"; the step's
stretch is kept whole, so an attempt that finds the results cached is not bounded by the gaps between its lines."""

from __future__ import annotations

from pathlib import Path

import pytest

from supervisor.attempt import search_lines
from supervisor.decision import core
from supervisor.decision.stall import watchdog
from supervisor.decision.status_view import snapshot
from supervisor.verbs.status import render
from tests.decision.test_startup_steps import STEPS_OF_A_START, start, step
from tests.helpers.driver import Driver, kinds, make, verdicts

FIXTURE = Path(__file__).parent.parent / "fixtures" / "miopen" / "search.log"
SEARCH = [n for line in FIXTURE.read_text().splitlines() if (n := search_lines.read(line)) is not None]


def in_first_step(startup_timeout: float = 600) -> Driver:
    d = Driver(make(watchdog={"startup_timeout": startup_timeout}))
    d.boot_and_spawn()
    start(d, steps=STEPS_OF_A_START, first_batch=False)
    step(d, "first_step")
    return d


def search(d: Driver, every: float, lines=SEARCH) -> None:
    """Each of the search's lines ``every`` seconds after the last, the clock checked before each."""
    for news in lines:
        d.at(d.t + every)
        assert d(core.Tick()) == []
        d(news)


def test_a_search_that_prints_for_longer_than_startup_timeout_is_not_killed_and_status_says_where_it_is():
    d = in_first_step()
    entered = d.t
    search(d, 100.0)  # 13 lines, 1300 s: twice startup_timeout, never 600 s without a line
    assert d.s.state == core.State.STARTING and d.t - entered > 2 * 600
    status = snapshot(d.s, core.Now(d.t, 0.0)).to_dict()
    assert status["startup_step_search"] == "MIOpen search, 0 runs left"
    d(SEARCH[1])  # 287 left
    text = render({**status, **snapshot(d.s, core.Now(d.t, 0.0)).to_dict()}, now=0.0)
    assert "startup   step first_step: MIOpen search, 287 runs left, bound 10m00s without news" in text
    d.at(d.t + 30).beat(pid=d.s.current.worker_pid, epoch=1, epochs=3, batch=1, batches=10, samples=4)
    assert d.s.state == core.State.HEALTHY
    # Kept whole, from the step's entry: a later attempt whose search is cached says nothing for as long.
    assert d.s.startup_steps_seen["first_step"] == pytest.approx(d.t - entered)


def test_a_search_that_goes_silent_for_the_steps_bound_is_a_hang_and_its_incident_names_the_search():
    d = in_first_step()
    search(d, 100.0, SEARCH[:4])  # 262 left at the last line
    last = d.t
    assert watchdog.deadline(d.s).at == last + 600
    assert verdicts(d.at(last + 599.9)(core.Tick())) == []
    actions = d.at(last + 600.01)(core.Tick())
    assert kinds(actions)[-1] == "KillTree"
    incident = actions[-1].incident
    assert incident.startup_step == "first_step"
    assert incident.kernel_search == "MIOpen search, 236 runs left (4 lines), silent for 600.0 s"
    assert "a kernel search went silent, MIOpen search, 236 runs left" in incident.detail


def test_the_same_count_again_is_no_news():
    d = in_first_step(startup_timeout=60)
    d.at(d.t + 30)(SEARCH[1])
    said = d.t
    d.at(d.t + 29)(SEARCH[1])
    assert watchdog.deadline(d.s).at == said + 60
    assert kinds(d.at(said + 60.01)(core.Tick()))[-1] == "KillTree"


def test_a_search_line_in_training_changes_nothing():
    d = in_first_step()
    d.at(d.t + 5).beat(pid=d.s.current.worker_pid, epoch=1, epochs=3, batch=1, batches=10, samples=4)
    due = watchdog.deadline(d.s)
    d.at(d.t + 1)(SEARCH[2])
    assert watchdog.deadline(d.s) == due and d.s.current.search is None
