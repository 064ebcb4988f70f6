"""The GPU's devcoredump copied from a fake sysfs tree laid out as drivers/base/devcoredump.c makes it (this machine
has no GPU to dump): /sys/class/devcoredump/devcdN, a link to /sys/devices/virtual/devcoredump/devcdN, whose ``data``
is the dump and whose ``failing_device`` links to the device that dumped."""

import time

from supervisor.host import devcoredump
from tests.helpers.devcoredump_tree import DUMP, PCI, fake_sysfs

def test_each_dump_is_copied_with_its_device_and_not_twice(tmp_path):
    root, state = tmp_path / "root", tmp_path / "state"
    fake_sysfs(root)
    fake_sysfs(root, "devcd2", b"second", pci="0000:03:00.0")
    dest = state / "incidents" / "devcoredumps-1"
    kept = devcoredump.keep(root, dest, state)
    assert [(d.source, d.device, d.bytes, d.truncated, d.path) for d in kept] == [
        ("devcd1", PCI, len(DUMP), False, "incidents/devcoredumps-1/devcoredump-devcd1"),
        ("devcd2", "0000:03:00.0", 6, False, "incidents/devcoredumps-1/devcoredump-devcd2")]
    assert (state / kept[0].path).read_bytes() == DUMP
    assert devcoredump.keep(root, dest, state, kept=("devcd1", "devcd2")) == ()
    assert (root / devcoredump.DEVCOREDUMPS / "devcd1" / "data").read_bytes() == DUMP  # never written: not deleted


def test_a_dump_of_1_gib_is_cut_at_the_bound(tmp_path):
    root, state = tmp_path / "root", tmp_path / "state"
    fake_sysfs(root, data=DUMP, size=1 << 30)
    started = time.monotonic()
    (kept,) = devcoredump.keep(root, state / "incidents" / "x", state)
    assert (kept.bytes, kept.truncated) == (devcoredump.COPY_LIMIT, True)
    copy = state / kept.path
    assert copy.stat().st_size == devcoredump.COPY_LIMIT < 1 << 30
    assert copy.read_bytes()[:len(DUMP)] == DUMP
    assert time.monotonic() - started < 30  # the agent's loop waits for it: bounded in time as in bytes


def test_no_dumps_or_no_class_directory_is_nothing(tmp_path):
    assert devcoredump.keep(tmp_path, tmp_path / "dest", tmp_path) == ()
    (tmp_path / devcoredump.DEVCOREDUMPS).mkdir(parents=True)
    assert devcoredump.keep(tmp_path, tmp_path / "dest", tmp_path) == ()


def test_dumps_kept_before_the_incident_move_into_its_directory(tmp_path):
    root, state = tmp_path / "root", tmp_path / "state"
    fake_sysfs(root)
    kept = devcoredump.keep(root, state / "incidents" / "devcoredumps-1", state)
    moved = devcoredump.move_into(state, kept, state / "incidents" / "1-1-1700000000")
    assert [d.path for d in moved] == ["incidents/1-1-1700000000/devcoredump-devcd1"]
    assert (state / moved[0].path).read_bytes() == DUMP
    assert not (state / "incidents" / "devcoredumps-1").exists()
    assert devcoredump.move_into(state, moved, state / "incidents" / "1-1-1700000000") == moved
