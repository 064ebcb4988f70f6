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
from tests.decision.stall.test_startup_steps import STEPS_OF_A_START, start, step
from tests.helpers.driver import Driver, healthy, kinds, make, verdicts

FIXTURE = Path(__file__).parents[2] / "fixtures" / "miopen" / "search.log"
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
    assert d.s.watch.deadline.at == last + 600
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
    assert d.s.watch.deadline.at == said + 60
    assert kinds(d.at(said + 60.01)(core.Tick()))[-1] == "KillTree"


def training(startup_timeout: float = 600) -> Driver:
    """Healthy at 0.5 s a batch, its witness heard once: a stall there is bounded at 10 s (auto_floor), 3 s held at
    one place."""
    d = healthy(watchdog={"startup_timeout": startup_timeout})
    d.beat("train", kind="wait", progress=d.progress, wait={"kind": "elsewhere", "where": "a.py:1 in f",
                                                             "stalled": 0.5})
    d.train_until(d.t + 2, 0.5)
    return d


def held_in_conv(d: Driver, phase: str = "train") -> None:
    """The witness's word: the main thread in the convolution the search times, every half second."""
    d.beat(phase, kind="wait", progress=d.progress, wait={"kind": "elsewhere", "where": "conv.py:456 in _conv_forward",
                                                           "stalled": 0.5})


@pytest.mark.parametrize("phase", ["train", "val"])
def test_a_search_that_prints_mid_epoch_or_at_validations_first_batch_is_not_killed(phase):
    """Issue 50: a search of 30 s mid-epoch (a line every 2 s) was killed at 12.7 s, "held at one place"; one at
    validation's first batch at 10 s. Its lines are news in every phase: the stall runs from the last line, bounded as
    a search (startup_timeout), whatever the witness says; the batch it held is no interval of the phase's rhythm."""
    d = training()
    if phase == "val":
        d.beat("val", kind="phase")
    start, intervals, places = d.t, list(d.s.current.intervals.get(phase, ())), dict(d.s.one_place_seen)
    for k, news in enumerate(SEARCH * 2):  # a line every 2 s, 48 s and more
        for half in range(4):
            d.at(start + 2 * k + 0.5 * half)
            held_in_conv(d, phase)
            assert verdicts(d(core.Tick())) == [], (k, d.s.watch.deadline)
        d(news)
    assert d.s.watch.deadline.label == "kernel search, startup_timeout"
    assert d.s.state == core.State.HEALTHY and d.t - start > 45
    d.at(d.t + 1).beat(phase, epoch=1, epochs=3, batch=2, batches=10, samples=4)
    assert list(d.s.current.intervals.get(phase, ())) == intervals and d.s.one_place_seen == places
    assert d.s.watch.deadline.label != "kernel search, startup_timeout"  # progress: the search is over


def test_a_search_silent_for_its_bound_mid_training_is_a_hang_that_says_so_and_the_next_attempt_bounds_it_alike():
    d = training(startup_timeout=60)
    for news in SEARCH[:4]:
        d.at(d.t + 2)(news)
    last = d.t
    assert d.s.watch.deadline == watchdog.Deadline(last + 60, watchdog.DeadlineKind.PHASE,
                                                       "kernel search, startup_timeout")
    assert d(SEARCH[3]) == [] and d.s.watch.deadline.at == last + 60  # the same count again is no news
    assert verdicts(d.at(last + 59.9)(core.Tick())) == []
    actions = d.at(last + 60.1)(core.Tick())
    incident = [a for a in actions if isinstance(a, core.KillTree)][0].incident
    assert "a kernel search went silent, MIOpen search, 236 runs left (4 lines), silent for 60.1 s" in incident.detail
    assert incident.kernel_search.endswith("bounded as a search (startup_timeout 60 s) in every attempt, never by the "
                                           "phase's batch rhythm")
    d(core.TreeKilled(killed=2))
    d(core.Spawned(4243, "/s/last.pt"))
    d.beat("train", kind="phase", pid=4243)
    for _ in range(10):
        d.at(d.t + 0.5).beat(pid=4243, epoch=1, epochs=3, batch=1, batches=10, samples=4)
    assert d.s.state == core.State.HEALTHY
    d.at(d.t + 1)(SEARCH[1])  # the same search at the same point: a search's bound again, not the batch's
    assert d.s.watch.deadline == watchdog.Deadline(d.t + 60, watchdog.DeadlineKind.PHASE,
                                                       "kernel search, startup_timeout")


