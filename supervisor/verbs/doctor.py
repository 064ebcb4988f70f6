"""`yolo-train doctor`: checks that the machine can train, each with pass / warn / fail and its fix.

Every check is a pure function of a filesystem root (``/`` normally, a fixture tree in tests)
and plain inputs, returning a ``Check``. The I/O shell (``doctor_main``) gathers those inputs:
torch is probed in a subprocess of the training venv's python, so a broken torch install is
reported, not crashed on, and this process never imports torch.

Exit status (the convention of Nagios plugins): 0 when every check passes, 1 when the worst is a
warning (training can run, maybe badly), 2 when any check fails (training will not run).
"""

from __future__ import annotations

import argparse
import enum
import grp
import json
import os
import pwd
import re
import shutil
import subprocess
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from worker.patches.miopen_db import (
    arch_from_override,
    find_kernel_db,
    gpu_arch_seen_by_runtime,
    kernel_db_names,
    kfd_gpu_nodes,
    miopen_db_dirs,
)


class Status(enum.IntEnum):
    PASS = 0
    WARN = 1
    FAIL = 2


@dataclass(frozen=True)
class Check:
    name: str
    status: Status
    detail: str
    fix: str = ""


@dataclass(frozen=True)
class TorchProbe:
    """What the venv's torch says about itself; ``error`` set when it could not even be imported."""

    version: str = ""
    hip: str | None = None  # torch.version.hip, e.g. "6.2.41133-dd7f95766"
    cuda: str | None = None
    gpu_available: bool = False
    gpu_names: list[str] = field(default_factory=list)
    gpu_archs: list[str] = field(default_factory=list)  # gcnArchName under ROCm
    torch_dir: str | None = None
    error: str | None = None

    @property
    def build(self) -> str:
        return "ROCm" if self.hip else "CUDA" if self.cuda else "CPU"


# -- torch ----------------------------------------------------------------------------------------

_PROBE_SCRIPT = """
import json, os, torch
out = {"version": torch.__version__, "hip": torch.version.hip, "cuda": torch.version.cuda,
       "torch_dir": os.path.dirname(torch.__file__)}
out["gpu_available"] = torch.cuda.is_available()
n = torch.cuda.device_count() if out["gpu_available"] else 0
props = [torch.cuda.get_device_properties(i) for i in range(n)]
out["gpu_names"] = [p.name for p in props]
out["gpu_archs"] = [getattr(p, "gcnArchName", "") for p in props]
print(json.dumps(out))
"""


def probe_torch(python: str, env: Mapping[str, str] | None = None, timeout: float = 120) -> TorchProbe:
    """Import torch in a subprocess of ``python``; a crash or hang becomes ``TorchProbe.error``."""
    try:
        done = subprocess.run(
            [python, "-c", _PROBE_SCRIPT], capture_output=True, text=True, timeout=timeout, env=dict(env or os.environ)
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        return TorchProbe(error=f"{python}: {exc}")
    if done.returncode != 0:
        tail = (done.stderr.strip().splitlines() or [f"exit status {done.returncode}"])[-1]
        return TorchProbe(error=f"{python} -c 'import torch' failed: {tail}")
    try:
        data = json.loads(done.stdout.strip().splitlines()[-1])
    except (ValueError, IndexError):
        return TorchProbe(error=f"{python}: unreadable probe output {done.stdout[-200:]!r}")
    return TorchProbe(**data)


def check_torch_build(probe: TorchProbe) -> Check:
    name = "torch build"
    if probe.error:
        return Check(name, Status.FAIL, probe.error, "reinstall torch in the venv: make install TORCH_REQ='torch torchvision --index-url https://download.pytorch.org/whl/rocm6.4'")
    detail = f"torch {probe.version}, {probe.build} build" + (f" (HIP {probe.hip})" if probe.hip else f" (CUDA {probe.cuda})" if probe.cuda else "")
    if probe.build == "CPU":
        return Check(name, Status.WARN, detail + ": training runs on the CPU", "install a ROCm build of torch: make install TORCH_REQ='torch torchvision --index-url https://download.pytorch.org/whl/rocm6.4'")
    return Check(name, Status.PASS, detail)


def check_gpus_visible(probe: TorchProbe, root: Path) -> Check:
    name = "GPUs visible"
    kfd = kfd_gpu_nodes(root)
    if probe.error or probe.build == "CPU":
        seen = f"; the kernel lists {len(kfd)} AMD GPU(s)" if kfd else ""
        return Check(name, Status.WARN, f"torch cannot use a GPU ({probe.build if not probe.error else 'no torch'}){seen}", "see the torch build check")
    if not probe.gpu_available or not probe.gpu_names:
        fix = "check /dev/kfd and /dev/dri access (below) and HSA_OVERRIDE_GFX_VERSION" if probe.hip else "check the NVIDIA driver: nvidia-smi"
        return Check(name, Status.FAIL, f"torch ({probe.build}) sees no GPU; the kernel lists {len(kfd)} AMD GPU(s)", fix)
    gpus = ", ".join(f"{n} ({a})" if a else n for n, a in zip(probe.gpu_names, probe.gpu_archs + [""] * len(probe.gpu_names)))
    return Check(name, Status.PASS, f"{len(probe.gpu_names)} GPU(s): {gpus}")


# -- architecture and versions ---------------------------------------------------------------------

# The override each family needs to use torch's prebuilt kernels, and whether that is known to work.
# Sources: ROCm's GPU support matrix (gfx1030, gfx1100, gfx1101 supported); the override values are
# the community's (ROCm/ROCm issues, e.g. #1756 for gfx1031/gfx1032 -> 10.3.0; gfx1010 -> 10.3.0 is
# the seeds' users' setting, which runs but needs the conv fallback: issue 6).
SUPPORTED_ARCHS = {"gfx900", "gfx906", "gfx908", "gfx90a", "gfx942", "gfx950", "gfx1030", "gfx1100", "gfx1101", "gfx1200", "gfx1201"}
OVERRIDES = {
    "gfx1010": ("10.3.0", Status.WARN), "gfx1011": ("10.3.0", Status.WARN), "gfx1012": ("10.3.0", Status.WARN),
    "gfx1031": ("10.3.0", Status.PASS), "gfx1032": ("10.3.0", Status.PASS), "gfx1033": ("10.3.0", Status.PASS),
    "gfx1034": ("10.3.0", Status.PASS), "gfx1035": ("10.3.0", Status.PASS), "gfx1036": ("10.3.0", Status.PASS),
    "gfx1102": ("11.0.0", Status.PASS), "gfx1103": ("11.0.0", Status.PASS),
}


def check_architecture(root: Path, env: Mapping[str, str], rocminfo_text: str | None = None) -> Check:
    """The real architecture (kfd topology, else rocminfo run without the override) against HSA_OVERRIDE_GFX_VERSION."""
    name = "GPU architecture"
    nodes = kfd_gpu_nodes(root)
    real = nodes[0].arch if nodes else (parse_rocminfo(rocminfo_text) if rocminfo_text else None)
    override = env.get("HSA_OVERRIDE_GFX_VERSION", "").strip()
    if real is None:
        return Check(name, Status.PASS, "no AMD GPU in the kfd topology: not applicable")
    wanted, verdict = OVERRIDES.get(real, (None, Status.PASS))
    if not override:
        if real in SUPPORTED_ARCHS:
            return Check(name, Status.PASS, f"{real}, no HSA_OVERRIDE_GFX_VERSION needed")
        if wanted:
            return Check(name, Status.FAIL, f"{real} has no kernels in torch's ROCm builds and HSA_OVERRIDE_GFX_VERSION is unset",
                         f"set [rocm] HSA_OVERRIDE_GFX_VERSION = \"{wanted}\" in the config")
        return Check(name, Status.WARN, f"{real} is not in ROCm's support list", "expect missing kernels; try conv_fallback = \"on\"")
    seen = arch_from_override(override)
    if seen is None:
        return Check(name, Status.FAIL, f"HSA_OVERRIDE_GFX_VERSION={override!r} is not major.minor.stepping", "use a value like 10.3.0")
    if seen == real:
        return Check(name, Status.PASS, f"{real}; HSA_OVERRIDE_GFX_VERSION={override} matches the card")
    if wanted and seen == arch_from_override(wanted):
        note = "" if verdict is Status.PASS else " (unsupported but known to run; keep conv_fallback = \"auto\")"
        return Check(name, verdict, f"{real} runs as {seen} via HSA_OVERRIDE_GFX_VERSION={override}{note}",
                     "" if verdict is Status.PASS else "watch for MIOpen hangs; the conv fallback avoids them")
    fix = f"set HSA_OVERRIDE_GFX_VERSION={wanted}" if wanted else "unset HSA_OVERRIDE_GFX_VERSION"
    return Check(name, Status.FAIL, f"the card is {real} but HSA_OVERRIDE_GFX_VERSION={override} makes it {seen}: kernels for another ISA family crash or hang", fix)


def parse_rocminfo(text: str) -> str | None:
    """The first GPU agent's ``Name: gfxNNNN`` in rocminfo's output."""
    m = re.search(r"^\s*Name:\s+(gfx[0-9a-f]+)\s*$", text, re.MULTILINE)
    return m.group(1) if m else None


# (torch version prefix, architecture regex, the ROCm (HIP) version needed, what happens, source)
INCOMPATIBLE = [
    ("2.5.", r"gfx110[0-3]", (6, 3), "HIPBLAS_STATUS_ALLOC_FAILED at the first matrix product",
     "issue 6 (seeds' users, RX 7900 XTX with torch 2.5.1+rocm6.2)"),
    ("2.6.", r"gfx942", (6, 3), "HIPBLAS_STATUS_NOT_SUPPORTED in nn layers",
     "https://github.com/pytorch/pytorch/issues/150016 (torch 2.6.0+rocm6.2.4)"),
]


def hip_version_tuple(hip: str) -> tuple[int, int] | None:
    m = re.match(r"(\d+)\.(\d+)", hip or "")
    return (int(m.group(1)), int(m.group(2))) if m else None


def check_torch_rocm_pair(probe: TorchProbe, arch: str | None) -> Check:
    name = "torch and ROCm versions"
    if not probe.hip or arch is None:
        return Check(name, Status.PASS, "not a ROCm build on an AMD GPU: not applicable")
    hip = hip_version_tuple(probe.hip)
    for prefix, arch_re, needed, symptom, source in INCOMPATIBLE:
        if probe.version.startswith(prefix) and re.fullmatch(arch_re, arch) and hip and hip < needed:
            want = f"{needed[0]}.{needed[1]}"
            return Check(name, Status.FAIL, f"torch {probe.version} with ROCm {probe.hip} on {arch}: {symptom} (source: {source})",
                         f"install torch built for ROCm >= {want}: make install TORCH_REQ='torch torchvision --index-url https://download.pytorch.org/whl/rocm{want}'")
    return Check(name, Status.PASS, f"torch {probe.version} with ROCm {probe.hip} on {arch}: no known incompatibility")


def check_miopen_db(root: Path, env: Mapping[str, str], probe: TorchProbe) -> Check:
    name = "MIOpen kernel database"
    if probe.build != "ROCm":
        return Check(name, Status.PASS, "not a ROCm build: not applicable")
    arch = gpu_arch_seen_by_runtime(root, env)
    if arch is None:
        return Check(name, Status.PASS, "no AMD GPU in the kfd topology: not applicable")
    dirs = miopen_db_dirs(root, env, Path(probe.torch_dir) if probe.torch_dir else None)
    found = find_kernel_db(dirs, arch.name, arch.compute_units)
    if found:
        return Check(name, Status.PASS, f"{found} for {arch.describe()}")
    names = " or ".join(kernel_db_names(arch.name, arch.compute_units))
    where = ", ".join(str(d) for d in dirs) or "no MIOpen db directory"
    return Check(name, Status.WARN, f"no {names} in {where}: MIOpen compiles kernels at run time (slow first epoch; runs were seen to hang)",
                 f"keep [patches] conv_fallback = \"auto\" (it turns on) or install the package miopen-hip-{arch.name}kdb")


# -- devices, logs, services -----------------------------------------------------------------------

def _can_open_rw(path: Path) -> bool:
    return os.access(path, os.R_OK | os.W_OK)


def check_device_access(root: Path, user: str, groups: set[str], probe: TorchProbe, can_open=_can_open_rw) -> Check:
    """/dev/kfd and /dev/dri/renderD* readable and writable, and the user in the video and render groups."""
    name = "GPU device access"
    kfd = root / "dev/kfd"
    if not kfd.exists():
        if probe.build == "ROCm" or kfd_gpu_nodes(root):
            return Check(name, Status.FAIL, f"{kfd} does not exist: the amdgpu kernel driver is not loaded", "sudo modprobe amdgpu; check dmesg for amdgpu errors")
        return Check(name, Status.PASS, "no /dev/kfd: not a ROCm system")
    renders = sorted((root / "dev/dri").glob("renderD*"))
    denied = [str(p) for p in [kfd, *renders] if not can_open(p)]
    missing_groups = sorted({"video", "render"} - groups)
    if not renders:
        return Check(name, Status.FAIL, f"no {root / 'dev/dri'}/renderD* device", "check that amdgpu bound the card: ls /sys/class/drm")
    if denied:
        return Check(name, Status.FAIL, f"{user} cannot open {', '.join(denied)}; groups missing: {', '.join(missing_groups) or 'none'}",
                     f"sudo usermod -aG video,render {user}, then log in again")
    if missing_groups:
        return Check(name, Status.WARN, f"devices open now, but {user} is not in {', '.join(missing_groups)} (a service user may lose access)",
                     f"sudo usermod -aG video,render {user}")
    return Check(name, Status.PASS, f"{user} can open {kfd} and {len(renders)} render node(s); in video and render")


def check_kernel_log(root: Path, journalctl: str | None) -> Check:
    name = "kernel log"
    kmsg = root / "dev/kmsg"
    try:
        fd = os.open(kmsg, os.O_RDONLY | os.O_NONBLOCK)
        os.close(fd)
        return Check(name, Status.PASS, f"{kmsg} readable: GPU resets and hangs are seen as they happen")
    except OSError as exc:
        reason = exc.strerror
    if journalctl:
        return Check(name, Status.WARN, f"{kmsg}: {reason}; falling back to {journalctl} -k",
                     "run the service as root or with CAP_SYSLOG (the unit file does), or: sudo sysctl kernel.dmesg_restrict=0")
    return Check(name, Status.WARN, f"{kmsg}: {reason}, and no journalctl: driver hangs are judged by heartbeats alone",
                 "run the service as root or with CAP_SYSLOG")


def check_systemd(root: Path) -> Check:
    # /run/systemd/system exists exactly when systemd is PID 1: sd_booted()'s own test.
    if (root / "run/systemd/system").is_dir():
        return Check("systemd", Status.PASS, "booted with systemd: `yolo-train install-service` can be used")
    return Check("systemd", Status.WARN, "not booted with systemd: no service, no restart after reboot",
                 "run `yolo-train run` in the foreground, or under your own supervisor")


def check_free_disk(path: Path, need_gib: float) -> Check:
    name = "free disk for checkpoints"
    probe = path
    while not probe.exists() and probe != probe.parent:
        probe = probe.parent
    try:
        free = shutil.disk_usage(probe).free / 2**30
    except OSError as exc:
        return Check(name, Status.FAIL, f"{path}: {exc.strerror}", "choose a writable checkpoint directory ([train] project)")
    if not os.access(probe, os.W_OK):
        return Check(name, Status.FAIL, f"{probe} is not writable", f"choose a writable directory or chown it to {pwd.getpwuid(os.getuid()).pw_name}")
    detail = f"{free:.1f} GiB free at {probe}"
    if free < need_gib:
        return Check(name, Status.FAIL, f"{detail}, need {need_gib:g} GiB", "free space or point [train] project elsewhere")
    if free < 2 * need_gib:
        return Check(name, Status.WARN, f"{detail}, under twice the {need_gib:g} GiB needed", "free space before a long run")
    return Check(name, Status.PASS, detail)


def check_dataset_yaml(path: Path | None) -> Check:
    name = "dataset YAML"
    if path is None:
        return Check(name, Status.WARN, "no dataset given", "pass --data path/to/data.yaml")
    try:
        import yaml

        data = yaml.safe_load(path.read_text())
    except OSError as exc:
        return Check(name, Status.FAIL, f"{path}: {exc.strerror}", "check the path and its permissions")
    except yaml.YAMLError as exc:
        return Check(name, Status.FAIL, f"{path}: not valid YAML ({str(exc).splitlines()[0]})", "fix the YAML syntax")
    if not isinstance(data, dict):
        return Check(name, Status.FAIL, f"{path}: not a mapping", "see https://docs.ultralytics.com/datasets/detect/")
    missing = [key for key in ("train", "val", "names") if key not in data]
    if missing:
        return Check(name, Status.FAIL, f"{path}: missing keys {', '.join(missing)}", "add them; see https://docs.ultralytics.com/datasets/detect/")
    base = Path(data.get("path") or path.parent)
    base = base if base.is_absolute() else path.parent / base
    absent = [str(base / p) for key in ("train", "val") for p in ([data[key]] if isinstance(data[key], str) else data[key]) if not (base / p).exists()]
    if absent:
        return Check(name, Status.WARN, f"{path} readable, but {', '.join(absent)} not found (Ultralytics may try to download it)",
                     "fix 'path'/'train'/'val', or set download: to nothing")
    return Check(name, Status.PASS, f"{path}: {len(data['names'])} classes, train and val found")


# -- shell --------------------------------------------------------------------------------------------

def user_groups() -> tuple[str, set[str]]:
    user = pwd.getpwuid(os.getuid()).pw_name
    return user, {grp.getgrgid(g).gr_name for g in os.getgroups() if _has_group(g)}


def _has_group(gid: int) -> bool:
    try:
        grp.getgrgid(gid)
        return True
    except KeyError:
        return False


def run_checks(root: Path, env: Mapping[str, str], probe: TorchProbe, user: str, groups: set[str],
               checkpoints: Path, data: Path | None, need_gib: float,
               rocminfo_text: str | None = None, journalctl: str | None = None) -> list[Check]:
    arch = gpu_arch_seen_by_runtime(root, env)
    return [
        check_torch_build(probe),
        check_gpus_visible(probe, root),
        check_architecture(root, env, rocminfo_text),
        check_torch_rocm_pair(probe, arch.name if arch else (probe.gpu_archs[0].split(":")[0] if probe.gpu_archs and probe.gpu_archs[0] else None)),
        check_miopen_db(root, env, probe),
        check_device_access(root, user, groups, probe),
        check_kernel_log(root, journalctl),
        check_systemd(root),
        check_free_disk(checkpoints, need_gib),
        check_dataset_yaml(data),
    ]


def format_check(check: Check) -> str:
    line = f"[{check.status.name.lower():4s}] {check.name}: {check.detail}"
    return line + (f"\n       fix: {check.fix}" if check.fix and check.status is not Status.PASS else "")


def _rocminfo_without_override(root: Path) -> str | None:
    if kfd_gpu_nodes(root) or not shutil.which("rocminfo"):
        return None
    env = {k: v for k, v in os.environ.items() if k != "HSA_OVERRIDE_GFX_VERSION"}
    try:
        return subprocess.run(["rocminfo"], capture_output=True, text=True, timeout=30, env=env).stdout
    except (OSError, subprocess.TimeoutExpired):
        return None


def doctor_main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="yolo-train doctor", description="Check that this machine can train; exit 0 pass, 1 warn, 2 fail.")
    parser.add_argument("--python", default=sys.executable, help="the training venv's python (default: this one)")
    parser.add_argument("--checkpoints", type=Path, default=Path("runs"), help="where checkpoints go (default: runs)")
    parser.add_argument("--data", type=Path, help="the dataset YAML")
    parser.add_argument("--need-gib", type=float, default=5.0, help="free disk needed for checkpoints (default 5)")
    parser.add_argument("--root", type=Path, default=Path("/"), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    env = os.environ
    user, groups = user_groups()
    checks = run_checks(args.root, env, probe_torch(args.python, env), user, groups, args.checkpoints, args.data,
                        args.need_gib, _rocminfo_without_override(args.root), shutil.which("journalctl"))
    for check in checks:
        print(format_check(check))
    worst = max(check.status for check in checks)
    print(f"doctor: {worst.name.lower()} ({sum(c.status is Status.WARN for c in checks)} warning(s), {sum(c.status is Status.FAIL for c in checks)} failure(s))")
    return int(worst)
