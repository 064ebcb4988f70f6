"""The message catalogue against recorded kernel logs of every class.

This machine has no AMD or NVIDIA GPU, so the driver lines in tests/fixtures/kernel/ are built from the
real format strings (cited per pattern in supervisor/kernel/catalogue.py) and from logs users posted of
real hangs; the workqueue, hung-task, lockup and OOM lines are the kernel's own formats.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from supervisor.kernel.catalogue import (
    BUILTIN_PATTERNS,
    KINDS,
    Catalogue,
    CatalogueError,
    classify,
    markdown_table,
    validate_patterns,
)

FIXTURES = Path(__file__).parents[1] / "fixtures" / "kernel"

# What each recorded log must produce, in order: (kind, pattern, pid) for every classified line.
EXPECTED = {
    "amdgpu_hang": [
        ("stall", "amdkfd_workqueue_hog", None),
        ("stall", "amdkfd_workqueue_hog", None),
        ("gpu_fault", "amdgpu_mes_no_response", None),
        ("gpu_fault", "amdgpu_ring_timeout", None),
        ("gpu_fault", "amdgpu_fault_process", 4242),
        ("gpu_fault", "amdgpu_ring_reset", None),
        ("gpu_fault", "amdgpu_ring_reset", None),
        ("gpu_fault", "amdgpu_reset_begin", None),
        ("gpu_fault", "amdgpu_reset_succeeded", None),
        ("gpu_fault", "amdgpu_vram_lost", None),
        ("gpu_fault", "amdgpu_reset_succeeded", None),
        ("gpu_fault", "drm_wedged_recovered", None),
    ],
    "amdgpu_page_fault": [
        ("gpu_fault", "amdgpu_page_fault", None),
        ("gpu_fault", "amdgpu_fault_process", 2261545),
        ("gpu_fault", "amdgpu_l2_protection_fault", None),
        ("gpu_fault", "amdgpu_page_fault", 1234),
        ("gpu_fault", "amdgpu_ring_timeout", None),
        ("gpu_fault", "amdgpu_fault_process", 977),
        ("gpu_fault", "amdgpu_ring_timeout", None),
        ("gpu_fault", "amdgpu_vm_fault_legacy", None),
        ("gpu_fault", "amdgpu_mes_no_response", None),
        ("gpu_fault", "amdkfd_preemption_failed", None),
        ("gpu_fault", "amdkfd_preemption_failed", None),
    ],
    # Seen in the field since the catalogue was written (issue 30): legacy-rocm-build#5952's SVM restore hogs, the
    # count doubling, before a GPU page fault; #4515's KFD release and SVM deferred-list hogs, then MES failing.
    "amdkfd_svm": [
        ("stall", "amdkfd_workqueue_hog", None),
        ("stall", "amdkfd_workqueue_hog", None),
        ("stall", "amdkfd_workqueue_hog", None),
        ("stall", "amdkfd_workqueue_hog", None),
        ("stall", "amdkfd_workqueue_hog", None),
        ("stall", "amdkfd_workqueue_hog", None),
        ("gpu_fault", "amdgpu_page_fault", None),
        ("gpu_fault", "amdgpu_fault_process", 4242),
        ("gpu_fault", "amdgpu_l2_protection_fault", None),
        ("gpu_fault", "amdgpu_utcl2_client", None),
        ("stall", "amdkfd_workqueue_hog", None),
        ("stall", "amdkfd_workqueue_hog", None),
        ("stall", "amdkfd_workqueue_hog", None),
        ("stall", "amdkfd_workqueue_hog", None),
        ("gpu_fault", "amdgpu_mes_no_response", None),
        ("gpu_fault", "amdkfd_mes_remove_queue_failed", None),
        ("gpu_fault", "amdkfd_mes_remove_queue_failed", None),
    ],
    "amdgpu_reset_failed": [
        ("gpu_fault", "amdgpu_ring_timeout", None),
        ("gpu_fault", "amdgpu_fault_process", 51590),
        ("gpu_fault", "amdgpu_reset_begin", None),
        ("gpu_lost", "amdgpu_lost_from_bus", None),
        ("gpu_lost", "amdgpu_reset_failed", None),
        ("gpu_lost", "amdgpu_reset_failed", None),
        ("gpu_lost", "amdgpu_recovery_failed", None),
        ("gpu_lost", "drm_wedged_needs_recovery", None),
        ("gpu_lost", "pci_device_inaccessible", None),
    ],
    "stalls": [
        ("stall", "hung_task", 4242),
        ("stall", "soft_lockup", 4243),
        ("stall", "hard_lockup", None),
        ("stall", "rcu_stall", None),
        ("stall", "rcu_stall", None),
    ],
    "oom": [
        ("oom", "oom_kill_summary", 4300),
        ("oom", "oom_killed_process", 4300),
        ("oom", "oom_killed_process", 4310),
    ],
    "nvidia_xid": [
        ("gpu_fault", "nvidia_xid", 1234),
        ("gpu_fault", "nvidia_xid", 79749),
        ("gpu_fault", "nvidia_xid", None),
        ("gpu_lost", "nvidia_xid_gpu_lost", 2001),
        ("gpu_lost", "nvidia_xid_gpu_lost", None),
        ("gpu_lost", "nvidia_xid_gpu_lost", None),
        ("gpu_lost", "nvidia_fallen_off_bus", None),
        ("gpu_lost", "nvidia_recovery_action_reset", None),
    ],
    # ROCm as it ships in 2026 (issue 40): a ring timeout cured by a per-queue reset the process may survive
    # (legacy-rocm-build#6273, #6658), then MES failing to remove a queue and to reset, a full reset (#5952, #5997),
    # the queues evicted after it (#6413: ignored, as at any process's teardown), a page fault naming its UTCL2 client, a timeout with recovery disabled.
    "amdgpu_2026": [
        ("gpu_fault", "amdgpu_ring_timeout", None),
        ("gpu_fault", "amdgpu_fault_process", 31337),
        ("gpu_fault", "amdgpu_ring_reset", None),
        ("gpu_fault", "amdgpu_ring_reset_succeeded", None),
        ("gpu_fault", "drm_wedged_recovered", None),
        ("gpu_fault", "amdgpu_mes_no_response", None),
        ("gpu_fault", "amdkfd_mes_remove_queue_failed", None),
        ("gpu_fault", "amdkfd_mes_remove_queue_failed", None),
        ("gpu_fault", "amdgpu_mes_no_response", None),
        ("gpu_fault", "amdgpu_reset_begin", None),
        ("gpu_fault", "amdgpu_reset_succeeded", None),
        ("gpu_fault", "drm_wedged_recovered", None),
        ("gpu_fault", "amdgpu_page_fault", None),
        ("gpu_fault", "amdgpu_l2_protection_fault", None),
        ("gpu_fault", "amdgpu_utcl2_client", None),
        ("gpu_fault", "amdgpu_ring_timeout", None),
        ("gpu_fault", "amdgpu_recovery_disabled", None),
    ],
    "harmless": [],
    # wq_cpu_intensive_report()'s line as kernels print it in 2026: amdkfd's work at each threshold (10000 us scaled by
    # BogoMIPS: 10666, 13333, 20000) and count (4, 5, 7, 11, 19: workqueue.cpu_intensive_warning_thresh; 8, 16 before
    # it), the short form logs quote; then amdgpu's display code (legacy-rocm-build#5933), DRM helpers, the GPU
    # scheduler, NVIDIA's DRM and a generic name without its module, none of them evidence.
    "workqueue_hogs": [("stall", "amdkfd_workqueue_hog", None)] * 11,
    # "GPU reset begin!. Source:  N" for each AMDGPU_RESET_SRCS value and the plain older form, with the coredump line
    # of a job timeout (written before the reset) and of a MES reset (after it).
    "amdgpu_reset_sources": [
        ("gpu_fault", "amdgpu_coredump_created", None),
        ("gpu_fault", "amdgpu_ring_timeout", None),
        ("gpu_fault", "amdgpu_reset_begin", None),
        ("gpu_fault", "amdgpu_reset_begin", None),
        ("gpu_fault", "amdgpu_reset_succeeded", None),
        ("gpu_fault", "amdgpu_coredump_created", None),
    ] + [("gpu_fault", "amdgpu_reset_begin", None)] * 7,
}

# What each reset line of amdgpu_reset_sources.dmesg names as its source, in order.
RESET_SOURCES = ["job timeout", "MES", "RAS", "hws", "user", "user queue", "unknown", "source 9", "not said"]


def dmesg_lines(name: str) -> list[str]:
    return (FIXTURES / f"{name}.dmesg").read_text().splitlines()


def classified(lines: list[str], catalogue: Catalogue | None = None) -> list[tuple]:
    found = (catalogue.classify(line) if catalogue else classify(line) for line in lines)
    return [tuple(c) for c in found if c is not None]


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_recorded_dmesg_log_classifies_as_expected(name):
    assert classified(dmesg_lines(name)) == EXPECTED[name]


def test_every_class_has_a_recorded_log():
    kinds = {kind for expected in EXPECTED.values() for kind, _, _ in expected}
    assert kinds == set(KINDS)


def test_every_builtin_pattern_is_exercised_by_a_fixture():
    """A pattern no recorded line matches is a pattern nobody has checked against a real format."""
    used = {pattern for expected in EXPECTED.values() for _, pattern, _ in expected}
    ignored_lines = [line for name in EXPECTED for line in dmesg_lines(name)]
    for pattern in BUILTIN_PATTERNS:
        if pattern.kind == "ignore":
            assert any(pattern.regex.search(line) for line in ignored_lines), pattern.name
        else:
            assert pattern.name in used, f"no fixture line exercises {pattern.name}"


def test_the_seeds_line_is_a_stall():
    line = "workqueue: amdgpu_amdkfd_restore_userptr_worker [amdgpu] hogged CPU for >10000us 4 times, consider switching to WQ_UNBOUND"
    assert classify(line) == ("stall", "amdkfd_workqueue_hog", None)


@pytest.mark.parametrize("work", ["amdgpu_amdkfd_restore_userptr_worker [amdgpu]", "svm_range_restore_work [amdgpu]",
                                  "svm_range_deferred_list_work [amdgpu]", "kfd_process_wq_release [amdgpu]",
                                  "kfd_process_wq_release", "evict_process_worker [amdgpu]"])
@pytest.mark.parametrize("threshold", [10000, 10666, 13333, 20000])
@pytest.mark.parametrize("count", [" 4 times", " 5 times", " 7 times", " 11 times", " 19 times", " 1027 times", ""])
def test_amdkfds_hogs_are_stall_evidence_at_any_threshold_and_count(work, threshold, count):
    tail = ", consider switching to WQ_UNBOUND" if count else ""
    line = f"[  421.004119] workqueue: {work} hogged CPU for >{threshold}us{count}{tail}"
    assert classify(line) == ("stall", "amdkfd_workqueue_hog", None)


@pytest.mark.parametrize("work", ["dm_irq_work_func [amdgpu]", "amdgpu_dm_hpd_low_irq [amdgpu]",
                                  "dm_handle_vmin_vmax_update [amdgpu]", "drm_fb_helper_damage_work",
                                  "drm_sched_run_job_work [gpu_sched]", "output_poll_execute [drm_kms_helper]",
                                  "e1000_watchdog [e1000e]", "interrupt_wq"])
@pytest.mark.parametrize("threshold, count", [(13333, " 11 times"), (10000, " 5 times"), (20000, "")])
def test_display_and_other_modules_hogs_are_no_event(work, threshold, count):
    line = f"workqueue: {work} hogged CPU for >{threshold}us{count}, consider switching to WQ_UNBOUND"
    assert Catalogue().event(line, "kmsg") is None


def test_a_reset_names_its_source_and_reset_lines_ask_for_the_devcoredump():
    events = [e for line in dmesg_lines("amdgpu_reset_sources") if (e := Catalogue().event(line, "kmsg"))]
    assert [e.reset_source for e in events if e.pattern == "amdgpu_reset_begin"] == RESET_SOURCES
    assert [e.pattern for e in events if e.devcoredump] == [
        "amdgpu_coredump_created", "amdgpu_reset_begin", "amdgpu_reset_begin", "amdgpu_reset_succeeded",
        "amdgpu_coredump_created"] + ["amdgpu_reset_begin"] * 7
    assert not any(e.reset_source for e in events if e.pattern != "amdgpu_reset_begin")


def test_a_journalctl_prefix_classifies_like_the_bare_message():
    bare = "INFO: task pt_main_thread:4242 blocked for more than 122 seconds."
    prefixed = "Nov 07 01:36:58 host kernel: " + bare
    assert classify(prefixed) == classify(bare) == ("stall", "hung_task", 4242)


def test_a_task_name_with_a_colon_keeps_the_pid():
    assert classify("INFO: task kworker/u64:3:1234 blocked for more than 120 seconds.") == ("stall", "hung_task", 1234)


def test_informational_xids_and_other_drivers_hogs_are_not_events():
    for line in dmesg_lines("harmless"):
        assert classify(line) is None, line


# --- the user extension ------------------------------------------------------------------------------


def test_user_pattern_adds_a_class_with_its_pid():
    cat = Catalogue([["my_driver_hang", r"mydrv: engine hung for task (?P<pid>\d+)", "gpu_fault"]])
    assert cat.classify("mydrv: engine hung for task 77") == ("gpu_fault", "my_driver_hang", 77)
    # Built-ins still apply.
    assert cat.classify("GPU reset begin!") == ("gpu_fault", "amdgpu_reset_begin", None)


def test_user_patterns_come_first_so_they_can_reclassify_or_ignore():
    line = "amdgpu 0000:03:00.0: amdgpu: MES failed to respond to msg=MISC (WAIT_REG_MEM)"
    assert classify(line) == ("gpu_fault", "amdgpu_mes_no_response", None)
    quiet = Catalogue([{"name": "mes_wait_reg_mem_is_noise", "regex": r"msg=MISC \(WAIT_REG_MEM\)", "kind": "ignore"}])
    assert quiet.classify(line) is None
    assert quiet.event(line, "kmsg") is None
    louder = Catalogue([("mes_is_lost", r"MES failed to respond", "gpu_lost")])
    assert louder.classify(line) == ("gpu_lost", "mes_is_lost", None)


def test_event_carries_the_line_and_where_it_came_from():
    line = "Out of memory: Killed process 4300 (python) total-vm:24493824kB, anon-rss:12049380kB"
    event = Catalogue().event(line, "kmsg", seq=12, monotonic_us=5_000_000)
    assert (event.kind, event.pid, event.pattern, event.source, event.seq, event.monotonic_us, event.message) == (
        "oom", 4300, "oom_killed_process", "kmsg", 12, 5_000_000, line,
    )


@pytest.mark.parametrize(
    "entries, expected",
    [
        ([["x", "(unclosed", "stall"]], "[kernel_log] patterns[0] ('x'): bad regular expression: missing ), unterminated subpattern at position 0; fix the regex"),
        ([["x", "ok", "stal"]], "[kernel_log] patterns[0] ('x'): kind 'stal' is not one of stall, gpu_fault, gpu_lost, oom, ignore; use one of those"),
        ([["x", "a", "stall"], ["x", "b", "oom"]], "[kernel_log] patterns[1] ('x'): the name is used twice; give each pattern its own name"),
        ([["x", "a"]], "[kernel_log] patterns[0]: expected [name, regex, kind], got ['x', 'a']"),
        ([{"name": "x", "regexp": "a", "kind": "oom"}], "[kernel_log] patterns[0]: unknown key(s) regexp; use name, regex, kind"),
        ([["", "a", "oom"]], "[kernel_log] patterns[0]: a pattern needs a non-empty name; give it one"),
        ("stall", "[kernel_log] patterns: expected a list of [name, regex, kind] entries, got str"),
    ],
)
def test_bad_user_patterns_are_refused_in_one_line(entries, expected):
    with pytest.raises(CatalogueError) as caught:
        validate_patterns(entries)
    assert str(caught.value) == expected
    assert "\n" not in str(caught.value)


def test_the_validator_names_the_config_file():
    with pytest.raises(CatalogueError, match=r"^/etc/yolo-train.toml: \[kernel_log\] patterns\[0\] "):
        Catalogue([["x", "(", "stall"]], where="/etc/yolo-train.toml: [kernel_log] patterns")


def test_no_user_patterns_is_the_builtin_catalogue():
    assert validate_patterns(None) == ()
    assert validate_patterns([]) == ()
    assert Catalogue().patterns == BUILTIN_PATTERNS


def test_the_readme_table_lists_every_builtin_pattern_once():
    table = markdown_table().splitlines()
    assert len(table) == 2 + len(BUILTIN_PATTERNS)
    for pattern, row in zip(BUILTIN_PATTERNS, table[2:]):
        assert row.startswith(f"| `{pattern.name}` | {pattern.kind} | ")
