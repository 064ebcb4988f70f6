"""The spawned-workers rung for real: the supervisor climbs to ``start_method = "spawn"``, the worker's DataLoader
workers are fresh interpreters fed the pickled dataset, the loader faults fire in them, and their tree is killed
whole."""

from __future__ import annotations

import pytest

from tests.helpers.supervised import climb_to_loader_rung


@pytest.mark.e2e
def test_rung_1_trains_on_spawned_workers_and_their_loader_faults_fire(tmp_path):
    # attempt 1 (rung 0, forked workers): the training loop hangs after its first batch; attempt 2 (rung 1): the
    # spawned workers hang, which only a hook that reached them by pickle can do; attempt 3 (rung 1) finishes.
    status, first, second = climb_to_loader_rung(tmp_path, "spawn-rung", '{ start_method = "spawn" }')
    assert first["settings"]["start_method"] == "fork" and first["kill"]["processes"] == 3  # main + 2 workers
    assert second["settings"]["start_method"] == "spawn" and second["settings"]["workers"] == 2
    # main + 2 workers + the resource tracker that multiprocessing starts beside spawned processes: none outlives it.
    assert second["kill"]["processes"] == 4 and second["kill"]["survivors"] == []
    assert status["settings"]["start_method"] == "spawn"
