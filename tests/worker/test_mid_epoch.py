"""Mid-epoch checkpoints as files: atomic under a failing write, a corrupt one replaced by last.good.pt, one of
another training refused with one line and exit 78, and the supervisor's stop request saving an exact checkpoint
even in the first epoch. Real files, real torch.load, real workers on the demo data."""

import signal
import subprocess
import sys
import textwrap

import pytest
import torch

from tests.helpers import ROOT
from tests.helpers.resume import launch, messages
from worker.checkpoints.checkpointing import EXACT_KEY, readable_checkpoint
from worker.wire.contract import EXIT_CONFIG as IDENTITY_EXIT
from worker.wire.contract import MessageKind


def test_a_failing_write_leaves_the_previous_checkpoint_and_no_temporary_file(tmp_path):
    target = tmp_path / "last.pt"
    target.write_bytes(b"good checkpoint")
    # A real failing write: the file size limit makes write() fail with EFBIG as a full disk fails with ENOSPC.
    script = textwrap.dedent(f"""
        import resource, signal, sys
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (4096, 4096))
        from worker.checkpoints.checkpointing import atomic_write, CheckpointWriteError
        try:
            atomic_write({str(target)!r}, b"x" * 100_000)
        except CheckpointWriteError as e:
            print(e)
            sys.exit(3)
    """)
    result = subprocess.run([sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert result.returncode == 3, result.stderr
    assert f"cannot write checkpoint {target}" in result.stdout and "previous last.pt is intact" in result.stdout
    assert target.read_bytes() == b"good checkpoint"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["last.pt"]


@pytest.fixture(scope="module")
def stopped_in_first_epoch(tmp_path_factory):
    """A real worker asked to stop (SIGUSR1) in its first epoch: its checkpoint and its heartbeats."""
    tmp = tmp_path_factory.mktemp("stop")
    worker = launch(tmp, tmp / "run", tmp / "fed.txt")
    seen = messages(worker, until=lambda m: m.kind == MessageKind.BEAT and m.epoch == 1 and (m.batch or 0) >= 3)
    worker.send_signal(signal.SIGUSR1)
    seen += messages(worker)
    assert worker.wait(60) == 0, worker.stdout.read()[-3000:]
    return tmp / "run" / "train" / "weights" / "last.pt", seen


def test_stop_request_in_the_first_epoch_saves_an_exact_checkpoint_and_reports_it(stopped_in_first_epoch):
    last, seen = stopped_in_first_epoch
    reported = [m for m in seen if m.kind == MessageKind.CHECKPOINT]
    assert len(reported) == 1 and reported[0].path == str(last)
    ckpt = torch.load(last, map_location="cpu", weights_only=False)
    assert (ckpt[EXACT_KEY]["epoch"], ckpt[EXACT_KEY]["batch"]) == (0, reported[0].batch)
    assert (reported[0].epoch, ckpt["epoch"]) == (1, -1)  # Ultralytics' own field: no epoch completed yet
    assert 3 <= reported[0].batch < 8


def test_a_truncated_checkpoint_falls_back_to_last_good(stopped_in_first_epoch, tmp_path):
    good = tmp_path / "last.good.pt"
    good.write_bytes(stopped_in_first_epoch[0].read_bytes())
    broken = tmp_path / "last.pt"
    broken.write_bytes(good.read_bytes()[: good.stat().st_size // 2])
    path, ckpt = readable_checkpoint(str(broken))
    assert path == str(good) and EXACT_KEY in ckpt
    good.unlink()
    with pytest.raises(ValueError, match=f"{broken}: unreadable checkpoint"):
        readable_checkpoint(str(broken))


@pytest.mark.parametrize("train, refusal", [
    ({"epochs": 50}, "(epochs: checkpoint 2, config 50)"),
    ({"model": "yolov8s.yaml"}, "(model: checkpoint yolov8n, config yolov8s)"),
    ({"imgsz": 96}, "(imgsz: checkpoint 64, config 96)"),
])
def test_a_checkpoint_of_another_training_is_refused_with_one_line_and_kept(stopped_in_first_epoch, tmp_path,
                                                                            train, refusal):
    last = stopped_in_first_epoch[0]
    before = last.read_bytes()
    worker = launch(tmp_path, tmp_path / "run", tmp_path / "fed.txt", resume=str(last), **train)
    messages(worker)
    assert worker.wait(60) == IDENTITY_EXIT
    lines = [line for line in worker.stdout.read().splitlines() if "checkpoint of another training" in line]
    assert lines == [f"yolo-train worker: {last}: checkpoint of another training {refusal}; "
                     f"point state_dir elsewhere or remove it"]
    assert last.read_bytes() == before
    assert not (tmp_path / "run").exists()
