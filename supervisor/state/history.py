"""The run's history: STATE_DIR/history.db, one row per sample of the live status, for ``yolo-train report``.

SQLite from the standard library: one file a user can query (``sqlite3 history.db 'select * from samples'``), written
in WAL mode, where a commit is one append to the log and a SIGKILL at any moment leaves the last committed sample
readable; a full disk fails the write (SQLITE_FULL), never the file. A failed write is said once and the supervisor
goes on without history until a write succeeds again (tried every RETRY seconds); training never waits for it.
The log is moved into the file every CHECKPOINT_EVERY seconds, so a copy of history.db alone holds all but the last
minute; a file copied without the log it needed says so, not "damaged".

A sample is taken at most every SAMPLE_INTERVAL seconds, and at once when the state, phase or rung changes. Older
samples are thinned (THIN): past 6 hours one a minute is kept, past 2 days one per 5 minutes, past 2 weeks one per
half hour, and never more than MAX_ROWS rows in all (the oldest go): a month is about 11 000 rows, under 4 MiB, and
no run's history exceeds 12 MiB (docs/design.md: "state/").
"""

from __future__ import annotations

import json
import logging
import sqlite3
import time
from pathlib import Path
from typing import Any

from supervisor.state.paths import StatePaths

log = logging.getLogger("yolo-train")

SCHEMA_VERSION = 1
SAMPLE_INTERVAL = 5.0  # seconds between samples while nothing but progress changes
THIN = ((6 * 3600.0, 60.0), (2 * 86400.0, 300.0), (14 * 86400.0, 1800.0))  # (older than, seconds per kept sample)
MAX_ROWS = 30_000  # a year and a half of samples thinned so
THIN_EVERY = 600.0  # seconds of samples between thinning passes
RETRY = 60.0  # seconds between tries after a failed write
CHECKPOINT_EVERY = 60.0  # seconds between moves of the log (history.db-wal) into history.db

# The status's own JSON names (status --json), one column each, rounded to what a picture shows; gpus is a JSON list
# of [utilization_ratio, memory_used_bytes, temperature_celsius, power_watts] per GPU, in the readers' order.
COLUMNS = ("state", "phase", "rung", "attempt", "epoch", "epochs", "batch", "batches", "progress", "it_s",
           "eta_seconds", "goodput", "trained_seconds", "lost_seconds", "restarts")
GPU_FIELDS = ("utilization_ratio", "memory_used_bytes", "temperature_celsius", "power_watts")
SCHEMA = (f"CREATE TABLE IF NOT EXISTS samples (t REAL NOT NULL, {', '.join(COLUMNS)}, checkpoint_epoch, "
          f"checkpoint_batch, gpus TEXT)", "CREATE INDEX IF NOT EXISTS samples_t ON samples (t)")


class History:
    """The writer, fed by the agent with each status it writes (``record``); ``clock`` is the wall clock."""

    def __init__(self, state_dir: Path, clock=time.time):
        self.path = StatePaths(state_dir).history
        self.clock = clock
        self.db: sqlite3.Connection | None = None
        self.last: tuple[float, Any, Any, Any] | None = None  # time, state, phase, rung of the last sample
        self.thinned_at: float | None = None
        self.checkpointed_at: float | None = None
        self.retry_at = 0.0
        self.failed = False  # said once

    def due(self, status: dict[str, Any]) -> bool:
        now = self.clock()
        if now < self.retry_at:
            return False
        if self.last is None:
            return True
        t, state, phase, rung = self.last
        return now - t >= SAMPLE_INTERVAL or (state, phase, rung) != (status.get("state"), status.get("phase"),
                                                                      status.get("rung"))

    def record(self, status: dict[str, Any], gpus: list[dict[str, Any]] | None = None) -> bool:
        """Write one sample if one is due; False when none was written."""
        if not self.due(status):
            return False
        now = self.clock()
        checkpoint = status.get("last_checkpoint") or {}
        row = (now, *(_plain(status.get(c)) for c in COLUMNS), checkpoint.get("epoch"), checkpoint.get("batch"),
               json.dumps([[g.get(k) for k in GPU_FIELDS] for g in gpus], separators=(",", ":")) if gpus else None)
        try:
            db = self.db or self._open()
            db.execute(f"INSERT INTO samples VALUES ({', '.join('?' * len(row))})", row)
            if self.thinned_at is None or now - self.thinned_at >= THIN_EVERY:
                self.thinned_at = now
                thin(db, now)
            if self.checkpointed_at is None or now - self.checkpointed_at >= CHECKPOINT_EVERY:
                # The samples move from history.db-wal into history.db itself: a copy of the file alone holds them
                # (SQLite's own checkpoint waits for 1000 pages, days of samples). PASSIVE: never waits for a reader.
                self.checkpointed_at = now
                db.execute("PRAGMA wal_checkpoint(PASSIVE)")
        except (sqlite3.Error, OSError) as e:
            self._failed(e, now)
            return False
        self.last = (now, status.get("state"), status.get("phase"), status.get("rung"))
        if self.failed:
            log.info(f"the run's history is written again to {self.path}")
            self.failed = False
        return True

    def close(self) -> None:
        if self.db is not None:
            try:
                self.db.close()
            except sqlite3.Error:
                pass
            self.db = None

    def _open(self) -> sqlite3.Connection:
        db = sqlite3.connect(self.path, isolation_level=None)
        try:
            db.execute("PRAGMA auto_vacuum = FULL")  # before the first table: the pages thinning frees leave the file
            db.execute("PRAGMA journal_mode = WAL")
            db.execute("PRAGMA synchronous = NORMAL")  # WAL: no fsync per commit; a SIGKILL loses nothing committed
            db.execute("PRAGMA journal_size_limit = 1048576")
            for statement in SCHEMA:
                db.execute(statement)
            db.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")
        except sqlite3.Error:
            db.close()
            raise
        self.db = db
        return db

    def _failed(self, e: Exception, now: float) -> None:
        if not self.failed:
            log.warning(f"cannot write the run's history to {self.path} ({e}); training goes on, the history has a "
                        f"gap from here, tried again every {RETRY:.0f} s")
        self.failed = True
        self.retry_at = now + RETRY
        self.close()


def thin(db: sqlite3.Connection, now: float) -> None:
    """Keep the first sample of each bucket past each age, then at most MAX_ROWS rows."""
    with db:
        for older_than, bucket in THIN:
            cut = now - older_than
            db.execute("DELETE FROM samples WHERE t < ? AND rowid NOT IN (SELECT MIN(rowid) FROM samples WHERE t < ? "
                       "GROUP BY CAST(t / ? AS INTEGER))", (cut, cut, bucket))
        db.execute("DELETE FROM samples WHERE rowid IN (SELECT rowid FROM samples ORDER BY t LIMIT "
                   "max(0, (SELECT COUNT(*) FROM samples) - ?))", (MAX_ROWS,))


def gpu_readings(readers: list) -> list[dict[str, Any]]:
    """One reading of each GPU (none on a CPU-only machine): what a sample keeps of them."""
    if not readers:
        return []
    from supervisor.host.gpu_metrics import sample_all

    try:
        samples = sample_all(readers)
    except Exception:  # noqa: BLE001  (a reader's failure costs the sample its GPU columns, nothing more)
        return []
    return [{k: getattr(g, k) for k in GPU_FIELDS} for g in samples]


def _plain(value: Any) -> Any:
    if isinstance(value, float):
        return float(f"{value:.4g}") if abs(value) < 1e4 else round(value, 1)
    return value if value is None or isinstance(value, (int, str)) else json.dumps(value)


def read(state_dir: Path) -> tuple[list[dict[str, Any]], str | None]:
    """Every sample, oldest first, and what could not be read (None when all was): for ``yolo-train report``.
    Read-only; a file another user's supervisor writes is read as it is on disk (``immutable``) if need be."""
    path = StatePaths(state_dir).history
    if not path.exists():
        return [], f"no {path.name} (a state directory of a version before the history, or no sample written yet)"
    left_behind = _wal_left_behind(path)  # (before reading: a reader may make an empty log beside it)
    best: list[dict[str, Any]] = []
    error = "empty"
    for mode in ("ro", "ro&immutable=1"):
        rows: list[dict[str, Any]] = []
        try:
            db = sqlite3.connect(f"file:{path}?mode={mode}", uri=True)
            try:
                db.row_factory = sqlite3.Row
                for r in db.execute("SELECT * FROM samples"):  # file order: a damaged page ends it, not the rest
                    rows.append(dict(r))
            finally:
                db.close()
            return sorted(rows, key=lambda r: r["t"]), None
        except sqlite3.Error as e:
            error = str(e)
            best = max(best, rows, key=len)
    shown = f"only {len(best)} samples of it could be read" if best else "none of it could be read"
    if left_behind:
        return sorted(best, key=lambda r: r["t"]), (
            f"{path.name} is in WAL mode and its log {path.name}-wal is not beside it (copied without it?): the "
            f"samples since its last checkpoint are in that log; {shown}; copy {path.name}-wal with it")
    return sorted(best, key=lambda r: r["t"]), f"{path.name} is damaged ({error}): {shown}; the timeline has gaps"


def _wal_left_behind(path: Path) -> bool:
    """The file is whole (as many pages as its header says), in WAL mode (header bytes 18-19: 2, 2), and has no log
    beside it: what a file copied without its -wal looks like; a truncated one is not whole."""
    try:
        with open(path, "rb") as f:
            header = f.read(32)
        size = path.stat().st_size
    except OSError:
        return False
    if len(header) < 32 or header[:16] != b"SQLite format 3\0" or header[18:20] != b"\2\2":
        return False
    page_size = int.from_bytes(header[16:18], "big")
    page_size = 65536 if page_size == 1 else page_size
    whole = size == page_size * int.from_bytes(header[28:32], "big")
    return whole and not path.with_name(path.name + "-wal").exists()
