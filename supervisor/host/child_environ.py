"""The environment a child of the supervisor starts with (the worker, its standby, a notify command)."""

from __future__ import annotations

from collections.abc import Mapping

# Set by systemd for the main process only; a worker that inherited them would ping a watchdog that is not
# its own, or be handed sockets meant for the supervisor.
SERVICE_MANAGER_VARIABLES = ("NOTIFY_SOCKET", "WATCHDOG_USEC", "WATCHDOG_PID", "LISTEN_FDS", "LISTEN_PID",
                             "LISTEN_FDNAMES")


def worker_environ(environ: Mapping[str, str]) -> dict[str, str]:
    """The environment for a child process: the parent's, without the service manager's variables."""
    return {k: v for k, v in environ.items() if k not in SERVICE_MANAGER_VARIABLES}
