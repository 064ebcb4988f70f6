"""A real supervisor as a user runs it, and what it leaves: the CLI in a subprocess, a stand-in worker, the configs
the supervised tests write (the demo's [train] table, ``quiet_config``, the end-to-end tests' config), the state file
and the incidents, waiting on a run's status."""

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import psutil

from bench.harness import quiet_sections, to_toml
from tests.helpers import ROOT


def demo_train(epochs: int = 3, plots: bool = False) -> str:
    """The [train] table the end-to-end tests train: the embedded demo (8 batches an epoch) at 64 px on the CPU."""
    return (f'[train]\ndata = "demo"\nmodel = "yolov8n.yaml"\nepochs = {epochs}\nimgsz = 64\nbatch = 4\n'
            f'workers = 2\ndevice = "cpu"\nplots = {str(plots).lower()}\n')


def quiet_config(kernel_log: str = "off", listen: str = "off") -> str:
    """The sections that keep a supervised test to itself: no metrics endpoint (tests run two at a time and would
    race for a port), no kernel log (``kernel_log = "kmsg"`` for the tests of it: the machine's /dev/kmsg is shared)
    and no udev GPU events. TOML text that ends inside [kernel_log]."""
    sections = quiet_sections(kernel_log)  # the benches' own (bench/harness.py), with the metrics' listen to choose
    sections["metrics"]["listen"] = listen
    return to_toml(sections)


# The end-to-end tests' config (tests/conftest.py's ``demo_config`` writes it).
# [ladder] prior_between_hangs = "off": rungs judged on their own hangs alone, so one hang a few seconds in climbs
# whether or not its rung's speed was measured first; these tests are about what a climb does, the choice rule itself
# is tested in the pure core (tests/decision/learning/test_hang_learning.py).
E2E_CONFIG = """
name = "e2e"
{train}{quiet}[watchdog]
startup_timeout = {startup}
[restart]
{restart}
[ladder]
prior_between_hangs = "off"
"""


def witnessed_loop(steps: int, at_step: str, then: str, imports: str = "os, sys, threading, time",
                    done: bool = True) -> str:
    """A plain training loop's script under our heartbeat client with its witness on: ``steps`` steps of 0.03 s of
    work, each beaten as a batch; after the step where ``at_step`` holds (an expression of ``step``), ``then`` runs
    (a hang, a wait: indented as the loop's body). ``done``: it says training is done at its end."""
    body = "\n".join("        " + line if line else line for line in then.strip("\n").splitlines())
    return f"""
import {imports}
sys.path.insert(0, {str(ROOT)!r})
from worker.heartbeat import Heartbeat
hb = Heartbeat.from_env(witness=True)
hb.phase("train")
for step in range(1, {steps + 1}):
    until = time.monotonic() + 0.03
    while time.monotonic() < until:  # a step of work
        pass
    hb.beat(epoch=1, epochs=1, batch=step, batches={steps})
    if {at_step}:
{body}
""" + ('hb.phase("done")\n' if done else "")


# What a stand-in leaves at its end: the run directory's weights/last.pt of its launch record (the last argument).
STAND_IN_WEIGHTS = """
import json as _json, sys as _sys, zipfile as _zipfile
from pathlib import Path as _Path
_train = _json.loads(_Path(_sys.argv[-1]).read_text())["train"]
(_Path(_train["project"]) / _train["name"] / "weights").mkdir(parents=True, exist_ok=True)
with _zipfile.ZipFile(_Path(_train["project"]) / _train["name"] / "weights" / "last.pt", "w") as _archive:
    _archive.writestr("last/data.pkl", b"\\x80\\x02}q\\x00.")
"""


def worker_launcher(tmp_path: Path, script: str) -> Path:
    """An executable that runs `script` (Python source) with the arguments the supervisor gives
    `[worker] python`: a stand-in for the Ultralytics worker. Started as a standby (`-m worker --standby`) it keeps
    the contract's part: it waits for the launch record's path on stdin, and exits 0 at its end. A script that runs to
    its end leaves its weights, as ours does (a last.pt in torch.save's archive layout): a training that ends with none
    is no success (exit 73)."""
    source = tmp_path / "stand_in_worker.py"
    source.write_text(script + STAND_IN_WEIGHTS)
    launcher = tmp_path / "launcher"
    launcher.write_text('#!/bin/sh\n'
                        'if [ "$3" = "--standby" ]; then read -r record || exit 0; set -- "$1" "$2" "$record"; fi\n'
                        f'exec {sys.executable} {source} "$@"\n')
    launcher.chmod(0o755)
    return launcher


# The real worker with a user's Ultralytics callbacks registered before the trainer is made, as a user adds them
# (``default_callbacks``): `[worker] python` names the executable ``callbacks_worker`` writes.
CALLBACKS_LAUNCHER = """#!{python}
import os, runpy, sys
os.environ.setdefault("YOLO_OFFLINE", "1")
os.environ.setdefault("MPLBACKEND", "Agg")
sys.path.insert(0, {root!r})
sys.path.insert(0, {here!r})
import {module}  # noqa: F401  (the user's callbacks)
sys.argv = [sys.argv[0], *sys.argv[3:]]  # as `python -m worker ARGS`
runpy.run_module("worker", run_name="__main__", alter_sys=True)
"""


def callbacks_worker(tmp_path: Path, module: str, source: str) -> Path:
    """An executable for `[worker] python` that runs the real worker after importing `source` as `module`."""
    (tmp_path / f"{module}.py").write_text(source)
    launcher = tmp_path / "launcher"
    launcher.write_text(CALLBACKS_LAUNCHER.format(python=sys.executable, root=str(ROOT), here=str(tmp_path),
                                                  module=module))
    launcher.chmod(0o755)
    return launcher


def yolo_train(*args: str, timeout: float = 300, env: dict | None = None) -> subprocess.CompletedProcess:
    """The real CLI in a subprocess, as a user runs it."""
    return subprocess.run([sys.executable, "-m", "supervisor", *args], capture_output=True, text=True,
                          timeout=timeout, cwd=ROOT, env={**os.environ, **(env or {})})


def start_supervisor(config, state_dir, *extra, env=None):
    """``yolo-train run`` left running, its output on pipes."""
    return subprocess.Popen([sys.executable, "-m", "supervisor", "run", "--config", str(config), "--state-dir",
                             str(state_dir), *extra], cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, env=None if env is None else {**os.environ, **env})


def read_state(state_dir: Path) -> dict:
    return json.loads((state_dir / "supervisor.json").read_text())


def read_incidents(state_dir: Path) -> list[dict]:
    """incidents.jsonl's lines, then the newest incident not written yet, as the state file's status has it: a run
    stopped by SIGKILL leaves the incident whose batches after were still being counted only there (``pending``)."""
    path = state_dir / "incidents.jsonl"
    written = [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []
    try:
        last = read_state(state_dir)["status"].get("last_incident")
    except (OSError, ValueError, KeyError):
        last = None
    if last and last["id"] not in {i["id"] for i in written}:
        written.append({**last, "pending": True})
    return written


def status_of(state_dir):
    """The status of a running supervisor, or None while its state file is missing or being replaced."""
    try:
        return read_state(state_dir)["status"]
    except (FileNotFoundError, ValueError, KeyError):
        return None


def wait_for(predicate, timeout=180, what="condition"):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.2)
    raise AssertionError(f"timed out waiting for {what}")


def assert_finished(state_dir, result, epochs=3):
    assert result.returncode == 0, result.stderr[-3000:]
    # The last save is verified while Ultralytics strips last.pt at its end: that rewrite must never look torn.
    assert "not a usable checkpoint" not in result.stderr, result.stderr[-3000:]
    status = read_state(state_dir)["status"]
    assert status["state"] == "succeeded"
    assert (status["epoch"], status["epochs"]) == (epochs, epochs)
    assert (state_dir / "train" / "weights" / "best.pt").exists()
    return status


LOADER_RUNG_CONFIG = """
name = "{name}"
{train}{quiet}[recovery]
in_place = false  # this test's point is the restart path
[watchdog]
startup_timeout = 90
[restart]
backoff_initial = 0.5
[ladder]
rungs = [{rung}]
"""


def climb_to_loader_rung(tmp_path: Path, name: str, rung: str) -> tuple[dict, dict, dict]:
    """The demo (``workers = 2``) with one ladder rung, ``rung`` (TOML): attempt 1's training loop hangs after its
    first batch (one training beat: rung 0's speed is never measured, so any rule climbs, rung_choice.py), attempt 2's
    loader hangs at that rung after batch 2 (inside the epoch of 8, never at its end), and attempt 3 finishes there:
    rung 0, never measured, keeps nothing. The final status and the two incidents, after checking that the run
    succeeded with two hangs in training at rungs 0 and 1."""
    config = tmp_path / "config.toml"
    config.write_text(LOADER_RUNG_CONFIG.format(name=name, train=demo_train(), quiet=quiet_config(), rung=rung))
    state_dir = tmp_path / "state"
    result = yolo_train("run", "--config", str(config), "--state-dir", str(state_dir),
                        "--fault", "main_hang,at_batch=1,attempt=1",
                        "--fault", "dataloader_hang,at_batch=2,attempt=2")
    assert result.returncode == 0, result.stderr[-3000:]
    status = read_state(state_dir)["status"]
    assert status["state"] == "succeeded" and (status["epoch"], status["epochs"]) == (3, 3)
    assert (state_dir / "train" / "weights" / "best.pt").exists()
    assert status["rung"] == 1 and status["attempt"] == 3
    first, second = read_incidents(state_dir)
    assert (first["reason"], first["phase"], first["rung"]) == ("hang", "train", 0), first
    assert (second["reason"], second["phase"], second["rung"]) == ("hang", "train", 1), second
    return status, first, second


# Several GPUs on the CPU (worker/distributed/ddp.py's CPU drill): two gloo ranks of the demo, as tests/worker/test_ddp.py and
# the in-place tier under DDP (tests/decision/recovery/test_in_place.py) supervise them.
DDP_CONFIG = """
name = "ddp"
[train]
data = "demo"
model = "yolov8n.yaml"
epochs = 3
imgsz = 64
batch = 8
workers = 1
device = "cpu"
plots = false
[worker]
env = {{ YOLO_TRAIN_CPU_RANKS = "2"{extra_env} }}
""" + quiet_config() + """[recovery]
in_place = false  # this test's point is the restart path
[watchdog]
startup_timeout = 120
[restart]
backoff_initial = 0.5
"""

EXAMPLES = ROOT / "examples"


def copy_example(name: str, tmp_path: Path, extra: str = "", step_delay: float = 0.0) -> Path:
    """The example in a directory of its own (its checkpoints are written beside its config), kernel log off.

    ``step_delay`` slows each step down: unslowed, an example trains its 120 steps in about a second on a quiet
    machine, so a freeze sent once a checkpoint is seen can land after the last step instead of inside training."""
    shutil.copytree(EXAMPLES / name, tmp_path / name, ignore=shutil.ignore_patterns("checkpoints"))
    config = tmp_path / name / "yolo-train.toml"
    text = config.read_text()
    if step_delay:
        assert '"--save-every", "10"' in text
        text = text.replace('"--save-every", "10"', f'"--save-every", "10", "--step-delay", "{step_delay}"')
    config.write_text(text + "\n" + quiet_config() + extra)
    return config


def sources_for_nobody() -> Path:
    """A world-readable copy of the project's packages and psutil, for a test that runs Python as user nobody: the
    checkout and its venv may sit where nobody cannot read them (a clone in /root, a 0700 home). The directory is
    removed at exit; pass it as PYTHONPATH and cwd."""
    import atexit
    import tempfile

    import psutil

    copy = Path(tempfile.mkdtemp(prefix="yolo-train-nobody-"))
    atexit.register(shutil.rmtree, copy, ignore_errors=True)
    for package in (ROOT / "supervisor", ROOT / "worker", Path(psutil.__file__).parent):
        shutil.copytree(package, copy / package.name, ignore=shutil.ignore_patterns("__pycache__"))
    for path in [copy, *copy.rglob("*")]:
        path.chmod(0o755 if path.is_dir() else 0o644)
    return copy


def wait_until_fed(path: Path, supervisor: subprocess.Popen, timeout: float, what: str) -> None:
    """Until the worker has recorded a batch fed to its model in ``path`` (RECORD_FED_ENV), the supervisor alive."""
    deadline = time.monotonic() + timeout
    while not (path.exists() and path.read_text().strip()):
        assert time.monotonic() < deadline and supervisor.poll() is None, what
        time.sleep(0.02)


def freeze_a_loader_worker(supervisor: subprocess.Popen, fed: Path) -> tuple[psutil.Process, psutil.Process, str]:
    """Once a batch is trained, SIGSTOP one loader worker of the training process (no fault flag: the main process
    comes to wait for a batch it owes), then the supervisor's run to its end: (trainer, frozen, its stderr)."""
    try:
        wait_until_fed(fed, supervisor, 120, "no batch trained")
        [trainer] = [p for p in psutil.Process(supervisor.pid).children() if "--standby" not in p.cmdline()]
        frozen = trainer.children()[0]
        frozen.send_signal(signal.SIGSTOP)
        _, stderr = supervisor.communicate(timeout=240)
    finally:
        if supervisor.poll() is None:
            supervisor.kill()
    return trainer, frozen, stderr


def python_without_py_spy(tmp_path: Path) -> Path:
    """This venv's interpreter as a venv of its own with no py-spy beside it (its packages are the same): a machine
    where py-spy is not installed, or lags the Python."""
    venv = Path(sys.prefix)
    fake = tmp_path / "no-py-spy"
    (fake / "bin").mkdir(parents=True)
    shutil.copy(venv / "pyvenv.cfg", fake / "pyvenv.cfg")
    (fake / "lib").symlink_to(venv / "lib")
    (fake / "bin" / "python").symlink_to(os.path.realpath(sys.executable))
    return fake / "bin" / "python"


def slow_server(seconds: float) -> tuple[int, threading.Event]:
    """A server outside the worker's tree that answers each request ``seconds`` after it came."""
    listener = socket.create_server(("127.0.0.1", 0))
    answered = threading.Event()

    def serve():
        with listener:
            connection, _ = listener.accept()
            with connection:
                connection.recv(16)
                time.sleep(seconds)
                connection.sendall(b"stored")
                answered.set()

    threading.Thread(target=serve, daemon=True).start()
    return listener.getsockname()[1], answered
