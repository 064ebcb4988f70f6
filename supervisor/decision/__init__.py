"""The pure decision: what the supervisor does next, with no I/O.

``core.decide(state, event, now)`` is the reducer every event goes through; ``events``/``actions`` are what it is
told and what it asks, ``state`` the records it keeps (and what of them persists), and one module per concern does
the rest: ``heartbeats``, ``kernel``, ``stopping``, ``restart``, ``probe``, ``goodput``. ``watchdog`` says how long a
phase may go without progress, ``ladder`` which settings each rung adds, ``restart_budget`` when to give up and how
long to back off, ``signatures`` which output lines name a failure and its remedy, ``vocabulary`` the one spelling of
every state, reason, kind and phase. Nothing here opens a file, reads a clock or starts a process, so every rule is
tested by feeding events at chosen times (``tests/test_core.py``).
"""
