"""The signals sent to the supervisor, as a file descriptor for its event loop: the wake-up fd carries each signal's
number into the loop, which reads it like any other source; the handlers themselves do nothing.

SIGTERM and SIGINT stop the supervision; SIGHUP is caught and ignored: a closed terminal must not end a night of
training.
"""

from __future__ import annotations

import os
import signal

from worker.wire.heartbeat_protocol import read_available

STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)


def catch_signals() -> int:
    """Route the signals to a non-blocking pipe; its read end, to be watched."""
    signal_r, signal_w = os.pipe()
    os.set_blocking(signal_w, False)
    os.set_blocking(signal_r, False)
    signal.set_wakeup_fd(signal_w)
    for sig in (*STOP_SIGNALS, signal.SIGHUP):
        signal.signal(sig, lambda *_: None)
    return signal_r


def stop_requests(fd: int) -> list[str]:
    """The names of the stopping signals waiting in the pipe (SIGTERM, SIGINT), in the order they came."""
    return [signal.Signals(signum).name for signum in read_available(fd) or b"" if signum in STOP_SIGNALS]
