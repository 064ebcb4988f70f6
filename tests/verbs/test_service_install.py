"""install_service into a directory standing for a fresh machine's root (systemd-sysusers --root writes its
passwd and group there); the same install inside a booted systemd is in tests/telemetry/test_systemd_unit.py."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from supervisor.verbs.install_service import InstallError, hidden_by_protect_home, home_dropin, install_service

ROOT = Path(__file__).resolve().parents[2]
UNIT = ROOT / "units" / "yolo-train.service"

pytestmark = pytest.mark.skipif(shutil.which("systemd-sysusers") is None, reason="systemd-sysusers not installed")


@pytest.fixture
def sources(tmp_path):
    config = tmp_path / "example.toml"
    config.write_text('name = "example"\n')
    binary = tmp_path / "bin" / "yolo-train"
    binary.parent.mkdir()
    binary.write_text("#!/usr/bin/python3\n")
    binary.chmod(0o755)
    return config, binary


def test_install_into_a_root(tmp_path, sources):
    config, binary = sources
    root = tmp_path / "root"
    done = install_service(root, UNIT, config, binary)
    assert "yolo-train:x:" in (root / "etc/passwd").read_text()
    assert any(line.startswith("render:") for line in (root / "etc/group").read_text().splitlines())
    unit = (root / "etc/systemd/system/yolo-train.service").read_text()
    assert f"ExecStart={binary} run --config /etc/yolo-train/config.toml" in unit
    assert (root / "etc/yolo-train/config.toml").read_text() == config.read_text()
    assert not any("daemon-reload" in line for line in done)  # not this machine's systemd

    (root / "etc/yolo-train/config.toml").write_text("# mine\n")
    again = install_service(root, UNIT, config, binary)
    assert (root / "etc/yolo-train/config.toml").read_text() == "# mine\n"
    assert "config /etc/yolo-train/config.toml kept as it is" in again


def test_missing_sources_are_named(tmp_path, sources):
    config, binary = sources
    with pytest.raises(InstallError, match=r"nowhere\.toml: example config not found"):
        install_service(tmp_path / "root", UNIT, tmp_path / "nowhere.toml", binary)


def test_home_directories_are_shown_read_only_and_minimally():
    paths = [Path("/root/.pyenv/versions/3.11.7/bin"), Path("/root/.pyenv/versions/3.11.7"),
             Path("/home/ada/yolo"), Path("/home/ada/yolo/.venv/bin"), Path("/opt/yolo-train/venv")]
    assert sorted(hidden_by_protect_home(paths)) == [Path("/home/ada/yolo"), Path("/root/.pyenv/versions/3.11.7")]
    assert "ProtectHome=tmpfs\nBindReadOnlyPaths=/home/ada/yolo\n" in home_dropin([Path("/home/ada/yolo")])


def test_a_checkout_in_a_temporary_directory_shows_through_private_tmp():
    paths = [Path("/tmp/ci/.venv/bin"), Path("/tmp/ci"), Path("/usr/lib/python3.11")]
    assert hidden_by_protect_home(paths) == [Path("/tmp/ci")]
    dropin = home_dropin([Path("/tmp/ci")])
    assert "BindReadOnlyPaths=/tmp/ci\n" in dropin and "ProtectHome" not in dropin


def test_the_unit_does_not_wait_for_the_network_the_offline_worker_never_uses(tmp_path, sources):
    config, binary = sources
    root = tmp_path / "root"
    install_service(root, UNIT, config, binary)
    unit = (root / "etc/systemd/system/yolo-train.service").read_text().splitlines()
    directives = [line for line in unit if line and not line.startswith("#")]
    assert not any("network-online.target" in line for line in directives)
    assert not any("download" in line.lower() for line in unit if "never download" not in line)


def test_the_shipped_example_config_passes_check_config():
    from supervisor.config import load

    example = load(ROOT / "units" / "config.example.toml")
    assert example.train["data"] == "demo"
    assert example.checkpoint.every == "auto"  # the documented default: an installed service learns its interval
