"""The agent's loop reads what the last decision left to watch (``Supervision.watch``): a real supervisor trains a real
loop to its end, and the stall is judged once per decision and never in a loop turn outside ``decide`` (issue 60.1)."""

import json
import os
import subprocess
import sys

from tests.agent.test_agent_shell import QUICK_LOOP
from tests.helpers import ROOT
from tests.helpers.supervised import quiet_config, worker_launcher

COUNTED = """
import atexit, json, runpy, sys
import supervisor.decision as decision
from supervisor.decision.stall import watchdog

counts = {{"decisions": 0, "in_decide": 0, "outside": 0}}
inside = [False]
judge, decide = watchdog.current_stall, decision.decide


def counted(s, own_stacks):
    counts["in_decide" if inside[0] else "outside"] += 1
    return judge(s, own_stacks)


def decided(s, event, now):
    inside[0], counts["decisions"] = True, counts["decisions"] + 1
    try:
        return decide(s, event, now)
    finally:
        inside[0] = False


watchdog.current_stall, decision.decide = counted, decided
atexit.register(lambda: open({out!r}, "w").write(json.dumps(counts)))
sys.argv = ["yolo-train", *sys.argv[1:]]
runpy.run_module("supervisor", run_name="__main__")
"""


def test_a_supervised_training_judges_its_stall_once_a_decision_and_never_between(write_config, tmp_path):
    out = tmp_path / "counts.json"
    script = tmp_path / "counted.py"
    script.write_text(COUNTED.format(out=str(out)))
    config = write_config(f"""
        [train]
        epochs = 1
        [worker]
        python = "{worker_launcher(tmp_path, QUICK_LOOP)}"
    """, quiet_config())
    result = subprocess.run([sys.executable, str(script), "run", "--config", str(config), "--state-dir",
                             str(tmp_path / "state")], capture_output=True, text=True, timeout=120, cwd=ROOT,
                            env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert result.returncode == 0, result.stderr[-2000:]
    counts = json.loads(out.read_text())
    assert counts["decisions"] > 30  # a heartbeat each batch, and the rest
    assert counts["in_decide"] == counts["decisions"] and counts["outside"] == 0, counts
