"""The suite's hooks and fixtures; the helpers the tests share are in tests/helpers/."""

import os
import subprocess
import textwrap
from pathlib import Path

import pytest

from tests.helpers.supervised import E2E_CONFIG, demo_train, quiet_config

# Seconds each slow test took in a full run (setup, call and teardown), "SECONDS NODEID" a line: `make durations`
# measures them anew. Only the order of the run depends on it.
DURATIONS = Path(__file__).parent / "durations.txt"


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

    from worker.startup.demo_data import ensure_demo_dataset

    data = check_det_dataset(str(ensure_demo_dataset()))
    for split in ("train", "val"):
        YOLODataset(img_path=data[split], data=data, imgsz=64, augment=False, hyp=get_cfg())


def pytest_collection_modifyitems(config, items):
    """The slowest tests first (``DURATIONS``), the rest in their order: workers that steal queued tests then end
    together instead of waiting on a DDP run handed out last (in file order the suite's last tenth took 8 of its 26
    minutes on the 2-core VM). Every xdist worker sorts its collection alike, as the scheduler requires."""
    seconds = {}
    if DURATIONS.exists():
        for line in DURATIONS.read_text().splitlines():
            taken, _, nodeid = line.partition(" ")
            seconds[nodeid] = float(taken)
    items.sort(key=lambda item: -seconds.get(item.nodeid, 0.0))


@pytest.fixture(autouse=True)
def umask_kept():
    """StateDir.lock() makes the process's umask as strict as its directory, as `run` needs: a test that locks one
    in-process must not hand 077 on to the next test of its xdist worker (CI: a booted systemd's overlay root made
    0700, so its service's user could not reach its working directory, 200/CHDIR)."""
    before = os.umask(0o022)
    os.umask(before)
    yield
    os.umask(before)


@pytest.fixture
def write_config(tmp_path):
    """Writes a config under tmp_path: the parts one after the other, each dedented (so a test may write its
    sections as an indented block and add ``quiet_config()``), into ``name``."""
    def write(*parts: str, name: str = "config.toml") -> Path:
        path = tmp_path / name
        path.write_text("".join(textwrap.dedent(part) for part in parts))
        return path
    return write


@pytest.fixture
def demo_config(write_config):
    """The end-to-end tests' config (E2E_CONFIG) around the demo's [train] table, ``extra`` TOML after it."""
    def make(extra: str = "", startup: int = 90, restart: str = "backoff_initial = 0.5", kernel_log: str = "off"):
        return write_config(E2E_CONFIG.format(train=demo_train(), quiet=quiet_config(kernel_log=kernel_log),
                                              startup=startup, restart=restart) + textwrap.dedent(extra))
    return make


class SmallDisk:
    """A real disk that fills: a 2 MiB tmpfs mounted at ``path``."""

    def __init__(self, path: Path):
        self.path = path

    def fill(self) -> None:
        """Write until the disk is full, as training's checkpoints do."""
        with open(self.path / "filler", "wb") as f:
            with pytest.raises(OSError):
                while True:
                    f.write(b"x" * 65536)
                    f.flush()


@pytest.fixture
def small_disk(tmp_path):
    """A ``SmallDisk`` under tmp_path, unmounted after the test; the test is skipped where none can be mounted."""
    mount = tmp_path / "small"
    mount.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=2m", "tmpfs", str(mount)], capture_output=True).returncode:
        pytest.skip("cannot mount a tmpfs here (not root)")
    try:
        yield SmallDisk(mount)
    finally:
        subprocess.run(["umount", "-l", str(mount)])
