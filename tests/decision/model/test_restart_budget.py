"""The crash backoff: doubling per crash in a row, capped, for any number of crashes."""

from pathlib import Path

from supervisor.config import parse
from supervisor.decision.model.state import backoff_delay


def test_the_backoff_doubles_up_to_its_cap_and_stays_there_after_any_number_of_crashes():
    raw = {"train": {"epochs": 1}, "restart": {"backoff_initial": 0.5, "backoff_max": 60}}
    cfg = parse(raw, "<test>", state_dir=Path("/nonexistent")).restart
    assert [backoff_delay(n, cfg) for n in (0, 1, 2, 3, 6, 8)] == [0.0, 0.5, 1.0, 2.0, 16.0, 60.0]
    for n in (1025, 1026, 10_000):  # 2 ** 1024 no longer fits a float
        assert backoff_delay(n, cfg) == 60.0
