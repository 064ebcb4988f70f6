"""Floor 5, one attempt's worker: its spawn and launch record (``worker_spawn``), the running process and its pipes
(``worker_process``, ``read_throttle``; its output without terminal escapes: ``terminal_escapes``) and what they
say as the core's events (``worker_pipes``), a command's output read as progress (``worker_command``,
``progress_lines``), MIOpen's kernel search read from any worker's output as news of its step (``search_lines``), the
standby that holds the next attempt's imports ready, the rendezvous of several hosts, whether the tree does anything
(``tree_activity``), what it shows before a kill (``incident_evidence``), its kill and its survivors
(``tree_kill``) and the in-place recovery tier's actions (``loader_workers``). Each turns what it reads into the
core's typed events.
May import: the floors below (ground, configuration, ``decision``, ``host``, ``state``); not ``kernel`` or
``telemetry`` beside it.
"""
