"""The spawned-workers rung for real: the supervisor climbs to ``start_method = "spawn"``, the worker's DataLoader
workers are fresh interpreters fed the pickled dataset, the loader faults fire in them, and their tree is killed
whole."""

from __future__ import annotations

import textwrap

import pytest

from tests.conftest import demo_train, read_incidents, read_state, yolo_train

CONFIG = """
name = "spawn-rung"
{train}[metrics]
listen = "off"
[kernel_log]
source = "off"
gpu_events = "off"
[watchdog]
startup_timeout = 90
[restart]
backoff_initial = 0.5
[ladder]
rungs = [{{ start_method = "spawn" }}]
"""


@pytest.mark.e2e
def test_rung_1_trains_on_spawned_workers_and_their_loader_faults_fire(tmp_path):
    config = tmp_path / "config.toml"
    config.write_text(textwrap.dedent(CONFIG.format(train=demo_train())))
    state_dir = tmp_path / "state"
    # attempt 1 (rung 0): the forked workers hang; attempt 2 (rung 1): the spawned workers hang, which only a hook
    # that reached them by pickle can do; attempt 3 (rung 1, the top) finishes.
    result = yolo_train("run", "--config", str(config), "--state-dir", str(state_dir),
                        "--fault", "dataloader_hang,at_batch=5,attempt=1",
                        "--fault", "dataloader_hang,at_batch=3,attempt=2")
    assert result.returncode == 0, result.stderr[-3000:]
    status = read_state(state_dir)["status"]
    assert status["state"] == "succeeded" and (status["epoch"], status["epochs"]) == (3, 3)
    first, second = read_incidents(state_dir)
    assert (first["reason"], first["phase"], first["rung"]) == ("hang", "train", 0)
    assert first["settings"]["start_method"] == "fork" and first["kill"]["processes"] == 3  # main + 2 workers
    assert (second["reason"], second["phase"], second["rung"]) == ("hang", "train", 1)
    assert second["settings"]["start_method"] == "spawn" and second["settings"]["workers"] == 2
    # main + 2 workers + the resource tracker that multiprocessing starts beside spawned processes: none outlives it.
    assert second["kill"]["processes"] == 4 and second["kill"]["survivors"] == []
    assert status["rung"] == 1 and status["attempt"] == 3 and status["settings"]["start_method"] == "spawn"
