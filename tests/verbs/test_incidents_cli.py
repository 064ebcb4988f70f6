"""``yolo-train incidents`` on a state directory as the supervisor leaves it: incidents.jsonl (the last line torn
by a kill mid-write) and the stacks of real hung processes captured by supervisor/host/stacks.py."""

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from supervisor.decision.model.incident import Incident, Kill, Loss
from supervisor.decision.model.incident import one_line
from supervisor.host.stacks import capture_tree, find_py_spy
from supervisor.state import state_file
from supervisor.state.incidents import load_incidents
from supervisor.state.paths import StatePaths
from supervisor.verbs.incidents import group_by_where
from supervisor.vocabulary import Reason

ROOT = Path(__file__).resolve().parents[2]
NIGHT = 1_700_000_000.0  # a fixed night: times in the output are checked against it


def cli(*args: str) -> subprocess.CompletedProcess:
    """The installed entry point, as a user runs it."""
    entry = Path(sys.executable).parent / "yolo-train"
    command = [str(entry)] if entry.exists() else [sys.executable, "-m", "supervisor"]
    return subprocess.run([*command, *args], capture_output=True, text=True, timeout=60, cwd=ROOT,
                          env={**os.environ, "TZ": "UTC"})


def incident(n: int, *, reason: str = "hang", phase: str = "train", rung: int = 0, when: float = NIGHT) -> dict:
    """An incident line as the supervisor writes it: the core's record, enriched by the shell, complete."""
    return Incident(
        id=f"{n}-{n}-{int(when)}", time=when, reason=Reason(reason), phase=phase, detail="no progress for 30 s",
        attempt=n, rung=rung, rung_label=f"workers={8 >> rung}", worker_pid=1000 + n, epoch=2, batch=17,
        seconds_since_progress=30.1, last_progress_wall=when - 30.1, loss=Loss(12.5, 25),
        processes=({"pid": 1000 + n, "ppid": 1, "name": "python", "state": "sleeping", "cpu_percent": 0.0,
                    "rss_bytes": 1 << 20, "cmdline": "python -m worker"},),
        output_tail=("Epoch 2/3 ...",), settings={"workers": 8 >> rung}, kill=Kill(1, 0.05, (), when + 1),
        restart_seconds=41.25).to_dict()


def hung_main_loop(state_dir: Path, record: dict, kind: str) -> None:
    """Hang a real process the way a training loop does and capture it where the agent would."""
    script = ("import sys\nfrom worker.supervision.faults import hang_forever, spin_forever\n"
              "def train_step():\n    print('hanging', flush=True)\n"
              f"    {'hang_forever' if kind == 'sleep' else 'spin_forever'}()\ntrain_step()\n")
    proc = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True, cwd=ROOT,
                            env={**os.environ, "PYTHONPATH": str(ROOT)})
    try:
        assert proc.stdout.readline().strip() == "hanging"
        time.sleep(0.2)
        capture_tree(proc.pid, [proc.pid], StatePaths(state_dir).incident_dir(record["id"]))
    finally:
        proc.kill()
        proc.wait()


@pytest.fixture
def night(tmp_path):
    """Five incidents: an old one without stacks, three sleeps in train_step at rungs 0-1, a spin, torn tail."""
    if find_py_spy() is None:
        pytest.skip("py-spy is installed with the project (make install)")
    records = [incident(1, phase="val", when=NIGHT),
               incident(2, rung=0, when=NIGHT + 3600), incident(3, rung=1, when=NIGHT + 7200),
               incident(4, rung=1, when=NIGHT + 9000), incident(5, rung=2, when=NIGHT + 10800)]
    for record in records[1:4]:
        hung_main_loop(tmp_path, record, "sleep")
    hung_main_loop(tmp_path, records[4], "spin")
    lines = [json.dumps(r) for r in records]
    (tmp_path / "incidents.jsonl").write_text("\n".join(lines) + "\n" + lines[0][:57])  # torn by a kill
    return tmp_path, records


def test_groups_by_where_it_hung(night):
    state_dir, records = night
    incidents = load_incidents(state_dir)
    assert [i["id"] for i in incidents] == [r["id"] for r in records]
    groups = group_by_where(incidents)
    assert [g.count for g in groups] == [3, 1, 1]
    sleep = groups[0]
    assert sleep.where.startswith("main in sleep at hang_forever (faults.py) < train_step"), sleep.where
    assert (sleep.first, sleep.last, sleep.rungs, sleep.phases) == (NIGHT + 3600, NIGHT + 9000, [0, 1],
                                                                   {"train": 3})
    assert groups[1].where.startswith("main running on CPU at spin_forever (faults.py)"), groups[1].where
    assert groups[2].where == "hang in val (no stacks)"
    assert one_line(incidents[-1]).startswith("hang in train at rung 2: main (pid "), one_line(incidents[-1])
    assert "spin_forever" in one_line(incidents[-1])


def test_cli_text_shows_groups_and_the_newest_in_full(night):
    state_dir, records = night
    result = cli("incidents", "--state-dir", str(state_dir))
    assert result.returncode == 0, result.stderr
    out = result.stdout
    assert out.startswith(f"5 incidents in {state_dir} (2023-11-14 22:13:20 to 2023-11-15 01:13:20), 3 places:")
    assert "  3  main in sleep at hang_forever (faults.py) < train_step" in out
    assert "23:13:20 .. 00:43:20   phase train x3   rung 0, 1   hang x3" in out
    assert "  1  hang in val (no stacks)" in out
    newest = out.split("newest: ", 1)[1]
    assert newest.startswith(f"{records[4]['id']} at 2023-11-15 01:13:20, hang in train (no progress for 30 s), "
                             "rung 2 (workers=2), epoch 2 batch 17, lost 25 batches, training again 41.2 s later")
    assert "\n  main (pid " in newest and ") running on CPU, " in newest and "spin_forever" in newest
    assert f"stacks: {StatePaths(state_dir).stacks(records[4]['id'])}" in newest


def test_cli_json(night):
    state_dir, records = night
    result = cli("incidents", "--json", "--state-dir", str(state_dir))
    assert result.returncode == 0, result.stderr
    data = json.loads(result.stdout)
    assert data["count"] == 5
    assert [g["count"] for g in data["groups"]] == [3, 1, 1]
    assert data["groups"][0]["ids"] == [r["id"] for r in records[1:4]]
    assert data["newest"]["id"] == records[4]["id"]
    assert data["newest"]["summary"][0].startswith("main (pid ")


def test_cli_without_incidents(tmp_path):
    result = cli("incidents", "--state-dir", str(tmp_path))
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == f"no incidents in {tmp_path}"
    assert json.loads(cli("incidents", "--json", "--state-dir", str(tmp_path)).stdout)["count"] == 0


def test_cli_bad_config_is_one_line(tmp_path):
    bad = tmp_path / "config.toml"
    bad.write_text("[watchdog]\nno_such_key = 1\n")
    result = cli("incidents", "--config", str(bad))
    assert result.returncode == 78
    assert len(result.stderr.strip().splitlines()) == 1 and str(bad) in result.stderr


def test_an_incident_line_with_a_time_no_clock_can_show_is_shown_with_a_question_mark(tmp_path):
    """A bad "time" (edited by hand, another tool's line) made `yolo-train incidents` a traceback."""
    lines = [{**incident(1), "time": "yesterday"}, {**incident(2), "time": 1e300}, {**incident(3), "time": [1]},
             incident(4)]
    (tmp_path / "incidents.jsonl").write_text("".join(json.dumps(line) + "\n" for line in lines)
                                              + '{"id": "5-5-0", "time": NaN, "reason": "hang"}\n')
    result = cli("incidents", "--state-dir", str(tmp_path))
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith(f"5 incidents in {tmp_path} (? to 2023-11-14 22:13:20)")
    assert "newest: 5-5-0 at ?, hang in ?" in result.stdout
    assert json.loads(cli("incidents", "--json", "--state-dir", str(tmp_path)).stdout)["count"] == 5


@pytest.mark.parametrize("verb", ["incidents", "check-config"])
def test_a_reader_that_stops_early_is_no_traceback(tmp_path, verb):
    """`yolo-train check-config | head`: the reader gone, the next print raised BrokenPipeError."""
    (tmp_path / "incidents.jsonl").write_text(json.dumps(incident(1)) + "\n")
    r, w = os.pipe()
    os.close(r)  # the reader is gone before the first line
    with os.fdopen(w, "w") as gone:
        result = subprocess.run([sys.executable, "-m", "supervisor", verb, "--state-dir", str(tmp_path)]
                                if verb == "incidents" else [sys.executable, "-m", "supervisor", verb], stdout=gone,
                                stderr=subprocess.PIPE, text=True, timeout=60, cwd=ROOT)
    assert (result.returncode, result.stderr) == (0, "")


def test_the_newest_incident_not_written_yet_is_shown_from_the_state_file_once(tmp_path):
    """Issue 59.2: a hang's incident is written once its batches after the recovery are counted; until then (or
    where its supervisor was killed first) `yolo-train incidents` shows it from the state file's status, marked
    pending, and never twice once written."""
    (tmp_path / "incidents.jsonl").write_text(json.dumps(incident(1)) + "\n")
    state_file.write(tmp_path, {"version": state_file.VERSION, "status": {"last_incident": incident(2)}})
    shown = load_incidents(tmp_path)
    assert [(i["id"], i.get("pending")) for i in shown] == [(incident(1)["id"], None), (incident(2)["id"], True)]
    result = cli("incidents", "--state-dir", str(tmp_path))
    assert result.returncode == 0 and result.stdout.startswith(f"2 incidents in {tmp_path}"), result.stdout
    state_file.write(tmp_path, {"version": state_file.VERSION, "status": {"last_incident": incident(1)}})
    assert [i["id"] for i in load_incidents(tmp_path)] == [incident(1)["id"]]
