"""A span of time as the records keep it: a start, a restart, a stall up to the next spawn, a startup step's stretch.

Two readings of one clock (both monotonic, or both wall clock), the span kept to the millisecond as incidents, the
rung records and the hang history hold it; a start not known has no span.
"""

from __future__ import annotations


def span(start: float | None, end: float) -> float | None:
    """Seconds from ``start`` to ``end``, to the millisecond; None where ``start`` is unknown."""
    return None if start is None else round(end - start, 3)
