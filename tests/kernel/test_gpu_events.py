"""DRM uevents: the translation from uevent properties, and the real netlink monitor.

This machine has no DRM device, so the uevents are property dicts in the kernel's format: what
kobject_uevent_env() sends for the card's minor (ACTION, DEVPATH, SUBSYSTEM, DEVNAME, DEVTYPE, MAJOR,
MINOR, SEQNUM) plus the event's own variables (drm_dev_wedged_event(): WEDGED=, PID=, TASK=; the
proposed drm_sysfs_reset_event(): RESET=1, PID=, NAME=, FLAGS=). The netlink monitor itself is tested
for real with a synthetic uevent on /sys/class/mem/null.
"""

from __future__ import annotations

import os
import selectors
import time

import pytest

from supervisor.kernel.gpu_events import GpuEventMonitor, open_gpu_events, render_uevent, uevent_to_event

CARD0 = "/devices/pci0000:00/0000:00:01.1/0000:01:00.0/0000:02:00.0/0000:03:00.0/drm/card0"


def uevent(action: str = "change", devpath: str = CARD0, **extra: str) -> dict[str, str]:
    name = devpath.rsplit("/", 1)[1]
    minor = "128" if name.startswith("renderD") else name.removeprefix("card").split("-")[0] or "0"
    base = {
        "ACTION": action,
        "DEVPATH": devpath,
        "SUBSYSTEM": "drm",
        "DEVNAME": f"dri/{name}",
        "DEVTYPE": "drm_minor",
        "MAJOR": "226",
        "MINOR": minor,
        "SEQNUM": "4711",
    }
    if "-" in name:  # a connector (card0-DP-1) is not a minor
        base.pop("DEVNAME"), base.pop("MAJOR"), base.pop("MINOR")
        base["DEVTYPE"] = "drm_connector"
    base.update(extra)
    return base


@pytest.mark.parametrize("wedged", ["rebind", "bus-reset", "rebind,bus-reset", "vendor-specific", "unknown"])
def test_a_wedged_device_needing_recovery_is_lost(wedged):
    event = uevent_to_event(uevent(WEDGED=wedged))
    assert (event.kind, event.pattern, event.source, event.seq, event.pid) == ("gpu_lost", "drm_wedged", "udev", None, None)
    assert f"WEDGED={wedged}" in event.message


def test_wedged_none_means_the_driver_recovered_by_a_reset():
    event = uevent_to_event(uevent(WEDGED="none", PID="4242", TASK="python3"))
    assert (event.kind, event.pattern, event.pid) == ("gpu_fault", "drm_wedged_recovered", 4242)
    assert event.message == f"udev drm change {CARD0} WEDGED=none PID=4242 TASK=python3 DEVNAME=dri/card0"


def test_the_guilty_task_of_a_wedge_is_reported():
    assert uevent_to_event(uevent(WEDGED="rebind", PID="4242", TASK="python3")).pid == 4242
    assert uevent_to_event(uevent(WEDGED="rebind", PID="0")).pid is None


def test_the_proposed_amdgpu_reset_uevent_is_a_fault_with_its_pid():
    event = uevent_to_event(uevent(RESET="1", PID="4242", NAME="python3", FLAGS="1"))
    assert (event.kind, event.pattern, event.pid) == ("gpu_fault", "drm_reset_event", 4242)


def test_removing_a_card_loses_the_gpu():
    event = uevent_to_event(uevent("remove"))
    assert (event.kind, event.pattern, event.pid) == ("gpu_lost", "drm_card_removed", None)


@pytest.mark.parametrize(
    "properties",
    [
        uevent("remove", CARD0.replace("card0", "renderD128")),  # the render node goes with the card
        uevent("remove", CARD0 + "/card0-DP-1"),  # a connector, not the GPU
        uevent("change", HOTPLUG="1"),  # a monitor plugged in
        uevent("add"),
        uevent("change", CONNECTOR="95", HOTPLUG="1"),
        {**uevent("change", WEDGED="rebind"), "SUBSYSTEM": "pci"},
    ],
)
def test_other_drm_uevents_are_not_events(properties):
    assert uevent_to_event(properties) is None


def test_render_puts_a_uevent_on_one_line():
    assert render_uevent({"ACTION": "remove", "SUBSYSTEM": "drm", "DEVPATH": CARD0}) == f"udev drm remove {CARD0}"


# --- the real netlink monitor -------------------------------------------------------------------------


def test_the_monitor_opens_and_has_a_descriptor():
    monitor, report = open_gpu_events()
    assert monitor is not None, report
    try:
        assert isinstance(monitor.fileno(), int) and monitor.fileno() >= 0
        assert monitor.source in ("udev", "kernel")
        assert report == f"GPU events: watching DRM uevents ({monitor.source} netlink)"
        assert monitor.read() == []  # nothing pending, and it does not block
    finally:
        monitor.close()


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root: writes to /sys/class/mem/null/uevent to make a uevent")
def test_the_monitor_receives_a_real_uevent_without_blocking():
    """A synthetic "change" uevent on /dev/null travels the real kernel netlink path. It is not a DRM
    event (its variables come back as SYNTH_ARG_*), so it is received but does not become an event."""
    monitor = GpuEventMonitor(source="kernel", subsystem="mem")
    try:
        with open("/sys/class/mem/null/uevent", "w") as trigger:
            trigger.write("change 0b7c8a0e-6f0e-4c8e-9d27-2f5d0c1e8a11 WEDGED=rebind\n")
        with selectors.DefaultSelector() as sel:
            sel.register(monitor.fileno(), selectors.EVENT_READ)
            deadline = time.monotonic() + 5.0
            events = []
            while monitor.received == 0 and time.monotonic() < deadline:
                if sel.select(timeout=deadline - time.monotonic()):
                    events += monitor.read()
        assert monitor.received >= 1, "the kernel's uevent never reached the monitor"
        assert events == []
    finally:
        monitor.close()


def test_unknown_source_is_refused():
    with pytest.raises(ValueError, match="expected auto, udev or kernel"):
        GpuEventMonitor(source="sysfs")
    assert open_gpu_events("off") == (None, "GPU events: off (configured)")
