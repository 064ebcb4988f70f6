"""The ladder moves only for evidence a rung changes (issues 48.3, 49.1, 49.3), on a chosen clock: under DDP the
hung rank's word weighs the rungs, never its peers', which wait for it in DDP's backward all-reduce or a collective;
a frozen tree, the training process's own lock or loop of Python count against no rung."""

import pytest

from supervisor.decision import core
from supervisor.decision.model.actions import Spawn
from supervisor.decision.learning import choices
from tests.decision.learning.test_hang_learning import Night
from tests.decision.stall.test_rank_naming import RANK_0, RANK_1, status
from tests.decision.stall.test_witness_judgement import LAST_BATCH, word
from tests.helpers.driver import kinds, loading
from worker.wire.contract import DDP_BACKWARD

PEERS = {"collective": dict(function=DDP_BACKWARD), "barrier": dict(function="barrier")}
OWN = {  # rank 1's own wait -> (its phrase, what the rung choice says of it, whether it counts against the rung: None, as
# the ladder has it (this CPU ladder has no rung that changes the device's runtime))
    "lock": (dict(function="acquire"), "rank 1 waits on a lock (acquire)", "no rung changes it", False),
    "spin": ({}, "rank 1 waits in no known wait at", "a loop of its own: no rung changes it", False),
    "device": (dict(function="synchronize"), "rank 1 waits for the device (synchronize)",
               "the rungs that change the device's runtime", None),
}


@pytest.mark.parametrize("own", OWN)
@pytest.mark.parametrize("peer", PEERS)
def test_rank_1_is_named_over_rank_0_waiting_for_its_peers_and_the_rungs_weigh_rank_1s_word(own, peer):
    d = loading(ladder={"prior_between_hangs": "off"})
    d.beat("train", kind="loader", pid=RANK_1, rank=1, progress=0, pids=[5101], seconds=0.4, loader="train")
    d.t = LAST_BATCH + 1.0
    # rank 0's progress is the older: by the old rule (the order of kinds, then the oldest) it was named
    word(d, "collective", pid=RANK_0, rank=0, **PEERS[peer])
    fields, phrase, why, counts = OWN[own]
    word(d, "elsewhere" if own == "spin" else own, pid=RANK_1, rank=1, **fields)
    watchdog = status(d)["watchdog"]
    assert watchdog["hung_rank"] == 1
    assert watchdog["ranks"][1]["waiting"].startswith(phrase)
    choice = choices.after_a_hang(d.s)
    assert choice.why.startswith(phrase) and why in choice.why and counts in (None, choice.counts)
    assert d.s.rung == 0
    d.at(LAST_BATCH + 10.01)(core.Tick())
    incident = d.s.incidents[-1].to_dict()
    assert incident["hung_rank"] == 1
    first, second = incident["witness"].split("; ")
    assert first.startswith(phrase) and second.endswith("for rank 1")
    if peer == "collective":
        assert second.startswith(f"rank 0 waits in {DDP_BACKWARD} at ")


def test_a_frozen_tree_restarts_where_the_ladder_stands_and_the_log_says_why():
    night = Night({0: 2.0, 1: 1.8}, ladder={"prior_between_hangs": "off"})
    night.train(6)
    d = night.d
    d(core.TreeActivity(idle_since=d.t, stopped=frozenset({night.pid, 5001, 5002})))
    actions = night.hang()
    assert "KillTree" in kinds(actions) or any(isinstance(a, Spawn) for a in actions)
    assert night.spawns[-1].rung == 0 and d.s.rung == 0
    assert choices.rung_facts(d.s)[0].hangs == 0
    why = [a.text for a in actions if isinstance(a, core.Log) and "frozen" in a.text]
    assert why and "no rung changes it" in why[0] and "counts against no rung" in why[0]


def test_a_loop_of_python_in_the_training_process_stays_and_a_native_busy_wait_weighs_the_environment_rungs():
    spin = Night({0: 2.0, 1: 1.8}, ladder={"prior_between_hangs": "off"})
    spin.train(6)
    actions = spin.hang({"kind": "elsewhere"})
    assert spin.d.s.rung == 0 and choices.rung_facts(spin.d.s)[0].hangs == 0
    why = [a.text for a in actions if isinstance(a, core.Log) and "a loop of its own" in a.text]
    assert why and "no rung changes it" in why[0] and "counts against no rung" in why[0]
    native = Night({0: 2.0, 1: 1.8}, ladder={"prior_between_hangs": "off"})
    native.train(6)
    native.d.beat("train", kind="wait", pid=native.pid, progress=native.d.progress,
                  wait={"kind": "elsewhere", "where": "trainer.py:42 in step", "stalled": 1.0, "function": "item"})
    choice = choices.after_a_hang(native.d.s)  # (this CPU ladder has no environment rung: it stays, uncounted)
    assert "(item)" in choice.why and "only an environment rung" in choice.why


@pytest.mark.parametrize("peer", PEERS)
def test_rank_1_stopped_while_rank_0_waits_for_it_moves_no_rung(peer):
    """Under DDP SIGSTOP from outside lands on one rank's tree (issue 49's night: rank 1's tree frozen in validation
    climbed to the forkserver rung): its peers wait for it in a collective, so the whole tree is not stopped, but a
    stopped process is a signal's or a debugger's doing, which no rung changes."""
    d = loading(ladder={"prior_between_hangs": "off"})
    d.beat("train", kind="loader", pid=RANK_1, rank=1, progress=0, pids=[5101], seconds=0.4, loader="train")
    d.t = LAST_BATCH + 1.0
    word(d, "collective", pid=RANK_0, rank=0, **PEERS[peer])
    d(core.TreeActivity(idle_since=d.t, stopped=frozenset({RANK_1, 5101})))
    assert status(d)["watchdog"]["hung_rank"] == 1
    choice = choices.after_a_hang(d.s)
    assert choice.counts is False and choice.rung == 0, choice.why
    assert choice.why.startswith("rank 1's process is stopped (frozen from outside)"), choice.why
    assert "no rung changes it" in choice.why
