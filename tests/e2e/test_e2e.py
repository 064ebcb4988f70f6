"""The whole path with real processes and real Ultralytics training on the CPU.

Each test runs ``yolo-train run`` as a user would, on the embedded demo dataset (8 batches per epoch),
injects a real fault, and checks what a user would check: the hang or crash was detected, the whole
process tree is gone, training resumed from last.pt at the right rung and finished with best.pt.
"""

import json
import signal

import psutil
import pytest

from tests.helpers import ROOT
from tests.helpers.supervised import (E2E_CONFIG, assert_finished, demo_train, quiet_config, read_incidents,
                                      read_state, start_supervisor, status_of, wait_for, worker_launcher, yolo_train)

pytestmark = pytest.mark.e2e


def assert_gone(pids):
    alive = [p for p in pids if psutil.pid_exists(p) and psutil.Process(p).status() != psutil.STATUS_ZOMBIE]
    assert alive == [], f"processes of a killed tree still alive: {alive}"


# kind -> (reason, phase, rung after the incident, resumed from last.pt?)
# A training process spinning in Python or blocked in a native call is no hang a loader rung changes (the witness
# says where it waits, hang_evidence.py): only an environment rung would be tried, and the CPU's ladder has none.
FAULTS = {
    "dataloader_hang": ("hang", "train", 1, True),
    "main_hang": ("hang", "train", 1, True),
    "spin": ("hang", "train", 0, True),
    "native_hang": ("hang", "train", 0, True),
    "val_hang": ("hang", "val", 1, False),  # in the first validation, before any last.pt exists: from scratch
    "exception": ("crash", "train", 0, True),
    "segfault": ("crash", "train", 0, True),
    "sigkill": ("crash", "train", 0, True),
}


@pytest.mark.parametrize("kind", FAULTS)
def test_fault_is_detected_killed_resumed_at_the_right_rung_and_training_finishes(kind, demo_config, tmp_path):
    reason, phase, rung, resumed = FAULTS[kind]
    state_dir = tmp_path / "state"
    result = yolo_train("run", "--config", str(demo_config()), "--state-dir", str(state_dir),
                        "--fault", f"{kind},at_batch=10,attempt=1")
    status = assert_finished(state_dir, result)
    incidents = read_incidents(state_dir)
    assert len(incidents) == 1, [i["detail"] for i in incidents]
    incident = incidents[0]
    assert (incident["reason"], incident["phase"], incident["rung"]) == (reason, phase, 0)
    assert incident == status["last_incident"]  # one record: incidents.jsonl and status --json agree
    assert 0 < incident["restart_seconds"] < 120  # from the verdict to the next attempt's first batch
    # the batches after it against those before its stall (issue 59.2): the run ended before PACE_BATCHES of them
    after = incident["after"]
    assert 0 < after["batches"] < 3 * 8 and after["before_batches"] > 0 and after["seconds"] > 0, after
    assert incident["kill"]["survivors"] == []
    # a hung tree is killed; a crashed worker's DataLoader workers die with it (parent-death signal)
    assert incident["kill"]["processes"] >= (1 if reason == "hang" else 0)
    assert incident["settings"]["workers"] == 2  # rung 0 on the CPU: Ultralytics' forced workers=0 undone
    assert_gone([p["pid"] for p in incident["processes"]])
    assert status["rung"] == rung and status["attempt"] == 2
    # [checkpoint] every = "auto": a run that has not hung checkpoints every max; the attempt after a hang gets the
    # interval its hang rate asks for, and it is the one its worker was launched with.
    launched = json.loads((state_dir / "launch-record.json").read_text())
    assert launched["checkpoint_every"] == status["checkpoint_every"]
    assert (status["checkpoint_every"] < 600) is (reason == "hang")
    expected_workers = {0: 2, 1: 1}[rung]
    assert status["settings"]["workers"] == expected_workers
    # training goes on with the epoch it was in: nothing before that epoch is lost
    assert status["settings"]["start_epoch"] == incident["epoch"]
    if resumed:
        assert status["resumed_from"].endswith("weights/last.pt") and status["settings"]["resumed"]
    else:
        assert status["resumed_from"] is None and incident["epoch"] == 1
    if kind == "dataloader_hang":  # the main process and both DataLoader workers were killed
        assert incident["kill"]["processes"] == 3
    # [recovery] in_place (on by default) looked first: the fault hangs every loader worker of the attempt, the
    # rebuilt loader's at once too, and no other hang is the loader's: each escalated to the restart, with why
    # (the bound counts from the kill, or from the rebuilt loader's new workers once reported: either phrase)
    escalations = {"dataloader_hang": "no batch within",
                   "val_hang": "the hang is not the loader's"}
    if reason == "hang":
        assert incident["tier"] == "restart" and status["recoveries"] == {"in_place": 0, "restart": 1}
        assert escalations.get(kind, "the hang is not the loader's") in incident["escalation"], incident["escalation"]
    if kind == "spin":  # 100% CPU is no progress either: the process was busy, not asleep
        main = [p for p in incident["processes"] if p["pid"] == incident["worker_pid"]][0]
        # any share of a core: on a loaded 2-core machine a spinner got 26% of the stacks' 0.4 s; a sleeper gets 0
        assert main["state"] == "running" and main["cpu_percent"] > 0
        assert ", idle" not in incident["detail"]  # a busy tree is no idle one: auto_floor bounds it
    # where it hung: the process that waited, and its frame (supervisor/host/stacks.py, before the kill)
    where = {"dataloader_hang": ("DataLoader worker", "hang_forever"), "main_hang": ("main (pid", "hang_forever"),
             "spin": ("main (pid", "spin_forever"), "native_hang": ("main (pid", "pause")}
    if kind in where:
        role, frame = where[kind]
        assert incident["culprit"].startswith(role) and frame in incident["culprit"], incident["culprit"]
        assert (state_dir / incident["stacks"]).exists() and incident["stacks_seconds"] <= 3.5
        assert any(line.startswith("main (pid") for line in incident["summary"])
        # the evidence the ladder reads for the same hang at the same point (issue 30): the loader's rungs change it
        assert incident["in_loader_worker"] is (kind == "dataloader_hang")
    if kind == "exception":
        assert "RuntimeError: injected fault after batch 10" in incident["detail"]
    if kind == "segfault":
        assert incident["detail"] == "killed by SIGSEGV"


def test_hang_before_the_first_batch_after_a_resume_climbs_again(demo_config, tmp_path):
    """The seeds' MIOpen case: the resumed worker never runs its first batch."""
    state_dir = tmp_path / "state"
    result = yolo_train("run", "--config", str(demo_config(startup=25)), "--state-dir", str(state_dir),
                        "--fault", "main_hang,at_batch=10,attempt=1", "--fault", "before_first_batch,attempt=2")
    status = assert_finished(state_dir, result)
    incidents = read_incidents(state_dir)
    assert [(i["reason"], i["phase"], i["rung"]) for i in incidents] == [("hang", "train", 0), ("hang", "startup", 1)]
    assert status["rung"] == 2 and status["settings"]["persistent_workers"] is False
    # Found in the first batch's step on the device, bounded by what attempt 1 showed of that step (10 x it, at
    # least 10 s, never more than startup_timeout), not by 10 x attempt 1's whole startup.
    hung = incidents[1]
    assert hung["startup_step"] == "first_step" and hung["startup_step_seen"] > 0
    assert hung["startup_step_bound"] == pytest.approx(min(25, max(10, 10 * hung["startup_step_seen"])))
    seen = read_state(state_dir)["startup_steps_seen"]  # kept in the state file, every step our worker reports
    assert set(seen) == {"imports", "checkpoint", "model", "amp_check", "dataset", "loaders", "first_batch",
                         "first_step"}


def test_each_rung_is_really_in_force_after_a_resume(demo_config, tmp_path):
    """Ultralytics' resume restores the checkpoint's arguments; lr0 and amp are ones it will not let change."""
    config = demo_config("""
        rungs = [{ workers = 1, lr0 = 0.002 }, { persistent_workers = false }, { workers = 0, val = false, amp = false }]
    """)
    state_dir = tmp_path / "state"
    # attempt 1 hangs in epoch 2 (after last.pt of epoch 1); attempts 2 and 3 hang in epoch 2 again
    faults = ["--fault=main_hang,at_batch=9,attempt=1"] + [f"--fault=main_hang,at_batch=5,attempt={n}" for n in (2, 3)]
    result = yolo_train("run", "--config", str(config), "--state-dir", str(state_dir), *faults)
    status = assert_finished(state_dir, result)
    seen = [i["settings"] for i in read_incidents(state_dir)] + [status["settings"]]
    assert [(s["workers"], s["persistent_workers"], s["val"]) for s in seen] == [
        (2, True, True), (1, True, True), (1, False, True), (0, False, False)]
    assert seen[1]["forced"]["lr0"] == 0.002
    assert seen[3]["forced"] == {"workers": 0, "val": False, "amp": False, "lr0": 0.002}
    assert all(s["resumed"] for s in seen[1:])


def test_a_worker_that_hangs_after_training_is_done_is_killed_and_the_run_succeeds_at_once(write_config, tmp_path):
    """ROCm processes can hang in the runtime's teardown at exit: the checkpoint is written, nothing is lost."""
    # save_timeout also bounds this one epoch's end (validation, the save): 10 s leaves a slow machine room for it.
    config = write_config(E2E_CONFIG.format(train=demo_train(epochs=1), quiet=quiet_config(), startup=90, restart="")
                          .replace("[watchdog]\n", "[watchdog]\nsave_timeout = 10\n"))
    state_dir = tmp_path / "state"
    result = yolo_train("run", "--config", str(config), "--state-dir", str(state_dir), "--fault", "exit_hang")
    status = assert_finished(state_dir, result, epochs=1)
    [incident] = read_incidents(state_dir)
    assert (incident["reason"], incident["phase"], incident["lost_seconds"]) == ("hang", "done", 0.0)
    assert incident["culprit"].startswith("main (pid") and "hang_forever" in incident["culprit"]
    assert_gone([p["pid"] for p in incident["processes"]])
    assert (status["attempt"], status["rung"], status["restarts"]) == (1, 0, 0)
    assert "training finished after 1 attempt(s)" in result.stderr


def test_a_crash_loop_ends_with_a_clear_error(demo_config, tmp_path):
    config = demo_config(restart="max_restarts = 2\nbackoff_initial = 0.1")
    state_dir = tmp_path / "state"
    result = yolo_train("run", "--config", str(config), "--state-dir", str(state_dir), "--fault", "exception,at_batch=2")
    assert result.returncode == 1
    last_line = result.stderr.strip().splitlines()[-1]
    assert last_line.startswith("yolo-train: restart budget spent: 3 restarts in the last 3600 s")
    assert "RuntimeError: injected fault after batch 2" in last_line
    assert read_state(state_dir)["status"]["state"] == "failed"
    assert_gone([p["pid"] for i in read_incidents(state_dir) for p in i["processes"]])


def test_a_supervisor_killed_with_sigkill_leaves_no_orphans_and_its_successor_keeps_the_rung(demo_config, tmp_path):
    config, state_dir = demo_config(), tmp_path / "state"
    first = start_supervisor(config, state_dir, "--fault", "main_hang,at_batch=10,attempt=1")
    status = wait_for(lambda: (s := status_of(state_dir)) and s["attempt"] == 2 and s["state"] == "healthy" and s,
                      what="attempt 2 training")
    pids = [p.pid for p in psutil.Process(status["worker_pid"]).children(recursive=True)] + [status["worker_pid"]]
    live = json.loads(yolo_train("status", "--json", "--config", str(config), "--state-dir", str(state_dir)).stdout)
    assert live["state"] == "healthy" and live["supervisor_running"] and live["rung"] == 1
    assert set(live["pids"]) == set(pids) and len(pids) == 2  # the worker and its one DataLoader worker
    assert live["last_incident"]["reason"] == "hang"
    human = yolo_train("status", "--config", str(config), "--state-dir", str(state_dir)).stdout
    assert "rung 1/" in human and "(workers=1)" in human and "last incident" in human and "it/s" in human
    first.send_signal(signal.SIGKILL)
    first.communicate()
    after = json.loads(yolo_train("status", "--json", "--config", str(config), "--state-dir", str(state_dir)).stdout)
    assert after["state"] == "not running" and after["pids"] == []
    wait_for(lambda: not [p for p in pids if psutil.pid_exists(p)], timeout=30, what="the orphaned worker tree to die")
    result = yolo_train("run", "--config", str(config), "--state-dir", str(state_dir))
    status = assert_finished(state_dir, result)
    assert "continuing at rung 1 (workers=1) after 2 attempts" in result.stderr
    assert status["rung"] == 1 and status["attempt"] == 3 and status["settings"]["workers"] == 1
    assert status["resumed_from"].endswith("last.pt")


def test_stop_then_corrupt_last_pt_resumes_from_the_verified_copy(write_config, tmp_path):
    # 6 epochs: a stop saves exactly where it is, so the resumed run must have more than a moment left to stop in
    config = write_config(E2E_CONFIG.format(train=demo_train(epochs=6), quiet=quiet_config(), startup=90,
                                            restart="backoff_initial = 0.5"))
    state_dir = tmp_path / "state"
    weights = state_dir / "train" / "weights"
    for run in (1, 2):
        proc = start_supervisor(config, state_dir)
        # run 1 stops after its first checkpoint; run 2 right after resuming (it verified and copied last.pt)
        wait_for(lambda: (s := status_of(state_dir)) and s["attempt"] == run and s["state"] == "healthy"
                 and (weights / "last.pt").exists() and (run == 2 or s["epoch"] >= 2), what=f"run {run} training")
        proc.send_signal(signal.SIGTERM)
        _, stderr = proc.communicate(timeout=60)
        assert proc.returncode == 0, stderr[-2000:]
        assert read_state(state_dir)["status"]["state"] == "stopped"
    assert (weights / "last.good.pt").exists()
    data = (weights / "last.pt").read_bytes()
    (weights / "last.pt").write_bytes(data[: len(data) // 3])  # as a kill in the middle of a save leaves it
    result = yolo_train("run", "--config", str(config), "--state-dir", str(state_dir))
    status = assert_finished(state_dir, result, epochs=6)
    notes = [line for line in result.stderr.splitlines() if "corrupt checkpoint" in line]
    assert len(notes) == 1 and "resuming from last.good.pt" in notes[0] and str(weights / "last.pt") in notes[0]
    assert status["resumed_from"].endswith("last.good.pt")
    assert len(list(weights.glob("last.pt.corrupt-*"))) == 1


GARBAGE_LOOP = """
import os, sys, time
import torch
from worker.heartbeat import Heartbeat
from worker.wire.heartbeat_protocol import ENV_FD

fd = int(os.environ[ENV_FD])
os.write(fd, b"\\x00\\xffnot json\\n" + b"{" * 9000 + b"\\n" + b'{"v": 99}\\n')  # garbage, oversized, unknown version
hb = Heartbeat(fd)
model = torch.nn.Linear(4, 1)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
x, y = torch.randn(64, 4), torch.randn(64, 1)
hb.phase("train", epoch=1, epochs=1, batch=0, batches=40)
for i in range(40):
    loss = torch.nn.functional.mse_loss(model(x), y)
    opt.zero_grad(); loss.backward(); opt.step()
    hb.beat(epoch=1, epochs=1, batch=i + 1, batches=40, samples=64, losses={"mse": loss.item()})
    if i == 20:
        os.write(fd, b"garbage in the middle\\n")
    time.sleep(0.02)
hb.phase("done")
"""


def test_a_plain_pytorch_loop_with_garbage_on_the_heartbeat_pipe(write_config, tmp_path):
    launcher = worker_launcher(tmp_path, GARBAGE_LOOP)  # stands in for "python -m worker ..."
    config = write_config(f"""
        [train]
        epochs = 1
        [worker]
        python = "{launcher}"
        [metrics]
        listen = "off"
    """)
    state_dir = tmp_path / "state"
    result = yolo_train("run", "--config", str(config), "--state-dir", str(state_dir),
                        env={"PYTHONPATH": str(ROOT)})
    assert result.returncode == 0, result.stderr
    status = read_state(state_dir)["status"]
    assert status["state"] == "succeeded" and status["batch"] == 40 and status["restarts"] == 0
    assert status["heartbeats"]["malformed"] == 3 and status["heartbeats"]["oversized"] == 1


def test_training_makes_no_download_attempt(write_config, tmp_path):
    """Offline is the normal case here: every HTTP(S) request is routed to a local proxy that only counts
    connections. With plots on and an empty Ultralytics config directory (no cached font), none may come."""
    import socket
    import threading

    proxy = socket.create_server(("127.0.0.1", 0))
    proxy.settimeout(0.2)
    connections, done = [], threading.Event()

    def count():
        while not done.is_set():
            try:
                connections.append(proxy.accept()[0])
            except TimeoutError:
                continue

    threading.Thread(target=count, daemon=True).start()
    url = f"http://127.0.0.1:{proxy.getsockname()[1]}"
    config = write_config(demo_train(epochs=2, plots=True) + '[metrics]\nlisten = "off"\n')
    state_dir = tmp_path / "state"
    env = {"HTTP_PROXY": url, "HTTPS_PROXY": url, "http_proxy": url, "https_proxy": url, "NO_PROXY": "",
           "YOLO_CONFIG_DIR": str(tmp_path / "ultralytics-config")}
    try:
        result = yolo_train("run", "--config", str(config), "--state-dir", str(state_dir), env=env)
    finally:
        done.set()
    assert result.returncode == 0, result.stderr[-2000:]
    assert (state_dir / "train" / "results.png").exists()  # the plots were drawn, with a local font
    assert connections == [], "a download was attempted"


def test_a_checkpoint_at_an_epochs_last_batch_resumes_into_the_next_epoch(demo_config, tmp_path):
    """A stop asked at an epoch's last batch waits for the epoch's own save, so no resume starts in an epoch with no
    batch left (Ultralytics' epoch end reads what only a trained batch makes)."""
    state_dir = tmp_path / "state"
    result = yolo_train("run", "--config", str(demo_config()), "--state-dir", str(state_dir),
                        "--fault", "stop_request,at_batch=7,attempt=1")  # the demo's epochs have 8 batches
    status = assert_finished(state_dir, result)
    assert "at the end of epoch 1 on the supervisor's request" in result.stdout + result.stderr
    assert status["attempt"] == 2 and status["resumed_from"].endswith("last.pt")
