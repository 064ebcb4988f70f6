"""GPU device events: the DRM subsystem's uevents, read through a pyudev netlink monitor.

What a uevent means (``uevent_to_event``, pure, tested with property dicts in the real format):

- ``WEDGED=<methods>``: the DRM device wedged uevent (drivers/gpu/drm/drm_drv.c drm_dev_wedged_event(),
  Linux 6.14+; Documentation/gpu/drm-uapi.rst "Device Wedging"). ``ACTION=change`` on the card's minor
  with ``WEDGED=`` a comma list of recovery methods, least side effects first: ``none`` (the driver
  reset the GPU itself; amdgpu sends it after a successful reset, with the log line "device wedged, but
  recovered through reset"), ``rebind``, ``bus-reset``, ``vendor-specific``, or ``unknown``. Later
  kernels add ``PID=`` and ``TASK=`` naming the guilty task. ``none`` becomes a ``gpu_fault`` (the
  worker's GPU context is gone but the GPU works); anything else is ``gpu_lost``: user space must
  unbind/rebind or reset the bus, which the supervisor does not do.
- ``RESET=1`` with ``PID=``, ``NAME=``, ``FLAGS=``: the GPU reset uevent proposed for DRM/amdgpu
  ("drm: Add GPU reset sysfs event", Shashank Sharma, amd-gfx 2022, drm_sysfs_reset_event()). It was
  not merged upstream (WEDGED= replaced it), but vendor kernels may carry it: a ``gpu_fault``.
- ``ACTION=remove`` of a card (``DEVTYPE=drm_minor``, DEVPATH ending in ``/cardN``): the GPU left the
  system (hot unplug, fell off the bus, driver unbound): ``gpu_lost``.

The monitor listens to udevd's rebroadcast (``source="udev"``) when udevd runs, else to the kernel's
own uevents (``source="kernel"``), which carry the same properties without udev rules applied.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from pathlib import Path

from supervisor.kernel.catalogue import KernelEvent

_CARD = re.compile(r"/card\d+$")
# Properties worth showing in the one-line rendering, in this order.
_SHOWN = ("WEDGED", "RESET", "PID", "TASK", "NAME", "FLAGS", "DEVNAME")
UDEV_CONTROL = "/run/udev/control"


def render_uevent(properties: Mapping[str, str]) -> str:
    """A uevent on one line: ``udev drm change /devices/.../drm/card0 WEDGED=rebind PID=1234``."""
    head = " ".join(
        p for p in (properties.get("SUBSYSTEM", "?"), properties.get("ACTION", "?"), properties.get("DEVPATH", "?"))
    )
    shown = " ".join(f"{k}={properties[k]}" for k in _SHOWN if k in properties)
    return f"udev {head}" + (f" {shown}" if shown else "")


def _pid(properties: Mapping[str, str]) -> int | None:
    value = properties.get("PID", "")
    return int(value) if value.isdigit() and int(value) > 0 else None


def uevent_to_event(properties: Mapping[str, str]) -> KernelEvent | None:
    """The event a DRM uevent's properties mean, or None for one the watchdog does not act on."""
    if properties.get("SUBSYSTEM", "drm") != "drm":
        return None
    action = properties.get("ACTION", "")
    wedged = properties.get("WEDGED")
    if wedged is not None:
        methods = [m.strip() for m in wedged.split(",") if m.strip()]
        if methods == ["none"]:
            kind, pattern = "gpu_fault", "drm_wedged_recovered"
        else:
            kind, pattern = "gpu_lost", "drm_wedged"
        return KernelEvent(kind, render_uevent(properties), "udev", None, _pid(properties), pattern, None)
    if properties.get("RESET") == "1":
        pid = _pid(properties)
        return KernelEvent("gpu_fault", render_uevent(properties), "udev", None, pid, "drm_reset_event", None)
    devpath = properties.get("DEVPATH", "")
    if action == "remove" and _CARD.search(devpath) and properties.get("DEVTYPE", "drm_minor") == "drm_minor":
        return KernelEvent("gpu_lost", render_uevent(properties), "udev", None, None, "drm_card_removed", None)
    return None


class GpuEventMonitor:
    """Non-blocking DRM uevent source for the agent's selectors loop.

    ``source``: ``auto`` (udev when udevd runs, else kernel), ``udev`` or ``kernel``. ``received``
    counts every uevent seen, acted on or not.
    """

    name = "udev"
    needs_polling = False

    def __init__(self, source: str = "auto", subsystem: str = "drm", context: object | None = None):
        import pyudev  # imported here: only the monitor needs it, not the pure translation

        if source == "auto":
            source = "udev" if Path(UDEV_CONTROL).exists() else "kernel"
        if source not in ("udev", "kernel"):
            raise ValueError(f"GPU event source {source!r}: expected auto, udev or kernel")
        self.source = source
        self.received = 0
        self._monitor = pyudev.Monitor.from_netlink(context or pyudev.Context(), source=source)
        self._monitor.filter_by(subsystem)
        self._monitor.start()

    def fileno(self) -> int:
        return self._monitor.fileno()

    def read(self) -> list[KernelEvent]:
        events: list[KernelEvent] = []
        while True:
            device = self._monitor.poll(timeout=0)
            if device is None:
                return events
            self.received += 1
            properties = dict(device.properties)
            properties.setdefault("ACTION", device.action or "")
            event = uevent_to_event(properties)
            if event is not None:
                events.append(event)

    def position(self) -> dict:
        return {}  # uevents are not replayed: nothing to continue from

    def close(self) -> None:
        # pyudev's Monitor has no close(); dropping it closes the netlink socket.
        self._monitor = None  # type: ignore[assignment]


def open_gpu_events(source: str = "auto") -> tuple[GpuEventMonitor | None, str]:
    """The GPU event monitor and a one-line report, or None and why (the watchdog goes on without it)."""
    if source == "off":
        return None, "GPU events: off (configured)"
    try:
        monitor = GpuEventMonitor(source=source)
    except ImportError:
        return None, "GPU events: WARNING: pyudev is not installed (pip install pyudev); going on without them"
    except OSError as exc:
        why = exc.strerror or exc
        return None, f"GPU events: WARNING: cannot open a netlink uevent socket ({why}); going on without them"
    return monitor, f"GPU events: watching DRM uevents ({monitor.source} netlink)"
