"""Bad configuration: one line naming file, key and expected form, and exit status 78."""

import re

import pytest

from supervisor.config import AUTO, ConfigError, load
from tests.helpers.supervised import yolo_train

LISTEN = 'metrics.listen: expected "HOST:PORT" or "off", e.g. "127.0.0.1:10133", '


def test_the_demo_config_loads():
    config = load(None)
    assert config.train["data"] == "demo" and config.watchdog.stall_timeout == AUTO


@pytest.mark.parametrize("body, message", [
    ("[watchdog]\nstall_timeout = \"fast\"\n",
     "watchdog.stall_timeout: expected seconds (a positive number) or \"auto\" or \"off\", got 'fast'"),
    ("[watchdog]\nstall_timout = 5\n", "[watchdog]: unknown key 'stall_timout'; expected one of"),
    ("[train]\nepoch = 3\n", "[train]: unknown key 'epoch'"),
    ("[train]\nworkers = -1\n", "train.workers: expected a whole number >= 0, got -1"),
    ("[restart]\nmax_restarts = 0\n", "restart.max_restarts: expected a whole number >= 1, got 0"),
    ("[ladder]\nrungs = [{ wrokers = 0 }]\n", "ladder.rungs[0]: unknown setting 'wrokers'"),
    ("[ladder]\nrungs = [{ persistent_workers = 0 }]\n",
     "ladder.rungs[0].persistent_workers: expected true or false, got 0"),
    ("[ladder]\nrungs = [{ start_method = \"exec\" }]\n",
     "ladder.rungs[0].start_method: expected \"fork\", \"spawn\" or \"forkserver\", got 'exec'"),
    ("[[faults]]\nkind = \"explode\"\n", "faults: kind: expected one of dataloader_hang"),
    ("[metrics]\nlisten = 9000\n", LISTEN + "got 9000"),
    ("[watchdog\n", "not valid TOML"),
    ("[worker]\nstandby = \"yes\"\n", "worker.standby: expected true or false, got 'yes'"),
    ("[worker]\ncommand = [\"python\", \"train.py\"]\nstandby = true\n",
     "worker.standby: a [worker] command cannot be started ahead of its launch"),
])
def test_bad_configs_are_rejected_with_file_and_key(write_config, body, message):
    path = write_config(body)
    with pytest.raises(ConfigError) as error:
        load(path)
    text = str(error.value)
    assert text.startswith(str(path)) and message in text and "\n" not in text


def test_cli_reports_a_bad_config_in_one_line_with_status_78(write_config):
    path = write_config("[watchdog]\nstartup_timeout = -3\n")
    result = yolo_train("run", "--config", str(path))
    assert result.returncode == 78
    assert result.stderr.strip().splitlines() == [
        f"yolo-train: {path}: watchdog.startup_timeout: expected seconds (a positive number) or \"off\", got -3"]


def test_cli_reports_a_missing_config(tmp_path):
    result = yolo_train("status", "--config", str(tmp_path / "nope.toml"))
    assert result.returncode == 78 and "no such file" in result.stderr


def test_check_config_prints_the_ladder(write_config):
    path = write_config("[train]\nworkers = 4\n")
    result = yolo_train("check-config", "--config", str(path))
    assert result.returncode == 0
    assert "rung 3: workers=1, persistent_workers=false" in result.stdout
    assert "rung 4: workers=1, persistent_workers=false, loader=threads" in result.stdout
    assert "rung 6: workers=0, persistent_workers=false, loader=process, val=false" in result.stdout


def test_patches_and_rung_environments_are_validated(write_config):
    from supervisor.config import load

    config = load(write_config('[train]\ndata = "demo"\n[patches]\nconv_fallback = "on"\nbatchnorm_fallback = "off"\n'
                               '[ladder]\nrungs = [{ env = { MIOPEN_FIND_MODE = "FAST" } }, { conv_fallback = "on" }]\n'))
    assert config.conv_fallback == "on" and config.ladder[0]["env"] == {"MIOPEN_FIND_MODE": "FAST"}
    assert config.batchnorm_fallback == "off" and load(write_config('[train]\ndata = "demo"\n')).batchnorm_fallback == "auto"
    for body, message in [('[patches]\nconv_fallback = "yes"\n', 'patches.conv_fallback: expected "auto", "on"'),
                          ('[patches]\nbatchnorm_fallback = true\n', 'patches.batchnorm_fallback: expected "auto", "on"'),
                          ('[ladder]\nrungs = [{ env = { A = 1 } }]\n', "ladder.rungs[0].env: expected a table"),
                          ('[kernel_log]\npatterns = [["x", "(", "stall"]]\n', "[kernel_log] patterns[0]")]:
        with pytest.raises(ConfigError, match=re.escape(message)):
            load(write_config(body))


def test_a_bad_deadline_is_rejected_at_load(write_config):
    from supervisor.config import load

    with pytest.raises(ConfigError, match="deadline: expected an RFC 3339 time"):
        load(write_config('deadline = "next friday"\n'))
    assert load(write_config('deadline = "2025-11-30T00:00:00Z"\n[train]\ndata = "demo"\n')).deadline == "2025-11-30T00:00:00Z"


TRAIN = '[train]\ndata = "demo"\nmodel = "yolov8n.yaml"\n'


@pytest.mark.parametrize("body, message", [
    (TRAIN + 'imgsz = "big"\n', "train.imgsz: expected pixels as a whole number >= 1, or [height, width], got 'big'"),
    (TRAIN + "batch = 0\n", "train.batch: expected a whole number >= 1, -1 (AutoBatch) or a fraction"),
    (TRAIN + "workers = true\n", "train.workers: expected a whole number >= 0, got true"),
    (TRAIN + "epochs = 2.5\n", "train.epochs: expected a whole number >= 1, got 2.5"),
    (TRAIN + "plots = 1\n", "train.plots: expected true or false, got 1"),
    (TRAIN + "lr0 = 3\n", "train.lr0: expected a number between 0 and 1, got 3"),
    (TRAIN + '[ladder]\nrungs = [{ workers = "many" }]\n', "ladder.rungs[0].workers: expected a whole number >= 0, "
                                                         "got 'many'"),
    (TRAIN + "[ladder]\nrungs = [{ val = 0 }]\n", "ladder.rungs[0].val: expected true or false, got 0"),
    ("", "no [train] table: nothing to train"),
    ('name = "x"\n[watchdog]\nstartup_timeout = 60\n', "no [train] table: nothing to train"),
    (TRAIN + '[metrics]\nlisten = "127.0.0.1:99999"\n', LISTEN + "got '127.0.0.1:99999'"),
    (TRAIN + '[metrics]\nlisten = ":9000"\n', LISTEN + "got ':9000'"),
    (TRAIN + '[metrics]\nlisten = "local host:9000"\n', LISTEN + "got 'local host:9000'"),
    (TRAIN + "[watchdog]\nkill_grace = 1000\n", "watchdog.kill_grace + watchdog.kill_timeout: expected at most "
                                               "30 s together, got 1000 + 10"),
    # Each passed check-config, then crashed run with a traceback at the spawn.
    ('[worker]\ncommand = ["python", "x.py"]\nenv = { "A=B" = "1" }\n',
     'worker.env: expected variable names without "=" or a NUL character, e.g. env = { OMP_NUM_THREADS = "4" }, '
     "got 'A=B'"),
    ('[worker]\ncommand = ["python", "x.py"]\nenv = { A = "1\\u0000" }\n',
     "worker.env: expected text without a NUL character (\\u0000), got '1\\x00'"),
    ('[worker]\ncommand = ["python", "x\\u0000.py"]\n',
     "worker.command: expected text without a NUL character (\\u0000), got ['python', 'x\\x00.py']"),
    (TRAIN + '[ladder]\nrungs = [{ env = { "" = "1" } }]\n', "ladder.rungs[0].env: expected variable names"),
])
def test_check_config_refuses_what_run_refuses_with_the_same_line(write_config, body, message):
    path = write_config(body)
    checked = yolo_train("check-config", "--config", str(path))
    assert checked.returncode == 78 and checked.stdout == ""
    assert checked.stderr.startswith(f"yolo-train: {path}: ") and message in checked.stderr
    assert len(checked.stderr.strip().splitlines()) == 1
    run = yolo_train("run", "--config", str(path), "--state-dir", str(path.parent / "state"))
    assert run.returncode == 78 and run.stderr == checked.stderr  # one validation serves both


def test_values_ultralytics_accepts_pass(write_config):
    config = load(write_config(TRAIN + "batch = 0.7\nimgsz = [64, 96]\nepochs = 100\namp = \"bf16\"\n"
                               "fraction = 0.5\nworkers = 0\nsave_period = -1\n"))
    assert config.train["imgsz"] == [64, 96] and config.train["batch"] == 0.7


def test_the_kill_bound_is_the_units_watchdog(write_config):
    from supervisor.config import UNIT_WATCHDOG_SEC
    from tests.helpers import ROOT

    unit = (ROOT / "units" / "yolo-train.service").read_text()
    assert f"WatchdogSec={UNIT_WATCHDOG_SEC:g}s" in unit.splitlines()
    load(write_config(TRAIN + f"[watchdog]\nkill_grace = {UNIT_WATCHDOG_SEC - 10}\nkill_timeout = 10\n"))


def test_a_config_that_is_not_utf8_is_one_line_and_78(tmp_path):
    path = tmp_path / "latin1.toml"
    path.write_bytes(TRAIN.encode() + 'name = "Übung"\n'.encode("latin-1"))
    result = yolo_train("check-config", "--config", str(path))
    assert result.returncode == 78
    assert result.stderr.strip().splitlines() == [
        f"yolo-train: {path}: not UTF-8 (byte 0xdc on line 4); TOML files are UTF-8: re-save it as UTF-8 (e.g. "
        f"iconv -f latin1 -t utf-8)"]


def test_check_config_stays_fast_without_importing_torch(write_config):
    import subprocess
    import sys

    probe = ("import sys; from supervisor.config import load; load(None); "
             "print('torch' in sys.modules, 'ultralytics.cfg' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True).stdout
    assert out.split() == ["False", "False"]


def test_where_a_run_writes_is_refused_in_the_train_table(write_config):
    for key in ("project", "name"):
        result = yolo_train("check-config", "--config", str(write_config(f'[train]\n{key} = "runs/x"\n')))
        assert result.returncode == 78 and f"train.{key}: yolo-train decides where a run writes" in result.stderr


@pytest.mark.parametrize("value, words, durations, seconds", [
    (90, {}, False, 90.0), (2.5, {}, True, 2.5), ("90s", {}, True, 90.0), ("10m", {}, True, 600.0),
    ("1h30m", {}, True, 5400.0), ("2d", {}, True, 172800.0), ("off", {"off": None}, True, None),
    ("auto", {"auto": "auto"}, False, "auto"),
])
def test_seconds_durations_and_words_are_read_by_one_function(value, words, durations, seconds):
    from supervisor.config_keys import parse_seconds

    assert parse_seconds(value, words, durations) == seconds


@pytest.mark.parametrize("value, words, durations", [
    ("10m", {}, False), (0, {}, True), (-1, {}, True), (True, {}, True), (float("inf"), {}, True),
    (float("nan"), {}, True), ("0s", {}, True), ("soon", {}, True), ("off", {"auto": "auto"}, True), ("", {}, True),
])
def test_what_is_not_seconds_is_refused_by_it(value, words, durations):
    from supervisor.config_keys import parse_seconds

    with pytest.raises(ValueError):
        parse_seconds(value, words, durations)


def test_check_config_refuses_a_notify_command_that_is_not_there(write_config, tmp_path):
    """Issue 41: it was accepted, and the run said so only at its first notice, hours later."""
    path = write_config('[train]\ndata = "demo"\n[notify]\ncommand = ["no-such-notifier", "hi"]\n')
    result = yolo_train("check-config", "--config", str(path))
    assert result.returncode == 78 and result.stderr.strip().splitlines() == [
        f"yolo-train: {path}: notify.command: 'no-such-notifier' is not found on PATH; give the program's full path "
        f"or install it"]
    path = write_config(f'[train]\ndata = "demo"\n[notify]\ncommand = ["{tmp_path}"]\n')
    result = yolo_train("check-config", "--config", str(path))
    assert result.returncode == 78 and f"notify.command: '{tmp_path}' is not an executable file" in result.stderr
    assert yolo_train("check-config", "--config", str(write_config(
        '[train]\ndata = "demo"\n[notify]\ncommand = ["sh", "-c", "true"]\n'))).returncode == 0
