"""The agent's own duties around the core, with a real supervisor and a stand-in worker: metrics stay optional."""

import re
import socket

from tests.helpers import ROOT
from tests.helpers.supervised import quiet_config, read_state, worker_launcher, yolo_train

LOOP = """
import time
from worker.heartbeat import Heartbeat

hb = Heartbeat.from_env()
hb.phase("train", epoch=1, epochs=1, batch=0, batches={batches})
for i in range({batches}):
    time.sleep({step})
    hb.beat(epoch=1, epochs=1, batch=i + 1, batches={batches}, samples=4)
hb.phase("done")
"""
QUICK_LOOP = LOOP.format(batches=30, step=0.02)


def run_quick_loop(write_config, tmp_path, listen: str):
    """A short training under a real supervisor whose metrics listen on ``listen``."""
    config = write_config(f"""
        [train]
        epochs = 1
        [worker]
        python = "{worker_launcher(tmp_path, QUICK_LOOP)}"
    """, quiet_config(listen=listen))
    return yolo_train("run", "--config", str(config), "--state-dir", str(tmp_path / "state"),
                      env={"PYTHONPATH": str(ROOT)}, timeout=120)


def test_a_busy_metrics_port_is_a_warning_and_training_goes_on(write_config, tmp_path):
    holder = socket.create_server(("127.0.0.1", 0))  # someone else listens on the configured port
    port = holder.getsockname()[1]
    try:
        result = run_quick_loop(write_config, tmp_path, f"127.0.0.1:{port}")
    finally:
        holder.close()
    assert result.returncode == 0, result.stderr[-2000:]
    assert f"127.0.0.1:{port}': cannot listen" in result.stderr and "training goes on without metrics" in result.stderr
    status = read_state(tmp_path / "state")["status"]
    assert status["state"] == "succeeded" and status["metrics_bind_failures"] >= 1


SLOW_LOOP = LOOP.format(batches=10, step=0.5)  # 5 s of training, a beat every 0.5 s: the supervisor mostly waits


def waiting_in_its_loop(pid: int) -> bool:
    """Whether the supervisor's main thread sleeps in its selector (epoll) right now: a pause is measured around that
    wait, so the test stops it there (a stop amid the handling of a beat goes unmeasured: see agent.PAUSE_GAP)."""
    try:
        with open(f"/proc/{pid}/wchan") as f:
            return f.read() in ("do_epoll_wait", "ep_poll")
    except OSError:
        return False


def test_a_supervisor_stopped_for_longer_than_the_stall_timeout_blames_no_one(write_config, tmp_path):
    """SIGSTOP the supervisor itself past the 10 s stall timeout while the worker finishes: no incident, exit 0."""
    import os
    import signal
    import subprocess
    import sys
    import time

    config = write_config(f"""
        [train]
        epochs = 1
        [worker]
        python = "{worker_launcher(tmp_path, SLOW_LOOP)}"
    """, quiet_config())
    state_dir = tmp_path / "state"
    proc = subprocess.Popen([sys.executable, "-m", "supervisor", "run", "--config", str(config), "--state-dir",
                             str(state_dir)], cwd=ROOT, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "PYTHONPATH": str(ROOT)})
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            try:
                if read_state(state_dir)["status"]["state"] == "healthy":
                    break
            except (OSError, ValueError, KeyError):
                pass
            time.sleep(0.1)
        while not waiting_in_its_loop(proc.pid) and time.monotonic() < deadline:
            time.sleep(0.001)
        os.kill(proc.pid, signal.SIGSTOP)
        time.sleep(13)  # the worker finishes (5 s) and waits on its exit; 13 s > the auto stall timeout (10 s)
        os.kill(proc.pid, signal.SIGCONT)
        _, stderr = proc.communicate(timeout=60)
    finally:
        proc.kill()
    assert proc.returncode == 0, stderr[-2000:]
    status = read_state(state_dir)["status"]
    assert status["state"] == "succeeded" and status["restarts"] == 0 and status["last_incident"] is None
    assert "the supervisor itself did not run" in stderr


def test_check_config_and_the_logs_show_a_rungs_environment_by_name_only(write_config):
    config = write_config("""
        [train]
        epochs = 1
        [ladder]
        rungs = [{ env = { WANDB_API_KEY = "s3cr3t-value" } }]
    """)
    result = yolo_train("check-config", "--config", str(config))
    assert result.returncode == 0 and "rung 1: env=WANDB_API_KEY" in result.stdout
    assert "s3cr3t-value" not in result.stdout + result.stderr


def test_a_supervisor_started_with_its_standard_streams_closed_trains_to_the_end(write_config, tmp_path):
    """`yolo-train run ... 2>&-`: Python leaves sys.stderr None, the first line forwarded raised, and the
    supervisor exited 1 without a word."""
    import os
    import subprocess
    import sys

    (tmp_path / "steps.py").write_text('import time\nfor i in range(3):\n    print(f"step {i + 1}/3", flush=True)\n'
                                       '    time.sleep(0.2)\n')
    config = write_config(f"""
        [worker]
        command = ["python", "{tmp_path / 'steps.py'}"]
        [progress]
        regex = 'step (?P<batch>\\d+)/(?P<batches>\\d+)'
    """, quiet_config())
    result = subprocess.run([sys.executable, "-m", "supervisor", "run", "--config", str(config), "--state-dir",
                             str(tmp_path / "state")], cwd=ROOT, timeout=60,
                            preexec_fn=lambda: [os.close(fd) for fd in (0, 1, 2)])
    assert result.returncode == 0
    assert read_state(tmp_path / "state")["status"]["state"] == "succeeded"


def test_listen_on_port_0_logs_the_port_bound(write_config, tmp_path):
    result = run_quick_loop(write_config, tmp_path, "127.0.0.1:0")
    assert result.returncode == 0, result.stderr[-2000:]
    [port] = re.findall(r"metrics: http://127\.0\.0\.1:(\d+)/metrics", result.stderr)
    assert int(port) > 0
