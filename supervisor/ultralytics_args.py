"""What Ultralytics takes as train arguments, read from its files without importing it (which imports torch,
seconds where reading takes milliseconds), and the values it would refuse, said as the form it expects.

Empty answers (every name and value let through, Ultralytics' own check at the worker) where Ultralytics is not
installed, or is a version whose files do not hold these names.
"""

from __future__ import annotations

import importlib.util
from functools import lru_cache
from pathlib import Path
from typing import Any


def _cfg_dir() -> Path | None:
    spec = importlib.util.find_spec("ultralytics")
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(next(iter(spec.submodule_search_locations))) / "cfg"


@lru_cache(maxsize=1)
def train_args() -> dict[str, Any]:
    """Ultralytics' argument names and defaults, read from its cfg/default.yaml."""
    import yaml

    cfg = _cfg_dir()
    return {} if cfg is None else yaml.safe_load((cfg / "default.yaml").read_text()) or {}


@lru_cache(maxsize=1)
def value_kinds() -> dict[str, Any]:
    """The key sets Ultralytics' ``check_cfg`` types its arguments by (CFG_INT_KEYS, CFG_BOOL_KEYS, ... and
    CFG_INT_MIN), read from ultralytics/cfg/__init__.py as literals."""
    import ast

    cfg = _cfg_dir()
    if cfg is None:
        return {}
    try:
        tree = ast.parse((cfg / "__init__.py").read_text())
    except (OSError, SyntaxError, ValueError):
        return {}
    kinds: dict[str, Any] = {}
    for node in tree.body:
        if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
            name = node.targets[0].id
            value = node.value
            if isinstance(value, ast.Call) and getattr(value.func, "id", "") == "frozenset" and value.args:
                value = value.args[0]
            if name.startswith("CFG_") and name.endswith(("_KEYS", "_MIN")):
                try:
                    kinds[name] = ast.literal_eval(value)
                except ValueError:
                    continue
    return kinds


def expected_form(key: str, value: Any) -> str | None:
    """The form Ultralytics' check_cfg (hard) or its trainer expects for ``key`` where ``value`` is not one; None where
    it passes. Stricter where Ultralytics is lax: a boolean is never a number (``workers = true`` would mean one
    worker)."""
    kinds = value_kinds()
    number = isinstance(value, (int, float)) and not isinstance(value, bool)
    whole = number and (isinstance(value, int) or value.is_integer())
    if key == "workers":
        return None if whole and value >= 0 else "a whole number >= 0"
    if key == "batch":
        return None if number and (value >= 1 and whole or value == -1 or 0 < value < 1) else \
            "a whole number >= 1, -1 (AutoBatch) or a fraction of GPU memory between 0 and 1"
    if key == "imgsz":
        sizes = value if isinstance(value, list) and len(value) in (1, 2) else [value]
        return None if all(isinstance(v, int) and not isinstance(v, bool) and v >= 1 for v in sizes) else \
            "pixels as a whole number >= 1, or [height, width]"
    if key in kinds.get("CFG_INT_KEYS", ()):
        least = kinds.get("CFG_INT_MIN", {}).get(key)
        return None if whole and (least is None or value >= least) else \
            "a whole number" + (f" >= {least}" if least is not None else "")
    if key in kinds.get("CFG_FLOAT_KEYS", ()):
        return None if number else "a number"
    if key in kinds.get("CFG_FRACTION_KEYS", ()):
        if key == "fraction" and isinstance(value, list):
            return None  # [train, val(, test)] counts or ratios: Ultralytics' own check at the worker
        return None if number and (0 <= value <= 1 or key == "fraction" and whole and value > 1) else \
            "a number between 0 and 1" + (" or a count of images > 1" if key == "fraction" else "")
    if key in kinds.get("CFG_BOOL_KEYS", ()):
        return None if isinstance(value, bool) else "true or false"
    if key in kinds.get("CFG_STR_KEYS", ()):
        return None if isinstance(value, str) else "a string"
    if key == "amp" and not (isinstance(value, bool) or str(value).lower() in ("fp16", "bf16", "fp32")):
        return 'true, false, "fp16", "bf16" or "fp32"'
    return None


# The nodes of the expression Ultralytics writes its asset names in (comprehensions of f-strings over literals, joined
# by +): evaluated only when made of these alone, so nothing of the file runs but string building.
_ASSET_NODES = ("Expression", "Call", "Name", "Load", "Store", "BinOp", "Add", "List", "ListComp", "comprehension",
                "JoinedStr", "FormattedValue", "Constant", "Tuple")


@lru_cache(maxsize=1)
def asset_names() -> frozenset[str] | None:
    """The files Ultralytics downloads by name (``GITHUB_ASSETS_NAMES`` of utils/downloads.py: yolov8n.pt,
    yolo11n-seg.pt ...), read from its file; None where it cannot be read."""
    import ast

    cfg = _cfg_dir()
    try:
        tree = ast.parse((cfg.parent / "utils" / "downloads.py").read_text()) if cfg is not None else None
    except (OSError, SyntaxError, ValueError):
        return None
    for node in tree.body if tree is not None else ():
        if isinstance(node, ast.Assign) and [getattr(t, "id", None) for t in node.targets] == ["GITHUB_ASSETS_NAMES"]:
            expression = ast.Expression(node.value)
            if all(type(n).__name__ in _ASSET_NODES for n in ast.walk(expression)):
                try:
                    names = eval(compile(expression, "downloads.py", "eval"),
                                 {"__builtins__": {}, "frozenset": frozenset})
                except Exception:
                    return None
                return frozenset(names) if all(isinstance(n, str) for n in names) else None
    return None
