"""No download attempts from Ultralytics during training.

Ultralytics fetches Arial.ttf from GitHub when a dataset is checked and when it draws labels, even with
YOLO_OFFLINE=1 (``check_font`` probes the URL with a 3 s timeout, a real request where DNS or a proxy
hangs). The replacement looks where Ultralytics looks locally and stops there: plots fall back to the
default font, training never waits on the network.
"""

from __future__ import annotations

import os
from pathlib import Path


def local_font(font: str = "Arial.ttf") -> Path | str | None:
    from matplotlib import font_manager
    from ultralytics.utils import USER_CONFIG_DIR

    name = Path(font).name
    cached = USER_CONFIG_DIR / name
    if cached.exists():
        return cached
    matches = [f.fname for f in font_manager.fontManager.ttflist if font in f.fname and os.path.exists(f.fname)]
    return matches[0] if matches else None


def install() -> None:
    from ultralytics.data import utils as data_utils
    from ultralytics.utils import checks, plotting

    for module in (checks, data_utils, plotting):
        module.check_font = local_font
