"""The decision's records and their pure arithmetic: what it is told (``events``) and asks (``actions``), what it
keeps (``state``, ``incident``, ``rung_record``, ``hang_history``, ``persistence``), the ladder, the failure
signatures, and the arithmetic the learning reads (``rung_choice``: expected goodput; ``checkpoint_interval``).
May import: the standard library, the ground floor and the configuration; nothing else of the decision.
"""
