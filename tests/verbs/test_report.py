"""`yolo-train report` from state directories made by hand: an earlier version's (no history), and one whose
history has GPU readings; the page says what it lacks and draws what it has."""

import json
import re
from pathlib import Path

from supervisor.config import parse
from supervisor.verbs import report
from supervisor.state.history import History

INCIDENT = {"id": "1-1-1800000100", "time": 1_800_000_100.0, "reason": "hang", "phase": "train",
            "detail": "no progress for 10.0 s in train", "attempt": 1, "rung": 0, "rung_label": "as configured",
            "epoch": 2, "batch": 7,
            "seconds_since_progress": 10.0, "last_progress_wall": 1_800_000_090.0, "lost_seconds": 4.0,
            "lost_batches": 7, "culprit": "main (pid 7) in sleep", "summary": ["main (pid 7) in sleep"],
            "kill": {"processes": 3, "seconds": 0.3, "survivors": []}, "restart_seconds": 6.0, "tier": "restart"}


def config_for(state_dir: Path):
    return parse({"train": {"data": "demo"}, "metrics": {"listen": "off"}, "deadline": "2027-01-15T08:00:00Z"},
                 "<test>", state_dir=state_dir)


def test_a_state_directory_of_an_earlier_version_is_reported_from_its_incidents_and_says_what_is_missing(tmp_path):
    (tmp_path / "incidents.jsonl").write_text(json.dumps(INCIDENT) + "\n")
    night = report.gather_night(config_for(tmp_path))
    page = report.render(night)
    assert "no history.db (a state directory of a version before the history" in page
    assert "no state file" in page and "no per-epoch metrics yet" in page
    assert page.count('<tr class="incident"') == 1 and "(tier restart)" in page and "main (pid 7) in sleep" in page
    assert "<script" not in page and re.findall(r'(?:src|href)\s*=\s*"(?!#|data:)', page) == []


def test_the_night_says_the_batches_its_restarts_replayed(tmp_path):
    """Issue 48: each restart trains again the batches since the checkpoint it resumed from: the page says how many,
    per incident and over the night (in-place recoveries replay none and are not counted)."""
    in_place = {**INCIDENT, "id": "1-2-1800000200", "time": 1_800_000_200.0, "tier": "in_place", "lost_batches": 0}
    second = {**INCIDENT, "id": "2-3-1800000300", "time": 1_800_000_300.0, "lost_batches": 5}
    # a line written before the tiers were said: a restart
    older = {k: v for k, v in {**INCIDENT, "id": "3-4-1800000400", "time": 1_800_000_400.0, "lost_batches": 3}.items()
             if k != "tier"}
    (tmp_path / "incidents.jsonl").write_text("".join(json.dumps(i) + "\n"
                                                      for i in (INCIDENT, in_place, second, older)))
    night = report.gather_night(config_for(tmp_path))
    assert night.replayed() == (15, 3)
    page = report.render(night)
    assert "(7 batches replayed)" in page and "15 batches replayed over 3 restarts (5.0 a restart)" in page


def test_the_night_says_what_the_slow_batches_after_each_recovery_cost(tmp_path):
    """Issue 59.2: each incident's ``after`` (its batches after the recovery against those before its stall) in its
    row, and over the night a row of its own, out of the training kept; a recovery whose batches ran faster costs 0."""
    slow = {**INCIDENT, "after": {"batches": 50, "seconds": 30.0, "before_batches": 50, "before_seconds": 25.0,
                                  "ratio": 1.2, "extra_seconds": 5.0, "slowest": 1.9}}
    fast = {**INCIDENT, "id": "2-3-1800000300", "time": 1_800_000_300.0, "tier": "in_place",
            "after": {"batches": 20, "seconds": 9.0, "before_batches": 50, "before_seconds": 25.0, "ratio": 0.9,
                      "extra_seconds": -1.0, "slowest": 0.6}}
    (tmp_path / "incidents.jsonl").write_text("".join(json.dumps(i) + "\n" for i in (slow, fast, INCIDENT)))
    night = report.gather_night(config_for(tmp_path))
    night.status.update(trained_seconds=100.0, lost_seconds=8.0)  # as a state file says them
    assert night.slow_after() == (5.0, 70, 2)
    rows = {what: seconds for what, seconds, _ in night.where_the_time_went()}
    assert rows["slow batches after recoveries"] == 5.0 and rows["training kept"] == 100.0 - 8.0 - 5.0
    page = report.render(night)
    assert "the 50 batches after 1.20x the 50 before (+5.0 s)" in page
    assert "the 20 batches after 0.90x the 50 before (-1.0 s)" in page
    assert "70 batches after 2 recoveries against the pace before each stall" in page


def test_gpu_readings_get_a_panel_and_the_png_keeps_its_size(tmp_path):
    clock = type("Clock", (), {"t": 1_800_000_000.0, "__call__": lambda self: self.t})()
    h = History(tmp_path, clock=clock)
    for k in range(30):
        clock.t += 5
        h.record({"state": "healthy", "phase": "train", "rung": k // 15, "epoch": 1, "epochs": 3, "batch": k,
                  "batches": 100, "progress": k / 300, "it_s": 12.5, "eta_seconds": 3600.0},
                 [{"utilization_ratio": 0.9, "memory_used_bytes": 1 << 30, "temperature_celsius": 70.0,
                   "power_watts": 200.0}])
    h.close()
    night = report.gather_night(config_for(tmp_path))
    svg = report.report_plot.timeline(night).decode()
    assert "GPU 0 busy %" in svg and "rung 1" in svg
    png = report.report_plot.timeline(night, "png")
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and int.from_bytes(png[16:20], "big") == report.report_plot.PNG_SIZE[0]


def test_an_output_that_is_a_directory_is_one_line_and_a_strange_results_csv_is_read_as_far_as_it_goes(tmp_path,
                                                                                                       capsys):
    """Issue 41: `-o ""`, `-o .`, `-o /` and a results.csv with a field over csv's 128 KiB or bytes that are not
    UTF-8 gave tracebacks."""
    (tmp_path / "incidents.jsonl").write_text(json.dumps(INCIDENT) + "\n")
    config = config_for(tmp_path)
    for out in (Path(""), Path("."), Path("/"), tmp_path):
        assert report.report_main(config, out, png=False) == 1
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and "is a directory, not a file; name the page to write (-o night.html)" in err
    results = tmp_path / "train" / "results.csv"
    results.parent.mkdir()
    results.write_bytes(b"epoch,loss\n1,0.5\n2,\xff\xfe\n3," + b"x" * 200_000 + b"\n4,0.25\n")
    assert [r.get("loss") for r in report.read_results(results)] == [0.5, None, 0.25]
    assert report.report_main(config, tmp_path / "night.html", png=False) == 0
    assert '<table id="results">' in (tmp_path / "night.html").read_text()


def test_a_month_with_3000_incidents_has_dated_ticks_a_bounded_page_and_the_directorys_name(tmp_path):
    """Issue 41: a month-long report showed every tick as "00:00" with no dates, 3,000 incidents made an 11.6 MB page
    in 40 s, and `--state-dir` without `--config` titled it "demo". Looked at in headless Chromium where it can."""
    import sqlite3
    import time

    from supervisor.config import load
    from supervisor.state import history
    from tests.helpers.headless_chromium import CHROMIUM
    from tests.helpers.headless_chromium import load as chromium_load

    state = tmp_path / "coco-night"
    state.mkdir()
    start = 1_800_000_000.0
    db = sqlite3.connect(state / "history.db")  # a month, a sample each half hour (what thinning leaves of it)
    with db:
        for statement in history.SCHEMA:
            db.execute(statement)
        db.executemany(f"INSERT INTO samples (t, {', '.join(history.COLUMNS)}) VALUES "
                       f"({', '.join('?' * (1 + len(history.COLUMNS)))})",
                       [(start + 1800 * k, "healthy", "train", 0, 1, 1 + k // 48, 31, k % 48, 48, k / 1440, 10.0,
                         1800.0 * (1440 - k), None, None, None, 0) for k in range(30 * 48)])
    db.close()
    with open(state / "incidents.jsonl", "w") as f:
        for k in range(3000):  # one every 15 minutes
            when = start + 900 * k
            f.write(json.dumps({**INCIDENT, "id": f"1-{k}-{int(when)}", "time": when,
                                "last_progress_wall": when - 10, "phase": "train" if k % 3 else "val"}) + "\n")
    config = load(None, state)  # `yolo-train report --state-dir coco-night`: no --config
    began = time.monotonic()
    assert report.report_main(config, tmp_path / "night.html", png=False) == 0
    took = time.monotonic() - began
    page = (tmp_path / "night.html").read_text()
    assert "<title>yolo-train report: coco-night</title>" in page
    assert page.count('<tr class="incident"') == 200 and page.count('<tr class="incident-group"') == 2
    assert "The 2800 incidents before the newest 200, by kind" in page
    assert len(page) < 2_000_000, len(page)
    print(f"report of a month with 3000 incidents: {len(page) / 1e6:.2f} MB in {took:.1f} s")
    if CHROMIUM is None:  # the page's text as written (make test installs Chromium)
        texts = re.findall(r"<text[^>]*>([^<]*)</text>", page.split('id="timeline"')[1].split("</figure>")[0])
    else:  # as the browser shows it
        seen = chromium_load(tmp_path / "night.html", "JSON.stringify([...document.querySelectorAll('#timeline "
                                                      "svg text')].map(t => t.textContent))")
        fetched = [r for r in seen.requests if not r.startswith("data:")]  # (the many lines, drawn as a picture)
        assert seen.errors == [] and fetched == [(tmp_path / "night.html").resolve().as_uri()]
        texts = json.loads(seen.value)
    months = [t for t in texts if re.fullmatch(r"[A-Z][a-z]{2} \d\d", t.strip())]
    assert len(months) >= 3, texts
    assert not any(t.strip() == "00:00" for t in texts), texts
