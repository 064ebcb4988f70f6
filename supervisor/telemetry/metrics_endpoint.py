"""The metrics endpoint ([metrics] listen) over the supervisor's life: started with it, serving between restarts.

Metrics are optional: a port that cannot be listened on is said once, tried again every RETRY seconds from the
event loop (``retry_if_due``, no thread of its own), and counted (``bind_failures``, in the status).
"""

from __future__ import annotations

import logging
import time
from typing import Any

from supervisor.config import Config, ConfigError

log = logging.getLogger("yolo-train")

RETRY = 30.0  # seconds between tries to listen on a busy metrics port


class MetricsEndpoint:
    def __init__(self, config: Config):
        self.config = config
        self.exporter = None  # metrics.Exporter once listening
        self.bind_failures = 0
        self.retry_at: float | None = None

    def start(self) -> None:
        if not self.config.metrics_listen:
            return
        from supervisor.telemetry.metrics import start_exporter  # prometheus_client is imported only when listening

        try:
            self.exporter = start_exporter(self.config)  # serves between restarts too: it lives with us
        except ConfigError as e:
            if self.bind_failures == 0:
                log.warning(f"{e}; training goes on without metrics, retrying every {RETRY:.0f} s")
            self.bind_failures += 1
            self.retry_at = time.monotonic() + RETRY
            return
        self.retry_at = None
        host, _ = self.config.metrics_address  # the port bound, not the one asked for: port 0 picks a free one
        log.info(f"metrics: http://{host}:{self.exporter.port}/metrics"
                 + (f" (after {self.bind_failures} failed tries)" if self.bind_failures else ""))

    def retry_if_due(self) -> None:
        if self.retry_at is not None and time.monotonic() >= self.retry_at:
            self.start()

    @property
    def gpu_readers(self) -> list:
        """The GPUs the exporter samples, for an incident's stacks to sample too; none without an exporter."""
        return self.exporter.gpu_readers if self.exporter is not None else []

    def publish(self, status: dict[str, Any]) -> None:
        if self.exporter is not None:
            self.exporter.publish(status)

    def close(self) -> None:
        if self.exporter is not None:
            self.exporter.close()
