"""The morning after, end to end: a supervised demo night with two real hangs and a [notify] command, then
`yolo-train report` opened in a real headless Chromium; and a supervisor SIGKILLed mid-run, its history then
truncated, reported all the same."""

import json
import os
import signal
import sqlite3
import struct
import subprocess
import sys
import textwrap
from types import SimpleNamespace

import psutil
import pytest

from tests.helpers import ROOT
from tests.helpers.headless_chromium import CHROMIUM, load
from tests.helpers.supervised import copy_example, demo_train, quiet_config, read_state, status_of, wait_for, yolo_train

pytestmark = [pytest.mark.e2e, pytest.mark.skipif(CHROMIUM is None, reason="Debian's chromium is not installed "
                                                                           "(make deb installs it)")]

# Records its notice, then holds until the test opens the gate, then fails: so the test sees training go on while
# a command runs, and the supervisor's one line for its failures.
GATED_RECORDER = """import json, os, sys, time
log, gate = sys.argv[1], sys.argv[2]
with open(log, "a") as f:
    f.write(json.dumps({"pid": os.getpid(), "stdin": json.loads(sys.stdin.read()),
                        "env": {k: v for k, v in os.environ.items() if k.startswith("YOLO_TRAIN_")}}) + "\\n")
while not os.path.exists(gate):
    time.sleep(0.05)
sys.exit(1)
"""

DOM = """JSON.stringify({
  incidents: [...document.querySelectorAll("tr.incident")].map(r => r.querySelector(".cause").textContent),
  rung_changes: [...document.querySelectorAll("li.rung-change")].map(li => li.textContent),
  timeline: document.querySelectorAll("#timeline svg").length,
  timeline_text: document.querySelector("#timeline svg").textContent,
  missing: document.getElementById("missing") ? document.getElementById("missing").textContent : null,
  goodput: document.getElementById("goodput").textContent,
  epochs: document.querySelectorAll("#results tr").length - 1})"""


def notices(path):
    """In the order of the notices' times: commands started together (a summary and the final notice) write their
    lines in any order."""
    lines = [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []
    return sorted(lines, key=lambda n: n["stdin"]["time"])


@pytest.fixture(scope="module")
def night(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("night")
    recorder, log, gate = tmp / "recorder.py", tmp / "notices.jsonl", tmp / "gate"
    recorder.write_text(GATED_RECORDER)
    config = tmp / "night.toml"
    config.write_text(f'name = "night"\n{demo_train(epochs=1)}' + quiet_config() + textwrap.dedent(f"""
        [ladder]
        prior_between_hangs = "off"  # each hang climbs: the rung changes are part of the night told
        [notify]
        command = [{json.dumps(sys.executable)}, "{recorder}", "{log}", "{gate}"]
        timeout = 300
        """))
    state_dir = tmp / "state"
    proc = subprocess.Popen([sys.executable, "-m", "supervisor", "run", "--config", str(config), "--state-dir",
                             str(state_dir), "--fault", "main_hang,at_batch=5,attempt=1", "--fault",
                             "main_hang,at_batch=3,attempt=2"], cwd=ROOT, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    try:
        first = wait_for(lambda: notices(log), 240, "the first notice")[0]
        # The command holds (its gate is shut) while the next attempt trains: nothing waits for it.
        trained = wait_for(lambda: (s := status_of(state_dir)) and s["attempt"] >= 2 and s["state"] == "healthy"
                           and s["batch"] and s, 240, "the next attempt training")
        held = psutil.Process(first["pid"]).is_running() and not gate.exists()
        live = yolo_train("report", "--config", str(config), "--state-dir", str(state_dir), "-o",
                          str(tmp / "live.html"))
        gate.touch()
        _, stderr = proc.communicate(timeout=300)
    finally:
        proc.kill()
    out = tmp / "night.html"
    report = yolo_train("report", "--config", str(config), "--state-dir", str(state_dir), "-o", str(out), "--png")
    return SimpleNamespace(tmp=tmp, config=config, state_dir=state_dir, code=proc.returncode, stderr=stderr,
                           notices=notices(log), held=held, trained=trained, live=live, report=report, html=out,
                           png=out.with_suffix(".png"))


def test_the_night_is_noticed_once_per_kind_without_holding_training_and_a_failing_command_is_said_once(night):
    assert night.code == 0, night.stderr[-3000:]
    assert night.held  # the first command was still running, its gate shut, when the next attempt trained
    kinds = [n["stdin"]["event"] for n in night.notices]
    # Two hangs: each a rung change and a recovery, then the end; three go at once, then the rate rule holds the
    # fourth, which the final notice's summary carries.
    assert kinds == ["rung_changed", "hang_recovered", "rung_changed", "summary", "finished"], kinds
    assert all(n["env"]["YOLO_TRAIN_EVENT"] == n["stdin"]["event"] for n in night.notices)
    recovered = night.notices[1]["stdin"]
    assert recovered["incident"]["reason"] == "hang" and "hang_forever" in recovered["incident"]["culprit"]
    assert night.notices[3]["stdin"]["counts"] == {"hang_recovered": 1}
    assert night.notices[4]["env"]["YOLO_TRAIN_EXIT_CODE"] == "0"
    said = [line for line in night.stderr.splitlines() if "[notify] command" in line]
    assert len(said) == 1 and "exited with status 1" in said[0], said


def test_the_report_opens_offline_in_chromium_with_both_hangs_and_the_rung_changes(night):
    assert night.report.returncode == 0, night.report.stderr
    canary = night.tmp / "canary.html"  # the checks themselves see a request and a console error
    canary.write_text('<img src="http://example.invalid/x.png"><script>console.error("canary")</script>')
    seen = load(canary, "1")
    assert "http://example.invalid/x.png" in seen.requests and "console.error: canary" in seen.errors

    page = load(night.html, DOM)
    (night.tmp / "night-screenshot.png").write_bytes(page.screenshot)  # the test's artifact
    assert page.requests == [night.html.resolve().as_uri()], page.requests  # nothing but the file itself
    assert page.errors == []
    dom = json.loads(page.value)
    assert [cause.split("no progress")[0] for cause in dom["incidents"]] == ["hang (tier restart)"] * 2
    assert [change.split(": ")[1] for change in dom["rung_changes"]] == ["rung 1", "rung 2"]
    assert dom["timeline"] == 1 and "#1 hang in train" in dom["timeline_text"] and "rung 2" in dom["timeline_text"]
    assert dom["missing"] is None and dom["epochs"] == 1
    assert dom["goodput"] == f"{100 * read_state(night.state_dir)['status']['goodput']:.1f}%"
    assert page.screenshot[:8] == b"\x89PNG\r\n\x1a\n"


def test_a_run_still_training_is_reported_as_far_as_it_got(night):
    assert night.live.returncode == 0, night.live.stderr
    page = (night.tmp / "live.html").read_text()
    assert '<dd id="state">healthy</dd>' in page and page.count('<tr class="incident"') == 1
    assert "results.csv is missing or empty" in page  # its first epoch is not over


def test_report_png_is_the_timeline_at_its_stated_size(night):
    from supervisor.verbs.report_plot import PNG_SIZE

    data = night.png.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and struct.unpack(">II", data[16:24]) == PNG_SIZE


def test_a_supervisor_killed_mid_run_and_its_history_truncated_still_give_a_report_saying_what_is_missing(tmp_path):
    config = copy_example("plain_loop", tmp_path, step_delay=0.05)
    state_dir = tmp_path / "state"
    proc = subprocess.Popen([sys.executable, "-m", "supervisor", "run", "--config", str(config), "--state-dir",
                             str(state_dir)], cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            start_new_session=True)
    try:
        wait_for(lambda: (s := status_of(state_dir)) and s["state"] == "healthy" and s["batch"], 120, "training")
        from supervisor.state import history
        from supervisor.state.paths import StatePaths

        wait_for(lambda: len([r for r in history.read(state_dir)[0] if r["state"] == "healthy"]) >= 2, 120,
                 "two samples of training")
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    finally:
        try:
            os.killpg(proc.pid, signal.SIGKILL)  # anything it leaves behind
        except ProcessLookupError:
            pass
    out = tmp_path / "killed.html"
    report = yolo_train("report", "--config", str(config), "--state-dir", str(state_dir), "-o", str(out))
    assert report.returncode == 0, report.stderr
    page = out.read_text()
    assert '<dd id="state">not running</dd>' in page and "history.db" not in page  # its history reads whole
    samples, problem = history.read(state_dir)
    assert problem is None and len(samples) >= 2

    db = StatePaths(state_dir).history
    with sqlite3.connect(db) as writer:  # as the next supervisor's first write does: the log into the file
        writer.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    with open(db, "r+b") as f:
        f.truncate(db.stat().st_size // 2)
    report = yolo_train("report", "--config", str(config), "--state-dir", str(state_dir), "-o", str(out))
    assert report.returncode == 0, report.stderr
    page = load(out, 'document.getElementById("missing").textContent')
    assert "history.db is damaged" in page.value and page.errors == [], page.value
    assert "missing:" in report.stdout
