"""MIOpen's kernel search, read from the worker's output: each line of it is news of the startup step it runs in
(decision/stall/kernel_search.py). Pure: a line in, a ``SearchNews`` or None out.

MIOpen prints through MIOPEN_LOG_W, ``MIOpen(HIP): Warning [FUNCTION] MESSAGE`` on stderr, at its default log level
(warnings), so these lines come without any setting. Its two searches, as their sources print them:

- the legacy exhaustive search of the direct OpenCL/HIP convolutions, ``SearchImpl`` (ROCm/MIOpen
  src/solver/conv_ocl_dir2Dfwd_exhaustive_search.cpp, ConvOclDirectFwdLegacyExhaustiveSearch::SearchImpl):
  ``Searching the best solution in the 9 dim space. Please, be patient...`` (or ``4 dim`` for a 1x1 kernel), then
  every ``report_inteval`` candidates (25, 5 for 1x1) ``Runs left: N, min time so far: T, curr time: T CONFIG``;
- the generic search of the tunable solvers (src/include/miopen/generic_search.hpp, GenericSearch):
  ``[GetAllConfigs] SOLVER: Searching the best solution among N...``, then the monitor's
  ``[Monitor] DONE/FAILED/TOTAL TIME, best within recent K: TIME #I CONFIG, ETA:S sec.`` and at its end
  ``[GenericSearch] Done: DONE/FAILED/TOTAL, best #I TIME CONFIG`` (ROCm/MIOpen#2253 shows them as printed).

The count left is what the search says of itself: a generic search's TOTAL less DONE. What output cannot show: a
search that times one candidate for longer than the step's bound says nothing meanwhile, and is judged as silent.
"""

from __future__ import annotations

import re

from supervisor.decision import SearchNews

LIBRARY = "MIOpen"
_PREFIX = "MIOpen("  # MIOpen(HIP) or MIOpen(OpenCL): the cheap test before any regex
_LINE = re.compile(r"MIOpen\((?:HIP|OpenCL)\): Warning "
                   r"\[(?P<function>SearchImpl|GetAllConfigs|Monitor|GenericSearch)\] (?P<message>.*)")
_DIM_SPACE = re.compile(r"Searching the best solution in the \d+ dim space")
_RUNS_LEFT = re.compile(r"Runs left: (?P<left>\d+)")
_AMONG = re.compile(r"Searching the best solution among (?P<total>\d+)")
_MONITOR = re.compile(r"^(?P<done>\d+)/(?P<failed>\d+)/(?P<total>\d+) ")
_DONE = re.compile(r"^Done: (?P<done>\d+)/\d+/(?P<total>\d+)")


def read(line: str) -> SearchNews | None:
    """The search news a line of output carries, or None for any other line."""
    if _PREFIX not in line:
        return None
    m = _LINE.search(line)
    if m is None:
        return None
    function, message = m.group("function"), m.group("message")
    shown = line.strip()[:300]
    if function == "SearchImpl":
        if (left := _RUNS_LEFT.search(message)) is not None:
            return SearchNews(LIBRARY, int(left.group("left")), shown)
        return SearchNews(LIBRARY, None, shown) if _DIM_SPACE.search(message) else None
    if function == "GetAllConfigs":
        among = _AMONG.search(message)
        return SearchNews(LIBRARY, int(among.group("total")), shown) if among is not None else None
    counted = (_MONITOR if function == "Monitor" else _DONE).search(message)
    if counted is None:
        return None
    return SearchNews(LIBRARY, max(0, int(counted.group("total")) - int(counted.group("done"))), shown)
