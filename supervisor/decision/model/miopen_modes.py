"""Which MIOpen mode a run's settings give: how PyTorch asks MIOpen for each new convolution's kernels, and what the
MIOpen variables change in that mode. Pure; the one table the docs' (docs/behaviour.md) is rendered from.

PyTorch's side, aten/src/ATen/native/miopen/Conv_miopen.cpp, by torch version (the flags are ``deterministic``:
``torch.backends.cudnn.deterministic`` or ``torch.use_deterministic_algorithms``, as Ultralytics' ``deterministic``
sets both; ``benchmark``: ``torch.backends.cudnn.benchmark``, which Ultralytics' training never sets):

- 2.6 and before: ``if (benchmark)`` a find (``miopenFind*Algorithm(..., exhaustiveSearch=false)``), else immediate
  mode (``miopenConvolution*Immediate``); under ROCm ``benchmark`` was on by default (pytorch PR #82656).
- 2.7, 2.8 (pytorch PR #145294, merged 2025-02-05): ``benchmark`` off by default; immediate mode only with
  ``deterministic`` on and ``benchmark`` off; otherwise a find, with ``exhaustiveSearch = benchmark``.
- 2.9 and later (pytorch PR #158951, merged 2025-07-25): immediate mode only with ``torch.backends.miopen.immediate``
  (``Context::immediateMiopen``, off by default); otherwise a find, ``exhaustiveSearch = benchmark``;
  ``deterministic`` only restricts the solvers (``MIOPEN_CONVOLUTION_ATTRIB_DETERMINISTIC`` on the descriptor).

With ``benchmark`` on, torch also sets the descriptor's find mode to NORMAL (aten/src/ATen/miopen/Descriptors.h,
``miopenSetConvolutionFindMode``), which MIOpen takes over ``MIOPEN_FIND_MODE``: the exhaustive search cannot be
turned off by the environment (legacy-rocm-build #6337).

MIOpen's side (projects/miopen/src/include/miopen/find_controls.hpp, src/ocl/convolutionocl.cpp ``FindConvolution``
in ROCm/rocm-libraries): immediate mode never searches, and disables MIOPEN_FIND_ENFORCE (``CompileSolution``).
A find does what ``MIOPEN_FIND_MODE`` says (``FIND_MODES``); it tunes (the kernel search whose lines
attempt/search_lines.py reads) only with ``exhaustiveSearch``, with TRUST_VERIFY(_FULL) (MIOpen PR #3604) where the
user find-db has no entry or the system db's timing is off, or with ``MIOPEN_FIND_ENFORCE`` SEARCH (3) or
SEARCH_DB_UPDATE (4).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from supervisor.vocabulary import MiopenMode

IMMEDIATE, FIND, EXHAUSTIVE = MiopenMode.IMMEDIATE, MiopenMode.FIND, MiopenMode.EXHAUSTIVE


@dataclass(frozen=True)
class TorchEra:
    label: str
    last: tuple[int, int] | None  # the last torch (major, minor) of the era; None: open
    source: str
    immediate_flag: bool  # torch.backends.miopen.immediate exists


ERAS = (
    TorchEra("torch 2.6 and before", (2, 6), "pytorch PR #82656 (benchmark on under ROCm)", False),
    TorchEra("torch 2.7, 2.8", (2, 8), "pytorch PR #145294", False),
    TorchEra("torch 2.9 and later", None, "pytorch PR #158951", True),
)

# (deterministic, benchmark, torch.backends.miopen.immediate) -> the mode in each era of ERAS; None: any value. The
# first row that fits is the one; an era without the immediate flag (its None) reads its rows as if it were off.
ASKS: tuple[tuple[bool | None, bool | None, bool, tuple[MiopenMode | None, ...]], ...] = (
    (None, None, True, (None, None, IMMEDIATE)),
    (False, False, False, (IMMEDIATE, FIND, FIND)),
    (True, False, False, (IMMEDIATE, IMMEDIATE, FIND)),
    (None, True, False, (FIND, EXHAUSTIVE, EXHAUSTIVE)),
)


@dataclass(frozen=True)
class FindMode:
    value: int
    name: str
    does: str  # what a find (not exhaustive) does in this mode
    searches: bool  # a find may tune (a kernel search) without exhaustiveSearch


FIND_MODES = (
    FindMode(1, "NORMAL", "compiles and times every applicable solver", False),
    FindMode(2, "FAST", "the find-db's entry, else a heuristic's choice: nothing compiled to be timed", False),
    FindMode(3, "HYBRID", "the find-db's entry, else a normal find", False),
    FindMode(4, "(deprecated)", "as NORMAL", False),
    FindMode(5, "DYNAMIC_HYBRID", "MIOpen's default: the find-db's entry, else a normal find over the solvers that "
                                  "need no recompiling", False),
    FindMode(6, "TRUST_VERIFY", "the user find-db's entry, else the system db's timed here, and a search where it "
                                "is missing or slower than recorded (MIOPEN_VERIFY_TOLERANCE_PCT)", True),
    FindMode(7, "TRUST_VERIFY_FULL", "as TRUST_VERIFY, its search over every solver", True),
)
DEFAULT_FIND_MODE = 5
ENFORCE_SEARCH = {3: "SEARCH", 4: "SEARCH_DB_UPDATE"}  # MIOPEN_FIND_ENFORCE values that tune in every find


@dataclass(frozen=True)
class MiopenRun:
    """What the shell knows of a run under a ROCm build of torch: its version, and the MIOPEN_ variables the worker
    inherits from the supervisor's environment ([worker] env and the rung's env come on top)."""
    torch: tuple[int, int]
    inherited: Mapping[str, str]


@dataclass(frozen=True)
class MiopenSetting:
    mode: MiopenMode
    searches: bool  # a kernel search (MIOpen's tuning) can happen under these settings
    why: str  # what the MIOPEN_ variables make of it

    def describe(self) -> str:
        """``normal find (MIOPEN_FIND_MODE unset: DYNAMIC_HYBRID, ...); no kernel search`` (incidents, doctor)."""
        return f"{self.mode.value} ({self.why}); {'a kernel search can happen' if self.searches else 'no kernel search'}"


def era_of(torch: tuple[int, int]) -> int:
    return next(i for i, era in enumerate(ERAS) if era.last is None or torch <= era.last)


def ask(torch: tuple[int, int], deterministic: bool, benchmark: bool, immediate: bool = False) -> MiopenMode:
    """How this torch asks MIOpen for a convolution's kernels under these flags (ASKS)."""
    era = era_of(torch)
    immediate = immediate and ERAS[era].immediate_flag
    for det, bench, imm, modes in ASKS:
        if imm == immediate and det in (None, deterministic) and bench in (None, benchmark) \
                and modes[era] is not None:
            return modes[era]
    raise AssertionError("ASKS covers every combination")


def find_mode(env: Mapping[str, str]) -> FindMode:
    """MIOPEN_FIND_MODE as MIOpen reads it (GetFindModeValueImpl2: a name, any case, or a number); unset or wrong:
    the default."""
    raw = env.get("MIOPEN_FIND_MODE", "").strip().upper()
    for mode in FIND_MODES:
        if raw in (mode.name, str(mode.value)):
            return mode
    return next(m for m in FIND_MODES if m.value == DEFAULT_FIND_MODE)


def enforce(env: Mapping[str, str]) -> str | None:
    """MIOPEN_FIND_ENFORCE's name where it makes every find tune, else None."""
    raw = env.get("MIOPEN_FIND_ENFORCE", "").strip().upper()
    return next((name for value, name in ENFORCE_SEARCH.items() if raw in (name, str(value))), None)


def setting(torch: tuple[int, int], deterministic: bool, benchmark: bool, immediate: bool,
            env: Mapping[str, str]) -> MiopenSetting:
    """The mode these flags give under this torch, and what ``env``'s MIOPEN_ variables change in it."""
    mode = ask(torch, deterministic, benchmark, immediate)
    if mode == IMMEDIATE:
        return MiopenSetting(mode, False, "no find: MIOPEN_FIND_MODE and MIOPEN_FIND_ENFORCE change nothing")
    if mode == EXHAUSTIVE:
        return MiopenSetting(mode, True, "benchmark on: torch sets each convolution's find mode to NORMAL, so "
                                         "MIOPEN_FIND_MODE changes nothing")
    found, forced = find_mode(env), enforce(env)
    said = f"MIOPEN_FIND_MODE={env['MIOPEN_FIND_MODE']}" if "MIOPEN_FIND_MODE" in env else "MIOPEN_FIND_MODE unset"
    why = f"{said}: {found.name}, {found.does}" + (f"; MIOPEN_FIND_ENFORCE={forced}: every find tunes" if forced else "")
    return MiopenSetting(mode, found.searches or forced is not None, why)


def _flag(value: bool | None) -> str:
    return "any" if value is None else "on" if value else "off"


def table() -> str:
    """docs/behaviour.md's tables, from ERAS, ASKS and FIND_MODES."""
    head = "| deterministic | benchmark | torch.backends.miopen.immediate | " + \
           " | ".join(era.label for era in ERAS) + " |"
    lines = [head, "|" + "---|" * (3 + len(ERAS))]
    for det, bench, imm, modes in ASKS:
        cells = [m.value if m is not None else "no such flag" for m in modes]
        lines.append(f"| {_flag(det)} | {_flag(bench)} | {_flag(imm)} | " + " | ".join(cells) + " |")
    lines += ["", "Sources: " + "; ".join(f"{era.label}: {era.source}" for era in ERAS) + ".", "",
              "| MIOPEN_FIND_MODE | what a normal find does | a kernel search without benchmark |", "|---|---|---|"]
    lines += [f"| {m.value} {m.name} | {m.does} | {'yes' if m.searches else 'no'} |" for m in FIND_MODES]
    lines += ["", "In immediate mode no MIOpen variable changes which kernels run, nor does MIOPEN_FIND_MODE under "
                  "`benchmark`; `MIOPEN_FIND_ENFORCE` = " + " or ".join(f"{v} ({n})" for v, n in ENFORCE_SEARCH.items())
              + " makes every find tune."]
    return "\n".join(lines) + "\n"
