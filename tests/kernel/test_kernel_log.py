"""Kernel log sources: /dev/kmsg for real (as root), recorded kmsg dumps, and real journal files.

The driver lines are built from the real formats (this machine has no AMD/NVIDIA GPU); the records are
injected into the real kernel log by writing to /dev/kmsg as root, which the kernel stores as a record
of the user facility, read back exactly like the driver's own.
"""

from __future__ import annotations

import os
import selectors
import shutil
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from supervisor.kernel.reader import (
    JournalReader,
    KmsgReader,
    current_boot_id,
    open_kernel_log,
    parse_kmsg_record,
    split_kmsg_records,
)
from supervisor.kernel.catalogue import classify
from tests.helpers.supervised import sources_for_nobody

FIXTURES = Path(__file__).parents[1] / "fixtures" / "kernel"
SEEDS_LINE = (
    "workqueue: amdgpu_amdkfd_restore_userptr_worker [amdgpu] hogged CPU for >10000us 4 times, "
    "consider switching to WQ_UNBOUND"
)
ROOT = os.geteuid() == 0
needs_root = pytest.mark.skipif(not ROOT, reason="needs root: writes records into the real /dev/kmsg")
pytestmark = pytest.mark.serial  # its records go into the real /dev/kmsg: no supervisor beside it may read them
JOURNAL_REMOTE = shutil.which("systemd-journal-remote") or next(
    (p for p in ("/lib/systemd/systemd-journal-remote", "/usr/lib/systemd/systemd-journal-remote") if os.path.exists(p)),
    None,
)


# --- the record format -------------------------------------------------------------------------------


def test_parse_record_with_continuation_lines_and_escapes():
    raw = b"3,1042,2441200003,-;amdgpu 0000:03:00.0: amdgpu: ring gfx_0.0.0 timeout\\x0asecond\n SUBSYSTEM=pci\n DEVICE=+pci:0000:03:00.0"
    record = parse_kmsg_record(raw)
    assert (record.level, record.facility, record.seq, record.ts_usec, record.flags) == (3, 0, 1042, 2441200003, "-")
    assert record.message == "amdgpu 0000:03:00.0: amdgpu: ring gfx_0.0.0 timeout\nsecond"
    assert record.fields == {"SUBSYSTEM": "pci", "DEVICE": "+pci:0000:03:00.0"}


def test_parse_record_of_user_facility_and_extra_header_fields():
    record = parse_kmsg_record(b"12,345,3809348548,-,caller=T123;text\n")
    assert (record.level, record.facility, record.seq, record.message) == (4, 1, 345, "text")


@pytest.mark.parametrize("raw", [b"", b"no header here", b"a,b,c,-;text", b"4,5;short header"])
def test_parse_rejects_what_is_not_a_record(raw):
    assert parse_kmsg_record(raw) is None


def test_split_records_keeps_continuation_lines_with_their_record():
    data = (FIXTURES / "amdgpu_hang.kmsg").read_bytes()
    records = [parse_kmsg_record(r) for r in split_kmsg_records(data)]
    assert len(records) == len((FIXTURES / "amdgpu_hang.dmesg").read_text().splitlines())
    assert records[1].fields == {"SUBSYSTEM": "pci", "DEVICE": "+pci:0000:03:00.0"}


# --- recorded kmsg dumps replayed through the real reader ---------------------------------------------


@pytest.mark.parametrize(
    "name", ["amdgpu_hang", "amdgpu_page_fault", "amdgpu_reset_failed", "stalls", "oom", "nvidia_xid", "harmless",
             "amdkfd_svm", "amdgpu_2026", "workqueue_hogs", "amdgpu_reset_sources"]
)
def test_recorded_kmsg_dump_replays_like_its_dmesg_rendering(name):
    reader = KmsgReader(str(FIXTURES / f"{name}.kmsg"), after_seq=0)
    try:
        events = reader.read()
    finally:
        reader.close()
    expected = [tuple(c) for c in map(classify, (FIXTURES / f"{name}.dmesg").read_text().splitlines()) if c]
    assert [(e.kind, e.pattern, e.pid) for e in events] == expected
    records = [parse_kmsg_record(r) for r in split_kmsg_records((FIXTURES / f"{name}.kmsg").read_bytes())]
    assert reader.last_seq == records[-1].seq
    by_seq = {r.seq: r for r in records}
    for event in events:
        assert event.source == "kmsg"
        assert event.monotonic_us == by_seq[event.seq].ts_usec
        assert event.message == by_seq[event.seq].message


def test_resume_from_a_recorded_dump_skips_what_was_handled():
    path = str(FIXTURES / "amdgpu_reset_failed.kmsg")
    records = [parse_kmsg_record(r) for r in split_kmsg_records(Path(path).read_bytes())]
    handled = records[3].seq  # "device lost from bus!" was handled before the restart
    reader = KmsgReader(path, after_seq=handled)
    events = reader.read()
    reader.close()
    assert [e.seq for e in events] == [r.seq for r in records[4:]]
    assert reader.missed == 0


def test_resume_with_a_sequence_number_from_another_boot_starts_at_the_end():
    path = str(FIXTURES / "stalls.kmsg")
    reader = KmsgReader(path, after_seq=10**9)
    assert reader.read() == []
    reader.close()


def test_a_gap_in_sequence_numbers_is_counted_as_missed(tmp_path):
    dump = tmp_path / "gap.kmsg"
    dump.write_text(
        "4,10,100,-;" + SEEDS_LINE + "\n"
        "4,15,200,-;" + SEEDS_LINE + "\n"
    )
    reader = KmsgReader(str(dump), after_seq=7)
    events = reader.read()
    reader.close()
    assert [e.seq for e in events] == [10, 15]
    assert reader.missed == 2 + 4  # 8..9 before the first record, 11..14 between them


# --- the real /dev/kmsg -------------------------------------------------------------------------------


def inject(text: str, level: int = 4) -> None:
    # A fresh open per line: the kernel rate-limits writes per open file (10 per 5 s by default).
    with open("/dev/kmsg", "w") as kmsg:
        kmsg.write(f"<{level}>{text}\n")


def wait_for(reader, nonce: str, timeout: float = 5.0):
    """Events until one carries the nonce; a bound, not a timing assertion."""
    with selectors.DefaultSelector() as sel:
        sel.register(reader.fileno(), selectors.EVENT_READ)
        deadline = time.monotonic() + timeout
        seen = []
        while time.monotonic() < deadline:
            if sel.select(timeout=max(0.0, deadline - time.monotonic())):
                seen += reader.read()
                hits = [e for e in seen if nonce in e.message]
                if hits:
                    return hits[0]
        return None


def ring_buffer_bytes() -> int:
    """The kernel's log buffer size (CONFIG_LOG_BUF_SHIFT), or 1 MiB when the config is not readable."""
    import gzip

    for path, opener in (("/proc/config.gz", gzip.open), (f"/boot/config-{os.uname().release}", open)):
        try:
            with opener(path, "rt") as config:
                for line in config:
                    if line.startswith("CONFIG_LOG_BUF_SHIFT="):
                        return 1 << int(line.split("=")[1])
        except OSError:
            continue
    return 1 << 20


def mine(events, nonce):
    return [e for e in events if nonce in e.message]


@needs_root
def test_kmsg_reader_picks_up_the_seeds_line_written_to_dev_kmsg():
    nonce = uuid.uuid4().hex
    reader = KmsgReader()
    try:
        assert mine(reader.read(), nonce) == []
        inject(f"{SEEDS_LINE} [{nonce}]")
        event = wait_for(reader, nonce)
        assert event is not None, "the record written to /dev/kmsg never reached the reader"
        assert (event.kind, event.pattern, event.source) == ("stall", "amdkfd_workqueue_hog", "kmsg")
        assert event.seq <= reader.last_seq
        assert event.monotonic_us > 0
    finally:
        reader.close()


@needs_root
def test_a_reader_opened_afterwards_does_not_replay_old_records():
    nonce = uuid.uuid4().hex
    inject(f"{SEEDS_LINE} [{nonce}]")
    reader = KmsgReader()
    try:
        later = uuid.uuid4().hex
        inject(f"INFO: task python:{os.getpid()} blocked for more than 120 seconds. [{later}]")
        event = wait_for(reader, later)
        assert event is not None and event.pid == os.getpid()
        assert mine(reader.read(), nonce) == []
    finally:
        reader.close()


@needs_root
def test_a_restarted_reader_resumes_after_the_last_handled_record():
    first, second = uuid.uuid4().hex, uuid.uuid4().hex
    reader = KmsgReader()
    inject(f"{SEEDS_LINE} [{first}]")
    handled = wait_for(reader, first)
    assert handled is not None
    last_seq, boot_id = reader.last_seq, reader.boot_id
    reader.close()  # the supervisor dies here; the next line comes while nobody reads

    inject(f"amdgpu 0000:03:00.0: amdgpu: GPU reset begin! [{second}]")
    resumed = KmsgReader(after_seq=last_seq, boot_id=boot_id)
    try:
        events = resumed.read()
        assert mine(events, first) == []
        [event] = mine(events, second)
        assert event.kind == "gpu_fault" and event.seq > last_seq
    finally:
        resumed.close()
    again = KmsgReader(after_seq=event.seq, boot_id=boot_id)
    try:
        assert mine(again.read(), second) == [] and mine(again.read(), first) == []
    finally:
        again.close()


@needs_root
def test_a_position_from_another_boot_is_not_trusted():
    nonce = uuid.uuid4().hex
    for reader in (KmsgReader(after_seq=10**15), KmsgReader(after_seq=0, boot_id="not-this-boot")):
        try:
            assert mine(reader.read(), nonce) == []
            inject(f"{SEEDS_LINE} [{nonce}]")
            assert wait_for(reader, nonce) is not None
            assert reader.boot_id == current_boot_id()
        finally:
            reader.close()
        nonce = uuid.uuid4().hex


@needs_root
def test_kmsg_reader_survives_records_overwritten_before_it_reads(tmp_path):
    """Floods the ring buffer (twice its size) so the reader's position is overwritten (EPIPE)."""
    reader = KmsgReader()
    try:
        flood = "x" * 900
        for i in range(2 * ring_buffer_bytes() // 900 + 50):
            inject(f"yolo-train kmsg overrun test {i} {flood}", level=7)
        nonce = uuid.uuid4().hex
        inject(f"{SEEDS_LINE} [{nonce}]")
        event = wait_for(reader, nonce, timeout=10.0)
        assert event is not None, "the reader did not recover after its records were overwritten"
        assert reader.overruns >= 1
        assert reader.missed >= 1
    finally:
        reader.close()


@needs_root
def test_open_kernel_log_prefers_kmsg_when_it_is_readable():
    source, report = open_kernel_log()
    try:
        assert isinstance(source, KmsgReader)
        assert report == "kernel log: reading /dev/kmsg"
    finally:
        source.close()


def test_open_kernel_log_off_and_unknown():
    assert open_kernel_log("off") == (None, "kernel log: off (configured); stalls are caught by the progress timeouts only")
    with pytest.raises(ValueError, match="expected auto, kmsg, journal or off"):
        open_kernel_log("dmesg")


def test_open_kernel_log_without_any_source_warns_how_to_fix(tmp_path):
    source, report = open_kernel_log(kmsg_path=str(tmp_path / "no-kmsg"), journal_path=str(tmp_path))
    assert source is None
    assert report.startswith("kernel log: WARNING: no kernel log source")
    for hint in ("no such device", "CAP_SYSLOG", "dmesg_restrict", "systemd-journal group"):
        assert hint in report


def test_open_kernel_log_kmsg_only_says_why_not(tmp_path):
    source, report = open_kernel_log("kmsg", kmsg_path=str(tmp_path / "no-kmsg"))
    assert source is None and "CAP_SYSLOG" in report and "no such device" in report


@pytest.mark.skipif(not ROOT or not shutil.which("setpriv"), reason="needs root and setpriv to drop privileges")
def test_an_unprivileged_supervisor_is_told_about_dmesg_restrict():
    """A real unprivileged process: with kernel.dmesg_restrict=1 and no CAP_SYSLOG /dev/kmsg refuses it."""
    if Path("/proc/sys/kernel/dmesg_restrict").read_text().strip() != "1":
        pytest.skip("kernel.dmesg_restrict is 0 here: an unprivileged process may read /dev/kmsg")
    code = "from supervisor.kernel.reader import open_kernel_log; s, r = open_kernel_log(); print(type(s).__name__); print(r)"
    sources = sources_for_nobody()
    out = subprocess.run(
        ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", "--inh-caps=-all", sys.executable, "-c", code],
        cwd=sources, capture_output=True, text=True, timeout=60, env={**os.environ, "PYTHONPATH": str(sources)},
    )
    if out.returncode != 0 and "Permission denied" in out.stderr and "python" in out.stderr.lower():
        pytest.skip(f"the unprivileged user cannot run this interpreter: {out.stderr.strip()[:200]}")
    assert out.returncode == 0, out.stderr
    kind, report = out.stdout.strip().split("\n", 1)
    if kind == "JournalReader":
        assert "kernel.dmesg_restrict=1 and the process lacks CAP_SYSLOG" in report
    else:
        assert kind == "NoneType"
        assert "kernel.dmesg_restrict=1 and the process lacks CAP_SYSLOG" in report and "CAP_SYSLOG" in report


# --- the journal ----------------------------------------------------------------------------------------


def export_entry(message: str, transport: str = "kernel", monotonic_us: int = 123_456_789) -> str:
    boot = (current_boot_id() or uuid.uuid4().hex).replace("-", "")
    return (
        f"__REALTIME_TIMESTAMP={int(time.time() * 1e6)}\n__MONOTONIC_TIMESTAMP={monotonic_us}\n_BOOT_ID={boot}\n"
        f"_TRANSPORT={transport}\nSYSLOG_IDENTIFIER=kernel\nPRIORITY=4\n"
        f"_SOURCE_MONOTONIC_TIMESTAMP={monotonic_us - 1000}\nMESSAGE={message}\n\n"
    )


def write_journal(directory: Path, *entries: str) -> None:
    """Appends entries to a real journal file with systemd-journal-remote (journal export format in)."""
    subprocess.run(
        [JOURNAL_REMOTE, "-o", str(directory / "kernel.journal"), "-"],
        input="".join(entries).encode(), check=True, capture_output=True, timeout=30,
    )


needs_journal_remote = pytest.mark.skipif(
    JOURNAL_REMOTE is None,
    reason="systemd-journal-remote is not installed (apt-get install systemd-journal-remote): no way to write a journal file",
)


@needs_journal_remote
def test_journal_reader_starts_at_the_tail_and_wakes_on_new_kernel_entries(tmp_path):
    write_journal(tmp_path, export_entry(SEEDS_LINE + " [old]"))
    reader = JournalReader(str(tmp_path))
    try:
        assert reader.sees_kernel_messages()
        assert reader.read() == []  # the old entry is not replayed
        write_journal(
            tmp_path,
            export_entry(SEEDS_LINE + " [from syslog]", transport="syslog"),
            export_entry("INFO: task python:4242 blocked for more than 120 seconds.", monotonic_us=200_000_000),
            export_entry("eth0: link up"),
        )
        with selectors.DefaultSelector() as sel:
            sel.register(reader.fileno(), selectors.EVENT_READ)
            assert sel.select(timeout=10.0), "the journal's descriptor never became readable"
        events = reader.read()
        assert [(e.kind, e.pattern, e.pid, e.source) for e in events] == [("stall", "hung_task", 4242, "journal")]
        assert events[0].monotonic_us == 200_000_000 - 1000  # the kernel's own timestamp
        assert events[0].seq is not None and reader.last_cursor is not None
        assert reader.records_read == 2  # the kernel transport only: the syslog entry is not seen
    finally:
        reader.close()


@needs_journal_remote
def test_journal_reader_resumes_after_a_persisted_cursor(tmp_path):
    write_journal(tmp_path, export_entry("GPU reset begin! [1]"), export_entry("GPU reset begin! [2]"))
    first = JournalReader(str(tmp_path))
    cursor = first.last_cursor  # positioned on entry 2: everything up to it counts as handled
    first.close()
    write_journal(tmp_path, export_entry("GPU Recovery Failed: -19"))
    reader = JournalReader(str(tmp_path), after_cursor=cursor)
    try:
        events = reader.read()
        assert [(e.kind, e.pattern) for e in events] == [("gpu_lost", "amdgpu_recovery_failed")]
    finally:
        reader.close()


@needs_journal_remote
def test_open_kernel_log_falls_back_to_the_journal(tmp_path):
    write_journal(tmp_path, export_entry("eth0: link up"))
    source, report = open_kernel_log(kmsg_path=str(tmp_path / "no-kmsg"), journal_path=str(tmp_path))
    try:
        assert isinstance(source, JournalReader)
        assert report == "kernel log: reading the systemd journal, kernel transport (" + str(tmp_path / "no-kmsg") + ": no such device (a container without /dev/kmsg?))"
    finally:
        source.close()


def test_the_system_journal_where_one_is_readable():
    dirs = [Path("/run/log/journal"), Path("/var/log/journal")]
    if not any(p.is_dir() and any(p.rglob("*.journal")) for p in dirs):
        pytest.skip("no system journal on this machine (journald does not run here): nothing to read")
    reader = JournalReader()
    try:
        assert reader.sees_kernel_messages()
        reader.read()  # reads without error from the tail
    finally:
        reader.close()
