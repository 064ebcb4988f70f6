"""Exact resume with real Ultralytics training on the CPU: a worker killed mid-epoch and resumed from its mid-epoch
checkpoint feeds the model the same samples, in the same order, as an uninterrupted run; none twice, none skipped.

The workers are driven as the supervisor drives them: a launch record, a heartbeat pipe read with the real Decoder.
"""

import shutil
import signal

import psutil
import pytest
import torch

from tests.helpers.resume import fed, kill_after_a_checkpoint_in_epoch_2, launch, messages
from worker.checkpoints.checkpointing import EXACT_KEY
from worker.wire.contract import MessageKind, Phase

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def killed_in_epoch_2(tmp_path_factory):
    """A real worker SIGKILLed after a mid-epoch checkpoint of epoch 2: (its directory, its project, epoch, batch)."""
    tmp = tmp_path_factory.mktemp("killed")
    seen, exact = kill_after_a_checkpoint_in_epoch_2(tmp, tmp / "old", tmp / "first.txt")
    assert (exact["epoch"], exact["batch"]) >= (1, seen[-1].batch)  # that checkpoint or a later complete one
    return tmp, tmp / "old", exact["epoch"], exact["batch"]


def test_killed_mid_epoch_and_resumed_feeds_each_sample_once_in_the_uninterrupted_order(killed_in_epoch_2, tmp_path):
    killed, old, epoch, batch = killed_in_epoch_2
    whole = launch(tmp_path, tmp_path / "whole", tmp_path / "whole.txt")
    messages(whole)
    assert whole.wait(60) == 0, whole.stdout.read()[-3000:]

    # The state directory is copied and the run resumed there (issue 15 item 1): the old one must stay as it was.
    new = tmp_path / "new"
    shutil.copytree(old, new)
    before = {p.name: p.read_bytes() for p in (old / "train" / "weights").iterdir()}
    resumed = launch(tmp_path, new, tmp_path / "resumed.txt", resume=str(new / "train" / "weights" / "last.pt"),
                     every=0.2)
    after = messages(resumed)
    assert resumed.wait(60) == 0, resumed.stdout.read()[-3000:]

    trained_before_kill = [r for r in fed(killed / "first.txt") if (r[0], r[1]) < (epoch, batch)]
    assert trained_before_kill + fed(tmp_path / "resumed.txt") == fed(tmp_path / "whole.txt")
    beats = [m for m in after if m.kind == MessageKind.BEAT and m.batch]
    assert (beats[0].epoch, beats[0].batch) == (epoch + 1, batch + 1)
    assert {p.name: p.read_bytes() for p in (old / "train" / "weights").iterdir()} == before
    assert (new / "train" / "weights" / "last.pt").read_bytes() != before["last.pt"]  # the resumed run wrote here


def test_resumed_at_half_the_batch_size_it_skips_the_samples_trained_and_trains_the_rest_once(killed_in_epoch_2,
                                                                                              tmp_path):
    """The OOM remedy halves the batch: the checkpoint's B batches of 4 are 2B batches of 2, not B."""
    killed, old, epoch, batch = killed_in_epoch_2
    run = tmp_path / "run"
    shutil.copytree(old, run)
    last = run / "train" / "weights" / "last.pt"
    exact = torch.load(last, map_location="cpu", weights_only=False)[EXACT_KEY]
    assert (exact["batch_size"], exact["samples"]) == (4, 4 * batch)

    resumed = launch(tmp_path, run, tmp_path / "resumed.txt", resume=str(last), forced={"batch": 2})
    after = messages(resumed)
    output = resumed.stdout.read()
    assert resumed.wait(60) == 0, output[-3000:]
    assert f"goes on at batch {2 * batch + 1} of 16, after the {4 * batch} samples already trained" in output

    trained = [name for e, b, name in fed(killed / "first.txt") if (e, b) < (epoch, batch) and e == epoch]
    rest = [name for e, b, name in fed(tmp_path / "resumed.txt") if e == epoch]
    assert len(trained) == 4 * batch and len(rest) == 32 - 4 * batch
    every_image = {name for e, _, name in fed(killed / "first.txt") if e == 0}  # epoch 1 fed each once
    assert len(every_image) == 32 and sorted(trained + rest) == sorted(every_image)
    beats = [m for m in after if m.kind == MessageKind.BEAT and m.phase == Phase.TRAIN]
    assert [m.batch for m in beats if m.epoch == epoch + 1] == list(range(2 * batch + 1, 17))


def test_a_worker_stopped_in_the_final_validation_is_resumed_as_finished_and_its_checkpoint_stripped(tmp_path):
    """The last epoch's own save says every epoch done; Ultralytics' final validation strips it, and a worker stopped
    in between (a freeze there, on the H100's bad night) left it as it was: Ultralytics' resume refuses it ("training
    to N epochs is finished, nothing to resume": an AssertionError, a crash on every attempt)."""
    project = tmp_path / "run"
    worker = launch(tmp_path, project, tmp_path / "fed.txt")
    messages(worker, until=lambda m: m.kind == MessageKind.BEAT and m.phase == Phase.TRAIN and m.epoch == 2)
    for process in [worker, *psutil.Process(worker.pid).children(recursive=True)]:
        process.send_signal(signal.SIGKILL)
    worker.wait(30)
    last = project / "train" / "weights" / "last.pt"
    ckpt = torch.load(last, map_location="cpu", weights_only=False)
    assert ckpt["epoch"] == 0 and ckpt["optimizer"] is not None  # epoch 1's own save
    ckpt.pop(EXACT_KEY, None)
    ckpt["train_args"]["epochs"] = 1  # so it is the last epoch's: as the final validation finds it
    torch.save(ckpt, last)

    resumed = launch(tmp_path, project, tmp_path / "resumed.txt", resume=str(last), epochs=1)
    seen = messages(resumed)
    output = resumed.stdout.read()
    assert resumed.wait(60) == 0, output[-3000:]
    assert "holds every epoch trained (its final validation did not finish)" in output
    assert "nothing to resume" in output and "AssertionError" not in output
    [done] = [m for m in seen if m.kind == MessageKind.PHASE and m.phase == Phase.DONE]
    # where it finished, which the status shows (a host restarted once the job was done said "epoch 0 of 0")
    assert (done.epoch, done.epochs) == (1, 1)
    stripped = torch.load(last, map_location="cpu", weights_only=False)
    assert stripped["epoch"] == -1 and stripped["optimizer"] is None  # as Ultralytics leaves a finished training
    assert not (tmp_path / "resumed.txt").exists()  # not a batch trained again
