"""Where the supervisor's status goes, each time the agent writes its state: the metrics exporter, systemd's STATUS=
line, the state file and, with several hosts, this host's view on the shared run directory. A failed write is said
once and the others go on.
"""

from __future__ import annotations

import logging
from typing import Any, Callable

from supervisor.config import Config
from supervisor.decision import Status
from supervisor.state import hosts
from supervisor.state.state_dir import StateDir, StateDirTaken
from supervisor.telemetry.metrics_endpoint import MetricsEndpoint
from supervisor.telemetry.systemd_notify import Notifier

log = logging.getLogger("yolo-train")


def status_line(status: Status) -> str:
    """One line for `systemctl status`."""
    s, p = status, status.reported
    return (f"{s.state}, epoch {p.epoch}/{p.epochs} batch {p.batch}/{p.batches}, "
            f"{f'{s.it_s:.2f}' if s.it_s else '-'} it/s, rung {s.rung} ({s.rung_label}), restarts {s.restarts}")


class StatusWriter:
    def __init__(self, config: Config, state_dir: StateDir, metrics: MetricsEndpoint, systemd: Notifier):
        self.config = config
        self.state_dir = state_dir
        self.metrics = metrics
        self.systemd = systemd
        self._hosts_view_failed = False

    def write(self, status: Status, record: dict[str, Any], on_taken: Callable[[StateDirTaken], None],
              final: bool = False) -> None:
        """``record``: the state file's content, ``status`` as JSON in it; ``final``: the supervisor's last.
        ``on_taken`` is told, once, that another supervisor took the state directory; nothing is written there after
        it."""
        self.metrics.publish(status)
        self.systemd.status(status_line(status))
        try:
            self.state_dir.write_state(record, final=final)
        except StateDirTaken as e:
            on_taken(e)
        if self.config.distributed.several_hosts:
            try:
                hosts.publish(self.state_dir.run_dir, self.config.distributed.node_rank, record["status"])
            except OSError as e:
                if not self._hosts_view_failed:  # said once: it is retried every second
                    log.warning(f"cannot write this host's view to {self.state_dir.run_dir} ({e.strerror}): "
                                f"`status` on the other hosts does not show this one")
                self._hosts_view_failed = True
