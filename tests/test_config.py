"""Bad configuration: one line naming file, key and expected form, and exit status 78."""

import re

import pytest

from supervisor.config import AUTO, ConfigError, load
from tests.conftest import yolo_train


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
    ("[ladder]\nrungs = [{ persistent_workers = 0 }]\n", "ladder.rungs[0].persistent_workers: expected bool"),
    ("[[faults]]\nkind = \"explode\"\n", "faults: kind: expected one of dataloader_hang"),
    ("[metrics]\nlisten = 9000\n", "metrics.listen: expected \"HOST:PORT\" or \"off\", got 9000"),
    ("[watchdog\n", "not valid TOML"),
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
    assert "rung 5: workers=0, persistent_workers=false, val=false" in result.stdout


def test_patches_and_rung_environments_are_validated(write_config):
    from supervisor.config import load

    config = load(write_config('[patches]\nconv_fallback = "on"\n[ladder]\nrungs = [{ env = { MIOPEN_FIND_MODE = "FAST" } },'
                               ' { conv_fallback = "on" }]\n'))
    assert config.conv_fallback == "on" and config.ladder[0]["env"] == {"MIOPEN_FIND_MODE": "FAST"}
    for body, message in [('[patches]\nconv_fallback = "yes"\n', 'patches.conv_fallback: expected "auto", "on"'),
                          ('[ladder]\nrungs = [{ env = { A = 1 } }]\n', "ladder.rungs[0].env: expected a table"),
                          ('[kernel_log]\npatterns = [["x", "(", "stall"]]\n', "[kernel_log] patterns[0]")]:
        with pytest.raises(ConfigError, match=re.escape(message)):
            load(write_config(body))


def test_a_bad_deadline_is_rejected_at_load(write_config):
    from supervisor.config import load

    with pytest.raises(ConfigError, match="deadline: expected an RFC 3339 time"):
        load(write_config('deadline = "next friday"\n'))
    assert load(write_config('deadline = "2025-11-30T00:00:00Z"\n')).deadline == "2025-11-30T00:00:00Z"
