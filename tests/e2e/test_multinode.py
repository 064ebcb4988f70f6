"""Several hosts: each host's supervisor launches its ranks through torch.distributed.run's c10d rendezvous.

On one machine, two supervisors play two hosts (127.0.0.1, gloo, one CPU rank each) sharing one run directory.
"""

import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from supervisor.config import ConfigError, parse
from tests.helpers import ROOT
from tests.helpers.supervised import quiet_config, read_incidents, read_state

# 16 batches an epoch at 192 px: an epoch's training outlasts the state file's 1 s updates, which the freeze waits on
HOST = """
name = "host-{node_rank}"
[train]
data = "demo"
model = "yolov8n.yaml"
epochs = {epochs}
imgsz = 192
batch = 2
workers = 0
device = "cpu"
plots = false
[distributed]
nnodes = 2
node_rank = {node_rank}
rdzv_endpoint = "127.0.0.1:{port}"
rdzv_id = "{rdzv_id}"
run_dir = "{run_dir}"
collective_timeout = 120
join_timeout = {join_timeout}
[worker]
standby = false
""" + quiet_config() + """[watchdog]
startup_timeout = 240
stall_timeout = {stall_timeout}
auto_floor = {auto_floor}
[restart]
backoff_initial = 0.5
"""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_host(tmp_path, node_rank: int, port: int, rdzv_id: str, join_timeout: float = 180,
               stall_timeout: float | str = 90, epochs: int = 2, faults: tuple[str, ...] = (),
               auto_floor: float = 10) -> subprocess.Popen:
    config = tmp_path / f"host-{node_rank}.toml"
    config.write_text(HOST.format(node_rank=node_rank, port=port, rdzv_id=rdzv_id, run_dir=tmp_path / "shared",
                                  join_timeout=join_timeout, stall_timeout=json.dumps(stall_timeout), epochs=epochs,
                                  auto_floor=auto_floor))
    log = open(tmp_path / f"host-{node_rank}.log", "w")
    return subprocess.Popen([sys.executable, "-m", "supervisor", "run", "--config", str(config), "--state-dir",
                             str(tmp_path / f"state-{node_rank}"), *(f"--fault={f}" for f in faults)], cwd=ROOT,
                            stdout=log, stderr=subprocess.STDOUT)


def wait_all(hosts: list[subprocess.Popen], timeout: float) -> list[int]:
    """Every host's exit status; none is left running, whatever happens."""
    try:
        return [h.wait(timeout=timeout) for h in hosts]
    finally:
        for h in hosts:
            if h.poll() is None:
                h.kill()
                h.wait()


def ours(tmp_path, rdzv_id: str) -> list[psutil.Process]:
    """Processes of either host's tree still alive: launchers (the rdzv id in their arguments), ranks (their start
    markers under tmp_path in their environment) and supervisors."""
    found = []
    for p in psutil.process_iter():
        try:
            if p.status() == psutil.STATUS_ZOMBIE:
                continue
            text = " ".join(p.cmdline()) + " " + p.environ().get("YOLO_TRAIN_RANKS_STARTED", "")
        except (psutil.Error, OSError):
            continue
        if rdzv_id in text or str(tmp_path) in text:
            found.append(p)
    return found


def frozen_rank_of_attempt_1(hosts: list[subprocess.Popen], state: Path, deadline: float) -> tuple[int, int]:
    """(pid, rank) of the host's rank in attempt 1, once its status shows it."""
    while True:
        assert time.monotonic() < deadline and all(h.poll() is None for h in hosts), \
            (state.parent / "host-1.log").read_text()[-3000:]
        time.sleep(0.5)
        try:
            status = read_state(state)["status"]
        except (OSError, ValueError, KeyError):
            continue
        if status["attempt"] == 1 and status["state"] == "healthy" and status["ranks"]:
            return status["ranks"][0]["pid"], status["ranks"][0]["rank"]


@pytest.mark.e2e
def test_a_frozen_rank_on_host_b_restarts_both_hosts_from_the_same_checkpoint_and_both_finish(tmp_path):
    port, rdzv_id = free_port(), f"job-{os.getpid()}"
    # B's own watchdog notices its frozen rank first; A's rank only waits on it in a collective: A learns through
    # its ranks' failure once B's are killed (A's stall timeout is longer than B's detection and kill)
    # Host B's rank stops itself (SIGSTOP) after its 24th batch: epoch 2's 8th of 16, after epoch 1's last.pt, inside
    # the epoch whatever this machine's speed (a freeze sent from outside once a status showed a batch could land at
    # the epoch's end, where the epoch end's timeout holds, not the batch rhythm). B's stall bound is "auto" over a
    # floor of 60 s: its rank stopped is found at the idle floor instead (an idle bound of 10 x its slowest batch,
    # at least 3 s, shorter than 60 s on any machine that trains this at all), though a rank waiting for another
    # host would get the 60 s.
    hosts = [start_host(tmp_path, 0, port, rdzv_id),
             start_host(tmp_path, 1, port, rdzv_id, stall_timeout="auto", auto_floor=60,
                        faults=("freeze,at_batch=24,attempt=1",))]
    deadline = time.monotonic() + 400
    try:
        frozen, frozen_rank = frozen_rank_of_attempt_1(hosts, tmp_path / "state-1", deadline)  # host B's
    finally:
        codes = wait_all(hosts, max(60.0, deadline - time.monotonic()))
    logs = [(tmp_path / f"host-{n}.log").read_text() for n in (0, 1)]
    assert codes == [0, 0], "\n".join(log[-3000:] for log in logs)

    a, b = (read_state(tmp_path / f"state-{n}")["status"] for n in (0, 1))
    for host in (a, b):
        assert host["state"] == "succeeded" and (host["epoch"], host["epochs"]) == (2, 2)
        # one restart a host: B's new launcher, had it met the round of A's old store, which A's old launcher closes
        # as it fails, joined again in place (worker/distributed/multinode.py's rejoin), not a second attempt
        assert host["attempt"] == 2 and host["resumed_from"] == str(tmp_path / "shared" / "weights" / "last.pt")
        assert host["settings"]["resumed"] is True
    assert (tmp_path / "shared" / "weights" / "best.pt").exists()
    # the same checkpoint: both hosts' last attempts began at the same epoch of it
    assert a["settings"]["start_epoch"] == b["settings"]["start_epoch"] == 2
    assert a["node_rank"] == 0 and b["node_rank"] == 1
    assert sorted(r["rank"] for r in a["ranks"] + b["ranks"]) == [0, 1]

    [hang] = read_incidents(tmp_path / "state-1")
    assert (hang["reason"], hang["phase"], hang["node_rank"]) == ("hang", "train", 1)
    assert "(train auto, idle " in hang["detail"], hang["detail"]  # a rank of its own stopped: the idle floor
    assert [r["waiting_kind"] for r in hang["ranks"]] == ["stopped"]
    assert (hang["epoch"], hang["batch"]) == (2, 8)  # where the freeze was asked for: epoch 2's 8th batch of 16
    assert hang["host"] == socket.gethostname() and hang["stopped_first_rank"] == frozen_rank
    assert frozen in [p["pid"] for p in hang["processes"]]
    [peer] = read_incidents(tmp_path / "state-0")  # host A read B's hang on the shared run_dir and restarted at once
    assert (peer["reason"], peer["node_rank"]) == ("peer", 0), peer["detail"]  # B's failure: no crash of A's
    # (B writes its decision before its kill, and A reads the shared file before any event but a heartbeat: before
    # the connection reset its rank prints once B's ranks are gone)
    assert "host 1" in peer["detail"] and "restarts for its hang in train" in peer["detail"], peer["detail"]
    assert a["restarts_by_reason"] == {"peer": 1} and b["restarts_by_reason"] == {"hang": 1}
    # and its incident names the host and rank that stopped first
    assert {k: peer["caused_by"][k] for k in ("node_rank", "stopped_first_rank", "reason", "id")} == \
        {"node_rank": 1, "stopped_first_rank": frozen_rank, "reason": "hang", "id": hang["id"]}
    # the ladder decision is the job's: B's hang chose the rung both hosts went on at (which rung is the choice rule's,
    # tested in the pure core: one hang after an epoch is no proof against rung 0)
    decision = json.loads((tmp_path / "shared" / "job-ladder.json").read_text())
    assert decision["node_rank"] == 1 and a["rung"] == b["rung"] == decision["rung"]
    # status on either host shows every host's ranks
    shown = subprocess.run([sys.executable, "-m", "supervisor", "status", "--json", "--config",
                            str(tmp_path / "host-0.toml"), "--state-dir", str(tmp_path / "state-0")],
                           capture_output=True, text=True, cwd=ROOT, timeout=120)
    every = json.loads(shown.stdout)["hosts"]
    assert [(h["node_rank"], h["state"], h["rung"]) for h in every] == \
        [(0, "succeeded", decision["rung"]), (1, "succeeded", decision["rung"])]
    assert sorted(r["rank"] for h in every for r in h["ranks"]) == [0, 1]
    assert ours(tmp_path, rdzv_id) == []




@pytest.mark.e2e
def test_a_rank_frozen_while_the_other_host_validates_is_found_and_both_resume_from_one_checkpoint(tmp_path):
    """Global rank 1 stops itself right after its last batch of epoch 2, so rank 0 validates epoch 2 while rank 1 is
    frozen, and then waits for it in the collective at validation's end (Ultralytics broadcasts the metrics before the
    save). Which host holds which rank is the rendezvous' choice: the fault goes to both hosts and fires in rank 1
    alone. Its host finds it frozen; rank 0's validation is no hang; both resume from epoch 1's last.pt.

    Which host speaks first is not left to the machine's speed: the frozen rank's is found at its train timeout (15 s),
    while a wait at an epoch's end, rank 0's in the collective, is bounded by "save auto" over a floor of 60 s. (The
    final validation's silent set-up and the wait of a host whose ranks are done for the other's are the ending,
    bounded by save_timeout: test_ending.py.)"""
    port, rdzv_id = free_port(), f"validating-{os.getpid()}"
    fault = ("freeze,at_batch=32,attempt=1,rank=1",)  # epoch 2's 16th batch of 16
    hosts = [start_host(tmp_path, n, port, rdzv_id, stall_timeout=15, epochs=3, faults=fault, auto_floor=60)
             for n in (0, 1)]
    deadline = time.monotonic() + 500
    try:
        ranks = {}  # global rank -> (node_rank, pid) in attempt 1
        while len(ranks) < 2:
            assert time.monotonic() < deadline and all(h.poll() is None for h in hosts)
            time.sleep(0.5)
            for n in (0, 1):
                try:
                    status = read_state(tmp_path / f"state-{n}")["status"]
                except (OSError, ValueError, KeyError):
                    continue
                if status["attempt"] == 1 and status["ranks"]:
                    ranks[status["ranks"][0]["rank"]] = (n, status["ranks"][0]["pid"])
    finally:
        codes = wait_all(hosts, max(60.0, deadline - time.monotonic()))
    logs = [(tmp_path / f"host-{n}.log").read_text() for n in (0, 1)]
    assert codes == [0, 0], "\n".join(log[-3000:] for log in logs)

    for n in (0, 1):
        host = read_state(tmp_path / f"state-{n}")["status"]
        assert host["state"] == "succeeded" and (host["epoch"], host["epochs"]) == (3, 3) and host["attempt"] == 2
        # one checkpoint for both: epoch 1's (epoch 2's save never came, its validation waiting on rank 1)
        assert host["settings"]["start_epoch"] == 2
    (frozen_host, frozen), (validating_host, _) = ranks[1], ranks[0]
    [hang] = read_incidents(tmp_path / f"state-{frozen_host}")
    assert (hang["reason"], hang["epoch"], hang["batch"], hang["stopped_first_rank"]) == ("hang", 2, 16, 1), hang
    assert frozen in [p["pid"] for p in hang["processes"]]
    # rank 0's host judged no wait a hang: it read the frozen host's verdict on the shared run_dir and restarted at once
    [peer] = read_incidents(tmp_path / f"state-{validating_host}")
    assert (peer["reason"], peer["phase"], peer["caused_by"]["id"]) == ("peer", "save", hang["id"]), peer
    assert ours(tmp_path, rdzv_id) == []


def distributed(**table):
    base = {"nnodes": 2, "node_rank": 0, "rdzv_endpoint": "10.0.0.1:29400", "rdzv_id": "job", "run_dir": "/shared"}
    return {"train": {"data": "demo"}, "distributed": {**base, **table}}


@pytest.mark.parametrize("table, message", [
    ({"nnodes": 0}, r"distributed\.nnodes: expected the number of hosts, a whole number >= 1, got 0"),
    ({"nnodes": True}, r"distributed\.nnodes: expected .* got true"),
    ({"node_rank": 2}, r"distributed\.node_rank: expected this host's number, a whole number from 0 to 1"),
    ({"node_rank": -1}, r"distributed\.node_rank: expected"),
    ({"rdzv_endpoint": "10.0.0.1"}, r"distributed\.rdzv_endpoint: expected \"HOST:PORT\""),
    ({"rdzv_endpoint": "10.0.0.1:0"}, r"distributed\.rdzv_endpoint: expected"),
    ({"rdzv_endpoint": "bad host:29400"}, r"distributed\.rdzv_endpoint: expected"),
    ({"rdzv_id": ""}, r"distributed\.rdzv_id: expected the job's name"),
    ({"run_dir": None}, r"distributed\.run_dir: not set, and nnodes = 2 needs it: expected a directory on storage "
                        r"every host shares"),
    ({"node_rank": None}, r"distributed\.node_rank: not set, and a \[distributed\] table needs it: expected this "
                          r"host's number"),
    ({"rdzv_endpoint": None}, r"distributed\.rdzv_endpoint: not set, and a \[distributed\] table needs it"),
    ({"rdzv_id": None}, r"distributed\.rdzv_id: not set, and a \[distributed\] table needs it: expected the job's "
                        r"name"),
    ({"collective_timeout": 0}, r"distributed\.collective_timeout: expected seconds"),
    ({"join_timeout": "10m"}, r"distributed\.join_timeout: expected seconds"),
    ({"hosts": 2}, r"\[distributed\]: unknown key 'hosts'"),
    ({"join_timeout": 600}, r"distributed\.join_timeout: expected less than watchdog\.startup_timeout \(600 s\)"),
])
def test_a_bad_distributed_table_is_one_line_naming_the_key(table, message):
    raw = distributed(**table)
    raw["distributed"] = {k: v for k, v in raw["distributed"].items() if v is not None}
    with pytest.raises(ConfigError, match=message) as e:
        parse(raw, "host.toml")
    assert "\n" not in str(e.value) and str(e.value).startswith("host.toml: ")


def test_a_bad_distributed_table_exits_78_from_the_cli(tmp_path):
    config = tmp_path / "host.toml"
    config.write_text('[train]\ndata = "demo"\n[distributed]\nnnodes = 2\nnode_rank = 5\n'
                      'rdzv_endpoint = "127.0.0.1:29400"\nrdzv_id = "job"\nrun_dir = "/shared"\n')
    result = subprocess.run([sys.executable, "-m", "supervisor", "check-config", "--config", str(config)],
                            capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert result.returncode == 78
    assert result.stderr.strip().count("\n") == 0 and "distributed.node_rank" in result.stderr


def test_a_good_table_gives_the_launcher_its_rendezvous_and_every_host_the_same_fingerprint():
    from supervisor.attempt.rendezvous import rendezvous_of
    from worker.distributed.multinode import launcher_argv

    a, b = (parse(distributed(node_rank=n), "host.toml") for n in (0, 1))
    assert a.distributed.collective_timeout == 600 and a.distributed.join_timeout == 300
    ra, rb = rendezvous_of(a), rendezvous_of(b)
    assert ra.fingerprint == rb.fingerprint and (ra.node_rank, rb.node_rank) == (0, 1)
    other = rendezvous_of(parse({**distributed(node_rank=1), "train": {"data": "demo", "epochs": 5}}, "host.toml"))
    assert other.fingerprint != ra.fingerprint
    argv = launcher_argv("python", 2, rb, "script.py")
    assert argv[:3] == ["python", "-m", "torch.distributed.run"] and argv[-1] == "script.py"
    flags = dict(zip(argv[3:-1:2], argv[4:-1:2]))
    assert flags == {"--nnodes": "2", "--nproc-per-node": "2", "--node-rank": "1", "--rdzv-backend": "c10d",
                     "--rdzv-endpoint": "10.0.0.1:29400", "--rdzv-id": "job", "--max-restarts": "0",
                     "--rdzv-conf": "is_host=false,join_timeout=300,read_timeout=300"}
    assert rendezvous_of(parse({"train": {"data": "demo"}}, "one.toml")) is None


def test_the_collective_timeout_variable_is_the_one_the_ranks_read():
    from supervisor.attempt import rendezvous
    from worker.distributed import ddp

    assert rendezvous.ENV_COLLECTIVE_TIMEOUT == ddp.ENV_COLLECTIVE_TIMEOUT


def test_a_host_among_several_reports_progress_through_its_local_rank_0():
    """Global rank 0 trains on one host only: the other's supervisor reads its own first rank's batches."""
    from supervisor.decision import core
    from supervisor.decision.model.ladder import build_ladder
    from supervisor.decision.status_view import snapshot
    from worker.wire.contract import HeartbeatMessage, MessageKind, Phase

    config = parse(distributed(node_rank=1), "host.toml")
    s = core.Supervision(config, build_ladder(None, 2))
    now = core.Now(mono=100.0, wall=1000.0)
    core.decide(s, core.Boot(), now)
    core.decide(s, core.Spawned(pid=10, resumed_from=None), now)
    beat = HeartbeatMessage(pid=12, kind=MessageKind.BEAT, phase=Phase.TRAIN, progress=3, epoch=1, epochs=3,
                            batch=1, batches=4, rank=1, local_rank=0)
    core.decide(s, core.HeartbeatReceived(beat), now)
    assert s.state.value == "healthy" and s.progress.batch == 1
    view = snapshot(s, now).to_dict()
    assert view["node_rank"] == 1 and view["ranks"] == [
        {"rank": 1, "local_rank": 0, "pid": 12, "device": None, "seconds_since_progress": 0.0}]


def several_hosts(node_rank: int):
    from supervisor.decision import core
    from supervisor.decision.model.ladder import build_ladder

    s = core.Supervision(parse(distributed(node_rank=node_rank), "host.toml"), build_ladder(None, 2))
    core.decide(s, core.Boot(), core.Now(mono=0.0, wall=1000.0))
    core.decide(s, core.Spawned(pid=10, resumed_from=None), core.Now(mono=0.0, wall=1000.0))
    return s


def test_a_hosts_climb_is_published_before_its_tree_is_killed_and_the_other_host_restarts_on_that_rung():
    from supervisor.decision import core
    from supervisor.decision.model.actions import PublishLadder, ReadStacksAhead, Spawn
    from worker.wire.contract import HeartbeatMessage, MessageKind, Phase

    b = several_hosts(1)
    for i, t in enumerate((1.0,)):  # one batch: a hang before the rung's speed is measured climbs (rung_choice.py)
        beat = HeartbeatMessage(pid=12, kind=MessageKind.BEAT, phase=Phase.TRAIN, progress=i + 1, epoch=1,
                                epochs=2, batch=i + 1, batches=8, rank=0)
        core.decide(b, core.HeartbeatReceived(beat), core.Now(mono=t, wall=1000.0 + t))
    _, asked = core.decide(b, core.Tick(), core.Now(mono=600.0, wall=1600.0))  # the verdict's stacks first
    assert [type(a) for a in asked] == [ReadStacksAhead]  # (unanswered: the kill reads them)
    _, actions = core.decide(b, core.Tick(), core.Now(mono=600.0, wall=1600.0))
    kinds = [type(a).__name__ for a in actions]
    assert kinds.index("PublishLadder") < kinds.index("KillTree")
    [decision] = [a for a in actions if isinstance(a, PublishLadder)]
    assert (decision.seq, decision.rung) == (1, 1)
    [hang] = b.incidents
    assert decision.cause == {"id": hang.id, "reason": "hang", "phase": "train", "stopped_first_rank": 0,
                              "time": hang.time}
    _, actions = core.decide(b, core.TreeKilled(3), core.Now(mono=601.0, wall=1601.0))
    assert b.rung == 1 and [a.rung for a in actions if isinstance(a, Spawn)] == [1]

    a = several_hosts(0)
    read = core.JobLadderRead(seq=decision.seq, rung=decision.rung, remedies=decision.remedies, node_rank=1,
                              host="b", cause=decision.cause)
    _, actions = core.decide(a, read, core.Now(mono=5.0, wall=1005.0))
    # B kills its tree for its hang: A's ranks would lose theirs, so A restarts now (reason peer), its next attempt
    # where B's decision says; the running one stays at the rung it was spawned at (issue 30)
    texts = [x.text for x in actions if isinstance(x, core.Log)]
    assert a.rung == 0 and a.job_seq == 1 and any("host 1 moved the job to rung 1" in t for t in texts), texts
    assert any(isinstance(x, core.KillTree) for x in actions)
    [peer] = a.incidents
    assert peer.reason.value == "peer" and peer.caused_by == {**decision.cause, "node_rank": 1, "host": "b"}
    _, actions = core.decide(a, core.TreeKilled(0), core.Now(mono=7.0, wall=1007.0))
    assert a.rung == 1 and [x.rung for x in actions if isinstance(x, Spawn)] == [1]  # at once: no backoff
    assert not any(isinstance(x, PublishLadder) for x in actions)
    # an older decision, or its own, moves nothing; one host alone ignores the file
    assert core.decide(a, core.JobLadderRead(0, 3, {}, 1), core.Now(mono=8.0, wall=1008.0))[1] == []
    assert core.decide(a, core.JobLadderRead(2, 3, {}, 0), core.Now(mono=8.0, wall=1008.0))[1] == []
    assert a.rung == 1 and core.Supervision(a.config, a.ladder).persistent(8.0)["job_seq"] == 0
    assert a.persistent(8.0)["job_seq"] == 1


def test_the_job_ladder_file_is_read_once_per_change(tmp_path):
    from supervisor.decision import core
    from supervisor.decision.model.actions import PublishLadder
    from supervisor.state.job_ladder import JobLadderFile

    a, b = JobLadderFile(tmp_path / "shared", 0), JobLadderFile(tmp_path / "shared", 1)
    assert a.read_if_changed() is None
    b.publish(PublishLadder(seq=2, rung=3, remedies={"batch": 2}, cause={"reason": "hang"}))
    assert a.read_if_changed() == core.JobLadderRead(seq=2, rung=3, remedies={"batch": 2}, node_rank=1,
                                                     host=socket.gethostname(), cause={"reason": "hang"})
    assert a.read_if_changed() is None
    (tmp_path / "shared" / "job-ladder.json").write_text("{torn")
    assert a.read_if_changed() is None


@pytest.mark.e2e
def test_a_host_alone_waits_join_timeout_then_exits_78_in_one_line(tmp_path):
    """Host 0 alone hosts the store and nobody joins; host 1 alone finds no store at the endpoint."""
    hosts = [start_host(tmp_path, n, free_port(), f"alone-{n}-{os.getpid()}", join_timeout=5) for n in (0, 1)]
    codes = wait_all(hosts, 240)
    logs = [(tmp_path / f"host-{n}.log").read_text() for n in (0, 1)]
    assert codes == [78, 78], "\n".join(log[-3000:] for log in logs)
    for n, log in enumerate(logs):
        [line] = [x for x in log.splitlines() if "did not complete in" in x and x.startswith("yolo-train worker:")]
        assert f"host {n} of 2: the rendezvous at 127.0.0.1:" in line and "join_timeout 5 s" in line
        assert read_state(tmp_path / f"state-{n}")["status"]["attempt"] == 1  # no restart loop
    assert ours(tmp_path, "alone-") == []


@pytest.mark.e2e
def test_hosts_with_different_train_tables_stop_with_exit_78_in_one_line(tmp_path):
    port, rdzv_id = free_port(), f"differ-{os.getpid()}"
    hosts = [start_host(tmp_path, 0, port, rdzv_id), start_host(tmp_path, 1, port, rdzv_id, epochs=3)]
    codes = wait_all(hosts, 240)
    logs = [(tmp_path / f"host-{n}.log").read_text() for n in (0, 1)]
    assert codes == [78, 78], "\n".join(log[-3000:] for log in logs)
    for n, log in enumerate(logs):
        last = log.strip().splitlines()[-1]
        assert "hosts_disagree" in last or "configurations differ" in last, last
        assert "give every host the same [train], [ladder] and [distributed]" in last
        assert read_state(tmp_path / f"state-{n}")["status"]["attempt"] == 1
    assert ours(tmp_path, rdzv_id) == []


def test_status_renders_every_hosts_ranks():
    from supervisor.verbs.status import render

    status = {"state": "healthy", "hosts": [
        {"node_rank": 0, "host": "a", "state": "healthy", "rung": 1, "attempt": 2, "updated": 990.0,
         "ranks": [{"rank": 0, "pid": 11, "seconds_since_progress": 0.5}]},
        {"node_rank": 1, "host": "b", "state": "healthy", "rung": 1, "attempt": 2, "updated": 960.0,
         "ranks": [{"rank": 1, "pid": 21, "seconds_since_progress": 42.0}]}]}
    lines = render(status, now=1000.0).splitlines()
    assert lines[-2] == "host 0 (a): healthy, rung 1, attempt 2: rank 0 pid 11 0m00s since progress"
    assert lines[-1] == "host 1 (b): healthy (not updated for 0m40s), rung 1, attempt 2: rank 1 pid 21 0m42s since " \
                        "progress"


def test_a_rank_started_twice_by_one_launch_exits_and_a_launch_that_never_met_its_hosts_is_a_config_error(
        tmp_path, monkeypatch, capsys):
    """The launcher restarts its ranks itself when another host rejoins: such a rank would resume from the launch's
    old checkpoint, so it exits and the host restarts under its supervisor."""
    from worker.distributed import multinode
    from worker.wire.contract import Rendezvous

    started = tmp_path / "ranks-started" / "123"
    started.mkdir(parents=True)
    monkeypatch.setenv(multinode.ENV_STARTED_DIR, str(started))
    monkeypatch.setenv("LOCAL_RANK", "0")
    monkeypatch.setenv("RANK", "3")
    r = Rendezvous(nnodes=2, node_rank=1, endpoint="10.0.0.1:29400", rdzv_id="job", join_timeout=30)
    code, line = multinode.launch_failure(r, started, began=time.monotonic() - 31)
    assert code == 78 and line.startswith("yolo-train worker: host 1 of 2: the rendezvous at 10.0.0.1:29400 (rdzv_id "
                                          "'job') did not complete in 31 s ([distributed] join_timeout 30 s)")
    assert multinode.launch_failure(r, started, began=time.monotonic() - 5)[0] == 1  # a peer left: retry
    # no rank started, within join_timeout: the rendezvous is joined again in place, a few times, saying why
    pause, line = multinode.rejoin(r, started, time.monotonic() - 5, tries=0, returncode=1)
    assert pause == multinode.REJOIN_PAUSES[0] and line.startswith(
        "yolo-train worker: host 1 of 2: the rendezvous at 10.0.0.1:29400 ended before any rank of this host started "
        "(torch.distributed.run exited with status 1)") and "try 2 of 5" in line
    monkeypatch.setenv(multinode.ENV_ERROR_FILE, "")  # restored after the test
    multinode.arm_launcher_error(started)  # what torch.distributed.run's @record writes of its own exception
    Path(os.environ[multinode.ENV_ERROR_FILE]).write_text(json.dumps({"message": {
        "message": "RendezvousClosedError: ", "extraInfo": {"py_callstack": "Traceback ..."}}}))
    assert "started (RendezvousClosedError): another host's launcher closed the round" in \
        multinode.rejoin(r, started, time.monotonic() - 5, tries=1, returncode=1)[1]
    assert multinode.rejoin(r, started, time.monotonic() - 5, tries=len(multinode.REJOIN_PAUSES), returncode=1) \
        is None  # tried enough
    assert multinode.rejoin(r, started, time.monotonic() - 29.9, tries=0, returncode=1) is None  # join_timeout spent
    multinode.mark_rank_started()
    assert multinode.rejoin(r, started, time.monotonic() - 5, tries=0, returncode=1) is None  # a rank started
    assert multinode.launch_failure(r, started, began=time.monotonic() - 31)[0] == 1  # it trained: a crash
    with pytest.raises(SystemExit) as e:
        multinode.mark_rank_started()
    assert e.value.code == 1 and "rank 3 started again by torch.distributed.run" in capsys.readouterr().err
