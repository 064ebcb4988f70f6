"""A DDP restart at a forkserver rung (issue 49.2), in real processes: Ultralytics' DDP path under torch.distributed.run,
two gloo ranks on the CPU (``YOLO_TRAIN_CPU_RANKS``). Each rank forks its loader's forkserver at its first line (its
imports done: a new interpreter importing torch, cv2 and Ultralytics is what its first batch waited for), and each
rank's share of the restart is in the incident, step by step."""

import pytest

from tests.helpers.supervised import DDP_CONFIG, read_incidents, read_state, yolo_train

LADDER = '[ladder]\nprior_between_hangs = "off"\nrungs = [{ start_method = "forkserver" }]\n'
NEW_SERVER = "from multiprocessing.forkserver import main"  # the command line of a forkserver that is a new interpreter


@pytest.mark.e2e
def test_at_the_forkserver_rung_each_rank_forks_its_server_and_says_its_share_of_the_restart(write_config, tmp_path):
    state_dir = tmp_path / "state"
    # epochs enough that a hang in attempt 2 lands in training, past what its loader worker prefetched
    config = write_config(DDP_CONFIG.format(extra_env="").replace("epochs = 3\n", "epochs = 6\n") + LADDER)
    # rank 1's loader worker hangs in attempt 1 (rung 0: forked workers), then again in attempt 2, at the forkserver
    # rung: the second incident holds the tree of an attempt whose ranks started their servers
    faults = [f"--fault=dataloader_hang,at_batch={batch},attempt={n},rank=1" for n, batch in ((1, 6), (2, 2))]
    result = yolo_train("run", "--config", str(config), "--state-dir", str(state_dir), *faults, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    assert read_state(state_dir)["status"]["state"] == "succeeded"
    first, second = read_incidents(state_dir)[:2]
    assert (first["rung"], second["rung"]) == (0, 1)
    processes = {p["pid"]: p for p in second["processes"]}
    ranks = {r["rank"]: r["pid"] for r in second["ranks"]}
    for rank, pid in ranks.items():
        # the rank's children but multiprocessing's resource tracker: its forkserver, parent of its loader worker
        servers = [p for p in processes.values() if p["ppid"] == pid and "resource_tracker" not in p["cmdline"]]
        assert len(servers) == 1, (rank, servers)
        [server] = servers
        assert server["cmdline"] == processes[pid]["cmdline"], server  # a fork of the rank, not a new interpreter
        assert [p for p in processes.values() if p["ppid"] == server["pid"]], server
    below = set(ranks.values())  # the ranks' trees (the launching worker has a server of its own, started ahead)
    while True:
        more = {p["pid"] for p in processes.values() if p["ppid"] in below} - below
        if not more:
            break
        below |= more
    assert not [p for p in processes.values() if p["pid"] in below and NEW_SERVER in p["cmdline"]]
    # each rank's share of the restart onto the forkserver rung, its first batch among its steps
    for incident in (first, second):
        assert [r["rank"] for r in incident["rank_parts"]] == [0, 1]
        assert all("start" in r["parts"] and "first_batch" in r["parts"] for r in incident["rank_parts"])
