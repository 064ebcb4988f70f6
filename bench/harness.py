"""What the benchmarks share: the checkout they measure, a free port, the one way to write a config, and the quiet
sections a supervised bench runs with."""

from __future__ import annotations

import argparse
import json
import os
import socket
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent  # the checkout: `python -m supervisor` is run from here


def checkout_env(root: Path = ROOT) -> dict[str, str]:
    """This process's environment with ``root`` first on PYTHONPATH, for a supervisor whose worker is a script written
    outside the checkout (a stand-in, a timed worker) that imports the checkout's packages: the children inherit it, and
    no script edits its own import path."""
    path = os.pathsep.join(p for p in (str(root), os.environ.get("PYTHONPATH", "")) if p)
    return {**os.environ, "PYTHONPATH": path}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def write_config(path: Path, train: dict | None = None, worker: dict | None = None, sections: dict | None = None,
                 name: str | None = None) -> Path:
    """The embedded demo's config (supervisor/demo.toml) with a free metrics port (the machine is shared, the
    default port may be taken), the given ``[train]`` and ``[worker]`` keys, other ``sections`` and ``name``."""
    raw = tomllib.loads((ROOT / "supervisor" / "demo.toml").read_text())
    if name is not None:
        raw["name"] = name
    raw.setdefault("metrics", {})["listen"] = f"127.0.0.1:{free_port()}"
    raw["train"].update(train or {})
    if worker:
        raw.setdefault("worker", {}).update(worker)
    for section, table in (sections or {}).items():
        raw.setdefault(section, {}).update(table)
    path.write_text(to_toml(raw))
    return path


def quiet_sections(kernel_log: str = "off", **kernel_log_keys) -> dict:
    """The tables that keep a supervised bench to itself: no metrics endpoint, no kernel log (``kernel_log = "kmsg"``
    and its ``kernel_log_keys`` for a bench of it) and no udev GPU events."""
    return {"metrics": {"listen": "off"},
            "kernel_log": {"source": kernel_log, "gpu_events": "off", **kernel_log_keys}}


def quiet_config(kernel_log: str = "off", **kernel_log_keys) -> str:
    """``quiet_sections`` as TOML, for a config a bench writes as text (after its top-level keys)."""
    return to_toml(quiet_sections(kernel_log, **kernel_log_keys))


def to_toml(raw: dict) -> str:
    """Enough TOML for a config: top-level scalars, then one table per section (inline tables inside)."""
    def value(v) -> str:
        if isinstance(v, dict):
            return "{" + ", ".join(f"{k} = {value(x)}" for k, x in v.items()) + "}"
        if isinstance(v, list):
            return "[" + ", ".join(value(x) for x in v) + "]"
        return json.dumps(v)  # str, int, float and bool are spelled the same in JSON and TOML

    lines = [f"{k} = {value(v)}" for k, v in raw.items() if not isinstance(v, dict)]
    for section, table in raw.items():
        if isinstance(table, dict):
            lines += [f"\n[{section}]"] + [f"{k} = {value(v)}" for k, v in table.items()]
    return "\n".join(lines) + "\n"


def add_training_args(parser: argparse.ArgumentParser) -> None:
    """The training a supervised bench runs: ``--gpu`` picks device 0's defaults, the rest override them one by one
    (``apply_training_defaults``)."""
    parser.add_argument("--gpu", action="store_true", help="device 0, YOLOv8n at 640 px, batch 32, 8 workers")
    for name in ("epochs", "images", "imgsz", "batch", "workers"):
        parser.add_argument(f"--{name}", type=int)
    parser.add_argument("--model", default="yolov8n.yaml")


def apply_training_defaults(args: argparse.Namespace, gpu: dict, cpu: dict) -> None:
    """Each training argument not given takes its value from ``gpu`` (with ``--gpu``) or ``cpu``."""
    for key, value in (gpu if args.gpu else cpu).items():
        if getattr(args, key, None) is None:
            setattr(args, key, value)
