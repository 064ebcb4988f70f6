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

from supervisor.decision import miopen_setting
from worker.wire.miopen_db import (
    arch_from_override,
    gpu_arch_seen_by_runtime,
    kernel_db_lookup,
    kernel_db_names,
    kfd_gpu_nodes,
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
    lookup = kernel_db_lookup(root, env, torch_dir=Path(probe.torch_dir) if probe.torch_dir else None, arch=arch)
    if lookup.found:
        return Check(name, Status.PASS, f"{lookup.found} for {arch.describe()}")
    names = " or ".join(kernel_db_names(arch.name, arch.compute_units))
    return Check(name, Status.WARN, f"no {names} in {lookup.searched()}: MIOpen compiles kernels at run time (slow first epoch; runs were seen to hang)",
                 f"keep [patches] conv_fallback = \"auto\" (it turns on) or install the package miopen-hip-{arch.name}kdb")


def torch_minor(version: str) -> tuple[int, int] | None:
    m = re.match(r"(\d+)\.(\d+)", version or "")
    return (int(m.group(1)), int(m.group(2))) if m else None


def check_miopen_mode(probe: TorchProbe, env: Mapping[str, str]) -> Check:
    """Which MIOpen mode Ultralytics' training gets from this torch (its ``deterministic``, default on, and off;
    ``benchmark`` it never sets) and this environment's MIOPEN_ variables (docs/behaviour.md's tables)."""
    name = "MIOpen mode"
    torch = torch_minor(probe.version)
    if probe.build != "ROCm" or torch is None:
        return Check(name, Status.PASS, "not a ROCm build: not applicable")
    on, off = (miopen_setting(torch, det, False, False, env).describe() for det in (True, False))
    said = f"torch {probe.version}, Ultralytics' deterministic = true (its default): {on}"
    return Check(name, Status.PASS, said + ("" if off == on else f"; with deterministic = false: {off}"))


# -- ROCm installs, packages and the wheel for the card ------------------------------------------------

# Where ROCm lives. The 2026 ROCm Core SDK packages (built by TheRock) install to /opt/rocm/core-X.Y, with
# /opt/rocm/core a link to it: TheRock build_tools/packaging/linux/build_package.py, "Release: /opt/rocm/core-7.15",
# and native_linux_package_install_test.py, "/opt/rocm/core -> /opt/rocm/core-X.Y". Before, /opt/rocm-X.Y.Z with
# /opt/rocm a link to it (or /opt/rocm itself).
HSA_RUNTIME = "lib/libhsa-runtime64.so.1"
CORE_DIR = re.compile(r"core-(?:(asan)-)?(\d+\.\d+)")
LEGACY_DIR = re.compile(r"rocm-(\d+\.\d+(?:\.\d+)?)")
# Package names: TheRock's packaging_utils.update_package_name makes amdrocm<X.Y> / amdrocm-<lib><X.Y>[-gfxNNNN]
# (e.g. amdrocm7.14-gfx1010, amdrocm-dnn7.14-gfx1010, MIOpen being amdrocm-dnn); ROCm 6 and before ship rocm-*,
# hip-*, hsa-rocr, miopen-hip and miopen-hip-<gfx>kdb.
ROCM_PACKAGE = re.compile(r"(?:amdrocm|rocm|hip|hsa|miopen|rocblas|hipblas|rccl)[\w.+-]*")


@dataclass(frozen=True)
class RocmInstall:
    path: Path  # as on the machine (without the fixture root)
    version: str | None
    kind: str  # "ROCm Core SDK" or "ROCm"
    has_runtime: bool  # lib/libhsa-runtime64.so.1 is there

    def describe(self) -> str:
        runtime = "" if self.has_runtime else f" (no {HSA_RUNTIME}: incomplete)"
        return f"{self.kind} {self.version or '(version unknown)'} at {self.path}{runtime}"


def _legacy_version(directory: Path) -> str | None:
    try:  # rocm-core writes .info/version, e.g. "6.3.1-48"
        return (directory / ".info/version").read_text().strip().split("-")[0] or None
    except OSError:
        return None


def find_rocm_installs(root: Path) -> list[RocmInstall]:
    """ROCm installs under ``root``: Core SDK trees /opt/rocm/core-X.Y first (newest first), then /opt/rocm-X.Y and
    /opt/rocm; a link to a tree already listed (/opt/rocm/core, /opt/rocm -> /opt/rocm-6.3.1) is not listed again."""
    found, seen = [], set()

    def add(directory: Path, version: str | None, kind: str) -> None:
        real = directory.resolve()
        if real in seen or not directory.is_dir():
            return
        seen.add(real)
        found.append(RocmInstall(Path("/") / directory.relative_to(root), version, kind, (directory / HSA_RUNTIME).exists()))

    cores = [(m, d) for d in (root / "opt/rocm").glob("core-*") if (m := CORE_DIR.fullmatch(d.name)) and not d.is_symlink()]
    for m, d in sorted(cores, key=lambda md: tuple(int(x) for x in md[0].group(2).split(".")), reverse=True):
        add(d, m.group(2), "ROCm Core SDK" + (" (ASan build)" if m.group(1) else ""))
    for d in sorted((root / "opt").glob("rocm-*"), reverse=True):
        if (m := LEGACY_DIR.fullmatch(d.name)) and not d.is_symlink():
            add(d, _legacy_version(d) or m.group(1), "ROCm")
    legacy = root / "opt/rocm"
    if legacy.is_dir() and ((legacy / HSA_RUNTIME).exists() or (legacy / ".info/version").exists()):
        add(legacy, _legacy_version(legacy), "ROCm")
    return found


def parse_package_list(text: str) -> list[tuple[str, str]]:
    """ROCm's packages in ``dpkg-query -W`` output (``name<TAB>version`` per line, its default format; the same as
    ``rpm -qa --qf '%{NAME}\\t%{VERSION}-%{RELEASE}\\n'``); an architecture suffix (``:amd64``) is dropped."""
    packages = []
    for line in text.splitlines():
        name, _, version = line.partition("\t")
        name = name.strip().split(":")[0]
        if ROCM_PACKAGE.fullmatch(name) and version.strip():
            packages.append((name, version.strip()))
    return packages


def check_rocm_install(installs: list[RocmInstall], packages: list[tuple[str, str]] | None) -> Check:
    name = "ROCm install"
    if packages is None:
        listed = "packages not read"
    elif not packages:
        listed = "no ROCm packages installed"
    else:
        family = "amdrocm-* (ROCm Core SDK)" if any(n.startswith("amdrocm") for n, _ in packages) else "rocm-*/hip-*"
        shown = ", ".join(f"{n} {v}" for n, v in packages[:6]) + (f", and {len(packages) - 6} more" if len(packages) > 6 else "")
        listed = f"{len(packages)} {family} package(s): {shown}"
    if not installs:
        # TheRock RELEASES.md: "The `torch` packages depend on `rocm[libraries]` ... you do not need to explicitly
        # install ROCm first": a system ROCm is optional; the amdgpu kernel driver is what the machine needs.
        return Check(name, Status.PASS, f"no ROCm under /opt (torch's multi-arch wheels bring their own ROCm); {listed}")
    broken = [i for i in installs if not i.has_runtime and i.kind.startswith("ROCm Core SDK")]
    detail = "; ".join(i.describe() for i in installs) + f"; {listed}"
    if broken:
        return Check(name, Status.WARN, detail, "reinstall the amdrocm packages (sudo apt install --reinstall amdrocm)")
    return Check(name, Status.PASS, detail)


# The wheel for the card: TheRock's multi-arch releases ("One index URL for all GPUs: select your target with a pip
# extra like `[device-gfx942]` instead of finding a per-family index URL", RELEASES.md; per-family releases stopped,
# docs/packaging/legacy_per_family_releases.md: "no new per-family releases will be generated"). RELEASES.md
# documents the nightly index https://rocm.nightlies.amd.com/whl-multi-arch/ and its install line
#   pip install --index-url https://rocm.nightlies.amd.com/whl-multi-arch/ "torch[device-gfx942]" "torchvision[device-gfx942]" torchaudio
# The release index is named by TheRock PR #6137 ("Mark RDNA3 (gfx1100-1103) and RDNA1/2 (gfx10xx)
# as Release Ready"): "These architectures are published at repo.amd.com/rocm/whl-multi-arch/"; RELEASES.md itself
# only has a TODO to mention it, so both are printed.
MULTI_ARCH_INDEX = "https://repo.amd.com/rocm/whl-multi-arch/"
MULTI_ARCH_NIGHTLY_INDEX = "https://rocm.nightlies.amd.com/whl-multi-arch/"
# RELEASES.md's table "Supported Python `[device-*]` install extras".
DEVICE_EXTRAS = {
    "gfx950", "gfx942", "gfx90a", "gfx908", "gfx906", "gfx900", "gfx1201", "gfx1200", "gfx1153", "gfx1152", "gfx1151",
    "gfx1150", "gfx1103", "gfx1102", "gfx1101", "gfx1100", "gfx1030", "gfx1031", "gfx1032", "gfx1033", "gfx1034",
    "gfx1035", "gfx1036", "gfx1010", "gfx1011", "gfx1012",
}


def wheel_install_line(arch: str) -> str:
    extra = f"device-{arch}"
    return f"make install TORCH_REQ='\"torch[{extra}]\" \"torchvision[{extra}]\" --index-url {MULTI_ARCH_INDEX}'"


def check_torch_wheel(root: Path, env: Mapping[str, str], probe: TorchProbe) -> Check:
    """The exact torch wheel for the card (its real architecture: the per-device wheel carries its kernels, so no
    HSA_OVERRIDE_GFX_VERSION is needed with it), and whether the installed torch already runs on it natively."""
    name = "torch wheel for this GPU"
    nodes = kfd_gpu_nodes(root)
    if not nodes:
        return Check(name, Status.PASS, "no AMD GPU in the kfd topology: not applicable")
    arch = nodes[0].arch
    if arch not in DEVICE_EXTRAS:
        return Check(name, Status.WARN, f"{arch} has no [device-{arch}] extra in TheRock's RELEASES.md table (not confirmed either way)",
                     f"see https://github.com/ROCm/TheRock/blob/main/RELEASES.md; [device-all] from {MULTI_ARCH_INDEX} carries every target built")
    wheel = f"torch[device-{arch}] and torchvision[device-{arch}] from {MULTI_ARCH_INDEX} (nightly: {MULTI_ARCH_NIGHTLY_INDEX})"
    override = env.get("HSA_OVERRIDE_GFX_VERSION", "").strip()
    native = probe.build == "ROCm" and not override and any(a.split(":")[0] == arch for a in probe.gpu_archs)
    if native:
        return Check(name, Status.PASS, f"torch {probe.version} runs on {arch} natively; the wheel for it is {wheel}")
    why = f"HSA_OVERRIDE_GFX_VERSION={override} makes {arch} pass for another card" if override else \
        f"the installed torch ({probe.error and 'broken' or probe.build}) does not run on {arch} natively"
    return Check(name, Status.WARN, f"{why}; the wheel built for it is {wheel}",
                 wheel_install_line(arch) + " (then unset HSA_OVERRIDE_GFX_VERSION)" * bool(override))


# -- the 2026 runtimes and the cards with a named workaround -------------------------------------------

# ROCr 1.21's Runtime::AsyncEventsLoop busy-spins one core for the life of the process after its first kernel launch:
# ROCm/TheRock#7051 (gfx1151 with the 7.14 wheels and TheRock's nightlies, "release-channel ROCR 1.18 clean"; in its
# thread a gfx1030 with the therock-7.14.1 tarball and a gfx1100 with the rocm 10.0.0 wheels), legacy-rocm-build#6634
# (gfx1201, ROCm 7.14, torch 2.12: a fix in develop and the nightlies only, in no release package as of 2026-08-27).
SPINNING_RUNTIMES = ((7, 14), (10, 0))
SPIN_SOURCE = "ROCm/TheRock#7051, legacy-rocm-build#6634"


def runtime_versions(probe: TorchProbe, installs: list[RocmInstall]) -> list[tuple[str, str]]:
    """(where, version) of each ROCm runtime a training may load: the one torch was built with (its wheels bring it),
    and each install under /opt."""
    found = [("torch's", probe.hip)] if probe.hip else []
    return found + [(str(i.path), i.version) for i in installs if i.version]


def check_rocm_runtime(probe: TorchProbe, installs: list[RocmInstall]) -> Check:
    name = "ROCm runtime"
    seen = runtime_versions(probe, installs)
    if not seen:
        return Check(name, Status.PASS, "no ROCm runtime: not applicable")
    spinning = [(where, v) for where, v in seen if hip_version_tuple(v) in SPINNING_RUNTIMES]
    listed = ", ".join(f"{where} {v}" for where, v in seen)
    if not spinning:
        return Check(name, Status.PASS, f"{listed}: not a runtime whose HIP thread is known to spin ({SPIN_SOURCE})")
    return Check(name, Status.WARN,
                 f"{', '.join(f'{where} {v}' for where, v in spinning)}: ROCr's AsyncEventsLoop thread spins a core "
                 f"for as long as the process lives after its first kernel launch (seen on gfx1151, gfx1201, gfx1030, "
                 f"gfx1100; {SPIN_SOURCE}): a core less for the loader workers, and a hung tree never looks idle, so "
                 f"the idle floor cannot shorten its bound",
                 "use torch wheels of ROCm 7.2 (its ROCr 1.18 does not spin) or a nightly that has the fix")


# Integrated GPUs, which share the host's memory (AMD's LLVM target table: Raven, Renoir/Cezanne, Van Gogh,
# Rembrandt, Raphael, Mendocino, Phoenix/Hawk Point, Strix Point, Strix Halo, Krackan).
APUS = ("gfx902", "gfx909", "gfx90c", "gfx1033", "gfx1035", "gfx1036", "gfx1037", "gfx1103", "gfx1150", "gfx1151",
        "gfx1152", "gfx1153")


@dataclass(frozen=True)
class CardWorkaround:
    archs: tuple[str, ...]
    family: str
    trouble: str
    variable: str
    value: str
    source: str
    ladder: str  # where the default ladder takes it


CARD_WORKAROUNDS = (
    CardWorkaround(("gfx1200", "gfx1201"), "gfx12 (RX 9060/9070, Radeon AI PRO R9700)",
                   "training with hipBLASLt resets the GPU or faults (\"Memory access fault by GPU node-1 ... Page not "
                   "present\")", "TORCH_BLAS_PREFER_HIPBLASLT", "0",
                   "ROCm/TheRock#7699; legacy-rocm-build#6413, traced to hipBLASLt in rocm-libraries#7992",
                   "its rung after a GPU reset or page fault in training"),
    CardWorkaround(APUS, "an APU", "lost SDMA copy completions hang the GPU and reset it", "HSA_ENABLE_SDMA", "0",
                   "legacy-rocm-build#6386: a Radeon 780M had 5 hangs and 9 resets in one night on a stack without "
                   "it, about one hang in 2-3 days with it", "its first rung"),
)


def check_card_workarounds(root: Path, env: Mapping[str, str]) -> Check:
    """The cards of this machine (their real architecture, kfd topology) for which a workaround is named, and whether
    the environment has it."""
    name = "workarounds for this GPU"
    archs = [node.arch for node in kfd_gpu_nodes(root)]
    if not archs:
        return Check(name, Status.PASS, "no AMD GPU in the kfd topology: not applicable")
    named = [(arch, w) for arch in dict.fromkeys(archs) for w in CARD_WORKAROUNDS if arch in w.archs]
    if not named:
        return Check(name, Status.PASS, f"{', '.join(dict.fromkeys(archs))}: no workaround named for it")
    said = [f"{arch} is {w.family}: {w.trouble}; {w.variable}={w.value} ({w.source}), "
            + ("set" if env.get(w.variable) == w.value else f"the default ladder sets it at {w.ladder}")
            for arch, w in named]
    missing = [w for _, w in named if env.get(w.variable) != w.value]
    if not missing:
        return Check(name, Status.PASS, "; ".join(said))
    fix = ", ".join(f'{w.variable} = "{w.value}"' for w in missing)
    return Check(name, Status.WARN, "; ".join(said), f"to train with it from the start: [worker] env = {{ {fix} }}")


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
               rocminfo_text: str | None = None, journalctl: str | None = None,
               packages: list[tuple[str, str]] | None = None) -> list[Check]:
    arch = gpu_arch_seen_by_runtime(root, env)
    installs = find_rocm_installs(root)
    return [
        check_torch_build(probe),
        check_gpus_visible(probe, root),
        check_architecture(root, env, rocminfo_text),
        check_torch_rocm_pair(probe, arch.name if arch else (probe.gpu_archs[0].split(":")[0] if probe.gpu_archs and probe.gpu_archs[0] else None)),
        check_miopen_db(root, env, probe),
        check_miopen_mode(probe, env),
        check_rocm_install(installs, packages),
        check_rocm_runtime(probe, installs),
        check_card_workarounds(root, env),
        check_torch_wheel(root, env, probe),
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


def installed_packages() -> list[tuple[str, str]] | None:
    """This machine's ROCm packages from dpkg, else rpm; None when neither can be asked."""
    for command in (["dpkg-query", "-W"], ["rpm", "-qa", "--qf", "%{NAME}\\t%{VERSION}-%{RELEASE}\\n"]):
        if shutil.which(command[0]):
            try:
                return parse_package_list(subprocess.run(command, capture_output=True, text=True, timeout=60).stdout)
            except (OSError, subprocess.TimeoutExpired):
                return None
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
                        args.need_gib, _rocminfo_without_override(args.root), shutil.which("journalctl"),
                        # a fixture root is not this machine: its packages are not read
                        installed_packages() if args.root == Path("/") else None)
    for check in checks:
        print(format_check(check))
    worst = max(check.status for check in checks)
    print(f"doctor: {worst.name.lower()} ({sum(c.status is Status.WARN for c in checks)} warning(s), {sum(c.status is Status.FAIL for c in checks)} failure(s))")
    return int(worst)
