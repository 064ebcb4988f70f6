"""docs/configuration.md, the configuration reference, written from the keys' declarations in supervisor/config.py:
``python -m supervisor.config_reference``. tests/config/test_config_reference.py fails while the committed file differs,
so a key is documented where it is declared, and nowhere by hand."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

from supervisor.config import KEYS, RUNG_SETTINGS, SECTION_DOCS, WORKERS_PER_CORE
from supervisor.config_keys import LONGEST, Key

REFERENCE = Path(__file__).resolve().parent.parent / "docs" / "configuration.md"
COMMAND = "python -m supervisor.config_reference"

INTRO = f"""\
# Configuration reference

<!-- Written by `{COMMAND}` from the keys declared in supervisor/config.py; edit those, not this file. -->

One TOML file: `yolo-train run --config FILE` (without one, the embedded demo). Every key is optional except
`[train]` (or a `[worker] command`). Unknown keys and bad values are refused with one line naming the file, the key
and the form expected, and exit status 78; `yolo-train check-config --config FILE` checks a file and prints the
ladder. `units/config.example.toml` is a complete example. Times are seconds, at most a day ({LONGEST:g}: a longer
bound is a slip, and `"off"`, where a key takes it, says no limit); where a key takes a duration, `"90s"`, `"10m"`,
`"2h"` or `"1h30m"` say the same.

What the machine must have is checked against the machine the check runs on (supervisor/host/machine_fit.py).
Wherever the file is read: a loader's count (`[train] workers`, a rung's `workers` or `threads`) of at most
{WORKERS_PER_CORE} per core. By `run` before it trains, and by `check-config` unless given `--portable` (a file that
trains on another machine): `[train] data` as Ultralytics resolves it (a path that exists, relative to the directory
`run` starts in; a name in Ultralytics' own `cfg/datasets` such as `"coco8.yaml"`; a URL; for classification a bare
name it downloads), `[train] model` as its trainer resolves it (a file that is a model: a `.pt` in torch.save's archive,
a YAML with a backbone and a head; a model YAML of Ultralytics' `cfg/models` such as `"yolov8n.yaml"`; a name it
downloads such as `"yolov8n.pt"` or `"yolo11n"`, or finds in its `weights_dir`; a URL), and `[train] device` among the GPUs the worker's torch sees (a device the driver lists passes
at once: NVIDIA's `/proc/driver/nvidia/gpus` for a CUDA torch, amdkfd's GPU nodes for a ROCm one, with no
`*_VISIBLE_DEVICES` set; else they are counted by `[worker] python` in the worker's environment, and only that count
refuses one; `"cpu"` always, `"mps"` on macOS only, `"0,1"` for DDP).
"""


def shown(value: Any) -> str:
    """A default as TOML writes it."""
    if value is None:
        return "none"
    if isinstance(value, bool):
        return f"`{str(value).lower()}`"
    if isinstance(value, float):
        return f"`{value:g}`"
    if isinstance(value, str):
        return f'`"{value}"`'
    if isinstance(value, (tuple, list)):
        return "`[]`" if not value else f"`{list(value)}`"
    if isinstance(value, dict):
        return "`{}`" if not value else f"`{value}`"
    return f"`{value}`"


def cell(text: str) -> str:
    return text.replace("|", "\\|")


def rows(keys: list[Key]) -> list[str]:
    lines = ["| key | takes | default | what it does |", "|---|---|---|---|"]
    for k in keys:
        if not k.doc:
            raise ValueError(f"{k.where}: a key without a doc; say what it does in its key(...) declaration")
        name = {"train": "[train]", "faults": "[[faults]]"}.get(k.where, k.name)
        lines.append(f"| `{name}` | {cell(k.kind.expected)} | {cell(k.shown or shown(k.default))} | {cell(k.doc)} |")
    return lines


def render() -> str:
    out = [INTRO]
    for section in dict.fromkeys(k.section for k in KEYS):
        out += ["", f"## {f'[{section}]' if section else 'Top level'}", ""]
        if SECTION_DOCS.get(section):
            out += [SECTION_DOCS[section], ""]
        out += rows([k for k in KEYS if k.section == section])
        if section == "ladder":
            out += ["", "### A rung's settings", "", SECTION_DOCS["ladder.rungs"], ""]
            out += rows(list(RUNG_SETTINGS))
    return "\n".join(out) + "\n"


def main(argv: list[str]) -> int:
    REFERENCE.parent.mkdir(exist_ok=True)
    REFERENCE.write_text(render())
    print(f"wrote {REFERENCE}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
