"""Floor 4, the state directory: its lock and state file (``state_dir``, ``state_file``), the incidents and their
stacks, the checkpoints guarded against truncation, the history the report draws, and the files several hosts share
(``hosts``, ``job_ladder``). A failed write is said once and supervision goes on.
May import: the floors below (ground, configuration, ``decision``, ``host``).
"""
