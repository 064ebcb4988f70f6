"""The ranks named (issue 39): under DDP each rank's witness says where it waits; the status and the incident say
which rank the others wait for and where each one waited (supervisor/decision/stall/witness.py's ``hung_rank``,
``by_rank``, ``ranks_phrase``). On a chosen clock: ``loading`` trains at 0.5 s a batch until LAST_BATCH."""

from supervisor.decision import core, status_view
from tests.decision.stall.test_witness_judgement import LAST_BATCH, word
from tests.helpers.driver import kinds, loading

RANK_0, RANK_1 = 7002, 7001


def status(d) -> dict:
    return status_view.snapshot(d.s, core.Now(d.t, 1_700_000_000 + d.t)).to_dict()


def test_a_rank_in_a_device_wait_is_named_and_the_rank_in_all_reduce_waits_for_it():
    d = loading()
    d.t = LAST_BATCH + 1.0
    word(d, "collective", pid=RANK_0, rank=0, function="all_reduce")  # rank 0 waits for rank 1's gradients
    word(d, "device", pid=RANK_1, rank=1, function="synchronize")
    watchdog = status(d)["watchdog"]
    assert watchdog["hung_rank"] == 1
    assert [(r["rank"], r["pid"], r["waiting_kind"]) for r in watchdog["ranks"]] == \
        [(0, RANK_0, "collective"), (1, RANK_1, "device")]
    assert watchdog["ranks"][1]["waiting"].startswith("rank 1 waits for the device (synchronize)")
    actions = d.at(LAST_BATCH + 5.01)(core.Tick())  # a device wait in training: the idle bound, then the restart
    assert "KillTree" in kinds(actions)
    incident = d.s.incidents[-1].to_dict()
    assert incident["hung_rank"] == 1
    assert [(r["rank"], r["waiting_kind"]) for r in incident["ranks"]] == [(0, "collective"), (1, "device")]
    first, second = incident["witness"].split("; ")
    assert first.startswith("rank 1 waits for the device (synchronize)")
    assert second.startswith("rank 0 waits in a collective (all_reduce)") and second.endswith("for rank 1")


def test_a_rank_that_says_nothing_while_another_waits_in_a_collective_is_the_hung_one():
    d = loading()
    d.beat("train", kind="loader", pid=RANK_1, rank=1, progress=0, pids=[5101], seconds=0.4, loader="train")
    d.t = LAST_BATCH + 1.0
    word(d, "collective", pid=RANK_0, rank=0, function="all_reduce")  # rank 1 is stopped: its witness is silent
    watchdog = status(d)["watchdog"]
    assert watchdog["hung_rank"] == 1
    assert watchdog["ranks"][1] == {"rank": 1, "pid": RANK_1, "waiting": None, "waiting_kind": None}
    d.at(LAST_BATCH + 10.01)(core.Tick())
    incident = d.s.incidents[-1].to_dict()
    assert incident["hung_rank"] == 1
    assert incident["witness"].startswith(f"rank 1 (pid {RANK_1}) says nothing")
    assert incident["witness"].endswith("for rank 1")


def test_one_process_has_no_ranks_in_its_status_nor_its_incident():
    d = loading()
    d.t = LAST_BATCH + 1.0
    word(d, "device", function="synchronize")
    assert (status(d)["watchdog"]["ranks"], status(d)["watchdog"]["hung_rank"]) == ([], None)
    d.at(LAST_BATCH + 5.01)(core.Tick())
    incident = d.s.incidents[-1].to_dict()
    assert "hung_rank" not in incident and "ranks" not in incident
    assert incident["witness"].startswith("waits for the device")


def test_a_rank_asleep_is_the_hung_one_beside_a_rank_in_backwards_all_reduce_and_of_two_device_waits_the_older():
    from supervisor.decision.stall import witness
    from supervisor.decision.model.state import RankView
    from supervisor.decision.stall.witness import WaitSeen
    from worker.wire.contract import WaitKind, WaitReport

    def seen(rank: int, kind: WaitKind) -> WaitSeen:
        return WaitSeen(WaitReport(kind=kind, where="x.py:1 in f", stalled=1.0), 100.0, rank)

    ranks = {0: RankView(RANK_0, last_progress_at=90.0), 1: RankView(RANK_1, last_progress_at=91.0)}
    # gloo: rank 0 in backward's all-reduce (a collective, worker/witness.py), rank 1 in the fault's sleep
    assert witness.hung_rank(ranks, {0: seen(0, WaitKind.COLLECTIVE), 1: seen(1, WaitKind.SLEEP)}, {}) == 1
    # NCCL: both wait for their device (rank 0's all-reduce kernel waits for rank 1's): the older progress hung
    assert witness.hung_rank(ranks, {0: seen(0, WaitKind.DEVICE), 1: seen(1, WaitKind.DEVICE)}, {}) == 0
    assert witness.hung_rank({}, {None: seen(0, WaitKind.DEVICE)}, {}) is None


def test_the_whole_tree_frozen_under_ddp_is_a_restart_that_says_so_and_names_every_rank_stopped():
    """Every rank and loader worker SIGSTOPped (bench/ddp.py's freeze): no rank speaks, /proc shows each stopped. The
    in-place tier declines before reading the stacks; the verdict says the tree is frozen, each rank is named."""
    d = loading()
    d.beat("train", kind="loader", pid=RANK_0, rank=0, progress=0, pids=[5201], seconds=0.4, loader="train")
    d.beat("train", kind="loader", pid=RANK_1, rank=1, progress=0, pids=[5101], seconds=0.4, loader="train")
    d.at(LAST_BATCH + 0.6)(core.TreeActivity(idle_since=LAST_BATCH + 0.5,
                                             stopped=frozenset({RANK_0, RANK_1, 5101, 5201, 5001, 5002})))
    watchdog = status(d)["watchdog"]
    assert [(r["rank"], r["waiting_kind"]) for r in watchdog["ranks"]] == [(0, "stopped"), (1, "stopped")]
    actions = d.at(LAST_BATCH + 10.01)(core.Tick())
    assert "KillTree" in kinds(actions) and "InspectStall" not in kinds(actions)
    incident = d.s.incidents[-1].to_dict()
    assert incident["escalation"] == "every rank's process is stopped (the whole tree frozen): restart"
    assert incident["witness"] == (f"every rank's process is stopped (the whole tree frozen): rank 0 (pid {RANK_0}), "
                                   f"rank 1 (pid {RANK_1})")
    assert [(r["rank"], r["pid"], r["waiting_kind"]) for r in incident["ranks"]] == \
        [(0, RANK_0, "stopped"), (1, RANK_1, "stopped")]
    assert incident["hung_rank"] == 0  # no rank hung: the oldest progress, as when all wait in a collective


def test_one_rank_stopped_while_the_other_waits_in_all_reduce_is_named_stopped_and_hung():
    d = loading()
    d.beat("train", kind="loader", pid=RANK_1, rank=1, progress=0, pids=[5101], seconds=0.4, loader="train")
    d.t = LAST_BATCH + 1.0
    word(d, "collective", pid=RANK_0, rank=0, function="all_reduce")
    d(core.TreeActivity(idle_since=LAST_BATCH + 0.5, stopped=frozenset({RANK_1})))
    d.at(LAST_BATCH + 10.01)(core.Tick())
    incident = d.s.incidents[-1].to_dict()
    assert incident["hung_rank"] == 1
    assert incident["witness"].startswith(f"rank 1 (pid {RANK_1}) is stopped (/proc says so); rank 0 waits in a "
                                          f"collective")
    assert incident["ranks"][1] == {"rank": 1, "pid": RANK_1, "waiting": f"rank 1 (pid {RANK_1}) is stopped",
                                    "waiting_kind": "stopped"}


def test_the_flight_recorder_dumps_the_shell_found_are_listed_in_the_incident():
    d = loading()
    d.t = LAST_BATCH + 1.0
    word(d, "collective", pid=RANK_0, rank=0, function="all_reduce")
    word(d, "device", pid=RANK_1, rank=1, function="synchronize")
    d.at(LAST_BATCH + 5.01)(core.Tick())
    incident = d.s.incidents[-1]
    dumps = ("incidents/x/flight_recorder_rank_0", "/tmp/nccl_trace_rank_1")
    d(core.IncidentEnriched(incident.id, (), flight_recorder=dumps))
    assert tuple(d.s.incidents[-1].to_dict()["flight_recorder"]) == dumps


def test_the_launchers_last_word_tells_no_stall_of_its_ranks():
    """CI (tests/e2e/test_multinode.py): the launching worker stops its witness as it starts its ranks
    (worker/training/train.py), and no progress of its own ever comes to end its last word, said while its setup imported a
    config module. In a stall of its ranks' that word was taken for the training process held at one place, and a
    host whose rank only waited for the other host's was killed at 3 s. A rank's progress ends the launcher's word."""
    from supervisor.decision.stall import watchdog
    from tests.helpers.driver import PID, Driver, make

    d = Driver(make())
    d.boot_and_spawn()
    d.beat("setup", kind="wait", progress=0, wait={"kind": "elsewhere", "stalled": 1.0,
                                                  "where": "torch/utils/_config_module.py:90 in __post_init__"})
    d.beat("train", kind="phase", pid=RANK_0, rank=0)
    while d.t + 0.5 <= LAST_BATCH:
        d.t += 0.5
        d.beat(pid=RANK_0, rank=0, epoch=1, epochs=3, batch=3, batches=10, samples=4)
    for k in range(1, 8):
        d.t = LAST_BATCH + 0.5 * k
        word(d, "collective", pid=RANK_0, rank=0, function="all_reduce")  # waits for the other host's rank
    assert None not in d.s.current.waits and PID != RANK_0
    assert "one place" not in d.s.watch.deadline.label
    assert kinds(d.at(LAST_BATCH + 3.01)(core.Tick())) == []
