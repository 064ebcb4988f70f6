"""The run's history (STATE_DIR/history.db): sampled at its rate, thinned with age to a bounded size, a full disk a
gap and one line, never an exception or a damaged file; a damaged file read as far as it goes."""

import logging
import os
import sqlite3

from supervisor.state import history
from supervisor.state.history import MAX_ROWS, SAMPLE_INTERVAL, History, thin
from supervisor.state.paths import HISTORY_FILE as FILE

DAY = 86400.0
MONTH_BOUND_BYTES = 4 * 2**20  # bench/RESULTS.md: a month of samples is about 1.9 MB (bounded here at 4 MiB)
MAX_BYTES = 12 * 2**20  # docs/design.md (state/): no history grows past 12 MiB
STATUS = {"state": "healthy", "phase": "train", "rung": 0, "rung_label": "as configured", "attempt": 1, "epoch": 3,
          "epochs": 300, "batch": 120, "batches": 3665, "progress": 0.0081, "it_s": 15.1, "samples_s": 483.2,
          "eta_seconds": 71234.5, "goodput": 0.93, "trained_seconds": 7012.3, "lost_seconds": 12.1, "restarts": 2,
          "last_checkpoint": {"epoch": 3, "batch": 100}}
GPUS = [{"utilization_ratio": 0.97, "memory_used_bytes": 17_012_345_678, "temperature_celsius": 81.0,
         "power_watts": 291.0}]


class Clock:
    def __init__(self, t=1_800_000_000.0):
        self.t = t

    def __call__(self):
        return self.t


def test_samples_come_at_their_interval_and_at_once_when_the_state_phase_or_rung_changes(tmp_path):
    clock = Clock()
    h = History(tmp_path, clock=clock)
    assert h.record(STATUS, GPUS)
    clock.t += 1
    assert not h.record(STATUS)
    assert h.record({**STATUS, "phase": "val"})  # a change is a sample at once
    clock.t += SAMPLE_INTERVAL
    assert h.record({**STATUS, "phase": "val"})
    h.close()
    rows, problem = history.read(tmp_path)
    assert problem is None and [r["phase"] for r in rows] == ["train", "val", "val"]
    assert rows[0]["it_s"] == 15.1 and rows[0]["checkpoint_batch"] == 100
    assert rows[0]["gpus"] == "[[0.97,17012345678,81.0,291.0]]"
    assert rows[1]["gpus"] is None


def test_a_month_of_samples_is_thinned_with_age_and_stays_under_the_stated_size(tmp_path):
    """A month at one sample every 5 s, thinned as the writer does it, every 6 hours here (pure: no clock runs)."""
    h = History(tmp_path, clock=Clock(0.0))
    h.record(STATUS, GPUS)  # the file, as the writer makes it, and the row copied
    db, start, step = h.db, 1_800_000_000.0, 6 * 3600.0
    copy = ", ".join(("? + k * ?",) + history.COLUMNS + ("checkpoint_epoch", "checkpoint_batch", "gpus"))
    for n in range(int(30 * DAY / step)):
        t0 = start + n * step
        with db:
            db.execute(f"INSERT INTO samples SELECT {copy} FROM (WITH RECURSIVE c(k) AS (SELECT 0 UNION ALL SELECT "
                       f"k + 1 FROM c WHERE k < ?) SELECT k FROM c), (SELECT * FROM samples WHERE t = 0)",
                       (t0, SAMPLE_INTERVAL, int(step / SAMPLE_INTERVAL) - 1))
        thin(db, t0 + step)
    now = start + 30 * DAY
    counts = [db.execute("SELECT COUNT(*) FROM samples WHERE t >= ? AND t < ?", (now - a, now - b)).fetchone()[0]
              for a, b in ((6 * 3600, 0), (2 * DAY, 6 * 3600), (14 * DAY, 2 * DAY), (30 * DAY, 14 * DAY))]
    db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    h.close()
    size = sum(os.path.getsize(tmp_path / name) for name in os.listdir(tmp_path) if name.startswith(FILE))
    assert counts[0] == 6 * 3600 / SAMPLE_INTERVAL  # the newest hours at full resolution
    assert abs(counts[1] - 42 * 60) <= 2 and abs(counts[2] - 12 * 288) <= 2 and abs(counts[3] - 16 * 48) <= 2
    print(f"a month: {sum(counts)} rows, {size} bytes")
    assert sum(counts) < 12_000 and size < MONTH_BOUND_BYTES, (counts, size)


def test_no_history_grows_past_its_row_bound(tmp_path):
    h = History(tmp_path, clock=Clock(0.0))
    h.record(STATUS)
    with h.db:
        h.db.execute("INSERT INTO samples SELECT k * 3600.0, state, phase, rung, attempt, epoch, epochs, batch, "
                     "batches, progress, it_s, eta_seconds, goodput, trained_seconds, lost_seconds, restarts, "
                     "checkpoint_epoch, checkpoint_batch, gpus FROM (WITH RECURSIVE c(k) AS (SELECT 1 UNION ALL "
                     f"SELECT k + 1 FROM c WHERE k < {MAX_ROWS + 500}) SELECT k FROM c), (SELECT * FROM samples)")
    thin(h.db, (MAX_ROWS + 500) * 3600.0)
    rows = h.db.execute("SELECT COUNT(*), MIN(t) FROM samples").fetchone()
    assert rows == (MAX_ROWS, 501 * 3600.0)  # the oldest went
    h.db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    size = os.path.getsize(tmp_path / FILE)
    print(f"{MAX_ROWS} rows: {size} bytes")
    assert size < MAX_BYTES


def test_a_full_disk_is_one_line_and_a_gap_and_the_file_stays_sound(tmp_path, caplog):
    clock = Clock()
    h = History(tmp_path, clock=clock)
    assert h.record(STATUS, GPUS)
    pages = h.db.execute("PRAGMA page_count").fetchone()[0]
    h.db.execute(f"PRAGMA max_page_count = {pages}")  # SQLite answers SQLITE_FULL, as on a full disk
    written = 0
    with caplog.at_level(logging.INFO, logger="yolo-train"):
        while h.record({**STATUS, "phase": "x" * 500}, GPUS * 8):
            written += 1
            clock.t += SAMPLE_INTERVAL
            assert written < 1000
        for _ in range(int(history.RETRY / SAMPLE_INTERVAL) - 1):  # no retry before RETRY, no second line
            clock.t += SAMPLE_INTERVAL
            assert not h.record(STATUS)
    said = [r.message for r in caplog.records if "cannot write the run's history" in r.message]
    assert len(said) == 1 and "full" in said[0], said
    with caplog.at_level(logging.INFO, logger="yolo-train"):  # room again: the next try writes, and says so
        clock.t += 2 * SAMPLE_INTERVAL
        assert h.record(STATUS)
    assert "written again" in caplog.text
    h.close()
    db = sqlite3.connect(tmp_path / FILE)
    assert db.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
    assert db.execute("SELECT COUNT(*) FROM samples").fetchone()[0] == 1 + written + 1


def test_a_truncated_file_is_read_as_far_as_it_goes_and_says_so(tmp_path):
    clock = Clock()
    h = History(tmp_path, clock=clock)
    for _ in range(3000):
        clock.t += SAMPLE_INTERVAL
        h.record(STATUS, GPUS)
    h.close()
    path = tmp_path / FILE
    with open(path, "r+b") as f:
        f.truncate(os.path.getsize(path) // 2)
    rows, problem = history.read(tmp_path)
    assert problem is not None and "history.db is damaged" in problem and len(rows) < 3000
    (path).unlink()
    assert history.read(tmp_path) == ([], "no history.db (a state directory of a version before the history, or no "
                                          "sample written yet)")


def test_a_copy_of_history_db_without_its_wal_holds_the_samples_up_to_a_minute_ago_and_says_what_it_lacks(tmp_path):
    """Issue 41: history.db copied without history.db-wal was "damaged" while its samples were in the log: the
    writer now moves the log into the file every minute, and a file whose log is missing says so."""
    import shutil

    clock = Clock()
    h = History(tmp_path / "live", clock=clock)
    (tmp_path / "live").mkdir()
    (tmp_path / "copy").mkdir()
    for _ in range(40):  # 200 s of samples, the writer still running
        clock.t += SAMPLE_INTERVAL
        assert h.record(STATUS)
    shutil.copy(tmp_path / "live" / FILE, tmp_path / "copy" / FILE)
    samples, problem = history.read(tmp_path / "copy")
    assert problem is None and len(samples) >= 40 - history.CHECKPOINT_EVERY / SAMPLE_INTERVAL, len(samples)
    h.close()

    # A file whose samples are all in its log (a writer that never moved them), copied alone.
    (tmp_path / "old").mkdir()
    (tmp_path / "bare").mkdir()
    db = sqlite3.connect(tmp_path / "old" / FILE, isolation_level=None)
    db.execute("PRAGMA journal_mode = WAL")
    db.execute("PRAGMA wal_autocheckpoint = 0")
    for statement in history.SCHEMA:
        db.execute(statement)
    shutil.copy(tmp_path / "old" / FILE, tmp_path / "bare" / FILE)
    db.close()
    samples, problem = history.read(tmp_path / "bare")
    assert samples == [] and "history.db is in WAL mode and its log history.db-wal is not beside it" in problem
    assert "copy history.db-wal with it" in problem and "damaged" not in problem
