"""Guarding last.pt: a verified copy kept at every save, the newest usable file chosen, nothing lost, disk bounded."""

import os

import torch

from supervisor.state.checkpoints import KEEP_CORRUPT, choose_resume, keep_verified_copy, verify


def save(path, value=1.0):
    path.parent.mkdir(parents=True, exist_ok=True)
    torch.save({"epoch": 3, "w": torch.full((1000,), value)}, path)


def save_atomically(path, value):
    """What the worker does: a new file renamed over the old one."""
    tmp = path.with_name(".last.pt.tmp")
    save(tmp, value)
    os.replace(tmp, path)


def torn(path):
    """A last.pt replaced by a truncated file (a full disk at the worker's write, a kill mid-copy)."""
    data = path.read_bytes()
    path.unlink()
    path.write_bytes(data[: len(data) // 2])
    return data[: len(data) // 2]


def test_a_real_checkpoint_verifies_and_a_truncated_one_does_not(tmp_path):
    path = tmp_path / "last.pt"
    save(path)
    assert verify(path) is None
    path.write_bytes(path.read_bytes()[:-100])
    assert "zip" in verify(path)
    path.write_bytes(b"")
    assert verify(path) is not None


def test_each_completed_save_is_kept_as_a_verified_copy_without_a_restart(tmp_path):
    weights = tmp_path / "weights"
    save_atomically(weights / "last.pt", 1.0)
    assert keep_verified_copy(tmp_path) is None
    assert not os.path.samefile(weights / "last.pt", weights / "last.good.pt")  # a copy: no write is shared
    save_atomically(weights / "last.pt", 2.0)
    assert keep_verified_copy(tmp_path) is None
    assert torch.load(weights / "last.good.pt")["w"][0] == 2.0
    torn(weights / "last.pt")
    note = keep_verified_copy(tmp_path)
    assert "not a usable checkpoint" in note and "last.good.pt stays" in note
    assert torch.load(weights / "last.good.pt")["w"][0] == 2.0


def test_a_last_pt_torn_in_place_leaves_the_verified_copy_whole(tmp_path):
    weights = tmp_path / "weights"
    save(weights / "last.pt", 3.0)  # written in place, as Ultralytics' own final save does
    assert keep_verified_copy(tmp_path) is None
    (weights / "last.pt").write_bytes(b"torn")  # in place again
    assert torch.load(weights / "last.good.pt")["w"][0] == 3.0


def test_a_first_attempt_with_a_torn_last_pt_resumes_from_the_verified_copy(tmp_path):
    weights = tmp_path / "weights"
    save_atomically(weights / "last.pt", 1.0)
    keep_verified_copy(tmp_path)  # as the agent does at the worker's "checkpoint" beat, no restart before
    half = torn(weights / "last.pt")
    chosen, notes = choose_resume(tmp_path)
    assert chosen == weights / "last.good.pt"
    assert len(notes) == 1 and "corrupt checkpoint" in notes[0] and "resuming from last.good.pt" in notes[0]
    kept = list(weights.glob("last.pt.corrupt-*"))
    assert len(kept) == 1 and kept[0].read_bytes() == half  # nothing lost
    assert torch.load(chosen)["w"][0] == 1.0


def test_an_archive_with_bytes_before_it_is_corrupt_for_torch_and_never_kept_as_the_verified_copy(tmp_path):
    """zipfile reads an archive that other bytes stand before (the start of another save, here): every member's CRC
    checks out, but torch's reader refuses it. Seen in CI: a run's last.pt and its copy both so, exit 78."""
    weights = tmp_path / "weights"
    save_atomically(weights / "last.pt", 1.0)
    assert keep_verified_copy(tmp_path) is None
    whole = (weights / "last.pt").read_bytes()
    (weights / "last.pt").write_bytes(whole[:100] + whole)
    assert "bytes of something else before the archive" in verify(weights / "last.pt")
    note = keep_verified_copy(tmp_path)
    assert "not a usable checkpoint" in note and torch.load(weights / "last.good.pt")["w"][0] == 1.0
    chosen, notes = choose_resume(tmp_path)
    assert chosen == weights / "last.good.pt" and "corrupt checkpoint" in notes[0]
    assert torch.load(chosen)["w"][0] == 1.0


def test_without_a_verified_copy_best_pt_is_used_and_named(tmp_path):
    weights = tmp_path / "weights"
    save(weights / "best.pt", 5.0)
    save(weights / "last.pt", 6.0)
    torn(weights / "last.pt")
    chosen, notes = choose_resume(tmp_path)
    assert chosen == weights / "best.pt" and torch.load(chosen)["w"][0] == 5.0
    assert len(notes) == 1 and "resuming from best.pt (the best epoch's weights, not the newest" in notes[0]


def test_the_newest_usable_fallback_wins_and_unusable_ones_are_named(tmp_path):
    weights = tmp_path / "weights"
    save(weights / "best.pt", 5.0)
    save(weights / "epoch7.pt", 7.0)
    save(weights / "last.good.pt", 8.0)
    os.utime(weights / "best.pt", (1, 1))
    os.utime(weights / "epoch7.pt", (2, 2))
    (weights / "last.good.pt").write_bytes(b"junk")  # newest, but unusable
    chosen, notes = choose_resume(tmp_path)  # no last.pt at all
    assert chosen == weights / "epoch7.pt"
    assert "last.pt: missing; resuming from epoch7.pt" in notes[0]


def test_empty_corrupt_files_are_removed_and_moved_aside_ones_are_bounded(tmp_path):
    weights = tmp_path / "weights"
    save(weights / "best.pt")
    for _ in range(KEEP_CORRUPT + 2):
        save(weights / "last.pt")
        torn(weights / "last.pt")
        assert choose_resume(tmp_path)[0] == weights / "best.pt"
    assert len(list(weights.glob("last.pt.corrupt-*"))) == KEEP_CORRUPT
    (weights / "last.pt").write_bytes(b"")  # a disk-full save leaves zero bytes: nothing to keep
    chosen, notes = choose_resume(tmp_path)
    assert chosen == weights / "best.pt" and "empty, removed" in notes[0]
    assert len(list(weights.glob("last.pt.corrupt-*"))) == KEEP_CORRUPT and not (weights / "last.pt").exists()


def test_no_checkpoint_means_scratch(tmp_path):
    assert choose_resume(tmp_path) == (None, [])


def test_scratch_is_said_when_nothing_usable_is_left(tmp_path):
    weights = tmp_path / "weights"
    save(weights / "last.pt")
    torn(weights / "last.pt")
    chosen, notes = choose_resume(tmp_path)
    assert chosen is None and "resuming from scratch: no usable checkpoint" in notes[0]


DISK_FULL_WORKER = r'''
import json, sys
from pathlib import Path
from worker.heartbeat import Heartbeat
settings = json.load(open(sys.argv[-1]))
Path(settings["train"]["project"], f"seen-attempt-{settings['attempt']}").touch()
hb = Heartbeat.from_env()
hb.phase("train", epoch=1, epochs=1, batch=0, batches=4)
hb.beat(epoch=1, epochs=1, batch=1, batches=4)
Path("/dev/full").write_bytes(b"checkpoint")  # a real ENOSPC: OSError: [Errno 28] No space left on device
'''


def test_a_disk_full_save_stops_with_free_space_advice_instead_of_a_safer_rung(tmp_path):
    from tests.helpers import ROOT
    from tests.helpers.supervised import quiet_config, worker_launcher, yolo_train

    launcher = worker_launcher(tmp_path, DISK_FULL_WORKER)
    config = tmp_path / "config.toml"
    config.write_text(f'[train]\ndata = "demo"\n[worker]\npython = "{launcher}"\n' + quiet_config() +
                      '[restart]\nbackoff_initial = 0.1\n')
    state = tmp_path / "state"
    result = yolo_train("run", "--config", str(config), "--state-dir", str(state), env={"PYTHONPATH": str(ROOT)},
                        timeout=120)
    assert result.returncode == 78, result.stderr
    assert "the disk is full: free space" in result.stderr
    assert sorted(p.name for p in state.glob("seen-attempt-*")) == ["seen-attempt-1"]  # no retry on a safer rung


def test_ultralytics_final_strip_replaces_last_pt_whole_while_the_supervisor_verifies_it(tmp_path):
    """The end of every run: Ultralytics strips last.pt right after its last save, while the supervisor verifies that
    save. A reader in a loop, as the supervisor's check, must never see it half written."""
    import threading
    import types

    from worker.training.train import supervised_trainer

    weights = tmp_path / "weights"
    weights.mkdir()
    last = weights / "last.pt"
    torch.save({"model": torch.nn.Linear(1500, 1500), "train_args": {}, "optimizer": {"state": 1}}, last)
    before = os.stat(last).st_ino
    trainer = object.__new__(supervised_trainer("detect"))  # final_eval alone: no training set up
    trainer.last, trainer.best = last, weights / "best.pt"  # no best.pt: no final validation
    trainer.args = types.SimpleNamespace(val=True)  # Ultralytics' default: its own final_eval
    trainer.epoch, trainer.epochs = 2, 3  # its ending said to a link that hears nothing: no supervisor here
    trainer.link = types.SimpleNamespace(hb=types.SimpleNamespace(phase=lambda *args, **kwargs: None), rank=None)
    done, torn = threading.Event(), []

    def supervisor_check():
        while not done.is_set():
            note = keep_verified_copy(tmp_path)
            if note:
                torn.append(note)

    reader = threading.Thread(target=supervisor_check)
    reader.start()
    try:
        trainer.final_eval()
    finally:
        done.set()
        reader.join()
    assert torn == []
    assert os.stat(last).st_ino != before and verify(last) is None  # renamed over, not rewritten in place
    assert torch.load(last, weights_only=False)["optimizer"] is None  # and stripped
    assert [p.name for p in weights.iterdir() if p.name.startswith(".")] == []
