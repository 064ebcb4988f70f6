"""Terminal escapes taken out of a worker's output: Ultralytics colours its prefixes (``\\x1b[34m\\x1b[1mtrain:``) and
erases lines (``\\x1b[K``), and a terminal's title or hyperlink is an OSC (``\\x1b]8;;URL\\x07``). Lines the supervisor
keeps (an incident's output tail, a signature's line) or writes to its log (the journal, which stores a line with an
escape as a blob that journalctl does not show) are the text a terminal would show.
"""

from __future__ import annotations

import re

# ECMA-48: a CSI (ESC [, parameters, intermediates, a final byte), an OSC or other string (ESC ] P X ^ _, ended by BEL
# or ESC \, or cut off by the line's end), or any other escape of one byte after ESC.
ESCAPES = re.compile(rb"\x1b(?:\[[0-?]*[ -/]*[@-~]|[\]PX^_][^\x07\x1b]*(?:\x07|\x1b\\|$)|[ -/]*[0-~])")


def without_escapes(data: bytes) -> bytes:
    return ESCAPES.sub(b"", data) if b"\x1b" in data else data
