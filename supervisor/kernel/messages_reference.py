"""docs/kernel_messages.md, the kernel lines acted on, written from the catalogue in supervisor/kernel/catalogue.py:
``python -m supervisor.kernel.messages_reference``. tests/kernel/test_messages_reference.py fails while the committed
file differs, so a pattern is documented where it is declared, and nowhere by hand."""

from __future__ import annotations

import sys
from pathlib import Path

from supervisor.kernel.catalogue import markdown_table

REFERENCE = Path(__file__).resolve().parents[2] / "docs" / "kernel_messages.md"
COMMAND = "python -m supervisor.kernel.messages_reference"

INTRO = f"""\
# Kernel messages acted on

<!-- Written by `{COMMAND}` from supervisor/kernel/catalogue.py; edit that, not this file. -->

The kernel lines the supervisor acts on, in the order it tries them (after the user's `[kernel_log] patterns`), each
with the kernel function or the driver document that prints it. What each kind does: `stall` and `gpu_fault` put the
worker under suspicion (killed when it shows no progress), `gpu_lost` ends the run with exit 3 (reboot needed), `oom`
names the crash that follows, `ignore` is known and left alone. How the lines are read:
[design.md](design.md#kernel-messages-acted-on-kernel).
"""


def render() -> str:
    return INTRO + "\n" + markdown_table() + "\n"


def main(argv: list[str]) -> int:
    REFERENCE.write_text(render())
    print(f"wrote {REFERENCE}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
