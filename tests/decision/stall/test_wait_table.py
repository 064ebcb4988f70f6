"""A wait kind's meaning is one row of ``witness.WAITS``: every kind the worker can report has its row, and the
orders it sets (which word tells a stall best, which rank is the hung one) leave no tie between two kinds."""

from supervisor.decision.stall import witness
from worker.wire.contract import WaitKind


def test_every_wait_kind_the_worker_reports_has_its_row():
    assert set(witness.WAITS) == set(WaitKind)


def test_no_two_kinds_tie_in_telling_a_stall_or_naming_the_hung_rank():
    telling = [w.telling for w in witness.WAITS.values()]
    assert len(set(telling)) == len(telling)
    hung = [w.hung for w in witness.WAITS.values() if w.hung is not None] + [witness.SAYS_NOTHING]
    assert len(set(hung)) == len(hung)


def test_what_a_kind_weighs_is_said_where_it_weighs_any():
    assert [k for k, w in witness.WAITS.items() if w.weighs is not None and not w.weighs_why] == []
