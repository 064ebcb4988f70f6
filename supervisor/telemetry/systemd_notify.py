"""What the supervisor tells systemd (sd_notify) and where its log records go (the journal or stderr).

Everything here is a no-op outside systemd: without NOTIFY_SOCKET nothing is sent, without a matching
JOURNAL_STREAM logs go to plain stderr. Only the supervisor (the unit's main process, NotifyAccess=main)
talks to systemd; supervisor/host/child_environ.py strips the variables that would make a child believe it may.
"""

from __future__ import annotations

import logging
import os
import sys
import time
from collections.abc import Mapping
from typing import TextIO

try:
    from systemd import daemon, journal
except ImportError:  # systemd-python is a dependency, but a supervisor without it still supervises
    daemon = journal = None

SYSLOG_IDENTIFIER = "yolo-train"



class Notifier:
    """sd_notify(3) messages: READY=1 once the worker runs, STATUS= for `systemctl status`, WATCHDOG=1 from the
    event loop every `watchdog_interval()` seconds, STOPPING=1 on shutdown.

    A message that cannot be delivered returns False rather than raising: training must not stop because
    systemd could not be told about it.
    """

    def __init__(self) -> None:
        self._watchdog_every = self.watchdog_interval()
        self._watchdog_sent = 0.0

    @property
    def enabled(self) -> bool:
        # Read at each call, as sd_notify does: the process environment is the one truth.
        return bool(os.environ.get("NOTIFY_SOCKET"))

    def ready(self, status: str | None = None) -> bool:
        return self._send("READY=1", status)

    def status(self, text: str) -> bool:
        return self._send(None, text)

    def watchdog(self) -> bool:
        return self._send("WATCHDOG=1", None)

    def keepalive(self) -> None:
        """WATCHDOG=1 once its interval has passed since the last: called from the event loop itself (and while a
        kill waits), so that a hung loop stops the pings."""
        if self._watchdog_every and time.monotonic() - self._watchdog_sent >= self._watchdog_every:
            self._watchdog_sent = time.monotonic()
            self.watchdog()

    def stopping(self, status: str | None = None) -> bool:
        return self._send("STOPPING=1", status)

    def watchdog_interval(self) -> float | None:
        """Seconds between WATCHDOG=1 pings (half of WatchdogSec=), or None when no watchdog is set for us."""
        usec = os.environ.get("WATCHDOG_USEC", "")
        owner = os.environ.get("WATCHDOG_PID", "")
        if not usec.isdigit() or int(usec) == 0:
            return None
        if owner and (not owner.isdigit() or int(owner) != os.getpid()):
            return None
        return int(usec) / 2 / 1_000_000

    def _send(self, state: str | None, status: str | None) -> bool:
        if not self.enabled or daemon is None:
            return False
        lines = [state] if state else []
        if status is not None:
            # One STATUS= line: a newline would start a new assignment.
            lines.append("STATUS=" + " ".join(status.splitlines()))
        try:
            return bool(daemon.notify("\n".join(lines)))
        except OSError:
            return False


def under_journal(environ: Mapping[str, str] = os.environ, stream: TextIO = sys.stderr) -> bool:
    """True when `stream` is the journal stream systemd connected us to (JOURNAL_STREAM is "dev:ino" of it);
    a stderr redirected elsewhere by a child of ours or by the user does not count."""
    expected = environ.get("JOURNAL_STREAM", "")
    if not expected:
        return False
    try:
        st = os.fstat(stream.fileno())
    except (OSError, ValueError, AttributeError):
        return False
    return expected == f"{st.st_dev}:{st.st_ino}"


def journal_logging(logger: logging.Logger, environ: Mapping[str, str] = os.environ,
                    stream: TextIO = sys.stderr) -> logging.Handler:
    """Attach one handler to `logger` and return it: the journal under systemd, else plain stderr.

    In the journal, the keys of a record's ``extra=`` become fields: ``extra={"EPOCH": 3, "RUNG": 1}`` gives
    EPOCH=3 RUNG=1, so ``journalctl -u yolo-train RUNG=1`` selects them. Field names must be upper case
    (letters, digits, underscore); journald drops the others.
    """
    handler: logging.Handler
    if under_journal(environ, stream) and journal is not None:
        handler = journal.JournalHandler(SYSLOG_IDENTIFIER=SYSLOG_IDENTIFIER)
        handler.setFormatter(logging.Formatter("%(message)s"))  # the journal stamps time and priority itself
    else:
        handler = logging.StreamHandler(stream)
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    logger.addHandler(handler)
    return handler
