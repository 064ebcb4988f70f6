"""A fake sysfs devcoredump, laid out as drivers/base/devcoredump.c makes it (this machine has no GPU to dump):
/sys/class/devcoredump/devcdN, a link to /sys/devices/virtual/devcoredump/devcdN, whose ``data`` is the dump and whose
``failing_device`` links to the device that dumped (which links back to it as ``devcoredump``)."""

import os
from pathlib import Path

from supervisor.host import devcoredump

PCI = "0000:c5:00.0"
DUMP = b"**** AMDGPU Device Coredump ****\nversion: 1\nkernel: 6.18.0\n...\nRing timed out details\n"


def fake_sysfs(root: Path, name: str = "devcd1", data: bytes = DUMP, size: int | None = None, pci: str = PCI) -> Path:
    """One dump; a device has one at a time (dev_coredumpm() discards a second while the first is there)."""
    device = root / "sys/devices/pci0000:00/0000:00:01.1" / pci
    device.mkdir(parents=True, exist_ok=True)
    dump = root / "sys/devices/virtual/devcoredump" / name
    dump.mkdir(parents=True)
    with open(dump / "data", "wb") as f:
        f.write(data)
        if size is not None:
            f.truncate(size)  # sparse: no disk behind it
    os.symlink(os.path.relpath(device, dump), dump / "failing_device")
    (root / devcoredump.DEVCOREDUMPS).mkdir(parents=True, exist_ok=True)
    os.symlink(os.path.relpath(dump, root / devcoredump.DEVCOREDUMPS), root / devcoredump.DEVCOREDUMPS / name)
    (device / "devcoredump").symlink_to(os.path.relpath(dump, device))
    return dump
