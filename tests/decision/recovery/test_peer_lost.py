"""Several hosts: a rank that lost its peer on another host mid-collective (gloo's connection reset, NCCL's remote
error) ends this host's attempt for the other host's failure: restarted at once (reason ``peer``), no crash counted,
no backoff, no rung change. Without several hosts, or with another failure as the worker's last words, a crash."""

import pytest

from supervisor.decision import core
from supervisor.decision.model.actions import Spawn
from tests.helpers.driver import PID, Driver, kinds, make

# gloo's own words, as a rank of host 0 said them when host 1's frozen rank was SIGKILLed (bench.ddp's hosts case)
GLOO_RESET = ("RuntimeError: [/__w/pytorch/pytorch/third_party/gloo/gloo/transport/tcp/pair.cc:545] Read error "
              "[127.0.0.1]:43440: Connection reset by peer. This is typically caused by a remote worker hanging or "
              "bugs in the application. Check the logs of the remote worker before reporting an error. GLHF!")
NCCL_REMOTE = ("torch.distributed.DistBackendError: NCCL error in: /pytorch/torch/csrc/distributed/c10d/NCCLUtils.hpp:"
               "268, remote process exited or there was a network error, NCCL version 2.21.5")
HOSTS = {"nnodes": 2, "node_rank": 0, "rdzv_endpoint": "10.0.0.1:29400", "rdzv_id": "job", "run_dir": "/shared"}


def training(several_hosts: bool = True) -> Driver:
    sections = {"restart": {"backoff_initial": 2}}
    if several_hosts:
        sections["distributed"] = HOSTS
    d = Driver(make(**sections))
    d.boot_and_spawn()
    d.beat("train", kind="phase")
    d.train_until(1005, 0.5)
    return d


@pytest.mark.parametrize("words", [GLOO_RESET, NCCL_REMOTE])
def test_a_rank_that_lost_another_hosts_rank_restarts_at_once_without_a_crash_counted(words):
    d = training()
    d.beat(kind="error", progress=d.progress, error=words)
    assert "KillTree" in kinds(d(core.WorkerExited(1)))
    peer = d.s.incidents[-1]
    assert (peer.reason, peer.phase) == ("peer", "train")
    assert peer.detail.startswith("exited with status 1 after its rank lost another host's (")
    assert peer.tiers == ("restart",)
    spawn = [a for a in d(core.TreeKilled(killed=1)) if isinstance(a, Spawn)]
    assert [s.attempt for s in spawn] == [2]  # at once: no backoff
    assert d.s.state == core.State.STARTING and d.s.backoff_until is None
    assert d.s.consecutive_crashes == 0 and dict(d.s.restarts_by_reason) == {"peer": 1}
    assert d.s.rung == 0 and d.s.hangs_by_phase == {}  # no rung change, no hang of this host's counted
    # a crash of its own after that is the first in a row: the shortest backoff
    d(core.Spawned(PID + 1, "/shared/weights/last.pt"))
    d.beat(pid=PID + 1, progress=1, epoch=1, epochs=3, batch=11, batches=20)
    d.beat("train", kind="error", pid=PID + 1, progress=1, error="RuntimeError: boom")
    d(core.WorkerExited(1))
    d(core.TreeKilled(killed=1))
    assert d.s.state == core.State.BACKOFF and d.s.backoff_until - d.t == pytest.approx(2.0)


def test_on_one_host_a_peers_reset_is_a_crash():
    """One host: the supervisor kills the whole tree itself, so a rank's lost peer is a crash of this tree's own."""
    d = training(several_hosts=False)
    d.beat(kind="error", progress=d.progress, error=GLOO_RESET)
    d(core.WorkerExited(1))
    assert d.s.incidents[-1].reason == "crash"
    d(core.TreeKilled(killed=1))
    assert d.s.state == core.State.BACKOFF


def test_a_reset_seen_before_another_failure_is_not_the_failure():
    """Only the worker's last words say what ended it: a rank's own error after a reset line is a crash."""
    d = training()
    d.beat(kind="error", progress=d.progress, error=GLOO_RESET)
    d.beat(kind="error", progress=d.progress, error="RuntimeError: a crash of its own")
    d(core.WorkerExited(1))
    assert d.s.incidents[-1].reason == "crash"


def test_a_ranks_lost_peer_in_the_output_stops_the_tree_at_once_before_its_launcher_winds_down():
    """The rank is dying of it; its launcher then closes its rendezvous and the worker exits, seconds on the path of
    both hosts' restart: the tree is killed on the line, and the exit that follows is the stop's own."""
    d = training()
    actions = d(core.SignatureSeen("peer_lost", core.Remedy.PEER_LOST, "restarted at once", f"[rank0]: {GLOO_RESET}"))
    assert "KillTree" in kinds(actions)
    peer = d.s.incidents[-1]
    assert (peer.reason, peer.phase) == ("peer", "train")
    assert peer.detail.startswith("a rank lost another host's ([rank0]: RuntimeError: [/__w/pytorch")
    assert d(core.WorkerExited(1)) == []  # an exit this host caused
    assert [a.attempt for a in d(core.TreeKilled(killed=3)) if isinstance(a, Spawn)] == [2]
    assert dict(d.s.restarts_by_reason) == {"peer": 1} and len(d.s.incidents) == 1


def test_on_one_host_a_lost_peer_in_the_output_is_only_remembered():
    d = training(several_hosts=False)
    actions = d(core.SignatureSeen("peer_lost", core.Remedy.PEER_LOST, "restarted at once", GLOO_RESET))
    assert kinds(actions) == ["Log"] and d.s.state == core.State.HEALTHY


def test_a_local_ranks_own_crash_whose_reset_reached_its_local_peer_is_this_hosts_crash():
    """Two ranks on this host: rank 1 crashed on its own, and rank 0 then met gloo's reset from it. The reset is not
    another host's failure: no restart at once on the line; the exit is this host's crash, named by rank 1's words,
    with its backoff."""
    d = training()
    d.beat(kind="error", pid=PID + 11, rank=1, local_rank=1, progress=0, error="RuntimeError: CUDA error: boom")
    d.beat(kind="error", pid=PID + 10, rank=0, local_rank=0, progress=0, error=GLOO_RESET)
    assert "KillTree" not in kinds(d(core.SignatureSeen("peer_lost", core.Remedy.PEER_LOST, "restarted at once",
                                                        f"[rank0]: {GLOO_RESET}")))
    d(core.WorkerExited(1))
    crash = d.s.incidents[-1]
    assert crash.reason == "crash" and "rank 1: RuntimeError: CUDA error: boom" in crash.detail, crash.detail
    d(core.TreeKilled(killed=3))
    assert d.s.state == core.State.BACKOFF and dict(d.s.restarts_by_reason) == {"crash": 1}


def test_a_reset_that_is_every_local_ranks_first_error_is_another_hosts_failure():
    """Two ranks on the healthy host: both met the reset of another host's rank; the first error is a reset."""
    d = training()
    d.beat(kind="error", pid=PID + 11, rank=1, local_rank=1, progress=0, error=GLOO_RESET)
    assert "KillTree" in kinds(d(core.SignatureSeen("peer_lost", core.Remedy.PEER_LOST, "restarted at once",
                                                    f"[rank1]: {GLOO_RESET}")))
    assert d.s.incidents[-1].reason == "peer"
