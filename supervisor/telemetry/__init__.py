"""Floor 5, what the supervisor tells people and programs while it runs: the metric rows (``metric_table``, from
which the exporter, the names and the dashboard's checks derive), the Prometheus exporter and its endpoint, the
status written each second (``status_writer``), systemd's notify protocol and journal fields, and the notify command.
None of them decides anything.
May import: the floors below (ground, configuration, ``decision``, ``host``, ``state``); not ``attempt`` or
``kernel`` beside it.
"""
