"""What the tests share, in one place: a test file imports from here and from tests/conftest.py's fixtures, never
from another test file.

- ``supervised``: the real CLI in a subprocess and what a run leaves (its state file, its incidents), a stand-in
  worker, the demo's [train] table, ``quiet_config`` (the sections every supervised test writes: no metrics endpoint,
  no kernel log, no GPU events) and the end-to-end tests' config;
- ``driver``: the decision core fed events at chosen times (``Driver``, ``make``, ``healthy``, ``loading``);
- ``resume``: a real worker driven as the supervisor drives it (a launch record, its heartbeat pipe), killed mid-epoch;
- ``source_imports``: what a source file imports, read with ast (the floors' and the contract's tests);
- ``systemd_harness``, ``headless_chromium``: a throwaway booted systemd, Debian's headless Chromium.

The fixtures (``write_config``, ``demo_config``) are in tests/conftest.py; recorded inputs stay in tests/fixtures/.
"""

from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]  # the checkout: `python -m supervisor` runs from here
