"""docs/behaviour.md's MIOpen tables, written from supervisor/decision/model/miopen_modes.py:
``python -m supervisor.verbs.miopen_reference``. tests/decision/model/test_miopen_modes.py fails while the page's tables
differ from the code's, so a mode is documented where it is decided, and nowhere by hand."""

from __future__ import annotations

import sys
from pathlib import Path

from supervisor.decision import miopen_table

PAGE = Path(__file__).resolve().parents[2] / "docs" / "behaviour.md"
COMMAND = "python -m supervisor.verbs.miopen_reference"
BEGIN = f"<!-- MIOpen tables: written by `{COMMAND}` from supervisor/decision/model/miopen_modes.py -->"
END = "<!-- end of the MIOpen tables -->"


def block() -> str:
    return f"{BEGIN}\n{miopen_table()}{END}"


def render(page: str) -> str:
    """``page`` with its MIOpen tables written again."""
    start, end = page.index(BEGIN), page.index(END) + len(END)
    return page[:start] + block() + page[end:]


def main(argv: list[str]) -> int:
    PAGE.write_text(render(PAGE.read_text()))
    print(f"wrote {PAGE}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
