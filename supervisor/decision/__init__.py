"""Floor 2, the pure decision: what the supervisor does next, and every rule that reads a record, with no I/O.

``core.decide(state, event, now)`` is the reducer every event goes through; ``events``/``actions`` are what it is
told and what it asks, ``state`` the records it keeps; one module per concern does the rest (``heartbeats``,
``kernel``, ``stopping``, ``recovery`` (a hang's recovery tiers, walked cheapest first, each a ``tier``:
``in_place``, ``restart``), ``probe``, ``goodput``, ``watchdog``, ``ladder``, ``rung_choice``); ``worker_kind`` says
once what the worker can do (ours or a ``[worker] command``), ``span`` how a recorded span of time is measured. Pure
readings live here too: ``status_view`` (the status users script against), ``stack_reading`` (what a capture of
stacks says), ``loader_judgement`` (whether a hang is the loader's).
May import: the standard library, the ground floor (``supervisor.vocabulary``, ``supervisor.exit_codes``,
``worker.contract``) and the configuration. Nothing here opens a file, reads a clock or starts a process.
"""
