"""One stall, judged once (issues 47, 60): a decision judges the stall under way once, at its end
(``watchdog.watch``, kept as ``Supervision.watch``), and the next tick's verdict, the recovery tier
(``tier.Verdict.stall``) and the hang's incident read that judgement; the loop between decisions judges nothing; the incident's words
of the witness are written by one builder (``tier.witness_fields``) for every tier. On a chosen clock: ``loading``
trains at 0.5 s a batch until LAST_BATCH; then rank 1 waits for a batch from its loader worker 5101, rank 0 in
all_reduce."""

import pytest

from supervisor.decision import core
from supervisor.decision.model.actions import ReadStacksAhead
from supervisor.decision.model.persistence import to_json
from supervisor.decision.recovery import tier
from supervisor.decision.stall import watchdog
from tests.decision.stall.test_witness_judgement import LAST_BATCH, loader_word, word
from tests.helpers.driver import kinds, loading

VERDICT = LAST_BATCH + 5.01  # the loader's idle floor (3 s) from the word, 1 s in, has passed


def ddp_loader_hang(**sections):
    d = loading(**sections)
    d.beat("train", kind="loader", pid=7001, rank=1, progress=0, pids=[5101, 5102], seconds=0.4, loader="train")
    d.t = LAST_BATCH + 1.0
    word(d, "collective", pid=7002, rank=0, function="all_reduce")  # rank 0 waits for rank 1's gradients
    loader_word(d, 5101, pid=7001, rank=1)
    return d


def judgements(monkeypatch) -> list:
    """Each judgement of the stall from here on (every caller reads ``watchdog.current_stall`` by its module)."""
    calls, judge = [], watchdog.current_stall

    def counted(s, own_stacks):
        calls.append(s.state)
        return judge(s, own_stacks)
    monkeypatch.setattr(watchdog, "current_stall", counted)
    return calls


def test_a_heartbeat_and_a_tick_before_any_deadline_judge_the_stall_once_each(monkeypatch):
    d = loading()
    calls = judgements(monkeypatch)
    d.beat("train", epoch=1, epochs=3, batch=LAST_BATCH, batches=100, samples=4)
    assert len(calls) == 1
    calls.clear()
    assert decide(d, d.t + 0.1) == [] and len(calls) == 1
    assert d.s.watch.stall is not None and d.s.watch.deadline.at > d.t  # what the loop reads until the next one


def decide(d, t: float) -> list:
    return core.decide(d.s, core.Tick(), core.Now(t, 1_700_000_000 + t))[1]


def test_the_tick_that_hands_a_hang_to_the_in_place_tier_judges_its_stall_once(monkeypatch):
    d = ddp_loader_hang()
    calls = judgements(monkeypatch)
    actions = decide(d, VERDICT)
    assert kinds(actions) == ["Log", "ReplaceLoaderWorkers"]
    assert len(calls) == 1


def test_the_ticks_that_read_a_hangs_stacks_ahead_and_restart_it_judge_its_stall_once_each(monkeypatch):
    d = ddp_loader_hang(recovery={"in_place": False})
    calls = judgements(monkeypatch)
    [ask] = decide(d, VERDICT)  # its verdict is due before its stacks were read: they are asked for first
    assert isinstance(ask, ReadStacksAhead) and len(calls) == 1
    calls.clear()
    actions = decide(d, VERDICT)  # asked, not read yet (none to give): the verdict, and the kill reads them
    assert kinds(actions)[-1] == "KillTree" and d.s.state == core.State.STOPPING
    assert len(calls) == 1


def test_both_tiers_write_the_witness_fields_of_one_builder_for_the_same_stall():
    written = {}
    for in_place in (True, False):
        d = ddp_loader_hang(recovery={"in_place": in_place})
        built = tier.witness_fields(d.s, d.s.watch.stall, core.Now(VERDICT, 1_700_000_000 + VERDICT))
        d.at(VERDICT)(core.Tick())
        incident = d.s.incidents[-1].to_dict()
        assert incident.get("tier") == ("in_place" if in_place else "restart")
        written[in_place] = {key: incident.get(key) for key in ("witness", "hung_rank", "ranks")}
        assert written[in_place] == {key: to_json(value) for key, value in built.items()}
    assert written[True] == written[False] and written[True]["hung_rank"] == 1
    assert written[True]["witness"].startswith("rank 1 waits for a batch from train loader worker 0 (pid 5101")


@pytest.mark.parametrize("field", ["witness", "hung_rank", "ranks"])
def test_no_tier_writes_a_witness_field_the_builder_did_not(monkeypatch, field):
    """The builder is the only writer: emptied, neither tier's incident has a word of the witness."""
    for in_place in (True, False):
        d = ddp_loader_hang(recovery={"in_place": in_place})
        monkeypatch.setattr(tier, "witness_fields", lambda *args, **kwargs: {})
        d.at(VERDICT)(core.Tick())
        assert field not in d.s.incidents[-1].to_dict()
        monkeypatch.undo()
