"""``python -m worker``: what must come before the worker's imports, which take seconds (Ultralytics among them)."""

import os
import signal
import sys

from worker.supervision.link import STOP_REQUESTED

# SIGUSR1 (the supervisor's "save and exit") must never meet its default action, death, even during the imports.
signal.signal(signal.SIGUSR1, lambda *_: STOP_REQUESTED.append(True))
# Read by Ultralytics when it is imported: no download attempt may stall a run (fonts, AMP check weights).
os.environ.setdefault("YOLO_OFFLINE", "1")
os.environ.setdefault("MPLBACKEND", "Agg")

from worker.training.train import main  # noqa: E402  (after the handler and the environment above)

sys.exit(main(sys.argv[1:]))
