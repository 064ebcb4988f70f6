"""The rank that hung is named (issues 49.1, 49.3), in real processes: Ultralytics' DDP path under
torch.distributed.run, two gloo ranks on the CPU (``YOLO_TRAIN_CPU_RANKS``). Rank 1's training process blocks on a
lock or spins in Python, made from outside the project (bench/hangs.py's sitecustomize: a SIGUSR2 handler), while
rank 0 comes to wait for rank 1's gradients in DDP's backward all-reduce (or another collective). Rank 1 is named in
``status --json`` and in the incident, every time; the rung choice weighs rank 1's word (no rung changes either)."""

import os
import subprocess
import sys

import pytest

from bench.hangs import Hangs
from tests.helpers import ROOT
from tests.helpers.supervised import DDP_CONFIG, read_incidents, status_of, wait_for

# The stall's bound long and fixed (no idle floor): the ranks' words stand in status --json long before the verdict.
WATCHDOG = "stall_timeout = 20\nidle_floor = \"off\"\n"

HANGS = {  # bench/hangs.py's kind -> (rank 1's waiting_kind, its phrase in the incident, the rung choice's words)
    "main_blocked": ("lock", "rank 1 waits on a lock", "no rung changes it"),
    "main_spinning": ("elsewhere", "rank 1 waits in no known wait at", "a loop of its own: no rung changes it"),
}


@pytest.mark.e2e
@pytest.mark.parametrize("kind", HANGS)
def test_rank_1_hung_on_its_own_is_named_over_rank_0_waiting_for_its_gradients(kind, write_config, tmp_path,
                                                                                  monkeypatch):
    waiting_kind, phrase, why = HANGS[kind]
    monkeypatch.setenv("PYTHONPATH", str(ROOT))
    hangs = Hangs.install(tmp_path)  # on this process's PYTHONPATH: the supervisor's and its ranks'
    state_dir = tmp_path / "state"
    # epochs enough that the hang lands in training however fast this machine is (the test ends at the restart)
    config = write_config(DDP_CONFIG.format(extra_env="").replace("[watchdog]\n", "[watchdog]\n" + WATCHDOG)
                          .replace("epochs = 3\n", "epochs = 100\n"))
    with open(tmp_path / "supervisor.err", "w") as err:
        supervisor = subprocess.Popen([sys.executable, "-m", "supervisor", "run", "--config", str(config),
                                       "--state-dir", str(state_dir)], cwd=ROOT, stdout=subprocess.DEVNULL,
                                      stderr=err, env=dict(os.environ))
        try:
            def training() -> dict | None:  # both ranks train, past the first epoch's checkpoint
                s = status_of(state_dir)
                return s if s and s["state"] == "healthy" and s["phase"] == "train" and len(s["ranks"]) == 2 \
                    and (s["epoch"], s["batch"]) >= (2, 1) and all(r["pid"] for r in s["ranks"]) else None

            ranks = {r["rank"]: r["pid"] for r in wait_for(training, 240, "both ranks training")["ranks"]}
            assert hangs.make(kind, ranks[1])

            def both_said() -> dict | None:  # rank 1's word and rank 0's, before any verdict (20 s away)
                s = status_of(state_dir)
                words = {r["rank"]: r["waiting_kind"] for r in ((s or {}).get("watchdog") or {}).get("ranks", [])}
                return s if words.get(1) == waiting_kind and words.get(0) == "collective" else None

            watchdog = wait_for(both_said, 60, "rank 1's and rank 0's words in status --json")["watchdog"]
            assert watchdog["hung_rank"] == 1, watchdog
            # the verdict's incident, then the restart's log line that says where the ladder stands and why
            wait_for(lambda: "counts against no rung" in (tmp_path / "supervisor.err").read_text(), 120, "the rung")
        finally:
            supervisor.terminate()
            supervisor.wait(60)
    [incident] = read_incidents(state_dir)[:1]
    assert incident["hung_rank"] == 1, incident.get("witness")
    first, second = incident["witness"].split("; ")
    assert first.startswith(phrase) and "sitecustomize.py" in first, incident["witness"]
    assert second.startswith("rank 0 waits in ") and second.endswith("for rank 1"), incident["witness"]
    assert [(r["rank"], r["waiting_kind"]) for r in incident["ranks"]] == [(0, "collective"), (1, waiting_kind)]
    log = (tmp_path / "supervisor.err").read_text()
    assert any(phrase in line and why in line and "counts against no rung" in line for line in log.splitlines()), \
        log[-3000:]
