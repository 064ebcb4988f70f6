"""The Notifier against a real AF_UNIX datagram socket standing in for systemd's NOTIFY_SOCKET (the same
datagrams sd_notify sends to PID 1), and journal_logging's choice of handler. The journal itself is exercised
inside a booted systemd by tests/telemetry/test_systemd_unit.py."""

from __future__ import annotations

import io
import logging
import os
import socket
import sys
import time

import pytest
from systemd import journal

from supervisor.host.child_environ import worker_environ
from supervisor.telemetry.systemd_notify import Notifier, journal_logging, under_journal


@pytest.fixture
def notify_socket(tmp_path, monkeypatch):
    path = tmp_path / "notify"
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind(str(path))
    sock.settimeout(5)
    monkeypatch.setenv("NOTIFY_SOCKET", str(path))
    yield sock
    sock.close()


def received(sock: socket.socket) -> list[str]:
    return sock.recv(4096).decode().split("\n")


def test_ready_with_status_arrives_as_one_datagram(notify_socket):
    assert Notifier().ready("epoch 1/3 rung 0")
    assert received(notify_socket) == ["READY=1", "STATUS=epoch 1/3 rung 0"]


def test_status_watchdog_stopping(notify_socket):
    notifier = Notifier()
    notifier.status("epoch 2/3\nbatch 5")  # a newline would start a bogus assignment
    assert received(notify_socket) == ["STATUS=epoch 2/3 batch 5"]
    notifier.watchdog()
    assert received(notify_socket) == ["WATCHDOG=1"]
    notifier.stopping("saving a checkpoint")
    assert received(notify_socket) == ["STOPPING=1", "STATUS=saving a checkpoint"]


def test_everything_is_a_noop_without_notify_socket(monkeypatch):
    monkeypatch.delenv("NOTIFY_SOCKET", raising=False)
    notifier = Notifier()
    assert not notifier.enabled
    assert not notifier.ready("x") and not notifier.status("x") and not notifier.watchdog()
    assert not notifier.stopping()


def test_a_vanished_socket_does_not_raise(tmp_path, monkeypatch):
    monkeypatch.setenv("NOTIFY_SOCKET", str(tmp_path / "gone"))
    assert Notifier().watchdog() is False


@pytest.mark.parametrize("usec, pid, expected", [
    ("30000000", "self", 15.0),
    ("30000000", None, 15.0),       # WATCHDOG_PID is optional
    ("30000000", "1", None),        # the watchdog is someone else's (we inherited it)
    ("0", "self", None),
    (None, None, None),
    ("junk", None, None),
])
def test_watchdog_interval_is_half_of_watchdog_usec_for_us_only(monkeypatch, usec, pid, expected):
    for name, value in (("WATCHDOG_USEC", usec), ("WATCHDOG_PID", str(os.getpid()) if pid == "self" else pid)):
        if value is None:
            monkeypatch.delenv(name, raising=False)
        else:
            monkeypatch.setenv(name, value)
    assert Notifier().watchdog_interval() == expected


def test_keepalive_pings_at_most_once_per_watchdog_interval_and_not_at_all_without_a_watchdog(notify_socket,
                                                                                            monkeypatch):
    monkeypatch.setenv("WATCHDOG_USEC", "400000")  # a ping every 0.2 s
    monkeypatch.delenv("WATCHDOG_PID", raising=False)
    notifier = Notifier()
    notifier.keepalive()
    assert received(notify_socket) == ["WATCHDOG=1"]
    notifier.keepalive()  # within the interval: nothing is sent
    notify_socket.settimeout(0.05)
    with pytest.raises(TimeoutError):
        notify_socket.recv(4096)
    time.sleep(0.2)
    notifier.keepalive()
    assert received(notify_socket) == ["WATCHDOG=1"]
    monkeypatch.delenv("WATCHDOG_USEC")
    Notifier().keepalive()
    with pytest.raises(TimeoutError):
        notify_socket.recv(4096)


def test_worker_environ_drops_the_service_manager_variables():
    env = {"PATH": "/usr/bin", "NOTIFY_SOCKET": "/run/systemd/notify", "WATCHDOG_USEC": "1", "WATCHDOG_PID": "7"}
    assert worker_environ(env) == {"PATH": "/usr/bin"}


def test_journal_stream_must_match_our_stderr(tmp_path):
    log = open(tmp_path / "stderr", "w")
    st = os.fstat(log.fileno())
    assert under_journal({"JOURNAL_STREAM": f"{st.st_dev}:{st.st_ino}"}, log)
    # Inherited from a parent whose stderr went to the journal, while ours goes to a file: not the journal.
    assert not under_journal({"JOURNAL_STREAM": f"{st.st_dev}:{st.st_ino + 1}"}, log)
    assert not under_journal({}, log)
    assert not under_journal({"JOURNAL_STREAM": "1:2"}, io.StringIO())
    log.close()


def test_journal_logging_picks_the_handler(tmp_path):
    logger = logging.getLogger("test_journal_logging_picks_the_handler")
    log = open(tmp_path / "stderr", "w")
    st = os.fstat(log.fileno())
    try:
        assert isinstance(journal_logging(logger, {}, log), logging.StreamHandler)
        assert isinstance(journal_logging(logger, {"JOURNAL_STREAM": f"{st.st_dev}:{st.st_ino}"}, log),
                          journal.JournalHandler)
        logger.warning("plain line", extra={"EPOCH": 3})
        log.flush()
        assert "WARNING test_journal_logging_picks_the_handler: plain line" in (tmp_path / "stderr").read_text()
    finally:
        for handler in list(logger.handlers):
            logger.removeHandler(handler)
        log.close()
