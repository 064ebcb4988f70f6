"""`make run` sets up what running needs and nothing of the tests; `make test` adds the test packages. Read from
make's own dry run on a venv that does not exist yet, as on a fresh machine."""

import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TEST_ONLY = ("chromium", "prometheus", "systemd-journal-remote", "libfuse3-3", "[test,dashboards]")


def dry_run(target: str, tmp_path: Path) -> str:
    return subprocess.run(["make", "-n", target, f"VENV={tmp_path / 'venv'}"], cwd=ROOT, capture_output=True,
                          text=True, check=True).stdout


def test_make_run_installs_what_running_needs_and_no_test_package(tmp_path):
    plan = dry_run("run", tmp_path)
    assert "libsystemd-dev" in plan and "pip install -q -e ." in plan and "yolo-train run" in plan
    assert [p for p in TEST_ONLY if p in plan] == []


def test_make_test_adds_the_test_packages_to_those_of_running(tmp_path):
    plan = dry_run("test", tmp_path)
    assert "libsystemd-dev" in plan and "pytest" in plan
    assert [p for p in TEST_ONLY if p not in plan] == []
