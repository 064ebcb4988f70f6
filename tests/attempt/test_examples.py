"""The examples under examples/ run as a user runs them, get frozen and killed mid-run, and resume from their own
checkpoint at the right step: what the supervisor will do to them, done by hand (the supervised end-to-end tests
come with the ``[worker] command`` path). Their live output is also read by the progress parser."""

import os
import signal
import subprocess
import sys
import time
import tomllib
from pathlib import Path

import psutil
import pytest
import torch

from supervisor.attempt.progress_lines import ProgressCounter, ProgressParser

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples"
SHORT = ["--epochs", "2", "--steps", "10", "--save-every", "4"]


def run(argv: list[str], cwd: Path, env: dict | None = None) -> str:
    result = subprocess.run(argv, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=180,
                            env={**os.environ, **(env or {})})
    out = result.stdout.decode(errors="replace")
    assert result.returncode == 0, out[-3000:]
    return out


def signal_tree(proc: subprocess.Popen, sig: int) -> None:
    # By tree, not by process group: torchrun starts each rank in a session of its own.
    tree = psutil.Process(proc.pid)
    for p in [tree, *tree.children(recursive=True)]:
        try:
            p.send_signal(sig)
        except psutil.NoSuchProcess:
            pass


def freeze_and_kill_once(argv: list[str], cwd: Path, checkpoint: Path, env: dict | None = None) -> None:
    """Start it, and once `checkpoint` exists, SIGSTOP its whole process tree (a hang as seen from outside),
    then SIGKILL the tree: what the supervisor does to a stalled worker."""
    proc = subprocess.Popen(argv, cwd=cwd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            env={**os.environ, **(env or {})})
    try:
        deadline = time.monotonic() + 120
        while not checkpoint.exists():
            assert proc.poll() is None, f"{argv} exited ({proc.returncode}) before writing {checkpoint}"
            assert time.monotonic() < deadline, f"no {checkpoint} within 120 s"
            time.sleep(0.05)
        signal_tree(proc, signal.SIGSTOP)
        time.sleep(0.2)
    finally:
        signal_tree(proc, signal.SIGKILL)
        proc.wait()
    assert proc.returncode == -signal.SIGKILL, "it finished before it could be killed: slow it down"


def worker_table(example: str) -> dict:
    return tomllib.loads((EXAMPLES / example / "yolo-train.toml").read_text())["worker"]


def resume_from(example: str, cwd: Path) -> tuple[Path, list[str]]:
    """The resume point as the example's config names it: the newest match of ``[worker] checkpoint``, passed
    through ``resume_args``."""
    table = worker_table(example)
    path = max(cwd.glob(table["checkpoint"]), key=lambda p: p.stat().st_mtime_ns)
    return path, [a.replace("{checkpoint}", str(path)) for a in table["resume_args"]]


def last_position(output: str) -> tuple[int | None, int | None]:
    counter = ProgressCounter()
    for reading in ProgressParser().feed(output.encode()):
        counter.observe(reading)
    return counter.last.epoch, counter.last.batch


def test_plain_loop_killed_mid_epoch_resumes_at_its_step_and_ends_as_an_uninterrupted_run(tmp_path):
    script = [sys.executable, str(EXAMPLES / "plain_loop" / "train.py"), *SHORT]
    whole = tmp_path / "whole"
    whole.mkdir()
    out = run([*script, "--workers", "0"], whole)
    assert "training finished" in out and last_position(out) == (2, 10)

    cut = tmp_path / "cut"
    cut.mkdir()
    # NUM_WORKERS stands in for --workers: one DataLoader process, frozen and killed with the rest.
    freeze_and_kill_once([*script, "--step-delay", "0.1"], cut, cut / "checkpoints" / "step-000008.ckpt",
                         env={"NUM_WORKERS": "1"})
    checkpoint, resume_args = resume_from("plain_loop", cut)
    assert checkpoint.name == "step-000008.ckpt"
    out = run([*script, "--workers", "0", *resume_args], cut)
    assert "at epoch 1 step 8 (global step 8)" in out and "training finished" in out
    assert last_position(out) == (2, 10)
    a = torch.load(whole / "checkpoints" / "step-000020.ckpt")["model"]
    b = torch.load(cut / "checkpoints" / "step-000020.ckpt")["model"]
    assert all(torch.equal(a[k], b[k]) for k in a), "the resumed run did not continue where it stopped"
    assert not list(cut.glob("checkpoints/.*.tmp")), "a temporary checkpoint was left under the directory"
    # A restart after the end (the supervisor saw no clean exit) resumes from the final checkpoint: nothing to do.
    assert "nothing left to train" in run([*script, *resume_from("plain_loop", cut)[1]], cut)


def test_lightning_killed_mid_epoch_resumes_from_last_ckpt_at_its_step(tmp_path):
    pytest.importorskip("lightning")
    script = [sys.executable, str(EXAMPLES / "lightning" / "train.py"), *SHORT, "--workers", "0"]
    last = tmp_path / "checkpoints" / "last.ckpt"
    freeze_and_kill_once([*script, "--step-delay", "0.1"], tmp_path, last)
    saved_step = torch.load(last, weights_only=False)["global_step"]
    assert 0 < saved_step < 20
    out = run([*script, *resume_from("lightning", tmp_path)[1]], tmp_path)
    assert f"training starts at global step {saved_step}" in out
    assert "training finished at global step 20" in out
    assert last_position(out) == (2, 10)


def test_ddp_gloo_two_ranks_killed_resume_from_rank_zero_checkpoint(tmp_path):
    script = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
              str(EXAMPLES / "ddp_gloo" / "train.py"), *SHORT]
    freeze_and_kill_once([*script, "--step-delay", "0.1"], tmp_path, tmp_path / "checkpoints" / "step-000004.ckpt")
    checkpoint, resume_args = resume_from("ddp_gloo", tmp_path)
    step = torch.load(checkpoint)["global_step"]
    out = run([*script, *resume_args], tmp_path)
    assert f"(global step {step})" in out and "on 2 ranks" in out and "training finished" in out
    assert last_position(out) == (2, 10)  # one bar: rank 0's
    assert (tmp_path / "checkpoints" / "step-000020.ckpt").exists()


@pytest.mark.parametrize("example", ["plain_loop", "lightning", "ddp_gloo"])
def test_each_config_runs_its_own_script_and_its_rungs_turn_knobs_the_script_has(example):
    config = tomllib.loads((EXAMPLES / example / "yolo-train.toml").read_text())
    table = config["worker"]
    cwd = EXAMPLES / example / table["cwd"]
    script = next(a for a in table["command"] if a.endswith(".py"))
    assert (cwd / script).is_file()
    assert "{checkpoint}" in table["resume_args"]
    source = (cwd / script).read_text()
    for rung in config["ladder"]["rungs"]:
        for flag in rung.get("args", {}):
            assert flag in source or flag in table["command"], f"{example}: rung flag {flag} is not the script's"
        for name in rung.get("env", {}):
            assert name in source or name.startswith("OMP_"), f"{example}: rung variable {name} is not read"
