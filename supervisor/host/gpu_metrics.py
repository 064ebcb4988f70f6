"""What the GPUs report right now: utilisation, VRAM, temperature, power and clocks, one sample per device.

Two readers, both cheap enough to run in the supervisor every sampling interval (default 5 s):

- ``AmdgpuSysfsReader`` reads the amdgpu driver's sysfs files under ``/sys/class/drm/card*/device``. It needs
  no ROCm library, so it keeps working when the ROCm user space is what broke. Paths are resolved once, at
  construction; a sample is a handful of small ``read()`` calls per device.
- ``NvmlReader`` asks NVML through nvidia-ml-py (``pynvml``). It initialises NVML on first use; without the
  library or the driver it has no devices and raises nothing.

A value a device does not report is ``None``, never 0: the exporter leaves that series out instead of
drawing a false zero. On a CPU-only machine ``discover_gpu_readers()`` returns no readers and
``sample_all()`` an empty list.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

AMD_VENDOR_ID = "0x1002"
DRM_CARD = re.compile(r"card\d+$")
# pp_dpm_sclk / pp_dpm_mclk lines: "1: 1800Mhz *"; the starred level is the current one.
DPM_LEVEL = re.compile(r"^\s*\d+:\s*(\d+)\s*[Mm][Hh]z\s*(\*?)\s*$")
PCI_IDS_PATHS = ("usr/share/misc/pci.ids", "usr/share/hwdata/pci.ids")
NVML_CLOCKS = {"graphics": "NVML_CLOCK_GRAPHICS", "memory": "NVML_CLOCK_MEM"}


@dataclass
class GpuSample:
    """One device at one moment. ``index`` is the device's position within its reader (PCI order for amdgpu,
    NVML's index for NVIDIA); ``pci`` is the PCI address as sysfs writes it (``0000:03:00.0``)."""

    index: int
    pci: str
    name: str
    vendor: str  # "amd" or "nvidia"
    utilization_ratio: float | None = None
    memory_used_bytes: int | None = None
    memory_total_bytes: int | None = None
    temperature_celsius: float | None = None
    power_watts: float | None = None
    clocks_hertz: dict[str, float] = field(default_factory=dict)  # "graphics", "memory"


class GpuReader(Protocol):
    def sample(self) -> list[GpuSample]: ...


def _read_text(path: Path | None) -> str | None:
    """The file's content, or None when it is absent or unreadable (a device mid-reset returns EIO or
    ENODEV, a card without the sensor has no file)."""
    if path is None:
        return None
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return None
    try:
        return os.read(fd, 4096).decode("ascii", "replace")
    except OSError:
        return None
    finally:
        os.close(fd)


def _read_int(path: Path | None) -> int | None:
    text = _read_text(path)
    if text is None:
        return None
    try:
        return int(text.strip(), 0)
    except ValueError:
        return None


def parse_dpm_current_mhz(text: str | None) -> int | None:
    """The current level of a ``pp_dpm_*clk`` file in MHz: the first starred line, None if none is starred."""
    if text is None:
        return None
    for line in text.splitlines():
        match = DPM_LEVEL.match(line)
        if match and match.group(2):
            return int(match.group(1))
    return None


def parse_uevent(text: str | None) -> dict[str, str]:
    """``KEY=value`` lines of a sysfs ``uevent`` file."""
    pairs = {}
    for line in (text or "").splitlines():
        key, sep, value = line.partition("=")
        if sep:
            pairs[key.strip()] = value.strip()
    return pairs


def pci_ids_device_name(root: Path, vendor: str, device: str) -> str | None:
    """The device's name in the PCI ID database under ``root`` (``1002``, ``744c`` ->
    ``Navi 31 [Radeon RX 7900 XT/7900 XTX/7900 GRE/7900M]``), None without the file or the entry.
    Read once per device at discovery, never per sample."""
    if not vendor or not device:
        return None
    for path in PCI_IDS_PATHS:
        try:
            with open(root / path, encoding="utf-8", errors="replace") as lines:
                in_vendor = False
                for line in lines:
                    if line.startswith("#") or not line.strip():
                        continue
                    if not line.startswith("\t"):
                        if in_vendor:
                            return None  # past the vendor's block
                        in_vendor = line.lower().startswith(vendor + "  ")
                    elif in_vendor and not line.startswith("\t\t") and line[1:].lower().startswith(device + "  "):
                        return line[1 + len(device):].strip()
        except OSError:
            continue
    return None


@dataclass
class _AmdgpuDevice:
    """The files of one amdgpu device, resolved once."""

    index: int
    pci: str
    name: str
    device_dir: Path
    hwmon_dir: Path | None
    power_file: Path | None


class AmdgpuSysfsReader:
    """Reads every amdgpu device under ``root``/sys/class/drm. ``root`` exists for tests (a fixture tree in the
    real layout); in production it is ``/``. Devices are found once, at construction: call
    ``discover_gpu_readers()`` again after a GPU is lost or comes back."""

    def __init__(self, root: Path = Path("/")):
        self.root = Path(root)
        self.devices = self._find_devices()

    def _find_devices(self) -> list[_AmdgpuDevice]:
        drm = self.root / "sys/class/drm"
        try:
            cards = sorted(p for p in drm.iterdir() if DRM_CARD.match(p.name))
        except OSError:
            return []
        found: dict[str, Path] = {}
        for card in cards:
            device_dir = card / "device"
            if (_read_text(device_dir / "vendor") or "").strip().lower() != AMD_VENDOR_ID:
                continue
            uevent = parse_uevent(_read_text(device_dir / "uevent"))
            if uevent.get("DRIVER", "amdgpu") != "amdgpu":
                continue  # an AMD card bound to radeon or vfio: no amdgpu files to read
            pci = uevent.get("PCI_SLOT_NAME") or device_dir.resolve().name
            found.setdefault(pci, device_dir)  # card0 and card1 may be the same device
        devices = []
        for index, pci in enumerate(sorted(found)):
            device_dir = found[pci]
            hwmon_dir = self._hwmon_dir(device_dir)
            devices.append(_AmdgpuDevice(
                index=index,
                pci=pci,
                name=self._product_name(device_dir),
                device_dir=device_dir,
                hwmon_dir=hwmon_dir,
                power_file=self._power_file(hwmon_dir),
            ))
        return devices

    @staticmethod
    def _hwmon_dir(device_dir: Path) -> Path | None:
        try:
            return next(iter(sorted((device_dir / "hwmon").glob("hwmon*"))), None)
        except OSError:
            return None

    @staticmethod
    def _power_file(hwmon_dir: Path | None) -> Path | None:
        # Older SMUs (Navi 1x) report power1_average; newer kernels give RDNA3 only power1_input.
        if hwmon_dir is None:
            return None
        for name in ("power1_average", "power1_input"):
            if (hwmon_dir / name).exists():
                return hwmon_dir / name
        return None

    def _product_name(self, device_dir: Path) -> str:
        # product_name comes from the board's FRU EEPROM, which most consumer cards lack: then the chip's
        # name from the PCI ID database (pciutils' pci.ids), then the bare PCI ID.
        name = (_read_text(device_dir / "product_name") or "").strip()
        if name:
            return name
        pci_id = parse_uevent(_read_text(device_dir / "uevent")).get("PCI_ID", "").lower()
        vendor, _, device = pci_id.partition(":")
        return pci_ids_device_name(self.root, vendor, device) or (f"AMD GPU {pci_id}" if pci_id else "AMD GPU")

    def sample(self) -> list[GpuSample]:
        return [self._sample(device) for device in self.devices]

    @staticmethod
    def _sample(device: _AmdgpuDevice) -> GpuSample:
        d = device.device_dir
        busy = _read_int(d / "gpu_busy_percent")
        temp = _read_int(device.hwmon_dir / "temp1_input") if device.hwmon_dir else None
        power = _read_int(device.power_file)
        clocks = {}
        for clock, file in (("graphics", "pp_dpm_sclk"), ("memory", "pp_dpm_mclk")):
            mhz = parse_dpm_current_mhz(_read_text(d / file))
            if mhz is not None:
                clocks[clock] = mhz * 1e6
        return GpuSample(
            index=device.index,
            pci=device.pci,
            name=device.name,
            vendor="amd",
            utilization_ratio=busy / 100 if busy is not None else None,
            memory_used_bytes=_read_int(d / "mem_info_vram_used"),
            memory_total_bytes=_read_int(d / "mem_info_vram_total"),
            temperature_celsius=temp / 1000 if temp is not None else None,  # millidegrees
            power_watts=power / 1e6 if power is not None else None,  # microwatts
            clocks_hertz=clocks,
        )


def normalize_pci_bus_id(bus_id: str | bytes) -> str:
    """NVML writes ``00000000:65:00.0``; sysfs and our labels use ``0000:65:00.0``."""
    if isinstance(bus_id, bytes):
        bus_id = bus_id.decode("ascii", "replace")
    domain, _, rest = bus_id.strip().lower().partition(":")
    return f"{int(domain, 16):04x}:{rest}" if rest else bus_id.lower()


class NvmlReader:
    """NVIDIA GPUs through NVML. Initialises on first use; without pynvml, libnvidia-ml or a driver it has no
    devices and raises nothing. Each field is asked separately, so a device that does not support one
    (power on some boards, clocks under MIG) still reports the rest."""

    def __init__(self):
        self._nvml = None
        self._handles: list | None = None

    @property
    def devices(self) -> list:
        if self._handles is None:
            self._handles = self._init()
        return self._handles

    def _init(self) -> list:
        try:
            import pynvml
        except ImportError:
            return []
        try:
            pynvml.nvmlInit()
            count = pynvml.nvmlDeviceGetCount()
            handles = [pynvml.nvmlDeviceGetHandleByIndex(i) for i in range(count)]
        except pynvml.NVMLError:
            return []
        self._nvml = pynvml
        return handles

    def sample(self) -> list[GpuSample]:
        return [self._sample(index, handle) for index, handle in enumerate(self.devices)]

    def _ask(self, function, *args):
        try:
            return function(*args)
        except self._nvml.NVMLError:
            return None

    def _sample(self, index: int, handle) -> GpuSample:
        nvml = self._nvml
        name = self._ask(nvml.nvmlDeviceGetName, handle) or "NVIDIA GPU"
        if isinstance(name, bytes):
            name = name.decode("utf-8", "replace")
        pci_info = self._ask(nvml.nvmlDeviceGetPciInfo, handle)
        utilization = self._ask(nvml.nvmlDeviceGetUtilizationRates, handle)
        memory = self._ask(nvml.nvmlDeviceGetMemoryInfo, handle)
        temperature = self._ask(nvml.nvmlDeviceGetTemperature, handle, nvml.NVML_TEMPERATURE_GPU)
        milliwatts = self._ask(nvml.nvmlDeviceGetPowerUsage, handle)
        clocks = {}
        for clock, constant in NVML_CLOCKS.items():
            mhz = self._ask(nvml.nvmlDeviceGetClockInfo, handle, getattr(nvml, constant))
            if mhz is not None:
                clocks[clock] = mhz * 1e6
        return GpuSample(
            index=index,
            pci=normalize_pci_bus_id(pci_info.busId) if pci_info is not None else "",
            name=name,
            vendor="nvidia",
            utilization_ratio=utilization.gpu / 100 if utilization is not None else None,
            memory_used_bytes=memory.used if memory is not None else None,
            memory_total_bytes=memory.total if memory is not None else None,
            temperature_celsius=float(temperature) if temperature is not None else None,
            power_watts=milliwatts / 1000 if milliwatts is not None else None,
            clocks_hertz=clocks,
        )

    def close(self) -> None:
        if self._nvml is not None:
            self._ask(self._nvml.nvmlShutdown)
            self._nvml = None
        self._handles = None


def discover_gpu_readers(root: Path = Path("/")) -> list[GpuReader]:
    """The readers that found at least one device: none on a CPU-only machine."""
    readers: list[GpuReader] = []
    amd = AmdgpuSysfsReader(root)
    if amd.devices:
        readers.append(amd)
    nvidia = NvmlReader()
    if nvidia.devices:
        readers.append(nvidia)
    return readers


def sample_all(readers: list[GpuReader]) -> list[GpuSample]:
    """One sample of every device of every reader."""
    return [sample for reader in readers for sample in reader.sample()]
