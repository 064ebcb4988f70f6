"""What the supervisor writes for people and programs: the state directory (lock, state file, incidents,
checkpoints guarded against truncation), ``yolo-train status``, the Prometheus exporter and systemd's notify and
journal fields. Outputs never decide anything; a failed write is said once and supervision goes on.
"""
