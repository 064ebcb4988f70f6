"""Which AMD GPU architecture the ROCm runtime will report, and whether MIOpen has a kernel database for it.

No torch here: the supervisor's `yolo-train doctor` uses this module too.

Formats, from the real things:
- ``/sys/class/kfd/kfd/topology/nodes/<n>/properties``: one ``key value`` per line. A GPU node has
  ``gfx_target_version`` = major*10000 + minor*100 + stepping (100300 is gfx1030, 90010 is gfx90a:
  minor and stepping are written in hex in the name); processor nodes have 0. Compute units are
  ``simd_count / simd_per_cu``.
- ``HSA_OVERRIDE_GFX_VERSION=10.3.0`` makes the runtime report gfx1030 whatever the card is.
- MIOpen's kernel database is ``<db dir>/<arch><suffix>.kdb``, where the suffix is the compute-unit
  count the runtime reports (``_40`` for 40, bare hex above 64: ``gfx90a6e``), as in MIOpen's
  ``Handle::GetDbBasename``; newer MIOpen falls back to ``<arch>.kdb``. On gfx10 and later the
  runtime counts work-group processors (two CUs each), so an 80-CU RX 6900 XT looks up
  ``gfx1030_40.kdb``. The db directory is ``$MIOPEN_SYSTEM_DB_PATH`` when set, else
  ``<rocm>/share/miopen/db`` (``<rocm>/miopen/share/miopen/db`` before ROCm 5.3; ``<rocm>`` is
  ``/opt/rocm/core-X.Y`` for the 2026 ROCm Core SDK packages), and torch's ROCm
  wheels carry their own MIOpen whose database goes under ``<torch>/share/miopen/db``.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

KFD_NODES = "sys/class/kfd/kfd/topology/nodes"


@dataclass(frozen=True)
class GpuArch:
    name: str  # "gfx1030"
    compute_units: int | None  # as the runtime reports them (work-group processors on gfx10+)
    overridden_from: str | None = None  # the real architecture when HSA_OVERRIDE_GFX_VERSION is set

    def describe(self) -> str:
        cu = f", {self.compute_units} CUs" if self.compute_units else ""
        real = f" (HSA_OVERRIDE_GFX_VERSION; the card is {self.overridden_from})" if self.overridden_from else ""
        return f"{self.name}{cu}{real}"


@dataclass(frozen=True)
class KfdNode:
    path: Path
    arch: str
    hardware_compute_units: int | None
    properties: dict[str, int]


def arch_from_target_version(version: int) -> str | None:
    if version <= 0:
        return None
    major, minor, stepping = version // 10000, version // 100 % 100, version % 100
    return f"gfx{major}{minor:x}{stepping:x}"


def arch_from_override(value: str) -> str | None:
    """"10.3.0" -> "gfx1030"; None when the value is not major.minor.stepping."""
    m = re.fullmatch(r"\s*(\d+)\.(\d+)\.(\d+)\s*", value)
    if not m:
        return None
    major, minor, stepping = (int(g) for g in m.groups())
    return f"gfx{major}{minor:x}{stepping:x}"


def parse_properties(text: str) -> dict[str, int]:
    props = {}
    for line in text.splitlines():
        key, _, value = line.strip().partition(" ")
        try:
            props[key] = int(value)
        except ValueError:
            continue
    return props


def kfd_gpu_nodes(root: Path) -> list[KfdNode]:
    """The GPU nodes of the kfd topology under ``root``, in node order."""
    nodes_dir = root / KFD_NODES
    try:
        entries = sorted(nodes_dir.iterdir(), key=lambda p: int(p.name) if p.name.isdigit() else -1)
    except OSError:
        return []
    nodes = []
    for entry in entries:
        try:
            props = parse_properties((entry / "properties").read_text())
        except OSError:
            continue
        arch = arch_from_target_version(props.get("gfx_target_version", 0))
        if arch is None:
            continue
        simds, per_cu = props.get("simd_count", 0), props.get("simd_per_cu", 0)
        nodes.append(KfdNode(entry, arch, simds // per_cu if simds and per_cu else None, props))
    return nodes


def runtime_compute_units(arch: str, hardware_cus: int | None) -> int | None:
    """The count HIP reports and MIOpen names its files by: work-group processors on gfx10+."""
    if hardware_cus is None:
        return None
    return hardware_cus // 2 if re.match(r"gfx1\d\d", arch) else hardware_cus


def gpu_arch_seen_by_runtime(root: Path, env: Mapping[str, str]) -> GpuArch | None:
    """The first GPU's architecture as the ROCm runtime will report it; None without an AMD GPU."""
    nodes = kfd_gpu_nodes(root)
    if not nodes:
        return None
    node = nodes[0]
    override = arch_from_override(env.get("HSA_OVERRIDE_GFX_VERSION", ""))
    name = override or node.arch
    return GpuArch(
        name,
        runtime_compute_units(name, node.hardware_compute_units),
        node.arch if override and override != node.arch else None,
    )


def miopen_db_dirs(root: Path, env: Mapping[str, str], torch_dir: Path | None = None) -> list[Path]:
    """Existing MIOpen system-db directories, most specific first; paths are under ``root``."""
    candidates = []
    if env.get("MIOPEN_SYSTEM_DB_PATH"):
        candidates.append(Path(env["MIOPEN_SYSTEM_DB_PATH"]))
    if torch_dir is not None:
        candidates.append(torch_dir / "share/miopen/db")
    # ROCm Core SDK packages (TheRock, 2026) install to /opt/rocm/core-X.Y (build_package.py's prefix).
    cores = sorted((root / "opt/rocm").glob("core-*"), reverse=True)
    for rocm in (env.get("ROCM_PATH"), *("/" + str(c.relative_to(root)) for c in cores), "/opt/rocm"):
        if rocm:
            candidates += [Path(rocm) / "share/miopen/db", Path(rocm) / "miopen/share/miopen/db"]
    found = []
    for path in candidates:
        under_root = root / path.relative_to("/") if path.is_absolute() else path
        if under_root.is_dir() and under_root not in found:
            found.append(under_root)
    return found


def kernel_db_names(arch: str, compute_units: int | None) -> list[str]:
    """File names MIOpen tries, in order."""
    names = []
    if compute_units:
        suffix = f"_{compute_units}" if compute_units <= 64 else f"{compute_units:x}"
        names.append(f"{arch}{suffix}.kdb")
    names.append(f"{arch}.kdb")
    return names


def find_kernel_db(dirs: list[Path], arch: str, compute_units: int | None) -> Path | None:
    for directory in dirs:
        for name in kernel_db_names(arch, compute_units):
            if (directory / name).is_file():
                return directory / name
    return None


@dataclass(frozen=True)
class KernelDbLookup:
    """Where MIOpen's kernel database for one architecture was looked for, and what was found."""
    dirs: list[Path]
    found: Path | None

    def searched(self) -> str:
        return ", ".join(str(d) for d in self.dirs) or "(no MIOpen db directory exists)"


def kernel_db_lookup(root: Path, env: Mapping[str, str], *, torch_dir: Path | None, arch: GpuArch) -> KernelDbLookup:
    """MIOpen's kernel database for the architecture the runtime reports, looked up as MIOpen does."""
    dirs = miopen_db_dirs(root, env, torch_dir=torch_dir)
    return KernelDbLookup(dirs, find_kernel_db(dirs, arch.name, arch.compute_units))


def configured(key: str, mode: str, modes: tuple[str, ...]) -> tuple[bool, str] | None:
    """A MIOpen fallback's ``[patches] key = mode`` where the configuration decides it ("on", "off"): (enable, reason
    in words); None for "auto", which the machine decides. A mode not in ``modes`` is a ValueError naming the key."""
    if mode not in modes:
        raise ValueError(f"[patches] {key} = {mode!r}: expected one of {', '.join(modes)}")
    if mode in ("on", "off"):
        return mode == "on", f"{key} = {mode!r} in the configuration"
    return None
