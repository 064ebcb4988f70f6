"""Issue 50 in real supervised runs: what the witness cannot speak through, and a kernel search's lines once training.

- a callback's 1.2 s of Python (the witness puts it at one place), then 6 s in which the training process holds the
  GIL and works (its switch interval raised: the witness thread cannot run, as under ``pickle.dumps`` of a large
  object): work until the phase's own bound, never "held at one place";
- an idle training process held by a C call that keeps the GIL (libc's ``sleep`` through ``ctypes.PyDLL``) at an
  epoch's end: a hang at ``idle_floor``, its incident naming the frame the stacks saw, not the witness's last word;
- MIOpen's search (its own lines, tests/fixtures/miopen/search.log) mid-epoch and at validation's first batch, each
  longer than the phase's bound: its lines are news, nothing is killed.

Each stretch is timed by the worker's own clock: the preconditions hold however slow the machine is.
"""

import sys
from pathlib import Path

from tests.helpers import ROOT
from tests.helpers.supervised import quiet_config, read_incidents, read_state, witnessed_loop, yolo_train

FIXTURE = Path(__file__).parent.parent / "fixtures" / "miopen" / "search.log"

SPIN = """
def spin(seconds):
    until = time.monotonic() + seconds
    while time.monotonic() < until:
        pass
"""

# the callback: 1.2 s of Python at one place, then 6 s of work holding the GIL
GIL_HELD_WORK = witnessed_loop(60, "step == 30", SPIN + """
spin(1.2)
sys.setswitchinterval(60)  # no other thread runs until it is set back: the witness cannot speak
spin(6.0)
sys.setswitchinterval(0.005)
""")


def run(write_config, tmp_path: Path, script: str, watchdog: str, timeout: float = 180):
    (tmp_path / "train.py").write_text(script)
    config = write_config(f'[worker]\ncommand = ["{sys.executable}", "train.py"]\ncwd = "{tmp_path}"\n'
                          f'[restart]\nbackoff_initial = 0.5\n[watchdog]\n{watchdog}\n', quiet_config())
    result = yolo_train("run", "--config", str(config), "--state-dir", str(tmp_path / "state"), timeout=timeout)
    assert result.returncode == 0, result.stderr[-3000:]
    return read_state(tmp_path / "state")["status"], read_incidents(tmp_path / "state")


def test_a_callback_that_holds_the_gil_while_it_works_is_not_killed_as_held_at_one_place(write_config, tmp_path):
    """Killed at idle_floor as "held at one place (<listcomp>)" before: the witness's last word stood for a stretch
    it could not speak through. The tree is busy: the phase's own bound (10 s) holds."""
    status, incidents = run(write_config, tmp_path, GIL_HELD_WORK, "idle_floor = 4")
    assert incidents == []
    assert (status["state"], status["attempt"], status["restarts"]) == ("succeeded", 1, 0)


# the end of epoch 1 of 2: 1.2 s of Python, then a C call that keeps the GIL and sleeps, in the first attempt only
GIL_HELD_ASLEEP = f"""
import ctypes, os, sys, time
sys.path.insert(0, {str(ROOT)!r})
from worker.heartbeat import Heartbeat
{SPIN}
hb = Heartbeat.from_env(witness=True)
for epoch in (1, 2):
    hb.phase("train")
    for batch in range(1, 11):
        spin(0.03)
        hb.beat(epoch=epoch, epochs=2, batch=batch, batches=10)
    hb.phase("save")
    spin(1.2)
    if not os.path.exists("hung"):
        open("hung", "w").close()
        ctypes.PyDLL(None).sleep(3600)  # libc's sleep, the GIL held: the whole tree idle, the witness silent
hb.phase("done")
"""


def test_an_idle_tree_held_by_a_c_call_at_an_epochs_end_is_found_at_the_idle_floor_naming_the_stacks_frame(
        write_config, tmp_path):
    """Found at the epoch end's own bound before (save_timeout here, 30 s; 25 s in the issue, 10 x the slowest
    batch): an idle tree whose training process keeps the GIL is a hang at idle_floor (3 s) from its idleness."""
    status, incidents = run(write_config, tmp_path, GIL_HELD_ASLEEP, "save_timeout = 30")
    assert (status["state"], status["attempt"]) == ("succeeded", 2)
    [hang] = incidents
    assert (hang["reason"], hang["phase"]) == ("hang", "save")
    assert hang["seconds_since_progress"] < 12, hang["detail"]  # its idleness read within a second or two, then 3 s
    assert "spin" not in hang["witness"] and "held at one place" not in hang["detail"]
    assert hang["witness"].startswith("the training process's witness said nothing for the last")
    assert "the training thread idle" in hang["witness"]
    assert "the stacks saw: " in hang["witness"] and hang["where"] in hang["witness"]


SEARCH_LINES = [line for line in FIXTURE.read_text().splitlines() if line.startswith("MIOpen(")]

# MIOpen's search at a batch mid-epoch and at validation's first batch: each 6 s (twice the phase's 3 s bound), a
# line every 0.5 s on stderr, the main thread timing candidates in one place between them (as in a convolution)
SEARCHING = f"""
import sys, time
sys.path.insert(0, {str(ROOT)!r})
from worker.heartbeat import Heartbeat
LINES = {SEARCH_LINES!r}
{SPIN}
def search():
    began = time.monotonic()
    k = 0
    while time.monotonic() - began < 6.0:
        print(LINES[k % len(LINES)], file=sys.stderr, flush=True)
        k += 1
        spin(0.5)
hb = Heartbeat.from_env(witness=True)
hb.phase("train")
for batch in range(1, 41):
    spin(0.03)
    if batch == 20:
        search()
    hb.beat(epoch=1, epochs=1, batch=batch, batches=40)
hb.phase("val")
search()
for batch in range(1, 6):
    spin(0.03)
    hb.beat(epoch=1, epochs=1, batch=batch, batches=5)
hb.phase("done")
"""


def test_a_search_that_prints_mid_epoch_and_at_validations_first_batch_is_not_killed(write_config, tmp_path):
    """Killed at the phase's bound before (train auto 12.7 s, val auto 10 s in the issue; 3 s here), and again at the
    same point in the next attempt: a search's lines are news in every phase, bounded as a search (startup_timeout)."""
    status, incidents = run(write_config, tmp_path, SEARCHING, "auto_floor = 3\nstartup_timeout = 5")
    assert incidents == []
    assert (status["state"], status["attempt"], status["restarts"]) == ("succeeded", 1, 0)


# py-spy as the supervisor runs it, made slow: it first ends the training process's wait (a byte down the FIFO the
# wait reads), then takes 2 s before the real py-spy reads the stacks. The wait ends during the reading by construction.
SLOW_PY_SPY = """#!/bin/sh
python3 - "{fifo}" <<'END'
import os, sys
try:
    fd = os.open(sys.argv[1], os.O_WRONLY | os.O_NONBLOCK)
    os.write(fd, b"x")
    os.close(fd)
except OSError:
    pass
END
sleep 2
exec "{real}" "$@"
"""


def test_a_wait_that_ends_while_its_stacks_are_read_is_not_killed(tmp_path):
    """A 6 s GIL-held wait got its verdict, ended 0.8 s later while its stacks were read, and was killed 2.8 s after
    it ended. The loop (tests/fixtures/loader_loop.py, our worker's contract, its loader workers reported: the
    in-place tier reads the stacks first) waits in a GIL-held read until py-spy runs: the batch that follows comes
    while the stacks are read, and drops the verdict."""
    import json
    import os
    import subprocess

    from tests.helpers.supervised import demo_train, python_without_py_spy, worker_launcher
    from worker.training.trainer import RECORD_FED_ENV

    fifo, tools = tmp_path / "wait.fifo", tmp_path / "tools"
    os.mkfifo(fifo)
    tools.mkdir()
    (tools / "py-spy").write_text(SLOW_PY_SPY.format(fifo=fifo, real=Path(sys.executable).parent / "py-spy"))
    (tools / "py-spy").chmod(0o755)
    plan = {"hang": "main_gil_fifo", "path": str(fifo), "attempt": 1, "epoch": 1, "batch": 5}
    launcher = worker_launcher(tmp_path, f"import runpy, sys\nsys.path.insert(0, {str(ROOT)!r})\n"
                                         f"runpy.run_path({str(ROOT / 'tests' / 'fixtures' / 'loader_loop.py')!r}, "
                                         f"run_name='__main__')\n")
    (tmp_path / "marks").mkdir()
    config = tmp_path / "config.toml"
    config.write_text(f'name = "loader-loop"\n{demo_train(epochs=2)}{quiet_config()}'
                      f'[worker]\npython = "{launcher}"\n'
                      f"env = {{ LOADER_LOOP = '{json.dumps(plan)}', LOADER_LOOP_MARKS = '{tmp_path / 'marks'}' }}\n"
                      f"[incidents]\nstacks_budget = 8\n")
    state_dir = tmp_path / "state"
    env = {**os.environ, "PATH": f"{tools}:/usr/bin:/bin", RECORD_FED_ENV: str(tmp_path / "fed.txt")}
    result = subprocess.run([str(python_without_py_spy(tmp_path)), "-m", "supervisor", "run", "--config", str(config),
                             "--state-dir", str(state_dir)], cwd=ROOT, env=env, capture_output=True, text=True,
                            timeout=150)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "no hang, nothing killed" in result.stderr  # the verdict came, and was dropped
    assert read_incidents(state_dir) == []
    status = read_state(state_dir)["status"]
    assert (status["state"], status["attempt"], status["restarts"]) == ("succeeded", 1, 0)
