"""The embedded demo: a small synthetic detection dataset, generated on first use (no download).

Coloured rectangles (class 0) and ellipses (class 1) on a noisy background, with YOLO labels. Generated into
a cache directory under a temporary name and renamed into place, so concurrent first uses cannot see half
a dataset.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

DEMO_VERSION = 1
NAMES = ("box", "ellipse")


def cache_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache")
    return Path(base) / "yolo-train"


def ensure_demo_dataset(root: Path | None = None, train_images: int = 32, val_images: int = 8,
                        size: int = 64) -> Path:
    """Path of the demo's dataset YAML, generating the dataset if it is not there yet."""
    root = root or cache_dir()
    target = root / f"demo-v{DEMO_VERSION}-{train_images}-{val_images}-{size}"
    yaml_path = target / "data.yaml"
    if yaml_path.exists():
        return yaml_path
    root.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=".demo-", dir=root))
    try:
        _generate(tmp, train_images, val_images, size)
        (tmp / "data.yaml").write_text(
            f"path: {target}\ntrain: images/train\nval: images/val\n"
            f"names:\n" + "".join(f"  {i}: {n}\n" for i, n in enumerate(NAMES)))
        try:
            os.rename(tmp, target)
        except OSError:
            if not yaml_path.exists():  # not a lost race with another process: a real failure
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return yaml_path


def _generate(root: Path, train_images: int, val_images: int, size: int) -> None:
    import cv2
    import numpy as np

    rng = np.random.default_rng(0)
    for split, count in (("train", train_images), ("val", val_images)):
        (root / "images" / split).mkdir(parents=True)
        (root / "labels" / split).mkdir(parents=True)
        for i in range(count):
            image = rng.integers(0, 60, (size, size, 3), dtype=np.uint8)
            labels = []
            for _ in range(int(rng.integers(1, 4))):
                cls = int(rng.integers(0, len(NAMES)))
                w, h = (int(v) for v in rng.integers(size // 6, size // 2, 2))
                x, y = int(rng.integers(0, size - w)), int(rng.integers(0, size - h))
                colour = tuple(int(c) for c in rng.integers(120, 256, 3))
                if cls == 0:
                    cv2.rectangle(image, (x, y), (x + w, y + h), colour, -1)
                else:
                    cv2.ellipse(image, (x + w // 2, y + h // 2), (w // 2, h // 2), 0, 0, 360, colour, -1)
                labels.append(f"{cls} {(x + w / 2) / size:.6f} {(y + h / 2) / size:.6f} {w / size:.6f} {h / size:.6f}")
            cv2.imwrite(str(root / "images" / split / f"{i:04d}.png"), image)
            (root / "labels" / split / f"{i:04d}.txt").write_text("\n".join(labels) + "\n")
