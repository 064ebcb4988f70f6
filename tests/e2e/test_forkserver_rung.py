"""The forkserver rung for real: the standby starts and preloads the loader workers' forkserver while it waits, the
supervisor climbs to ``start_method = "forkserver"``, the worker's DataLoader workers fork from that server (not from
the training process), the loader faults fire in them, and their tree is killed whole."""

from __future__ import annotations

import pytest

from tests.helpers.supervised import climb_to_loader_rung

pytestmark = pytest.mark.e2e


def test_rung_1_trains_on_workers_forked_from_the_forkserver_and_their_loader_faults_fire(tmp_path):
    # attempt 1 (rung 0): the forked workers hang; attempt 2 (rung 1): the workers forked from the server hang,
    # which only a hook that reached them by pickle can do; attempt 3 (rung 1, the top) finishes.
    status, first, second = climb_to_loader_rung(tmp_path, "forkserver-rung", '{ start_method = "forkserver" }')
    assert first["settings"]["start_method"] == "fork" and first["kill"]["processes"] == 3  # main + 2 workers
    assert second["settings"]["start_method"] == "forkserver" and second["settings"]["workers"] == 2
    tree = {p["pid"]: p for p in second["processes"]}
    [server] = [p for p in tree.values() if p["ppid"] == second["worker_pid"] and "forkserver" in p["cmdline"]]
    assert len([p for p in tree.values() if p["ppid"] == server["pid"]]) == 2  # the loader workers, its children
    # Attempt 2 was the standby made for rung 1, which started the server while it waited, preloaded: torch, cv2 and
    # Ultralytics make hundreds of MB where a bare forkserver holds about 15.
    assert "--standby" in tree[second["worker_pid"]]["cmdline"] and server["rss_bytes"] > 200 * 2**20
    # main + the server + 2 workers + the resource tracker that multiprocessing starts beside it: none outlives it.
    assert second["kill"]["processes"] == 5 and second["kill"]["survivors"] == []
    assert status["settings"]["start_method"] == "forkserver"

