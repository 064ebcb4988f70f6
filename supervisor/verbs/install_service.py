"""`yolo-train install-service`: put the systemd unit, the example config and the service user in place.

Idempotent: run it again after an upgrade. It never overwrites an existing /etc/yolo-train/config.toml, and it
does not enable or start the service (that is the administrator's `systemctl enable --now yolo-train`).
"""

from __future__ import annotations

import argparse
import os
import shlex
import shutil
import stat
import subprocess
import sys
from pathlib import Path

from supervisor.exit_codes import EXIT_FAILED, EXIT_OK

UNITS = Path(__file__).resolve().parents[2] / "units"
UNIT_NAME = "yolo-train.service"
UNIT_BINARY = "/usr/local/bin/yolo-train"  # the ExecStart= path written in units/yolo-train.service
UNIT_DIR = Path("etc/systemd/system")
CONFIG = Path("etc/yolo-train/config.toml")
SYSUSERS = Path("etc/sysusers.d/yolo-train.conf")
HOME_DROPIN = UNIT_DIR / f"{UNIT_NAME}.d" / "home.conf"
# What ProtectHome=yes hides from the service.
HOME_DIRS = (Path("/home"), Path("/root"), Path("/run/user"))
# What PrivateTmp=yes replaces with the service's own empty directories.
TMP_DIRS = (Path("/tmp"), Path("/var/tmp"))


class InstallError(RuntimeError):
    """One line: what could not be installed, where, and the fix."""


def install_service(root: Path = Path("/"), unit_src: Path | None = None, config_src: Path | None = None,
                    binary: Path | None = None) -> list[str]:
    """Install under `root` (a chroot or image; "/" for this machine) and return one line per thing done.

    unit_src, config_src: default to the repository's units/; binary: the `yolo-train` that ExecStart= runs,
    by default the one of this Python environment.
    """
    unit_src = unit_src or UNITS / UNIT_NAME
    config_src = config_src or UNITS / "config.example.toml"
    sysusers_src = unit_src.with_name("yolo-train.sysusers.conf")
    binary = Path(os.path.abspath(binary or default_binary()))
    for path, what in ((unit_src, "unit"), (config_src, "example config"), (sysusers_src, "sysusers.d snippet"),
                       (binary, "yolo-train executable")):
        if not path.is_file():
            raise InstallError(f"{path}: {what} not found; run from the yolo-train checkout or pass its path")
    if root == Path("/") and os.geteuid() != 0:
        raise InstallError("installing a system service needs root: run sudo yolo-train install-service")
    done: list[str] = []

    sysusers = _copy(sysusers_src, root / SYSUSERS)
    _run(["systemd-sysusers", f"--root={root}", str(sysusers)], "creating the yolo-train user")
    done.append(f"user and group yolo-train ({SYSUSERS.name} in /{SYSUSERS.parent})")

    unit_text = unit_src.read_text()
    if str(binary) != UNIT_BINARY:
        unit_text = unit_text.replace(f"ExecStart={UNIT_BINARY} ", f"ExecStart={_quote(binary)} ")
    _write(root / UNIT_DIR / UNIT_NAME, unit_text)
    done.append(f"unit /{UNIT_DIR / UNIT_NAME} running {binary}")

    hidden = hidden_by_protect_home(_paths_the_service_reads(binary))
    dropin = root / HOME_DROPIN
    if hidden:
        _write(dropin, home_dropin(hidden))
        done.append(f"drop-in /{HOME_DROPIN}: {', '.join(map(str, hidden))} shown read-only despite ProtectHome=")
    elif dropin.exists():
        dropin.unlink()
    for path in _unreadable_for_service(_paths_the_service_reads(binary), hidden):
        done.append(f"warning: {path} is not readable by other users; the yolo-train user cannot run it "
                    f"(chmod o+rX, or install the virtualenv under /opt)")

    config = root / CONFIG
    if config.exists():
        done.append(f"config /{CONFIG} kept as it is")
    else:
        _copy(config_src, config)
        done.append(f"config /{CONFIG} from {config_src}")

    if root == Path("/") and Path("/run/systemd/system").is_dir():
        _run(["systemctl", "daemon-reload"], "reloading systemd")
        done.append("systemctl daemon-reload")
    done.append("next: edit /etc/yolo-train/config.toml, then systemctl enable --now yolo-train")
    return done


def install_service_main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="yolo-train install-service",
                                     description="install the systemd unit, example config and service user")
    parser.add_argument("--root", type=Path, default=Path("/"), help="install into this root (default /)")
    parser.add_argument("--unit", type=Path, help="unit file (default: units/yolo-train.service)")
    parser.add_argument("--config", type=Path, help="example config (default: units/config.example.toml)")
    parser.add_argument("--binary", type=Path, help="the yolo-train executable ExecStart= runs")
    args = parser.parse_args(argv)
    try:
        lines = install_service(args.root, args.unit, args.config, args.binary)
    except InstallError as e:
        print(f"yolo-train install-service: {e}", file=sys.stderr)
        return EXIT_FAILED
    for line in lines:
        print(line)
    return EXIT_OK


def default_binary() -> Path:
    beside = Path(sys.prefix) / "bin" / "yolo-train"
    found = beside if beside.is_file() else shutil.which("yolo-train")
    if not found:
        raise InstallError("no yolo-train executable in this environment; pass --binary PATH")
    return Path(found)


def hidden_by_protect_home(paths: list[Path]) -> list[Path]:
    """The smallest set of directories among `paths` (resolved) that lie in a home directory or in a temporary
    directory (PrivateTmp= gives the service its own)."""
    inside = sorted({p for p in (Path(os.path.realpath(p)) for p in paths) if _in_home(p) or _in_tmp(p)},
                    key=lambda p: len(p.parts))
    kept: list[Path] = []
    for p in inside:
        if not any(p.is_relative_to(k) for k in kept):
            kept.append(p)
    return kept


def home_dropin(paths: list[Path]) -> str:
    if not any(_in_home(p) for p in paths):  # only temporary directories: PrivateTmp= stays, these show through
        return ("# Written by yolo-train install-service: the Python that runs yolo-train lives in a temporary\n"
                "# directory, which PrivateTmp=yes replaces; these paths are shown read-only in the private one.\n"
                "[Service]\n" + "".join(f"BindReadOnlyPaths={_quote(p)}\n" for p in paths))
    return ("# Written by yolo-train install-service: the Python that runs yolo-train lives in a home directory,\n"
            "# which ProtectHome=yes hides. Home directories become an empty tmpfs with only these paths in it.\n"
            "[Service]\nProtectHome=tmpfs\n"
            + "".join(f"BindReadOnlyPaths={_quote(p)}\n" for p in paths))


def _paths_the_service_reads(binary: Path) -> list[Path]:
    """The executable, its interpreter, and this Python's installation and source tree (an editable install
    runs from the checkout)."""
    paths = [binary]
    interpreter = _shebang(binary)
    if interpreter:
        paths.append(interpreter)
        if Path(os.path.realpath(interpreter)) == Path(os.path.realpath(sys.executable)):
            paths += [Path(sys.prefix), Path(sys.base_prefix), Path(__file__).resolve().parents[2]]
    resolved = [Path(os.path.realpath(p)) for p in paths]
    return [p if p.is_dir() else p.parent for p in resolved]


def _unreadable_for_service(paths: list[Path], shown: list[Path]) -> list[Path]:
    """Directories on the way to `paths` that users other than owner and group cannot enter; the home
    directories above a path the drop-in shows do not count (the service sees a tmpfs there instead)."""
    blocked = set()
    for path in paths:
        for p in [*reversed(path.parents), path]:
            if _in_home(p) and any(s.is_relative_to(p) and s != p for s in shown):
                continue
            if not p.stat().st_mode & stat.S_IXOTH:
                blocked.add(p)
                break
    return sorted(blocked)


def _in_tmp(path: Path) -> bool:
    return any(path.is_relative_to(tmp) for tmp in TMP_DIRS)


def _in_home(path: Path) -> bool:
    return any(path.is_relative_to(home) for home in HOME_DIRS)


def _shebang(script: Path) -> Path | None:
    with open(script, "rb") as f:
        first = f.readline(512)
    if not first.startswith(b"#!"):
        return None
    words = first[2:].decode(errors="replace").split()
    return Path(words[0]) if words else None


def _quote(path: Path) -> str:
    return shlex.quote(str(path))


def _write(target: Path, text: str) -> None:
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.with_name(f".{target.name}.tmp")
    tmp.write_text(text)
    tmp.chmod(0o644)
    tmp.replace(target)


def _copy(src: Path, target: Path) -> Path:
    _write(target, src.read_text())
    return target


def _run(cmd: list[str], what: str) -> None:
    try:
        done = subprocess.run(cmd, capture_output=True, text=True)
    except FileNotFoundError:
        raise InstallError(f"{cmd[0]} not found while {what}; install systemd (apt-get install systemd)") from None
    if done.returncode != 0:
        detail = (done.stderr or done.stdout).strip().splitlines()
        raise InstallError(f"{' '.join(cmd)} failed while {what}: {detail[-1] if detail else done.returncode}")
