"""Kernel log sources: ``/dev/kmsg`` read directly, or the systemd journal's kernel transport.

Both are non-blocking sources for the agent's ``selectors`` loop: ``fileno()`` to wait on, ``read()``
to drain what is there and get the classified ``KernelEvent``s (unclassified lines are dropped),
``close()``, and ``name`` for reports. ``open_kernel_log()`` picks one and says which and why.

/dev/kmsg record format (Documentation/ABI/testing/dev-kmsg)::

    PRI,SEQ,TS_USEC,FLAGS[,more];message text\\n
     KEY=value\\n                  (zero or more continuation lines, each starting with a space)

PRI is facility * 8 + level; SEQ a 64-bit sequence number that grows by one per record; TS_USEC the
kernel's monotonic clock in microseconds; FLAGS ``-`` or ``c`` (continuation). Non-printable bytes in the
text are escaped as ``\\xNN``. One read() returns one record; a reader whose next record was overwritten
in the ring buffer gets EPIPE once, and the next read() returns the oldest record still there.

Records written by user space (``echo '<4>text' > /dev/kmsg`` as root) are read too, and marked: the kernel
forces them to a non-kernel facility, which ``KmsgRecord.facility`` keeps and ``KernelEvent.from_kernel``
carries, so that such a line may raise suspicion but never end a run (decision/kernel.py).
"""

from __future__ import annotations

import errno
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from supervisor.config import SOURCE_CHOICES
from supervisor.kernel.catalogue import DEFAULT, Catalogue, KernelEvent

KMSG_PATH = "/dev/kmsg"
BOOT_ID_PATH = "/proc/sys/kernel/random/boot_id"
# The kernel formats at most CONSOLE_EXT_LOG_MAX (8 KiB) per record; a smaller buffer gets EINVAL.
READ_SIZE = 16384
# Records handled per read() call, so a flood cannot starve the rest of the event loop: what is left
# keeps the descriptor readable and the loop comes back.
MAX_RECORDS_PER_READ = 1024

_ESCAPE = re.compile(rb"\\x([0-9a-fA-F]{2})")


class KernelLogSource(Protocol):
    """What the agent needs of a source of kernel events: /dev/kmsg, the journal, udev's GPU events."""

    name: str
    needs_polling: bool  # its descriptor may not wake the loop: read() it once per loop turn too

    def fileno(self) -> int: ...

    def read(self) -> list[KernelEvent]: ...

    def position(self) -> dict[str, Any]:
        """Where a restarted supervisor continues reading (persisted in the state file); {} when it cannot."""
        ...

    def close(self) -> None: ...


@dataclass(frozen=True)
class KmsgRecord:
    level: int  # 0 (emerg) .. 7 (debug)
    facility: int  # 0 for the kernel's own messages, >= 1 for lines user space wrote to /dev/kmsg
    seq: int
    ts_usec: int
    flags: str
    message: str
    fields: dict[str, str] = field(default_factory=dict)  # continuation lines, e.g. DEVICE=+pci:0000:03:00.0


def parse_kmsg_record(data: bytes) -> KmsgRecord | None:
    """One /dev/kmsg record (header line plus continuation lines), or None if it is not one."""
    header, sep, rest = data.partition(b";")
    if not sep:
        return None
    prefix = header.split(b",")
    if len(prefix) < 4:
        return None
    try:
        pri, seq, ts_usec = int(prefix[0]), int(prefix[1]), int(prefix[2])
    except ValueError:
        return None
    lines = rest.split(b"\n")
    text = _ESCAPE.sub(lambda m: bytes([int(m.group(1), 16)]), lines[0])
    fields: dict[str, str] = {}
    for line in lines[1:]:
        if line.startswith(b" ") and b"=" in line:
            key, _, value = line[1:].partition(b"=")
            fields[key.decode("ascii", "replace")] = value.decode("utf-8", "replace")
    return KmsgRecord(
        level=pri & 7,
        facility=pri >> 3,
        seq=seq,
        ts_usec=ts_usec,
        flags=prefix[3].decode("ascii", "replace"),
        message=text.decode("utf-8", "replace"),
        fields=fields,
    )


def split_kmsg_records(data: bytes) -> list[bytes]:
    """Records in a chunk that may hold several (a recorded /dev/kmsg dump read as a file)."""
    records: list[bytes] = []
    current: list[bytes] = []
    for line in data.split(b"\n"):
        if line.startswith(b" ") and current:
            current.append(line)
            continue
        if current:
            records.append(b"\n".join(current))
        current = [line] if line else []
    if current:
        records.append(b"\n".join(current))
    return records


def current_boot_id() -> str | None:
    try:
        return Path(BOOT_ID_PATH).read_text().strip()
    except OSError:
        return None


class KmsgReader:
    """Reads /dev/kmsg without blocking and turns classified records into KernelEvents.

    Without ``after_seq`` it starts at the end: old boot messages are not replayed. With ``after_seq``
    (the ``last_seq`` a previous supervisor persisted) it reads every record still in the ring buffer
    with a larger sequence number, so a restarted supervisor neither re-reads what it handled nor misses
    what came while it was down. Either way it first reads the ring buffer from its first record
    (SEEK_SET) to learn the newest sequence number; not from SEEK_DATA, which skips everything before
    the last ``dmesg --clear`` and would lose unhandled records. A sequence number from another boot is ignored (start at the end): ``boot_id`` (the one persisted
    with it) when given, and in any case an ``after_seq`` beyond the newest record.

    ``last_seq`` is the sequence number of the newest record read, known from the open on (None only
    for an empty buffer); persist it with ``boot_id``. ``missed`` counts records overwritten before they could be read; ``overruns`` the
    times the kernel reported that (EPIPE).
    """

    name = "kmsg"
    needs_polling = False

    def __init__(
        self,
        path: str = KMSG_PATH,
        after_seq: int | None = None,
        catalogue: Catalogue | None = None,
        boot_id: str | None = None,
    ):
        self.path = path
        self.catalogue = catalogue or DEFAULT
        self.boot_id = current_boot_id()
        self.last_seq: int | None = None
        self.missed = 0
        self.overruns = 0
        self.records_read = 0
        self._pending: list[KmsgRecord] = []
        if boot_id is not None and boot_id != self.boot_id:
            after_seq = None
        self._fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
        try:
            self._position(after_seq)
        except BaseException:
            os.close(self._fd)
            raise

    def _position(self, after_seq: int | None) -> None:
        # Reading the ring buffer once from its first record (rather than SEEK_END) tells us the newest
        # sequence number, so a later overrun can count what it lost, and a resume can check its number.
        os.lseek(self._fd, 0, os.SEEK_SET)
        backlog = self._drain(limit=None)
        newest = backlog[-1].seq if backlog else None
        if after_seq is None or (newest is not None and newest < after_seq):
            # No position, or one beyond the newest record: sequence numbers restart at boot, so it
            # belongs to another boot. Start at the end.
            self.last_seq = newest
            return
        self.last_seq = after_seq  # read() counts a gap before the first kept record as missed
        self._pending = [r for r in backlog if r.seq > after_seq]

    def fileno(self) -> int:
        return self._fd

    def _read_chunk(self) -> bytes | None:
        """The next record's bytes; None when nothing is left to read now."""
        while True:
            try:
                data = os.read(self._fd, READ_SIZE)
            except BlockingIOError:
                return None
            except InterruptedError:
                continue
            except OSError as exc:
                if exc.errno == errno.EPIPE:
                    # Our position was overwritten; the kernel moved us to the oldest record. The seq gap
                    # at the next record counts how many were lost.
                    self.overruns += 1
                    continue
                if exc.errno == errno.EINVAL:
                    raise OSError(
                        errno.EINVAL, f"{self.path}: a record is larger than the {READ_SIZE}-byte read buffer"
                    ) from None
                raise
            return data or None  # b"" only from a regular file (a recorded log) at its end

    def _drain(self, limit: int | None) -> list[KmsgRecord]:
        records: list[KmsgRecord] = []
        while limit is None or len(records) < limit:
            data = self._read_chunk()
            if data is None:
                break
            for raw in split_kmsg_records(data):
                record = parse_kmsg_record(raw)
                if record is not None:
                    records.append(record)
        return records

    def _accept(self, record: KmsgRecord) -> bool:
        if self.last_seq is not None:
            if record.seq <= self.last_seq:
                return False
            self.missed += record.seq - self.last_seq - 1
        self.last_seq = record.seq
        self.records_read += 1
        return True

    def read(self) -> list[KernelEvent]:
        """Classified events among the records available now; never blocks."""
        pending, self._pending = self._pending, []
        records = pending + self._drain(limit=MAX_RECORDS_PER_READ)
        events: list[KernelEvent] = []
        for record in records:
            if not self._accept(record):
                continue
            event = self.catalogue.event(record.message, self.name, record.seq, record.ts_usec,
                                         from_kernel=record.facility == 0)
            if event is not None:
                events.append(event)
        return events

    def position(self) -> dict[str, Any]:
        return {"seq": self.last_seq, "boot_id": self.boot_id}

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1


def _cursor_seq(cursor: str) -> int | None:
    """The journal's sequence number in a cursor ("s=...;i=<hex>;b=...")."""
    for part in cursor.split(";"):
        if part.startswith("i="):
            try:
                return int(part[2:], 16)
            except ValueError:
                return None
    return None


def _usec(value: object) -> int | None:
    """Microseconds from what systemd-python gives for a monotonic field (timedelta or Monotonic tuple)."""
    delta = getattr(value, "timestamp", value)
    if hasattr(delta, "total_seconds"):
        return delta.days * 86_400_000_000 + delta.seconds * 1_000_000 + delta.microseconds
    return None


class JournalReader:
    """Kernel messages from the systemd journal (``_TRANSPORT=kernel``), for when /dev/kmsg is closed.

    Starts at the tail, or after ``after_cursor`` (the ``last_cursor`` a previous supervisor persisted).
    ``path`` reads a journal directory instead of the system journal (tests, a copied journal).
    ``fileno()`` is the journal's inotify descriptor; ``read()`` calls ``process()`` as the journal API
    requires after every wake-up. When ``needs_polling`` is true (journal on a network file system) the
    descriptor is not reliable and the agent must also call ``read()`` every ``poll_interval`` seconds.
    """

    name = "journal"
    poll_interval = 2.0
    needs_polling = False

    def __init__(self, path: str | None = None, after_cursor: str | None = None, catalogue: Catalogue | None = None):
        from systemd import journal  # imported here: the supervisor runs without it when /dev/kmsg works

        self.catalogue = catalogue or DEFAULT
        self.last_cursor: str | None = None
        self.records_read = 0
        self._reader = journal.Reader(path=path) if path else journal.Reader()
        try:
            self._reader.add_match(_TRANSPORT="kernel")
            positioned = False
            self._saw_kernel_entry = False
            if after_cursor:
                try:
                    self._reader.seek_cursor(after_cursor)
                    # seek_cursor positions before the entry; step onto it so the next get_next is the one after.
                    entry = self._reader.get_next()
                    positioned = bool(entry) and self._reader.test_cursor(after_cursor)
                except OSError:
                    positioned = False
                if positioned:
                    self.last_cursor = after_cursor
                    self._saw_kernel_entry = True
            if not positioned:
                self._reader.seek_tail()
                entry = self._reader.get_previous()
                if entry:
                    self.last_cursor = entry.get("__CURSOR")
                    self._saw_kernel_entry = True
            self._fd = self._reader.fileno()
            self.needs_polling = not self._reader.reliable_fd()
        except BaseException:
            self._reader.close()
            raise

    def sees_kernel_messages(self) -> bool:
        """Whether any kernel message was visible when opened. A booted system always has some, so none
        means no journal, or journal files we may not read (only our own user journal is open to us)."""
        return self._saw_kernel_entry

    def fileno(self) -> int:
        return self._fd

    def read(self) -> list[KernelEvent]:
        self._reader.process()
        events: list[KernelEvent] = []
        for _ in range(MAX_RECORDS_PER_READ):
            entry = self._reader.get_next()
            if not entry:
                break
            self.records_read += 1
            cursor = entry.get("__CURSOR")
            if cursor:
                self.last_cursor = cursor
            message = entry.get("MESSAGE")
            if isinstance(message, bytes):
                message = message.decode("utf-8", "replace")
            if not isinstance(message, str):
                continue
            monotonic = _usec(entry.get("_SOURCE_MONOTONIC_TIMESTAMP")) or _usec(entry.get("__MONOTONIC_TIMESTAMP"))
            seq = _cursor_seq(cursor) if cursor else None
            event = self.catalogue.event(message, self.name, seq, monotonic)
            if event is not None:
                events.append(event)
        return events

    def position(self) -> dict[str, Any]:
        return {"cursor": self.last_cursor}

    def close(self) -> None:
        self._reader.close()


def _kmsg_refusal(exc: OSError, path: str) -> str:
    if exc.errno in (errno.EPERM, errno.EACCES):
        restrict = _read_sysctl("/proc/sys/kernel/dmesg_restrict")
        why = "kernel.dmesg_restrict=1 and the process lacks CAP_SYSLOG" if restrict == "1" else "permission denied"
        return f"{path}: {why}"
    if exc.errno == errno.ENOENT:
        return f"{path}: no such device (a container without /dev/kmsg?)"
    return f"{path}: {exc.strerror}"


def _read_sysctl(path: str) -> str | None:
    try:
        return Path(path).read_text().strip()
    except OSError:
        return None


def open_kernel_log(
    preferred: str = "auto",
    after_seq: int | None = None,
    catalogue: Catalogue | None = None,
    boot_id: str | None = None,
    after_cursor: str | None = None,
    kmsg_path: str = KMSG_PATH,
    journal_path: str | None = None,
) -> tuple[KmsgReader | JournalReader | None, str]:
    """The kernel log source to watch and a one-line report of the choice (or of why there is none).

    ``preferred``: ``auto`` (/dev/kmsg if readable, else the journal), ``kmsg``, ``journal`` or ``off``.
    With no source the watchdog goes on without kernel messages; the report says how to fix it.
    """
    if preferred not in SOURCE_CHOICES:
        raise ValueError(f"kernel log source {preferred!r}: expected {', '.join(SOURCE_CHOICES[:-1])} or "
                         f"{SOURCE_CHOICES[-1]}")
    if preferred == "off":
        return None, "kernel log: off (configured); stalls are caught by the progress timeouts only"
    kmsg_problem = journal_problem = None
    if preferred in ("auto", "kmsg"):
        try:
            reader = KmsgReader(kmsg_path, after_seq=after_seq, catalogue=catalogue, boot_id=boot_id)
            resuming = after_seq is not None and reader.last_seq == after_seq
            resumed = f", resuming after record {after_seq}" if resuming else ""
            return reader, f"kernel log: reading {kmsg_path}{resumed}"
        except OSError as exc:
            kmsg_problem = _kmsg_refusal(exc, kmsg_path)
        if preferred == "kmsg":
            return None, (
                f"kernel log: cannot read {kmsg_problem}; run the supervisor as root or with CAP_SYSLOG "
                "(AmbientCapabilities=CAP_SYSLOG), or set kernel.dmesg_restrict=0"
            )
    try:
        journal_reader = JournalReader(journal_path, after_cursor=after_cursor, catalogue=catalogue)
    except ImportError:
        journal_problem = "systemd-python is not installed (pip install systemd-python)"
    except OSError as exc:
        journal_problem = f"cannot open the journal: {exc.strerror or exc}"
    else:
        if journal_reader.sees_kernel_messages():
            why = f" ({kmsg_problem})" if kmsg_problem else ""
            return journal_reader, f"kernel log: reading the systemd journal, kernel transport{why}"
        journal_reader.close()
        journal_problem = "no kernel messages are readable (no journald, or not in the systemd-journal group)"
    parts = [p for p in (kmsg_problem, f"journal: {journal_problem}") if p]
    return None, (
        "kernel log: WARNING: no kernel log source, the watchdog goes on without kernel messages ("
        + "; ".join(parts)
        + "). Fix: run as root or grant CAP_SYSLOG (AmbientCapabilities=CAP_SYSLOG in the unit), or set "
        "kernel.dmesg_restrict=0, or add the service user to the systemd-journal group"
    )
