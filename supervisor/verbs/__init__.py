"""Floor 6, the CLI's offline verbs, one module each: ``status``, ``report`` (with ``report_html`` and
``report_plot``), ``incidents``, ``doctor``, ``install_service``. They read a state directory or the machine and
print; ``yolo-train run`` is the agent's (``supervisor/agent.py``, on the same floor).
May import: every floor below.
"""
