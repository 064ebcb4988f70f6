import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def pytest_configure(config):
    """Tests run two at a time (``make test``: pytest-xdist): before any is handed out, the demo dataset and its
    Ultralytics label caches are built once, here in the process that hands them out. Two trainings that each build
    a missing label cache can read the other's half-written file (Ultralytics writes it in place)."""
    if hasattr(config, "workerinput") or not config.getoption("numprocesses", None):
        return
    os.environ.setdefault("YOLO_OFFLINE", "1")
    from ultralytics.cfg import get_cfg
    from ultralytics.data.dataset import YOLODataset
    from ultralytics.data.utils import check_det_dataset

    from worker.demo_data import ensure_demo_dataset

    data = check_det_dataset(str(ensure_demo_dataset()))
    for split in ("train", "val"):
        YOLODataset(img_path=data[split], data=data, imgsz=64, augment=False, hyp=get_cfg())


def demo_train(epochs: int = 3, plots: bool = False) -> str:
    """The [train] table the end-to-end tests train: the embedded demo (8 batches an epoch) at 64 px on the CPU."""
    return (f'[train]\ndata = "demo"\nmodel = "yolov8n.yaml"\nepochs = {epochs}\nimgsz = 64\nbatch = 4\n'
            f'workers = 2\ndevice = "cpu"\nplots = {str(plots).lower()}\n')


def worker_launcher(tmp_path: Path, script: str) -> Path:
    """An executable that runs `script` (Python source) with the arguments the supervisor gives
    `[worker] python`: a stand-in for the Ultralytics worker. Started as a standby (`-m worker --standby`) it keeps
    the contract's part: it waits for the launch record's path on stdin, and exits 0 at its end."""
    source = tmp_path / "stand_in_worker.py"
    source.write_text(script)
    launcher = tmp_path / "launcher"
    launcher.write_text('#!/bin/sh\n'
                        'if [ "$3" = "--standby" ]; then read -r record || exit 0; set -- "$1" "$2" "$record"; fi\n'
                        f'exec {sys.executable} {source} "$@"\n')
    launcher.chmod(0o755)
    return launcher


def yolo_train(*args: str, timeout: float = 300, env: dict | None = None) -> subprocess.CompletedProcess:
    """The real CLI in a subprocess, as a user runs it."""
    return subprocess.run([sys.executable, "-m", "supervisor", *args], capture_output=True, text=True,
                          timeout=timeout, cwd=ROOT, env={**os.environ, **(env or {})})


@pytest.fixture
def write_config(tmp_path):
    def write(body: str, name: str = "config.toml") -> Path:
        path = tmp_path / name
        path.write_text(textwrap.dedent(body))
        return path
    return write


def read_state(state_dir: Path) -> dict:
    return json.loads((state_dir / "supervisor.json").read_text())


def read_incidents(state_dir: Path) -> list[dict]:
    path = state_dir / "incidents.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


LOADER_RUNG_CONFIG = """
name = "{name}"
{train}[metrics]
listen = "off"
[recovery]
in_place = false  # this test's point is the restart path
[kernel_log]
source = "off"
gpu_events = "off"
[watchdog]
startup_timeout = 90
[restart]
backoff_initial = 0.5
[ladder]
rungs = [{rung}]
"""


def climb_to_loader_rung(tmp_path: Path, name: str, rung: str) -> tuple[dict, dict, dict]:
    """The demo (``workers = 2``) with one ladder rung, ``rung`` (TOML): attempt 1's training loop hangs after its
    first batch (one training beat: rung 0's speed is never measured, so any rule climbs, rung_choice.py), attempt 2's
    loader hangs at that rung after batch 2 (inside the epoch of 8, never at its end), and attempt 3 finishes there:
    rung 0, never measured, keeps nothing. The final status and the two incidents, after checking that the run
    succeeded with two hangs in training at rungs 0 and 1."""
    config = tmp_path / "config.toml"
    config.write_text(LOADER_RUNG_CONFIG.format(name=name, train=demo_train(), rung=rung))
    state_dir = tmp_path / "state"
    result = yolo_train("run", "--config", str(config), "--state-dir", str(state_dir),
                        "--fault", "main_hang,at_batch=1,attempt=1",
                        "--fault", "dataloader_hang,at_batch=2,attempt=2")
    assert result.returncode == 0, result.stderr[-3000:]
    status = read_state(state_dir)["status"]
    assert status["state"] == "succeeded" and (status["epoch"], status["epochs"]) == (3, 3)
    assert (state_dir / "train" / "weights" / "best.pt").exists()
    assert status["rung"] == 1 and status["attempt"] == 3
    first, second = read_incidents(state_dir)
    assert (first["reason"], first["phase"], first["rung"]) == ("hang", "train", 0)
    assert (second["reason"], second["phase"], second["rung"]) == ("hang", "train", 1)
    return status, first, second


def sources_for_nobody() -> Path:
    """A world-readable copy of the project's packages and psutil, for a test that runs Python as user nobody: the
    checkout and its venv may sit where nobody cannot read them (a clone in /root, a 0700 home). The directory is
    removed at exit; pass it as PYTHONPATH and cwd."""
    import atexit
    import shutil
    import tempfile

    import psutil

    copy = Path(tempfile.mkdtemp(prefix="yolo-train-nobody-"))
    atexit.register(shutil.rmtree, copy, ignore_errors=True)
    for package in (ROOT / "supervisor", ROOT / "worker", Path(psutil.__file__).parent):
        shutil.copytree(package, copy / package.name, ignore=shutil.ignore_patterns("__pycache__"))
    for path in [copy, *copy.rglob("*")]:
        path.chmod(0o755 if path.is_dir() else 0o644)
    return copy

