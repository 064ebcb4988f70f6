"""The kernel log drives the watchdog: real /dev/kmsg, a real supervisor, real Ultralytics training.

The AMD and OOM lines are written by the test (this machine has no AMD GPU): they are the drivers' real
formats, the same the fixtures under tests/fixtures/kernel/ replay.
"""

import os
import signal
import time

import psutil
import pytest

from tests.helpers.devcoredump_tree import DUMP, PCI, fake_sysfs
from tests.helpers.supervised import read_incidents, read_state, start_supervisor, status_of, wait_for

pytestmark = [pytest.mark.e2e, pytest.mark.root, pytest.mark.serial,
              pytest.mark.skipif(os.geteuid() != 0 or not os.access("/dev/kmsg", os.W_OK),
                                 reason="writing kernel log lines to /dev/kmsg needs root")]

SEEDS_LINE = ("workqueue: amdgpu_amdkfd_restore_userptr_worker [amdgpu] hogged CPU for >10000us 4 times, "
              "consider switching to WQ_UNBOUND")


def write_kmsg(line: str) -> None:
    with open("/dev/kmsg", "w") as kmsg:
        kmsg.write(f"<4>{line}\n")


def healthy_attempt(state_dir, attempt=1, epoch=2):
    return wait_for(lambda: (s := status_of(state_dir)) and s["attempt"] == attempt and s["state"] == "healthy"
                    and s["epoch"] >= epoch and s, what=f"attempt {attempt} training in epoch {epoch}")


def config_with_long_stall(demo_config, write_config):
    """Every timeout of a trained attempt far above the confirm window, so a kill within the window can only be
    the kernel line's: training and validation, and through auto_floor the epoch end's "save auto" too (a freeze
    that lands between two epochs was once killed by that, 10 s after the last batch, before the line's window), the
    epoch end's save bound itself, and the idle floor (a stopped tree is idle: it was once killed at 5.9 s by
    "save_timeout, idle")."""
    path = demo_config(kernel_log="kmsg")
    path.write_text(path.read_text().replace(
        "[watchdog]\n", "[watchdog]\nstall_timeout = 300\nval_timeout = 300\nsave_timeout = 300\nauto_floor = 300\n"
                         "idle_floor = \"off\"\n"))
    return path


def test_the_seeds_line_with_a_frozen_worker_restarts_it_within_the_confirm_window(demo_config, write_config,
                                                                                 tmp_path):
    config, state_dir = config_with_long_stall(demo_config, write_config), tmp_path / "state"
    proc = start_supervisor(config, state_dir)
    try:
        status = healthy_attempt(state_dir)
        os.kill(status["worker_pid"], signal.SIGSTOP)  # frozen: no progress, as a driver-wedged process
        written = time.time()
        write_kmsg(SEEDS_LINE)
        incident = wait_for(lambda: read_incidents(state_dir), timeout=240, what="an incident")[0]  # written at the end
        _, stderr = proc.communicate(timeout=240)
    finally:
        proc.kill()
    assert proc.returncode == 0, stderr[-2000:]
    assert incident["reason"] == "kernel" and SEEDS_LINE in incident["kernel_events"][0]["message"]
    assert incident["time"] - written <= 10 + 1.5  # the confirm window (10 s) and a little, not the 300 s timeout
    final = read_state(state_dir)["status"]
    assert final["state"] == "succeeded" and final["rung"] == 1 and final["kernel_events"]["stall"] == 1


def test_a_reset_line_keeps_the_gpus_devcoredump_in_its_incident(demo_config, write_config, tmp_path):
    """A MES reset of a frozen worker: its source and the GPU's devcoredump (a fake sysfs one) in the incident, the
    copy in the incident's directory when the incident is written."""
    root = tmp_path / "sysfs"
    fake_sysfs(root)
    config, state_dir = config_with_long_stall(demo_config, write_config), tmp_path / "state"
    proc = start_supervisor(config, state_dir, env={"YOLO_TRAIN_SYSFS_ROOT": str(root)})
    try:
        status = healthy_attempt(state_dir)
        os.kill(status["worker_pid"], signal.SIGSTOP)
        write_kmsg(f"amdgpu {PCI}: amdgpu: GPU reset begin!. Source:  3")
        incident = wait_for(lambda: read_incidents(state_dir), timeout=240, what="an incident")[0]  # written at the end
        copied = {path: path.read_bytes() for path in (state_dir / "incidents").rglob("devcoredump-*")}
        _, stderr = proc.communicate(timeout=240)
    finally:
        proc.kill()
    assert proc.returncode == 0, stderr[-2000:]
    assert incident["reason"] == "kernel" and incident["gpu_resets"] == ["MES"]
    (dump,) = incident["devcoredumps"]
    assert (dump["path"], dump["source"], dump["device"], dump["bytes"], dump["truncated"]) == \
        (f"incidents/{incident['id']}/devcoredump-devcd1", "devcd1", PCI, len(DUMP), False)
    assert copied == {state_dir / dump["path"]: DUMP}  # there as the incident was written


def test_stall_lines_while_training_progresses_kill_nothing(demo_config, write_config, tmp_path):
    config, state_dir = config_with_long_stall(demo_config, write_config), tmp_path / "state"
    config.write_text(config.read_text().replace("epochs = 3", "epochs = 2"))  # an epoch after the lines is enough
    proc = start_supervisor(config, state_dir)
    try:
        healthy_attempt(state_dir, epoch=1)
        for _ in range(3):
            write_kmsg(SEEDS_LINE)
            time.sleep(1.0)
        _, stderr = proc.communicate(timeout=240)
    finally:
        proc.kill()
    assert proc.returncode == 0, stderr[-2000:]
    assert read_incidents(state_dir) == []
    status = read_state(state_dir)["status"]
    assert status["restarts"] == 0 and status["kernel_events"]["stall"] == 3
    assert "counted, nothing killed" in stderr


def test_oom_kill_of_a_dataloader_worker_is_a_crash_with_reason_oom(demo_config, tmp_path):
    config, state_dir = demo_config(kernel_log="kmsg"), tmp_path / "state"
    proc = start_supervisor(config, state_dir)
    try:
        status = healthy_attempt(state_dir)
        victim = psutil.Process(status["worker_pid"]).children()[0]  # a DataLoader worker
        write_kmsg(f"Out of memory: Killed process {victim.pid} (pt_data_worker) total-vm:2449382kB, "
                   f"anon-rss:1204938kB, file-rss:0kB, shmem-rss:0kB, UID:0 pgtables:2453kB oom_score_adj:0")
        victim.kill()
        _, stderr = proc.communicate(timeout=240)
    finally:
        proc.kill()
    assert proc.returncode == 0, stderr[-2000:]
    incident = read_incidents(state_dir)[0]
    assert incident["reason"] == "oom" and f"OOM killer took pid {victim.pid}" in incident["detail"]
    assert read_state(state_dir)["status"]["restarts_by_reason"] == {"oom": 1}


def test_a_lost_gpu_ends_with_reboot_needed_and_no_new_worker(demo_config, tmp_path):
    """The line is written from user space, so this is a drill: the documented switch makes it count."""
    config, state_dir = demo_config(kernel_log="kmsg"), tmp_path / "state"
    proc = start_supervisor(config, state_dir, env={"YOLO_TRAIN_KERNEL_DRILL": "1"})
    try:
        status = healthy_attempt(state_dir, epoch=1)
        write_kmsg("amdgpu 0000:03:00.0: amdgpu: GPU reset(2) failed")
        _, stderr = proc.communicate(timeout=60)
    finally:
        proc.kill()
    assert proc.returncode == 3
    assert stderr.strip().splitlines()[-1].startswith("yolo-train: the GPU is lost")
    final = read_state(state_dir)["status"]
    assert final["attempt"] == 1 and final["reboot_needed"] and not psutil.pid_exists(status["worker_pid"])


def test_a_gpu_lost_line_forged_from_user_space_never_ends_a_run(demo_config, tmp_path):
    config, state_dir = demo_config(kernel_log="kmsg"), tmp_path / "state"
    config.write_text(config.read_text().replace("epochs = 3", "epochs = 2"))  # an epoch after the line is enough
    write_kmsg("amdgpu 0000:03:00.0: amdgpu: GPU reset(1) failed")  # before the run: stale on any account
    proc = start_supervisor(config, state_dir)
    try:
        healthy_attempt(state_dir, epoch=1)
        write_kmsg("amdgpu 0000:03:00.0: amdgpu: GPU reset(2) failed")  # facility user, and a CPU run
        _, stderr = proc.communicate(timeout=240)
    finally:
        proc.kill()
    assert proc.returncode == 0, stderr[-2000:]
    final = read_state(state_dir)["status"]
    assert final["state"] == "succeeded" and not final["reboot_needed"] and final["restarts"] == 0
    assert final["kernel_events"].get("gpu_lost") == 1  # the fresh line is counted; the stale one was never read
    assert "GPU-lost line ignored" in stderr


def test_a_restarted_supervisor_does_not_read_the_same_kernel_lines_again(demo_config, tmp_path):
    config, state_dir = demo_config(kernel_log="kmsg"), tmp_path / "state"
    config.write_text(config.read_text().replace("epochs = 3", "epochs = 8"))  # the stop must not meet the end
    first = start_supervisor(config, state_dir)
    try:
        healthy_attempt(state_dir, epoch=2)
        write_kmsg(SEEDS_LINE)
        wait_for(lambda: (status_of(state_dir) or {}).get("kernel_events", {}).get("stall") == 1, timeout=30,
                 what="the line counted")
        first.send_signal(signal.SIGTERM)
        first.communicate(timeout=60)
    finally:
        first.kill()
    second = start_supervisor(config, state_dir)
    try:
        healthy_attempt(state_dir, attempt=2, epoch=2)
        time.sleep(1.0)  # a replay of the ring buffer would have been read by now
        status = status_of(state_dir)
        second.send_signal(signal.SIGTERM)
        _, stderr = second.communicate(timeout=60)
    finally:
        second.kill()
    assert status["kernel_events"] == {"stall": 1}  # restored, not read twice
    assert "kernel log: reading /dev/kmsg, resuming after record" in stderr
