"""The forkserver rung for real: the standby starts and preloads the loader workers' forkserver while it waits, the
supervisor climbs to ``start_method = "forkserver"``, the worker's DataLoader workers fork from that server (not from
the training process), the loader faults fire in them, and their tree is killed whole."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import psutil
import pytest

from tests.conftest import ROOT, climb_to_loader_rung
from tests.test_e2e import wait_for
from worker.contract import ENV_FORKSERVER, STANDBY_FLAG

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
    # main + the server + 2 workers + the resource tracker that multiprocessing starts beside it: none outlives it.
    assert second["kill"]["processes"] == 5 and second["kill"]["survivors"] == []
    assert status["settings"]["start_method"] == "forkserver"


def test_a_standby_made_for_a_forkserver_rung_starts_the_server_with_torch_and_cv2_imported_while_it_waits():
    env = {**os.environ, "PYTHONPATH": str(ROOT), ENV_FORKSERVER: "1"}
    standby = subprocess.Popen([sys.executable, "-m", "worker", STANDBY_FLAG], cwd=ROOT, env=env,
                               stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        def preloaded_server() -> int | None:
            for child in psutil.Process(standby.pid).children():
                try:
                    maps, cmdline = Path(f"/proc/{child.pid}/maps").read_text(), " ".join(child.cmdline())
                except (OSError, psutil.Error):
                    continue
                if "forkserver" in cmdline and re.search(r"cv2.*\.so", maps) and "libtorch" in maps:
                    return child.pid
            return None

        server = wait_for(preloaded_server, 120, "the standby's forkserver, its imports done")
        standby.stdin.close()  # no launch: the standby exits, and its server with it
        assert standby.wait(timeout=60) == 0
        wait_for(lambda: not psutil.pid_exists(server) or psutil.Process(server).status() == psutil.STATUS_ZOMBIE,
                 30, "the server's end")
    finally:
        standby.kill()
