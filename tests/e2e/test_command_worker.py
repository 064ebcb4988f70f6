"""Any training script as the worker: the examples under the real supervisor, frozen from outside with SIGSTOP,
detected from their own progress bars, killed, resumed from their own checkpoints, finished."""

import signal
import subprocess
import sys
import time
import warnings
from pathlib import Path

import psutil
import pytest

from supervisor.decision.model.incident import one_line
from supervisor.state.incidents import load_incidents
from supervisor.verbs.incidents import group_by_where, render
from tests.helpers import ROOT
from tests.helpers.supervised import (copy_example, quiet_config, read_incidents, read_state, status_of, wait_for,
                                      yolo_train)


def freeze_when_checkpointed(config: Path, state_dir: Path, frozen: callable, argv_extra=(),
                             after_batches: int = 0) -> tuple[int, str, dict]:
    """Run the supervisor; once the script has a checkpoint and trains (past ``after_batches`` batches of the run),
    SIGSTOP the process `frozen` picks."""
    proc = subprocess.Popen([sys.executable, "-m", "supervisor", "run", "--config", str(config), "--state-dir",
                             str(state_dir), *argv_extra], cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)
    try:
        checkpoints = config.parent / "checkpoints"
        # Inside an epoch, not at its last batches: a loop frozen at an epoch's end is bounded by the epoch end's
        # timeout (save_timeout, 300 s until an epoch end is observed), not by the batch rhythm this test is about.
        status = wait_for(lambda: (s := status_of(state_dir)) and s["state"] == "healthy" and s["batch"]
                          and s["batch"] <= s["batches"] - 5
                          and (s["epoch"] - 1) * s["batches"] + s["batch"] > after_batches
                          and any(checkpoints.glob("*ckpt")) and s, 120, "training with a checkpoint")
        main = psutil.Process(status["worker_pid"])
        target = frozen(main)
        while not stopped_inside_an_epoch(target, state_dir):
            target.send_signal(signal.SIGCONT)  # it stopped at an epoch's end: let it into the next epoch, again
            wait_for(lambda: (s := status_of(state_dir)) and s["phase"] == "train" and s["batch"]
                     and s["batch"] <= s["batches"] - 5, 120, "the next epoch")
            if not target.is_running():  # a loader worker of the epoch that ended: the next epoch's instead
                target = frozen(main)
        _, stderr = proc.communicate(timeout=240)
    finally:
        proc.kill()
    return proc.returncode, stderr, status


def stopped_inside_an_epoch(target: psutil.Process, state_dir: Path) -> bool:
    """SIGSTOP ``target``; True once the supervisor, having read all it wrote, bounds it by the batch rhythm.

    The status the test froze on can be a few batches old: on a loaded machine the stop then lands at the epoch's
    end, whose timeout (save_timeout, 300 s until an epoch end is observed) this test is not about. The supervisor's
    own status says where it stopped once nothing has come for a second after the stop."""
    target.send_signal(signal.SIGSTOP)
    stopped_at = time.time()
    status = wait_for(lambda: (s := status_of(state_dir)) and s["updated"] > stopped_at + 1
                      and (s["seconds_since_progress"] or 0) >= 1 and s, 60, "the supervisor to see the stop")
    return status["phase"] == "train" and status["watchdog"]["timeout"].startswith("train")


def test_a_plain_loop_frozen_from_outside_is_detected_from_its_tqdm_bar_and_resumed_from_its_checkpoint(tmp_path):
    config = copy_example("plain_loop", tmp_path, step_delay=0.05)
    # The rung's own hangs alone (no prior): a hang that a rung could cure would climb; a frozen tree is none.
    config.write_text(config.read_text().replace("[watchdog]\n", "[watchdog]\nauto_floor = 20\n")
                      .replace("[ladder]\n", '[ladder]\nprior_between_hangs = "off"\n'))
    state_dir = tmp_path / "state"
    code, stderr, before = freeze_when_checkpointed(config, state_dir, lambda main: main, after_batches=25)
    assert code == 0, stderr[-3000:]
    first, *later = read_incidents(state_dir)
    assert (first["reason"], first["phase"], first["rung"]) == ("hang", "train", 0)
    # SIGSTOP leaves the tree doing nothing: found at idle_floor, not the 20 s of a tree that may still be working
    assert "(train auto, idle " in first["detail"] and first["seconds_since_progress"] < 20, first["detail"]
    assert before["worker_pid"] in [p["pid"] for p in first["processes"]]
    # lost: from where it froze down to where it resumed, at most the 10 steps between its checkpoints (not the
    # 25 and more it trained in that attempt)
    assert first["lost_batches"] is not None and 0 <= first["lost_batches"] <= 10, first["lost_batches"]
    final = read_state(state_dir)["status"]
    assert final["resumed_from"].endswith(".ckpt")
    # a tree frozen from outside is no evidence against the rung: the run stays, and the log says why
    assert "the tree frozen from outside): no rung changes it, and counts against no rung" in stderr
    assert (final["epoch"], final["epochs"], final["batch"], final["batches"]) == (3, 3, 40, 40)
    # One hang is sent. Twice on CI (never in 30 runs here, loaded or not) the resumed run also went 10 s, then
    # 20 s, without a bar moving, and was killed and resumed: the supervisor's job done, so it passes, but says what
    # it saw, so a third time shows where that run sat.
    assert (final["state"], final["restarts"]) == ("succeeded", 1 + len(later))
    assert final["rung"] == 0 or later
    for incident in later:
        assert incident["reason"] == "hang", one_line(incident)
    if later:  # what `yolo-train incidents` shows: where each hang sat, the newest with its detail and stacks
        incidents = load_incidents(state_dir)
        warnings.warn(f"a hang not sent by the test:\n{render(state_dir, incidents, group_by_where(incidents))}\n"
                      f"supervisor stderr:\n{stderr[-4000:]}")


def test_a_plain_loops_loader_worker_stopped_climbs_and_the_rungs_argv_reaches_the_script(tmp_path):
    """A hang a rung cures: one of the script's DataLoader workers stopped. The run climbs to rung 1, whose ``args``
    replace the script's ``--workers 2`` with ``--workers 1``: the script's own line says what it got."""
    config = copy_example("plain_loop", tmp_path, step_delay=0.05)
    config.write_text(config.read_text().replace("[ladder]\n", '[ladder]\nprior_between_hangs = "off"\n'))
    state_dir = tmp_path / "state"

    def a_loader_worker(main: psutil.Process) -> psutil.Process:
        return wait_for(lambda: next(iter(main.children()), None), 30, "the script's loader workers")

    code, stderr, _ = freeze_when_checkpointed(config, state_dir, a_loader_worker)
    assert code == 0, stderr[-3000:]
    first = read_incidents(state_dir)[0]
    assert (first["reason"], first["phase"], first["rung"]) == ("hang", "train", 0), one_line(first)
    assert "at rung 1 (args=--workers 1)" in stderr, stderr[-3000:]
    assert "training 3 epochs x 40 steps, workers=1" in stderr  # the script's own line: the rung reached its argv
    final = read_state(state_dir)["status"]
    assert (final["state"], final["epoch"], final["batch"]) == ("succeeded", 3, 40)
    assert final["rung"] >= 1


def test_lightning_frozen_is_resumed_from_its_last_ckpt(tmp_path):
    pytest.importorskip("lightning")
    config = copy_example("lightning", tmp_path, step_delay=0.05)
    state_dir = tmp_path / "state"
    code, stderr, _ = freeze_when_checkpointed(config, state_dir, lambda main: main)
    assert code == 0, stderr[-3000:]
    assert read_incidents(state_dir)[0]["reason"] == "hang"
    final = read_state(state_dir)["status"]
    assert final["state"] == "succeeded" and final["resumed_from"].endswith("last.ckpt")


def test_ddp_over_gloo_one_rank_frozen_kills_every_rank_and_resumes(tmp_path):
    config = copy_example("ddp_gloo", tmp_path, step_delay=0.1)
    state_dir = tmp_path / "state"

    def rank_1(torchrun: psutil.Process) -> psutil.Process:
        ranks = wait_for(lambda: [p for p in torchrun.children() if "train.py" in " ".join(p.cmdline())], 30,
                         "two ranks")
        return sorted(ranks, key=lambda p: p.pid)[-1]

    code, stderr, _ = freeze_when_checkpointed(config, state_dir, rank_1)
    assert code == 0, stderr[-3000:]
    incident = read_incidents(state_dir)[0]
    assert incident["reason"] == "hang"
    assert incident["culprit"].startswith("rank 1 (pid ") and ") stopped" in incident["culprit"], incident["summary"]
    killed = [p["pid"] for p in incident["processes"]]
    assert len(killed) >= 3  # torchrun and both ranks
    assert not [p for p in killed if psutil.pid_exists(p) and psutil.Process(p).status() != psutil.STATUS_ZOMBIE]
    assert read_state(state_dir)["status"]["state"] == "succeeded"


def test_bad_commands_and_regexes_are_one_line_at_config_load_or_spawn(write_config, tmp_path):
    missing = write_config('[worker]\ncommand = ["/nonexistent/train"]\n[metrics]\nlisten = "off"\n')
    result = yolo_train("run", "--config", str(missing), "--state-dir", str(tmp_path / "a"))
    assert result.returncode == 78 and "cannot start '/nonexistent/train' (No such file or directory)" in result.stderr
    assert len(result.stderr.strip().splitlines()) <= 3
    for regex, problem in (("epoch (\\\\d+)", "none of the named groups"), ("(?P<epoch>", "does not compile")):
        bad = write_config(f'[worker]\ncommand = ["python", "x.py"]\n[progress]\nregex = "{regex}"\n')
        result = yolo_train("check-config", "--config", str(bad))
        assert result.returncode == 78 and problem in result.stderr, result.stderr


SILENT = """
import sys, time
print("loading a dataset that never ends", flush=True)
time.sleep(600)
"""


def test_output_that_never_matches_hits_the_startup_timeout_and_the_incident_says_so(write_config, tmp_path):
    script = tmp_path / "silent.py"
    script.write_text(SILENT)
    config = write_config(f"""
        [worker]
        command = ["python", "{script}"]
        checkpoint = "nothing/*.ckpt"
        resume_args = ["--resume", "{{checkpoint}}"]
        [watchdog]
        startup_timeout = 3
        [restart]
        max_restarts = 1
    """, quiet_config())
    result = yolo_train("run", "--config", str(config), "--state-dir", str(tmp_path / "state"), timeout=60)
    assert result.returncode == 1  # the budget of 1 restart is spent
    assert "matches nothing" in result.stderr and "starts from scratch" in result.stderr
    incident = read_incidents(tmp_path / "state")[0]
    assert incident["phase"] == "startup" and "no progress line was ever seen in 1 lines of output" in incident["detail"]
    assert incident["output_tail"] == ["loading a dataset that never ends"]


BEATS = f"""
import sys, time
sys.path.insert(0, {str(ROOT)!r})
from worker.heartbeat import Heartbeat
hb = Heartbeat.from_env()
hb.phase("train")
steps = int(sys.argv[1])
for step in range(1, steps + 1):
    time.sleep(0.05)
    hb.beat(epoch=1, epochs=1, batch=step, batches=steps)
"""


def wrapped_beats(write_config, tmp_path: Path, wrapper: str, **watchdog: float) -> Path:
    """``command = ["./run.sh"]``: a shell script that runs python with the heartbeat client (BEATS)."""
    (tmp_path / "beats.py").write_text(BEATS)
    script = tmp_path / "run.sh"
    script.write_text(f"#!/bin/sh\nPYTHON={sys.executable}\n{wrapper}\n")
    script.chmod(0o755)
    settings = "".join(f"{key} = {value}\n" for key, value in watchdog.items())
    return write_config(f'[worker]\ncommand = ["./run.sh"]\ncwd = "."\n[watchdog]\n{settings}'
                        '[restart]\nmax_restarts = 1\n' + quiet_config())


def test_a_command_started_through_a_wrapper_is_judged_by_the_beats_of_the_script_it_runs(write_config, tmp_path):
    """The beats came from a child of the worker's pid (the shell): they were ignored, output parsing was switched
    off, and every attempt was killed as hung."""
    config = wrapped_beats(write_config, tmp_path, '"$PYTHON" beats.py 100', startup_timeout=3)
    result = yolo_train("run", "--config", str(config), "--state-dir", str(tmp_path / "state"), timeout=120)
    assert result.returncode == 0, result.stderr[-3000:]
    final = read_state(tmp_path / "state")["status"]
    assert (final["state"], final["batch"], final["restarts"]) == ("succeeded", 100, 0)
    assert read_incidents(tmp_path / "state") == []


def test_a_command_and_what_it_started_die_with_a_supervisor_killed_by_sigkill(write_config, tmp_path):
    """A command outlived its SIGKILLed supervisor, and the next supervisor trained a second copy beside it. The
    command (here ``sleep``, which never ends by itself) dies by the parent-death signal; the script it runs,
    a grandchild no such signal reaches, stops at its next beat (EPIPE)."""
    config = wrapped_beats(write_config, tmp_path, '"$PYTHON" beats.py 100000 &\nexec sleep 600')
    state_dir = tmp_path / "state"
    supervisor = subprocess.Popen([sys.executable, "-m", "supervisor", "run", "--config", str(config),
                                   "--state-dir", str(state_dir)], cwd=ROOT, stderr=subprocess.DEVNULL)
    tree = []
    try:
        status = wait_for(lambda: (s := status_of(state_dir)) and s["state"] == "healthy" and s, 60, "training")
        command = psutil.Process(status["worker_pid"])
        tree = [command, *command.children()]
        assert [p.name() for p in tree] == ["sleep", Path(sys.executable).name]
        supervisor.kill()
        supervisor.wait()
        gone, alive = psutil.wait_procs(tree, timeout=10)
        assert not [p for p in alive if p.status() != psutil.STATUS_ZOMBIE], alive
    finally:
        supervisor.kill()
        for p in tree:
            try:
                p.kill()
            except psutil.Error:
                pass
