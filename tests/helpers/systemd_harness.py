"""Boot a real systemd in a throwaway namespace, drive it from outside, and leave nothing behind.

The recipe of issue 5: new PID, mount, UTS namespaces (plus IPC, network and cgroup ones, so two harnesses
and the host do not meet), an overlay over the live / whose upper layer is a tmpfs, fresh tmpfs on /run and
/tmp, chroot, `container=other`, /lib/systemd/systemd as PID 1. Never boot systemd on the real root: its
tmpfiles clean-up would wipe the host's /tmp.

What the inner system sees: the host's files read-only in effect (writes land in the overlay and vanish),
so the repository and .venv are at their usual paths; `share`, a directory under /var/tmp bind-mounted at
the same path, for handing files in and out (services with PrivateTmp= do not see it: `put` writes into
the overlay instead); its own cgroup subtree (a child of ours in each hierarchy
systemd uses), its own loopback network, /proc/sys and /sys read-only.

Teardown: SIGKILL to the inner PID 1 ends every process of the PID namespace, the mount namespace and its
mounts go with them, then the cgroup subtrees and the share are removed.

    with booted_systemd(tmp_path) as sd:
        sd.run(["systemctl", "start", "foo"])
"""

from __future__ import annotations

import os
import shlex
import shutil
import signal
import subprocess
import tempfile
import time
import uuid
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import pytest

SYSTEMD = Path("/lib/systemd/systemd")
INNER_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
# basic.target: journald, tmpfiles, sockets; none of the host's services (databases, gettys) start inside.
BOOT_TARGET = "basic.target"
BOOT_TIMEOUT = 90.0
OVERLAY_FAILED = 97  # exit status of the boot script when this kernel cannot overlay /


class SystemdUnavailable(RuntimeError):
    """This machine cannot boot a throwaway systemd (not root, no unshare, no overlayfs...); a reason to skip."""


@dataclass(frozen=True)
class CgroupHierarchy:
    controllers: str     # as in /proc/self/cgroup: "" for cgroup2, "devices", "name=systemd"...
    mountpoint: Path     # where the host mounts it
    ours: Path           # the subtree made for the inner systemd, on the host

    @property
    def inner_mount(self) -> str:
        """The shell command mounting this hierarchy's namespace-rooted view under $R/sys/fs/cgroup."""
        if not self.controllers:
            target = "$R/sys/fs/cgroup" if self.mountpoint == Path("/sys/fs/cgroup") else f"$R{self.mountpoint}"
            return f'mkdir -p "{target}" && mount -t cgroup2 cgroup2 "{target}"'
        return (f'mkdir -p "$R{self.mountpoint}" && '
                f'mount -t cgroup -o {self.controllers} cgroup "$R{self.mountpoint}"')


@dataclass
class BootedSystemd:
    """A running throwaway systemd: `pid` is its PID 1 as the host sees it."""

    pid: int
    share: Path
    console: Path
    hierarchies: list[CgroupHierarchy] = field(default_factory=list)

    def command(self, cmd: Sequence[str] | str) -> list[str]:
        """The host command line running `cmd` inside (a string goes through sh -c), with a clean environment."""
        argv = ["sh", "-c", cmd] if isinstance(cmd, str) else list(cmd)
        return ["nsenter", "-t", str(self.pid), "-m", "-p", "-u", "-i", "-n", "-C", "-r", "-w", "--",
                "env", "-i", f"PATH={INNER_PATH}", "LANG=C.UTF-8", "SYSTEMD_PAGER=", "SYSTEMD_COLORS=0", *argv]

    def run(self, cmd: Sequence[str] | str, *, check: bool = True, timeout: float = 120,
            input: str | None = None) -> subprocess.CompletedProcess[str]:
        """Run `cmd` inside as root, in /, under umask 022 (what it makes, the system's services must reach), and
        return its outcome (text). check=True raises on failure, with the output in the message."""
        done = subprocess.run(self.command(cmd), capture_output=True, text=True, timeout=timeout, input=input,
                              umask=0o022)
        if check and done.returncode != 0:
            raise AssertionError(f"inside systemd: {cmd!r} exited {done.returncode}\n"
                                 f"stdout: {done.stdout}\nstderr: {done.stderr}")
        return done

    def systemctl(self, *args: str, check: bool = False) -> subprocess.CompletedProcess[str]:
        return self.run(["systemctl", "--no-pager", *args], check=check)

    def wait_for(self, cmd: Sequence[str] | str, accept, timeout: float = 60, what: str = "") -> str:
        """Run `cmd` inside until accept(stdout) is true; return that stdout, or fail after `timeout` s."""
        deadline = time.monotonic() + timeout
        while True:
            out = self.run(cmd, check=False).stdout
            if accept(out):
                return out
            if time.monotonic() > deadline:
                raise AssertionError(f"inside systemd: {what or cmd!r} not reached within {timeout:.0f} s; "
                                     f"last output: {out.strip()!r}")
            time.sleep(0.2)

    def put(self, path: str, text: str, mode: int = 0o644) -> None:
        """Write a file inside the overlay (root-owned): for what services must see, since PrivateTmp=
        hides `share` (it is under /var/tmp) from them."""
        self.run(["sh", "-c", 'mkdir -p "$(dirname "$1")" && cat > "$1" && chmod "$2" "$1"', "sh", path,
                  f"{mode:o}"], input=text)

    def read(self, path: str) -> str:
        return self.run(["cat", path]).stdout

    def write(self, relpath: str, text: str, mode: int = 0o644) -> Path:
        """Hand a file in: written under `share`, seen inside at the same absolute path (not by services
        with PrivateTmp=: use put())."""
        path = self.share / relpath
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
        path.chmod(mode)
        return path


def unavailable_reason() -> str | None:
    """Why a throwaway systemd cannot be booted here, or None when it can."""
    if os.geteuid() != 0:
        return "booting systemd in a namespace needs root"
    for tool in ("unshare", "nsenter", "chroot", "mount"):
        if shutil.which(tool) is None:
            return f"{tool} is not installed (util-linux / coreutils)"
    if not os.access(SYSTEMD, os.X_OK):
        return f"{SYSTEMD} is missing: apt-get install systemd"
    if "overlay" not in Path("/proc/filesystems").read_text():
        return "the kernel has no overlayfs (modprobe overlay)"
    return None


@contextmanager
def booted_systemd(workdir: Path, timeout: float = BOOT_TIMEOUT) -> Iterator[BootedSystemd]:
    """Boot systemd in namespaces; `workdir` is an empty directory of the caller's (it holds the mount point
    of the overlay and the console log). Raises SystemdUnavailable where this machine cannot do it."""
    reason = unavailable_reason()
    if reason:
        raise SystemdUnavailable(reason)
    workdir.mkdir(parents=True, exist_ok=True)
    base = workdir / "root-mount"
    base.mkdir()
    console = workdir / "console.log"
    share = Path(tempfile.mkdtemp(prefix="yolo-train-systemd-", dir="/var/tmp"))
    share.chmod(0o755)
    hierarchies = _make_cgroups(f"yolo-train-systemd-{uuid.uuid4().hex[:12]}")
    proc = None
    try:
        with open(console, "w") as log:
            proc = subprocess.Popen(["sh", "-c", _boot_script(base, share, hierarchies)], stdin=subprocess.DEVNULL,
                                    stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        pid = _inner_pid(proc, console, timeout)
        booted = BootedSystemd(pid=pid, share=share, console=console, hierarchies=hierarchies)
        booted.wait_for(["systemctl", "is-system-running"],
                        lambda out: out.strip() in ("running", "degraded"), timeout, "boot (is-system-running)")
        yield booted
    finally:
        _teardown(proc, hierarchies, share, base)


@pytest.fixture(scope="module")
def systemd_booted(tmp_path_factory) -> Iterator[BootedSystemd]:
    """One throwaway systemd per test module (booting costs seconds); skips where it cannot boot."""
    try:
        with booted_systemd(tmp_path_factory.mktemp("systemd")) as booted:
            yield booted
    except SystemdUnavailable as e:
        pytest.skip(f"no throwaway systemd: {e}")


def _boot_script(base: Path, share: Path, hierarchies: list[CgroupHierarchy]) -> str:
    # A checkout under /tmp or /run (a CI clone, say) would vanish under the fresh tmpfs: show it through.
    here = Path(__file__).resolve().parents[2]
    checkout = (f'mkdir -p "$R"{shlex.quote(str(here))}; mount --bind {shlex.quote(str(here))} "$R"{shlex.quote(str(here))}\n'
                if any(here.is_relative_to(p) for p in (Path("/tmp"), Path("/run"))) else "")
    join = "".join(f'echo $$ > "{h.ours}/cgroup.procs"\n' for h in hierarchies)
    cgroup_root = ("" if any(not h.controllers and h.mountpoint == Path("/sys/fs/cgroup") for h in hierarchies)
                   else 'mount -t tmpfs -o mode=755 cgroup "$R/sys/fs/cgroup"\n')
    # A system's own files are made under 022 whatever the caller's umask: under 077 the overlay's root, made from
    # upper/, is 0700 and no service user reaches its working directory or the journal's socket (200/CHDIR).
    inner = f"""set -e
umask 022
B={shlex.quote(str(base))}; R="$B/root"
mount -t tmpfs -o mode=755 tmpfs "$B"
mkdir "$B/upper" "$B/work" "$R"
mount -t overlay overlay -o lowerdir=/,upperdir="$B/upper",workdir="$B/work" "$R" || exit {OVERLAY_FAILED}
mount -t proc proc "$R/proc"
mount --bind "$R/proc/sys" "$R/proc/sys"; mount -o remount,bind,ro "$R/proc/sys"
mount --rbind /sys "$R/sys"; mount -o remount,bind,ro "$R/sys"
{cgroup_root}{"; ".join(h.inner_mount for h in hierarchies)}
mount --rbind /dev "$R/dev"
mount -t tmpfs -o mode=755 tmpfs "$R/run"
mount -t tmpfs -o mode=1777 tmpfs "$R/tmp"
{checkout}mount --bind {shlex.quote(str(share))} "$R"{shlex.quote(str(share))}
exec chroot "$R" /usr/bin/env -i container=other {SYSTEMD} --system --unit={BOOT_TARGET}
"""
    # Joining our own cgroups before unshare --cgroup makes them the root of the inner system's cgroup tree.
    return f"""set -e
{join}exec unshare --cgroup --pid --fork --mount --uts --ipc --net --propagation private sh -c {shlex.quote(inner)}
"""


def _make_cgroups(name: str) -> list[CgroupHierarchy]:
    """Create a child of our own cgroup, named `name`, in every hierarchy this host mounts: whichever the inner
    systemd mounts and uses, it sees (and creates cgroups in) only that child."""
    mounts: dict[str, Path] = {}  # controllers -> mountpoint
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        left, _, right = line.partition(" - ")
        fstype, _, superopts = right.split(" ")[:3]
        root, mountpoint = left.split(" ")[3:5]
        if root != "/" or fstype not in ("cgroup", "cgroup2"):
            continue
        if fstype == "cgroup2":
            mounts.setdefault("", Path(mountpoint))
        else:
            opts = superopts.split(",")
            mounts.setdefault(",".join(o for o in opts if o != "rw" and "=" not in o or o.startswith("name=")),
                              Path(mountpoint))
    made = []
    for line in Path("/proc/self/cgroup").read_text().splitlines():
        _, controllers, path = line.split(":", 2)
        if controllers not in mounts:
            continue
        ours = mounts[controllers] / path.lstrip("/") / name
        try:
            ours.mkdir()
            made.append(CgroupHierarchy(controllers, mounts[controllers], ours))
            for knob in ("cpuset.cpus", "cpuset.mems"):  # a v1 cpuset child starts empty: nothing may join it
                if (ours / knob).exists():
                    (ours / knob).write_text((ours.parent / knob).read_text())
        except OSError as e:
            _remove_cgroups(made)
            raise SystemdUnavailable(f"cannot create cgroup {ours} ({e.strerror})") from None
    if not any(h.controllers in ("", "name=systemd") for h in made):
        _remove_cgroups(made)
        raise SystemdUnavailable("no cgroup2 or name=systemd hierarchy mounted under /sys/fs/cgroup")
    return made


def _inner_pid(proc: subprocess.Popen, console: Path, timeout: float) -> int:
    """The host PID of the inner PID 1: unshare's child, once it has become systemd."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        rc = proc.poll()
        if rc is not None:
            tail = console.read_text()[-2000:]
            if rc == OVERLAY_FAILED:
                raise SystemdUnavailable(f"cannot mount an overlay over / here: {tail.strip()}")
            raise AssertionError(f"the systemd boot script exited {rc}: {tail}")
        for task in Path(f"/proc/{proc.pid}/task").glob("*/children"):
            for child in task.read_text().split():
                try:
                    if Path(f"/proc/{child}/comm").read_text().strip() == "systemd":
                        return int(child)
                except OSError:
                    pass
        time.sleep(0.05)
    raise AssertionError(f"systemd did not start within {timeout:.0f} s: {console.read_text()[-2000:]}")


def _teardown(proc: subprocess.Popen | None, hierarchies: list[CgroupHierarchy], share: Path, base: Path) -> None:
    if proc is not None:
        # The unshare process's only child is the inner PID 1 (sh, then chroot, then systemd: one PID);
        # SIGKILL to a PID namespace's init kills every process in that namespace.
        for task in Path(f"/proc/{proc.pid}/task").glob("*/children"):
            for child in task.read_text().split():
                try:
                    os.kill(int(child), signal.SIGKILL)
                except ProcessLookupError:
                    pass
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=10)
    _remove_cgroups(hierarchies)
    shutil.rmtree(share, ignore_errors=True)
    try:
        base.rmdir()  # the overlay was mounted here inside the namespace only: outside it stayed empty
    except OSError:
        pass


def _remove_cgroups(hierarchies: list[CgroupHierarchy], timeout: float = 10.0) -> None:
    """rmdir each subtree bottom-up; a cgroup whose last process is still being reaped is retried."""
    deadline = time.monotonic() + timeout
    for h in hierarchies:
        while h.ours.exists():
            for d in sorted((p for p in h.ours.rglob("*") if p.is_dir()), key=lambda p: -len(p.parts)) + [h.ours]:
                try:
                    d.rmdir()
                except FileNotFoundError:
                    pass
                except OSError:
                    if time.monotonic() > deadline:
                        raise AssertionError(f"cgroup {d} still busy after teardown: "
                                             f"{(d / 'cgroup.procs').read_text().split()}") from None
                    time.sleep(0.1)
                    break
