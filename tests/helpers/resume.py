"""A real worker driven as the supervisor drives it: a launch record, a heartbeat pipe read with the real Decoder, the
batches it fed recorded (RECORD_FED_ENV), and a kill once it has checkpointed inside epoch 2."""

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import torch

from tests.helpers import ROOT
from worker.checkpoints.checkpointing import EXACT_KEY
from worker.wire.contract import LaunchRecord, MessageKind
from worker.wire.heartbeat_protocol import Decoder
from worker.training.trainer import RECORD_FED_ENV


def launch(tmp: Path, project: Path, fed: Path, resume: str | None = None, every: float | None = None,
           env: dict[str, str] | None = None, forced: dict | None = None, **train) -> subprocess.Popen:
    """A real worker on the demo (8 batches an epoch, close_mosaic switching in epoch 2), its pipe on .heartbeats;
    ``env`` is added to its environment, ``forced`` are the rung's arguments (they win over a checkpoint's)."""
    record = LaunchRecord(attempt=1, rung=0, train={
        "data": "demo", "model": "yolov8n.yaml", "epochs": 2, "imgsz": 64, "batch": 4, "workers": 2,
        "device": "cpu", "plots": False, "val": False, "close_mosaic": 1, "project": str(project), "name": "train",
        "exist_ok": True, **train}, trainer_args=forced or {}, resume=resume, checkpoint_every=every)
    path = tmp / f"launch-{fed.stem}.json"
    path.write_text(record.to_json())
    read, write = os.pipe()
    proc = subprocess.Popen([sys.executable, "-m", "worker", str(path)], pass_fds=(write,), cwd=ROOT,
                            env={**os.environ, "YOLO_TRAIN_HEARTBEAT_FD": str(write), RECORD_FED_ENV: str(fed),
                                 **(env or {})},
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    os.close(write)
    proc.heartbeats = read
    return proc


def messages(proc: subprocess.Popen, until=lambda m: False, timeout: float = 120):
    """The worker's heartbeats until ``until`` says stop or the pipe closes."""
    decoder, seen, deadline = Decoder(), [], time.monotonic() + timeout
    while time.monotonic() < deadline:
        data = os.read(proc.heartbeats, 65536)
        if not data:
            break
        for m in decoder.feed(data):
            seen.append(m)
            if until(m):
                return seen
    return seen


def fed(path: Path) -> list[tuple[int, int, str]]:
    return [(int(e), int(b), name) for e, b, name in (line.split() for line in path.read_text().splitlines())]


def kill_after_a_checkpoint_in_epoch_2(tmp: Path, project: Path, fed: Path, env: dict[str, str] | None = None,
                                       timeout: float = 120) -> tuple[list, dict]:
    """A worker with mid-epoch checkpoints, SIGKILLed with its whole tree (under DDP torch.distributed.run, the ranks
    and their loader workers too) once it reports a checkpoint inside epoch 2: its heartbeats and last.pt's exact
    state."""
    worker = launch(tmp, project, fed, every=0.2, env=env)
    seen = messages(worker, until=lambda m: m.kind == MessageKind.CHECKPOINT and m.epoch == 2 and m.batch < 8,
                    timeout=timeout)
    for process in [worker, *psutil.Process(worker.pid).children(recursive=True)]:
        process.send_signal(signal.SIGKILL)
    worker.wait(30)
    assert seen[-1].kind == MessageKind.CHECKPOINT, "no mid-epoch checkpoint in epoch 2"
    last = project / "train" / "weights" / "last.pt"
    return seen, torch.load(last, map_location="cpu", weights_only=False)[EXACT_KEY]
