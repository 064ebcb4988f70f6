"""A worker pipe read a moment ago rests out of the selector for READ_INTERVAL, then is watched again.

A progress bar redrawn 50 times a second, or fast batches each sending a heartbeat, then cost the loop one wake-up
per interval instead of one per write; the 1 MiB pipe (``worker_process``) holds far more than that meanwhile. The
loop asks ``next_wake`` for its select() timeout and calls ``wake_due`` after each select(): no thread, no sleep.
"""

from __future__ import annotations

import math
import selectors
import time
from typing import Callable

READ_INTERVAL = 0.2  # seconds a worker pipe rests after a read: far below any timeout, 5 wake-ups a second at most


class ReadThrottle:
    def __init__(self, selector: selectors.BaseSelector, interval: float = READ_INTERVAL):
        self.selector = selector
        self.interval = interval
        self._resting: dict[int, tuple[float, Callable[[int], None]]] = {}  # fd -> (when again, its callback)

    def rest(self, fd: int, callback: Callable[[int], None]) -> None:
        """Stop watching ``fd`` until the interval has passed; then ``callback`` is registered for it again."""
        if fd in self.selector.get_map():
            self.selector.unregister(fd)
            self._resting[fd] = (time.monotonic() + self.interval, callback)

    def next_wake(self) -> float:
        """The monotonic time the first resting pipe is due back (inf when none rests)."""
        return min((at for at, _ in self._resting.values()), default=math.inf)

    def wake_due(self) -> None:
        now = time.monotonic()
        for fd, (at, callback) in list(self._resting.items()):
            if at <= now:
                del self._resting[fd]
                self.selector.register(fd, selectors.EVENT_READ, callback)

    def forget(self, fd: int) -> None:
        """``fd`` is done with (ended, or about to be closed): neither watched nor resting."""
        self._resting.pop(fd, None)
        if fd in self.selector.get_map():
            self.selector.unregister(fd)
