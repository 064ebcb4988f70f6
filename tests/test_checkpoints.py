"""Guarding last.pt: a truncated checkpoint is set aside, never deleted, and the verified copy is used."""

import torch

from supervisor.checkpoints import choose_resume, verify


def save(path, value=1.0):
    path.parent.mkdir(parents=True, exist_ok=True)
    torch.save({"epoch": 3, "w": torch.full((1000,), value)}, path)


def test_a_real_checkpoint_verifies_and_a_truncated_one_does_not(tmp_path):
    path = tmp_path / "last.pt"
    save(path)
    assert verify(path) is None
    path.write_bytes(path.read_bytes()[:-100])
    assert "zip" in verify(path)
    path.write_bytes(b"")
    assert verify(path) is not None


def test_choose_resume_keeps_a_copy_and_falls_back_to_it(tmp_path):
    weights = tmp_path / "weights"
    save(weights / "last.pt", 1.0)
    assert choose_resume(tmp_path) == (weights / "last.pt", [])
    assert (weights / "last.good.pt").exists()
    data = (weights / "last.pt").read_bytes()
    (weights / "last.pt").write_bytes(data[: len(data) // 2])  # killed mid-save
    chosen, notes = choose_resume(tmp_path)
    assert chosen == weights / "last.good.pt"
    assert len(notes) == 1 and "corrupt checkpoint" in notes[0] and "resuming from last.good.pt" in notes[0]
    kept = list(weights.glob("last.pt.corrupt-*"))
    assert len(kept) == 1 and kept[0].read_bytes() == data[: len(data) // 2]  # nothing lost
    assert torch.load(chosen)["w"][0] == 1.0


def test_no_checkpoint_means_scratch(tmp_path):
    assert choose_resume(tmp_path) == (None, [])
