"""GPU readers: amdgpu sysfs on a fixture tree, NVML on this CPU-only machine.

The amdgpu fixture (tests/fixtures/amdgpu_sysfs, see its README) is a fake only because an AMD GPU cannot
exist here; it is built from the real file names and formats of an RX 7900 XT and an RX 5600 XT. NVML is
the real library: on this machine it finds no driver, which is the case under test. Its readings on a real
GPU were taken with bench/gpu_sampling.py on the device machine.
"""

import shutil
from pathlib import Path

import pytest

from supervisor.host.gpu_metrics import (
    AmdgpuSysfsReader,
    GpuSample,
    NvmlReader,
    discover_gpu_readers,
    normalize_pci_bus_id,
    parse_dpm_current_mhz,
    pci_ids_device_name,
    sample_all,
)

FIXTURE = Path(__file__).parents[1] / "fixtures" / "amdgpu_sysfs"

RX_7900_XT = GpuSample(
    index=0,
    pci="0000:03:00.0",
    name="Navi 31 [Radeon RX 7900 XT/7900 XTX/7900 GRE/7900M]",
    vendor="amd",
    utilization_ratio=0.97,
    memory_used_bytes=16458113024,
    memory_total_bytes=21458059264,
    temperature_celsius=71.0,
    power_watts=284.0,
    clocks_hertz={"graphics": 2394e6, "memory": 1250e6},
)
RX_5600_XT = GpuSample(
    index=1,
    pci="0000:0b:00.0",
    name="Navi 10 [Radeon RX 5600 OEM/5600 XT / 5700/5700 XT]",
    vendor="amd",
    utilization_ratio=1.0,
    memory_used_bytes=5301600256,
    memory_total_bytes=6425673728,
    temperature_celsius=66.0,
    power_watts=150.0,
    clocks_hertz={"graphics": 1615e6, "memory": 875e6},
)


@pytest.fixture
def sysfs(tmp_path):
    """A writable copy of the fixture, for tests that take files away."""
    root = tmp_path / "root"
    shutil.copytree(FIXTURE, root)
    return root


def test_amdgpu_reads_both_cards_and_skips_everything_else():
    assert AmdgpuSysfsReader(FIXTURE).sample() == [RX_7900_XT, RX_5600_XT]


def test_amdgpu_power_from_power1_input_or_power1_average():
    reader = AmdgpuSysfsReader(FIXTURE)
    assert [d.power_file.name for d in reader.devices] == ["power1_input", "power1_average"]


def test_amdgpu_missing_files_read_as_none_not_zero(sysfs):
    device = sysfs / "sys/class/drm/card1/device"
    shutil.rmtree(device / "hwmon")
    for name in ("gpu_busy_percent", "pp_dpm_mclk", "mem_info_vram_used"):
        (device / name).unlink()
    sample = AmdgpuSysfsReader(sysfs).sample()[1]
    assert (sample.utilization_ratio, sample.temperature_celsius, sample.power_watts) == (None, None, None)
    assert sample.memory_used_bytes is None
    assert sample.memory_total_bytes == 6425673728
    assert sample.clocks_hertz == {"graphics": 1615e6}


def test_amdgpu_garbage_in_a_file_reads_as_none(sysfs):
    (sysfs / "sys/class/drm/card0/device/gpu_busy_percent").write_text("\n")
    (sysfs / "sys/class/drm/card0/device/pp_dpm_sclk").write_text("0: 500Mhz \n1: 2600Mhz \n")
    sample = AmdgpuSysfsReader(sysfs).sample()[0]
    assert sample.utilization_ratio is None
    assert "graphics" not in sample.clocks_hertz


def test_amdgpu_device_gone_after_discovery_reads_as_none(sysfs):
    reader = AmdgpuSysfsReader(sysfs)
    shutil.rmtree(sysfs / "sys/class/drm/card0")
    gone, alive = reader.sample()
    assert (gone.pci, gone.utilization_ratio, gone.memory_total_bytes, gone.clocks_hertz) == ("0000:03:00.0", None, None, {})
    assert alive == RX_5600_XT


def test_amdgpu_name_falls_back_to_product_name_then_pci_id(sysfs):
    (sysfs / "sys/class/drm/card0/device/product_name").write_text("AMD Radeon RX 7900 XT\n")
    (sysfs / "usr/share/misc/pci.ids").unlink()
    names = [s.name for s in AmdgpuSysfsReader(sysfs).sample()]
    assert names == ["AMD Radeon RX 7900 XT", "AMD GPU 1002:731f"]


def test_amdgpu_same_device_under_two_cards_counts_once(sysfs):
    shutil.copytree(sysfs / "sys/class/drm/card1", sysfs / "sys/class/drm/card5")
    assert [s.pci for s in AmdgpuSysfsReader(sysfs).sample()] == ["0000:03:00.0", "0000:0b:00.0"]


def test_no_drm_class_means_no_devices(tmp_path):
    assert AmdgpuSysfsReader(tmp_path).devices == []


def test_pci_ids_lookup_stays_inside_the_vendor_block():
    assert pci_ids_device_name(FIXTURE, "1002", "744c").startswith("Navi 31")
    assert pci_ids_device_name(FIXTURE, "1002", "4680") is None  # an Intel device ID under AMD
    assert pci_ids_device_name(FIXTURE, "8086", "4680") == "AlderLake-S GT1"


@pytest.mark.parametrize("text, mhz", [
    ("0: 96Mhz *\n1: 456Mhz \n2: 772Mhz \n3: 1218Mhz \n", 96),
    ("0: 500Mhz \n1: 2394Mhz *\n2: 2600Mhz \n", 2394),
    ("0: 0Mhz *\n1: 0Mhz *", 0),  # GFXOFF: every level starred at 0 MHz
    ("0: 300Mhz \n1: 1750Mhz \n", None),
    (None, None),
])
def test_parse_dpm_current(text, mhz):
    assert parse_dpm_current_mhz(text) == mhz


def test_nvml_bus_id_matches_sysfs_form():
    assert normalize_pci_bus_id(b"00000000:65:00.0") == "0000:65:00.0"
    assert normalize_pci_bus_id("00000001:AB:00.0") == "0001:ab:00.0"


def test_nvml_without_a_driver_has_no_devices_and_raises_nothing():
    reader = NvmlReader()
    assert reader.devices == []
    assert reader.sample() == []
    reader.close()


def test_cpu_only_machine_has_no_readers_and_no_samples(tmp_path):
    readers = discover_gpu_readers(tmp_path)
    assert readers == []
    assert sample_all(readers) == []


def test_discover_and_sample_all_on_the_fixture():
    readers = discover_gpu_readers(FIXTURE)
    assert [type(r).__name__ for r in readers] == ["AmdgpuSysfsReader"]
    assert sample_all(readers) == [RX_7900_XT, RX_5600_XT]
