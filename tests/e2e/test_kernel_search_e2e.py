"""MIOpen's kernel search under the real supervisor: a [worker] command that prints the search's lines (in MIOpen's
own format, tests/fixtures/miopen/search.log) on stderr before its first batch. Its first attempt goes silent after
three lines and is killed at ``startup_timeout``, the incident naming the search; its second prints for more than
twice ``startup_timeout`` without a first batch, is not killed, and trains to its end."""

from tests.helpers import ROOT
from tests.helpers.supervised import quiet_config, read_incidents, read_state, yolo_train

STARTUP_TIMEOUT = 3

SEARCHING = f"""
import sys, time
from pathlib import Path
sys.path.insert(0, {str(ROOT)!r})
from worker.heartbeat import Heartbeat

marker = Path("attempted")
first = not marker.exists()
marker.touch()
say = lambda text: print("MIOpen(HIP): Warning [SearchImpl] " + text, file=sys.stderr, flush=True)
say("Searching the best solution in the 9 dim space. Please, be patient...")
began, left = time.monotonic(), 5000
# The first attempt falls silent after three lines; the second searches for twice the step's bound, a line every
# 0.2 s (its own clock: the precondition holds however slow the machine is).
while (left > 4975) if first else (time.monotonic() - began < 2 * {STARTUP_TIMEOUT} + 1):
    left -= 1
    say(f"Runs left: {{left}}, min time so far: 0.250881, curr time: 0.301442 32,16,32,16,2,1,4,3,2")
    time.sleep(0.2)
if first:
    time.sleep(3600)  # the search's next candidate never returns
hb = Heartbeat.from_env()
hb.phase("train")
for batch in range(1, 11):
    time.sleep(0.05)
    hb.beat(epoch=1, epochs=1, batch=batch, batches=10)
"""


def test_a_search_that_prints_keeps_its_step_and_one_that_goes_silent_is_killed_naming_it(write_config, tmp_path):
    script = tmp_path / "searching.py"
    script.write_text(SEARCHING)
    config = write_config(f"""
        [worker]
        command = ["python", "{script}"]
        cwd = "{tmp_path}"
        [watchdog]
        startup_timeout = {STARTUP_TIMEOUT}
        [restart]
        backoff_initial = 0.5
    """, quiet_config())
    state_dir = tmp_path / "state"
    result = yolo_train("run", "--config", str(config), "--state-dir", str(state_dir), timeout=120)
    assert result.returncode == 0, result.stderr[-3000:]
    final = read_state(state_dir)["status"]
    assert (final["state"], final["batch"], final["attempt"]) == ("succeeded", 10, 2)
    [silent] = read_incidents(state_dir)  # the second attempt searched for 7 s and more: never killed
    assert (silent["reason"], silent["phase"], silent["startup_step"]) == ("hang", "startup", "imports")
    assert silent["kernel_search"].startswith("MIOpen search, 4975 runs left (26 lines), silent for ")
    assert "a kernel search went silent" in silent["detail"]
